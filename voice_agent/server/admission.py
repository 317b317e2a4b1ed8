"""Admission control: refuse a new call fast rather than let every call on the worker degrade.

Plain code over numbers the server samples (live calls, event-loop lag, process CPU), so the
rule is testable without load. A refused WebSocket call is closed with 1013 "try again later";
an HTTP request gets 503 with Retry-After.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

RETRY_AFTER_S = 5


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str  # the metric label: max_calls, loop_lag, cpu
    message: str  # for the close frame or the 503 body


class Admission:
    def __init__(
        self,
        *,
        max_calls: int,
        max_loop_lag_ms: float | None,
        max_cpu_percent: float | None,
    ) -> None:
        self.max_calls = max_calls
        self.max_loop_lag_ms = max_loop_lag_ms
        self.max_cpu_percent = max_cpu_percent

    def decide(self, *, live_calls: int, loop_lag_ms: float, cpu_percent: float) -> Refusal | None:
        if live_calls >= self.max_calls:
            return Refusal(
                "max_calls", f"this worker is at its limit of {self.max_calls} calls; try again"
            )
        # The running calls' audio is what lag and CPU protect: past these, one more call would
        # make every caller hear gaps.
        if self.max_loop_lag_ms is not None and loop_lag_ms > self.max_loop_lag_ms:
            return Refusal(
                "loop_lag",
                f"this worker is overloaded (event loop {loop_lag_ms:.0f} ms late); try again",
            )
        if self.max_cpu_percent is not None and cpu_percent > self.max_cpu_percent:
            return Refusal("cpu", f"this worker is overloaded ({cpu_percent:.0f}% CPU); try again")
        return None


class CpuSampler:
    """This process's CPU use over the last sampling interval, in percent of one core."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        cpu_time: Callable[[], float] = lambda: sum(os.times()[:2]),
        interval_s: float = 1.0,
    ) -> None:
        self._clock = clock
        self._cpu_time = cpu_time
        self.interval_s = interval_s
        self._at = clock()
        self._cpu = cpu_time()
        self.percent = 0.0

    def sample(self) -> float:
        """Cheap to call often: recomputes at most once per interval."""
        now = self._clock()
        elapsed = now - self._at
        if elapsed >= self.interval_s:
            cpu = self._cpu_time()
            self.percent = (cpu - self._cpu) / elapsed * 100
            self._at, self._cpu = now, cpu
        return self.percent


class RefusalReport:
    """What to log about refused calls: the first at once, then at most one line per interval
    with how many were refused since. Under overload calls are refused tens of times a second;
    a line each would flood the log (and a log line costs the worker as much as a fifth of
    the refusal itself). The metrics count every refusal."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._reported_at: float | None = None
        self._unreported = 0

    def refused(self, message: str, now: float) -> str | None:
        """A call was refused with `message` at `now` (seconds): the line to log, or None."""
        self._unreported += 1
        last = self._reported_at
        if last is not None and now - last < self.interval_s:
            return None
        count, self._unreported = self._unreported, 0
        self._reported_at = now
        if count == 1 or last is None:
            return message
        return f"{message} ({count} calls refused in the last {now - last:.0f} s)"

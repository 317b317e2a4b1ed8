"""Event-loop lag: how late a wake-up scheduled every half second actually runs.

Every call's audio shares the one event loop, so its lag is the first sign of overload: a loop
20 ms late is a frame of audio late for every caller. `LagMeter` is the arithmetic (testable
with any clock); `LoopLagMonitor` is the task that runs it on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

log = logging.getLogger("voice_agent.loop_lag")

INTERVAL_S = 0.5
WINDOW = 4  # samples kept for `recent_max_s`: 2 s at the default interval


class LagMeter:
    """Lag of each wake-up against when it was due, on whatever clock the caller reads."""

    def __init__(self, interval_s: float = INTERVAL_S, *, window: int = WINDOW) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self._due: float | None = None
        self._recent: deque[float] = deque(maxlen=max(1, window))
        self.last_s = 0.0

    def arm(self, now: float) -> float:
        """Schedule the next wake-up from `now`; returns how long to wait for it."""
        self._due = now + self.interval_s
        return self.interval_s

    def wake(self, now: float) -> float:
        """The wake-up ran at `now`: its lag in seconds (never negative: timers may fire a
        little early on a coarse clock)."""
        if self._due is None:
            raise RuntimeError("wake() before arm()")
        lag = max(0.0, now - self._due)
        self._due = None
        self.last_s = lag
        self._recent.append(lag)
        return lag

    @property
    def recent_max_s(self) -> float:
        """The worst lag of the last few samples: steadier than the last one for decisions such
        as admission, where one lucky sample should not let a call in on a busy loop."""
        return max(self._recent, default=0.0)


class LoopLagMonitor:
    """Runs a `LagMeter` on the running loop and hands each lag (seconds) to `report`."""

    def __init__(
        self,
        report: Callable[[float], None],
        *,
        interval_s: float = INTERVAL_S,
        window: int = WINDOW,
    ) -> None:
        self.meter = LagMeter(interval_s, window=window)
        self._report = report
        self._task: asyncio.Task[None] | None = None

    @property
    def last_s(self) -> float:
        return self.meter.last_s

    @property
    def recent_max_s(self) -> float:
        return self.meter.recent_max_s

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start on the running loop; starting twice is a no-op."""
        if self.running:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        # The loop's own clock: the one its timers are scheduled on.
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.meter.arm(loop.time()))
            lag = self.meter.wake(loop.time())
            try:
                self._report(lag)
            except Exception:
                # A broken consumer must not stop the measurement the admission control needs.
                log.exception("loop lag: the report callback failed")

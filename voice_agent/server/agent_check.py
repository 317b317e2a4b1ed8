"""HAProxy's agent check: one line on a TCP port telling the balancer this host's weight.

HAProxy (`agent-check agent-port P` on a server line) connects to `server.agent_check_listen`
every `agent-inter` and reads one line (its configuration manual, "agent-check"). The answer:

- `drain` while the server drains: HAProxy sends it no new connection, live ones go on;
- otherwise `up ready W%`: `ready` undoes a `drain` an earlier run of the server reported
  (only the agent can), `up` undoes nothing HAProxy's own health check sees, and W scales the
  server's configured weight.

The weight is the headroom admission control (server/admission.py) has left, its tightest
limit deciding:

    W = 100 x min(1 - live_calls / max_calls,
                  1 - loop_lag_ms / max_loop_lag_ms,     (when max_loop_lag_ms is set)
                  1 - cpu_percent / max_cpu_percent)     (when max_cpu_percent is set)

rounded down and kept within 0-100, and at least 1 while any call would be taken: HAProxy
reads 0% as drain. At 0 the worker would refuse the call anyway. The loop lag is the median
admission reads, so one stall does not take a host out of rotation.

With `--workers N` the workers share the main port and the kernel hands a new call to any of
them, so the agent port answers for the host: worker 0 listens, and its answer is the mean of
every worker's weight (each worker writes its own to a file beside its metrics every second,
`load-<n>.json`; one older than `STALE_AFTER_S` is a dead worker's and left out). The host
drains as a whole (the supervisor passes SIGTERM to every worker), so any worker draining
makes the answer `drain`; worker 0 stays up, answering it, until the other workers' calls
have ended too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("voice_agent.server")

WRITE_INTERVAL_S = 1.0
STALE_AFTER_S = 5.0
_FILE = re.compile(r"load-(\d+)\.json")


@dataclass(frozen=True)
class Load:
    """One worker's numbers, as admission control sees them."""

    live_calls: int
    max_calls: int
    loop_lag_ms: float
    max_loop_lag_ms: float | None
    cpu_percent: float
    max_cpu_percent: float | None
    draining: bool = False


def weight_percent(load: Load) -> int:
    """The worker's weight in percent (0-100), from the formula in the module's docstring."""
    headroom = [1 - load.live_calls / load.max_calls]
    if load.max_loop_lag_ms is not None:
        headroom.append(1 - load.loop_lag_ms / load.max_loop_lag_ms)
    if load.max_cpu_percent is not None:
        headroom.append(1 - load.cpu_percent / load.max_cpu_percent)
    tightest = min(headroom)
    if math.isnan(tightest) or tightest <= 0:
        return 0
    # The epsilon keeps 1 - 0.8 (0.19999...) at 20%: float error must not cost a point.
    return max(1, min(100, math.floor(tightest * 100 + 1e-9)))


@dataclass(frozen=True)
class WorkerReport:
    """What a worker writes for worker 0: its weight and whether it drains."""

    worker: int
    weight: int
    draining: bool
    live_calls: int


def answer(reports: Iterable[WorkerReport]) -> str:
    """The agent check's line for a host of these workers (at least the answering one)."""
    reports = list(reports)
    if not reports or any(report.draining for report in reports):
        return "drain\n"
    # Mean, rounded down: a worker at 0 refuses its share of the calls the kernel hands it.
    weight = sum(report.weight for report in reports) // len(reports)
    if weight == 0 and any(report.weight > 0 for report in reports):
        weight = 1
    return f"up ready {weight}%\n"


# ---- the files workers share ---------------------------------------------------------------


def write_report(directory: Path, report: WorkerReport) -> None:
    """Atomically: worker 0 never reads half a file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"load-{report.worker}.json"
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(asdict(report)), encoding="utf-8")
    partial.replace(path)


def read_reports(directory: Path, *, skip: int, now: float) -> list[WorkerReport]:
    """The other workers' fresh reports (not `skip`'s, not a dead worker's, not a bad file)."""
    try:
        paths = list(directory.iterdir())
    except FileNotFoundError:
        return []
    reports = []
    for path in paths:
        match = _FILE.fullmatch(path.name)
        if match is None or int(match[1]) == skip:
            continue
        try:
            if now - path.stat().st_mtime > STALE_AFTER_S:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
            reports.append(
                WorkerReport(
                    int(data["worker"]),
                    int(data["weight"]),
                    bool(data["draining"]),
                    int(data["live_calls"]),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # removed as its worker stopped, or written by another version
    return reports


# ---- the I/O -------------------------------------------------------------------------------


class AgentCheck:
    """The responder on `server.agent_check_listen` (worker 0's, with --workers), and each
    worker's report file for it."""

    def __init__(
        self,
        report: Callable[[], WorkerReport],
        *,
        listen: tuple[str, int] | None,
        shared_dir: Path | None,
    ) -> None:
        self._report = report
        self._listen = listen
        self._dir = shared_dir
        self._server: asyncio.Server | None = None
        self._writer: asyncio.Task[None] | None = None
        self.port = 0

    @property
    def answers_for_others(self) -> bool:
        """Whether this worker listens for a host of several workers (worker 0's, with
        --workers)."""
        return self._listen is not None and self._dir is not None

    def others_busy(self) -> bool:
        """Whether another worker's fresh report has live calls."""
        if self._dir is None:
            return False
        own = self._report().worker
        return any(r.live_calls > 0 for r in read_reports(self._dir, skip=own, now=time.time()))

    def line(self) -> str:
        own = self._report()
        others = (
            read_reports(self._dir, skip=own.worker, now=time.time())
            if self._dir is not None
            else []
        )
        return answer([own, *others])

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # HAProxy may send its `agent-send` string first; nothing here depends on it.
        try:
            writer.write(self.line().encode("ascii"))
            await writer.drain()
        except OSError:
            pass  # the checker gave up first: it will ask again
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def start(self) -> None:
        if self._dir is not None:
            self._writer = asyncio.ensure_future(self._keep_writing(self._dir))
        if self._listen is not None:
            host, port = self._listen
            self._server = await asyncio.start_server(self._answer, host, port)
            self.port = self._server.sockets[0].getsockname()[1]
            log.info("agent check for HAProxy on tcp %s:%d", host, self.port)

    async def _keep_writing(self, directory: Path) -> None:
        while True:
            try:
                await asyncio.to_thread(write_report, directory, self._report())
            except OSError as exc:
                log.warning("agent check: cannot write to %s: %s", directory, exc)
                await asyncio.sleep(60)
            await asyncio.sleep(WRITE_INTERVAL_S)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
            self._writer = None
            assert self._dir is not None
            with contextlib.suppress(OSError):
                (self._dir / f"load-{self._report().worker}.json").unlink()

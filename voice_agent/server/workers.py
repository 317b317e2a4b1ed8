"""`voice-agent serve --workers N`: N server processes on one port, kept running.

The kernel spreads new connections over the workers (SO_REUSEPORT); each owns its calls. A
worker that dies once serving (a crash, the OOM killer, a stray `kill`) is started again, so
the port keeps its capacity; its live calls are lost with it, and the call store marks them
interrupted. A worker whose first start ends before it serves (a bad config, a port taken by
another program) stops them all, as restarting could not help; nor could it for a worker that
dies within `QUICK_EXIT_S` of each start `MAX_QUICK_EXITS` times in a row. A worker says it
serves by writing to the pipe named in `READY_FD_ENV` (`mark_ready`). SIGTERM and SIGINT go to
every worker, which drain their calls and exit (a second signal ends the calls left at once);
a worker asked to drain on the control API signals the supervisor, so the host drains whole.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger("voice_agent.workers")

QUICK_EXIT_S = 10.0
MAX_QUICK_EXITS = 3
RESTART_DELAY_S = 1.0  # a worker dying in a loop must not spin the machine
POLL_S = 0.2  # how soon a dead worker is noticed; nothing here is latency-critical
READY_FD_ENV = "VOICE_AGENT_READY_FD"
# The supervisor's pid, for a worker asked to drain (POST /admin/drain) to drain the host.
SUPERVISOR_PID_ENV = "VOICE_AGENT_SUPERVISOR_PID"


def mark_ready() -> None:
    """In a worker: tell the supervisor this worker serves (nothing when not supervised)."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is None:
        return
    try:
        os.write(int(fd), b"1")
        os.close(int(fd))
    except (OSError, ValueError):
        pass  # the supervisor is gone: it will not restart anything either


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes]
    ready_fd: int  # the supervisor's end of the worker's ready pipe
    started_at: float
    starts: int = 1
    ready: bool = False
    quick_exits: int = 0
    code: int | None = None  # set once it has exited for good

    def check_ready(self) -> bool:
        if not self.ready:
            try:
                self.ready = bool(os.read(self.ready_fd, 1))
            except BlockingIOError:
                pass
        return self.ready

    def close(self) -> None:
        os.close(self.ready_fd)


def supervise(command: Sequence[str], count: int, env: Mapping[str, str]) -> int:
    """Run `command` + `--worker-id i` for i < count until signalled; the exit code is the
    worst of the workers' (0 after a clean stop)."""

    def start(index: int) -> tuple[subprocess.Popen[bytes], int]:
        ours, theirs = os.pipe()
        os.set_blocking(ours, False)
        try:
            process = subprocess.Popen(
                [*command, "--worker-id", str(index)],
                env={**env, READY_FD_ENV: str(theirs), SUPERVISOR_PID_ENV: str(os.getpid())},
                pass_fds=(theirs,),
            )
        except BaseException:
            os.close(ours)
            raise
        finally:
            os.close(theirs)
        return process, ours

    workers = [_Worker(i, *start(i), time.monotonic()) for i in range(count)]
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    failed: int | None = None
    while any(worker.code is None for worker in workers):
        time.sleep(POLL_S)
        for worker in workers:
            if worker.code is not None:
                continue
            code = worker.process.poll()
            if code is None:
                worker.check_ready()
                continue
            served = worker.check_ready()
            worker.close()
            if stopping or failed is not None:
                worker.code = code
                continue
            lived = time.monotonic() - worker.started_at
            worker.quick_exits = worker.quick_exits + 1 if lived < QUICK_EXIT_S else 0
            if (worker.starts == 1 and not served) or worker.quick_exits >= MAX_QUICK_EXITS:
                log.error(
                    "worker %d exited with code %s %.1f s after starting%s; stopping all workers",
                    worker.index,
                    code,
                    lived,
                    "" if served else ", before serving",
                )
                worker.code = failed = code if code != 0 else 1
                for other in workers:
                    if other.process.poll() is None:
                        other.process.terminate()
                continue
            log.error(
                "worker %d (pid %d) exited with code %s after %.0f s; starting it again",
                worker.index,
                worker.process.pid,
                code,
                lived,
            )
            time.sleep(RESTART_DELAY_S)
            if stopping:  # a stop came in while waiting to restart
                worker.code = code
                continue
            worker.process, worker.ready_fd = start(worker.index)
            worker.started_at = time.monotonic()
            worker.starts += 1
            worker.ready = False
    if failed is not None:
        return failed
    return max((worker.code or 0 for worker in workers), key=abs)

"""Resource sampling from /proc: CPU seconds, RSS, open files and run-queue wait of a process
and its descendants (`ProcWatch`, `process_tree`), and the whole machine's busy CPU
(`MachineWatch`). A level samples these every --sample-interval for the server, the stand-in
and this script itself; the load generator shares the machine, so its own load is measured
too."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, RSS bytes) of one process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return int(fields[1]), cpu, int(fields[21]) * PAGE_SIZE


def _run_queue_wait(pid: int) -> float:
    """Seconds the process's threads have waited for a CPU while runnable (schedstat): on a
    shared machine, what tells a starved server from a blocked one."""
    total = 0.0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[1])
    return total / 1e9


def process_tree(root: int) -> list[int]:
    """`root` and its descendants: the server's STT workers count as the server."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        if Path(f"/proc/{pid}").exists():
            tree.append(pid)
            todo.extend(children.get(pid, []))
    return tree


class ProcWatch:
    """CPU share between two samples, RSS and open files of a process and its descendants."""

    def __init__(self, pid: int, *, tree: bool = True) -> None:
        self.pid = pid
        self.tree = tree
        self._last: tuple[float, float, float] | None = None

    def sample(self) -> dict[str, float | int | None] | None:
        pids = process_tree(self.pid) if self.tree else [self.pid]
        cpu, rss, fds, waited = 0.0, 0, 0, 0.0
        for pid in pids:
            stat = _stat(pid)
            if stat is None:
                continue
            cpu += stat[1]
            rss += stat[2]
            waited += _run_queue_wait(pid)
            with contextlib.suppress(OSError):
                fds += len(os.listdir(f"/proc/{pid}/fd"))
        if not pids:
            return None
        now = time.monotonic()
        share = wait_share = None
        if self._last is not None and now > self._last[0]:
            elapsed = now - self._last[0]
            # A worker that exited takes its CPU time with it: never report a negative share.
            share = max(0.0, (cpu - self._last[1]) / elapsed * 100)
            wait_share = max(0.0, (waited - self._last[2]) / elapsed * 100)
        self._last = (now, cpu, waited)
        return {
            "cpu_pct": share,
            "cpu_wait_pct": wait_share,
            "rss_mb": rss / 2**20,
            "fds": fds,
            "processes": len(pids),
        }


class MachineWatch:
    """The whole machine's busy CPU, in the same unit (100% = one core)."""

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None

    def sample(self) -> float | None:
        try:
            values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except OSError:
            return None
        idle = values[3] + values[4]  # idle + iowait
        total = sum(values[:8])  # guest time is already in user
        share = None
        if self._last is not None and total > self._last[1]:
            busy = (total - self._last[1]) - (idle - self._last[0])
            share = busy / (total - self._last[1]) * 100 * (os.cpu_count() or 1)
        self._last = (idle, total)
        return share

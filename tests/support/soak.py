"""What a leak soak measures, shared by tests/test_soak.py and scripts/soak.py."""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from voice_agent.callers import NativeClient


@dataclass(frozen=True)
class Footprint:
    tasks: int
    threads: int
    fds: int
    rss_mb: float


def footprint(pid: int | None = None) -> Footprint:
    """This process's (or `pid`'s) asyncio tasks (own process only), threads, fds and RSS."""
    proc = Path(f"/proc/{pid or os.getpid()}")
    rss_kb = next(
        int(line.split()[1])
        for line in (proc / "status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    threads = len(list((proc / "task").iterdir())) if pid else threading.active_count()
    tasks = len(asyncio.all_tasks()) if pid is None else -1
    return Footprint(tasks, threads, len(list((proc / "fd").iterdir())), round(rss_kb / 1024, 1))


async def short_call(url: str) -> None:
    """A caller who hears the start of the greeting and hangs up."""
    caller = NativeClient(url, timeout=30)
    await caller.connect()
    await caller.wait_audio(200)
    await caller.stop()

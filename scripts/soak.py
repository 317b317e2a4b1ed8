#!/usr/bin/env python3
"""Leak soak: many short calls through a `voice-agent serve` process, then its footprint.

    .venv/bin/python scripts/soak.py                      # 1,000 sequential + 100 concurrent
    .venv/bin/python scripts/soak.py --sequential 200 --concurrent 50

After a warm-up, the server's asyncio tasks (from /healthz), threads, file descriptors and RSS
(from /proc) are read; then the calls run; then, once every call has ended, they are read again.
Tasks, threads and descriptors must be back exactly; RSS within 10%. Exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.soak import Footprint, footprint, short_call  # noqa: E402


async def health(http_url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        result: dict[str, Any] = (await http.get(f"{http_url}/healthz")).json()
        return result


async def idle(http_url: str, pid: int) -> tuple[Footprint, int]:
    """The server's footprint once no call is live (polled: the last hang-ups settle)."""
    deadline = time.monotonic() + 30
    while True:
        state = await health(http_url)
        if state["live_calls"] == 0 or time.monotonic() > deadline:
            await asyncio.sleep(1)  # let the handlers' tasks finish after their calls
            state = await health(http_url)
            return footprint(pid), int(state["asyncio_tasks"])
        await asyncio.sleep(0.2)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sequential", type=int, default=1000)
    parser.add_argument("--concurrent", type=int, default=100)
    parser.add_argument("--port", type=int, default=8793)
    args = parser.parse_args()

    server = subprocess.Popen(  # noqa: ASYNC220 - once, before anything is measured
        [str(ROOT / ".venv" / "bin" / "voice-agent"), "serve", "--port", str(args.port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert server.stdout is not None
    for line in server.stdout:
        if "serving agent" in line:
            break
    url, http_url = f"ws://127.0.0.1:{args.port}/ws", f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(5):
            await short_call(url)
        before, tasks_before = await idle(http_url, server.pid)
        started = time.monotonic()
        for n in range(args.sequential):
            await short_call(url)
            if n % 100 == 99:
                print(f"  {n + 1} sequential calls", flush=True)
        await asyncio.gather(*(short_call(url) for _ in range(args.concurrent)))
        elapsed = time.monotonic() - started
        after, tasks_after = await idle(http_url, server.pid)
    finally:
        server.terminate()
        server.wait(20)
    print(f"{args.sequential} sequential + {args.concurrent} concurrent calls in {elapsed:.0f} s")
    rows = [
        ("asyncio tasks", tasks_before, tasks_after, tasks_after == tasks_before),
        ("threads", before.threads, after.threads, after.threads == before.threads),
        ("file descriptors", before.fds, after.fds, after.fds == before.fds),
        ("RSS MB", before.rss_mb, after.rss_mb, after.rss_mb <= before.rss_mb * 1.10),
    ]
    for name, was, now, ok in rows:
        print(f"  {name:17} {was:>8} -> {now:<8} {'ok' if ok else 'LEAK'}")
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

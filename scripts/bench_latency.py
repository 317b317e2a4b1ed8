#!/usr/bin/env python3
"""Latency benchmark: plays the audio fixtures through a server over /twilio, prints percentiles.

    .venv/bin/python scripts/bench_latency.py                 # starts its own server
    .venv/bin/python scripts/bench_latency.py --url ws://127.0.0.1:8765   # a running one

Measures, from the server's own call records (GET /calls/{id}):
- caller speech end -> first agent audio sent, per turn;
- caller speech start -> `clear` sent, per barge-in;
and the server process's CPU per 20 ms frame per call on the media path without STT (callers
streaming silence after the greeting), read from /proc when the script started the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from voice_agent.callers import TwilioClient  # noqa: E402

AUDIO = ROOT / "tests" / "fixtures" / "audio"
MANIFEST = json.loads((AUDIO / "manifest.json").read_text())


def percentiles(values: list[float]) -> str:
    if not values:
        return "no samples"
    ordered = sorted(values)

    def pick(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    return (
        f"n={len(ordered)} p50={pick(50):.0f} p95={pick(95):.0f} p99={pick(99):.0f} "
        f"max={ordered[-1]:.0f} ms"
    )


async def fetch(http_url: str, call_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        for _ in range(100):
            call: dict[str, Any] = (await http.get(f"{http_url}/calls/{call_id}")).json()
            if call.get("ended_at"):
                return call
            await asyncio.sleep(0.1)
    return call


async def conversation(ws_url: str, http_url: str, n: int) -> dict[str, Any]:
    call_sid = f"CAbench{n}{int(time.time() * 1000)}"
    async with TwilioClient(f"{ws_url}/twilio", call_sid=call_sid, timeout=120) as caller:
        await caller.wait_silence_after_audio(400)
        for name in MANIFEST["conversations"]["joe"]["book"][:3]:
            heard = caller.received_ms
            await caller.send_audio((AUDIO / f"{name}.ulaw").read_bytes())
            await caller.wait_audio(heard + 1)
            await caller.wait_silence_after_audio(600)
        await caller.stop()
    return await fetch(http_url, call_sid)


async def barge_in(ws_url: str, http_url: str, n: int) -> dict[str, Any]:
    call_sid = f"CAbarge{n}{int(time.time() * 1000)}"
    async with TwilioClient(f"{ws_url}/twilio", call_sid=call_sid, timeout=120) as caller:
        await caller.wait_audio(1)
        await caller.send_silence(800 + 137 * n % 1500)
        await caller.send_audio((AUDIO / "joe_book1.ulaw").read_bytes())
        await caller.wait_clear()
        await caller.stop()
    return await fetch(http_url, call_sid)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def media_path_cpu(ws_url: str, pid: int, calls: int, seconds: float) -> float:
    """Microseconds of server CPU per 20 ms frame per call while callers send silence."""
    callers = [
        TwilioClient(f"{ws_url}/twilio", call_sid=f"CAcpu{i}{time.time()}", timeout=120)
        for i in range(calls)
    ]
    for caller in callers:
        await caller.connect()
    await asyncio.gather(*(c.wait_silence_after_audio(300) for c in callers))
    before, started = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    used, elapsed = cpu_seconds(pid) - before, time.monotonic() - started
    await asyncio.gather(*(c.stop() for c in callers))
    frames = calls * elapsed / 0.02
    return used / frames * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="ws://HOST:PORT of a running server (default: start one)")
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--barge-ins", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--cpu-calls", type=int, default=20)
    parser.add_argument("--cpu-seconds", type=float, default=10)
    args = parser.parse_args()

    server: subprocess.Popen[bytes] | None = None
    url = args.url
    if url is None:
        port = 8790
        server = subprocess.Popen(  # noqa: ASYNC220 - once, before anything is measured
            [str(ROOT / ".venv" / "bin" / "voice-agent"), "serve", "--port", str(port)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert server.stdout is not None
        for line in server.stdout:
            if b"serving agent" in line:
                break
        url = f"ws://127.0.0.1:{port}"
    http_url = url.replace("ws://", "http://")
    try:
        semaphore = asyncio.Semaphore(args.concurrency)

        async def limited(coro: Any) -> dict[str, Any]:
            async with semaphore:
                result: dict[str, Any] = await coro
                return result

        calls = await asyncio.gather(
            *(limited(conversation(url, http_url, n)) for n in range(args.conversations)),
            *(limited(barge_in(url, http_url, n)) for n in range(args.barge_ins)),
        )
        turn_latency = [
            t["speech_end_to_first_audio_ms"]
            for call in calls
            for t in call.get("turns", [])
            if t.get("speech_end_to_first_audio_ms") is not None
        ]
        clear_latency = [
            e["latency_ms"] for call in calls for e in call["audit"] if e["type"] == "barge_in"
        ]
        print(f"caller speech end -> first agent audio sent: {percentiles(turn_latency)}")
        print(f"caller speech start -> clear sent (barge-in): {percentiles(clear_latency)}")
        if server is not None:
            cpu = await media_path_cpu(url, server.pid, args.cpu_calls, args.cpu_seconds)
            print(
                f"server CPU per 20 ms frame per call, media path without STT "
                f"({args.cpu_calls} calls): {cpu:.1f} us"
            )
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    asyncio.run(main())

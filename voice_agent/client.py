"""A native-protocol client: plays a WAV file to a server as a caller would, records the agent.

`voice-agent call --wav in.wav [--out agent.wav]` uses it. It sends 20 ms frames in real time,
plays the agent's audio on a playback clock (acknowledging marks once their audio has played,
dropping queued audio on `clear`), and prints the transcript as events arrive.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from voice_agent.audio.frames import silence
from voice_agent.audio.resample import resample
from voice_agent.audio.wav import read_wav, write_wav

FRAME_MS = 20


@dataclass
class CallResult:
    call_id: str | None = None
    caller: list[str] = field(default_factory=list)  # final transcripts of what the caller said
    agent: list[str] = field(default_factory=list)  # agent speech, as sent
    events: list[dict[str, Any]] = field(default_factory=list)
    agent_audio: bytearray = field(default_factory=bytearray)  # what was played, in order
    end_reason: str | None = None


class _Player:
    """The caller's loudspeaker: audio plays in order at real-time speed."""

    def __init__(self, bytes_per_s: int) -> None:
        self.bytes_per_s = bytes_per_s
        self.busy_until = 0.0
        self.queued: list[tuple[float, bytes]] = []  # (start time, audio) not yet played

    def add(self, audio: bytes, now: float) -> None:
        start = max(self.busy_until, now)
        self.queued.append((start, audio))
        self.busy_until = start + len(audio) / self.bytes_per_s

    def played(self, now: float, sink: bytearray) -> None:
        while self.queued:
            start, audio = self.queued[0]
            end = start + len(audio) / self.bytes_per_s
            if end > now:
                break
            sink += audio
            self.queued.pop(0)

    def clear(self, now: float, sink: bytearray) -> None:
        self.played(now, sink)
        if self.queued:
            start, audio = self.queued[0]
            heard = int(max(0.0, now - start) * self.bytes_per_s) & ~1
            sink += audio[:heard]
        self.queued.clear()
        self.busy_until = now


async def call_wav(
    url: str,
    wav: Path,
    *,
    agent: str | None = None,
    args: dict[str, Any] | None = None,
    sample_rate: int = 16000,
    tail_s: float = 6.0,
    out: TextIO | None = None,
) -> CallResult:
    """Play `wav`, then wait until the agent has been quiet for `tail_s` (or the call ends)."""
    pcm, rate = read_wav(wav)
    if rate != sample_rate:
        pcm = resample(pcm, rate, sample_rate)
    frame_bytes = sample_rate * 2 * FRAME_MS // 1000
    result = CallResult()
    player = _Player(sample_rate * 2)
    last_agent_audio = time.monotonic()
    loop = asyncio.get_running_loop()

    async def echo_mark(ws: ClientConnection, name: str, at: float) -> None:
        await asyncio.sleep(max(0.0, at - loop.time()))
        try:
            await ws.send(json.dumps({"type": "mark", "name": name}))
        except ConnectionClosed:
            pass

    async def receive(ws: ClientConnection) -> None:
        nonlocal last_agent_audio
        marks: set[asyncio.Task[None]] = set()
        reply: object = None
        async for message in ws:
            now = loop.time()
            player.played(now, result.agent_audio)
            if isinstance(message, bytes):
                player.add(message, now)
                last_agent_audio = time.monotonic()
                continue
            event = json.loads(message)
            result.events.append(event)
            kind = event.get("type")
            if kind == "started":
                result.call_id = event.get("call_id")
            elif kind == "mark":
                task = asyncio.ensure_future(echo_mark(ws, event["name"], player.busy_until))
                marks.add(task)
                task.add_done_callback(marks.discard)
            elif kind == "clear":
                player.clear(now, result.agent_audio)
                for task in list(marks):
                    task.cancel()
            elif kind == "transcript" and event.get("final"):
                result.caller.append(event["text"])
                if out:
                    out.write(f"caller> {event['text']}\n")
            elif kind == "agent_text":
                if result.agent and event.get("reply_id") == reply:
                    result.agent[-1] += event["text"]
                else:
                    result.agent.append(event["text"])
                    reply = event.get("reply_id")
                if out:
                    out.write(f"agent> {event['text']}\n")
            elif kind == "end":
                result.end_reason = event.get("reason")

    async with connect(url, max_size=2**22) as ws:
        start = {
            "type": "start",
            "agent": agent,
            "args": args or {},
            "audio": {"encoding": "pcm16", "sample_rate": sample_rate},
        }
        await ws.send(json.dumps(start))
        receiver = asyncio.ensure_future(receive(ws))
        began = loop.time()
        sent = 0
        try:
            for offset in range(0, len(pcm), frame_bytes):
                await asyncio.sleep(max(0.0, began + sent * FRAME_MS / 1000 - loop.time()))
                await ws.send(pcm[offset : offset + frame_bytes].ljust(frame_bytes, b"\0"))
                sent += 1
            quiet = silence(FRAME_MS, sample_rate)
            while not receiver.done():
                await asyncio.sleep(max(0.0, began + sent * FRAME_MS / 1000 - loop.time()))
                idle = time.monotonic() - max(last_agent_audio, 0.0)
                if idle > tail_s and loop.time() >= player.busy_until:
                    break
                await ws.send(quiet)
                sent += 1
            await ws.send(json.dumps({"type": "stop"}))
        except ConnectionClosed:
            pass
        await asyncio.wait([receiver], timeout=5)
        receiver.cancel()
    player.played(float("inf"), result.agent_audio)
    return result


def save_agent_audio(result: CallResult, path: Path, sample_rate: int) -> None:
    write_wav(path, bytes(result.agent_audio), sample_rate)


async def main_call(url: str, wav: Path, out_wav: Path | None, agent: str | None) -> int:
    result = await call_wav(url, wav, agent=agent, out=sys.stdout)
    if out_wav is not None:
        save_agent_audio(result, out_wav, 16000)
    print(f"[call {result.call_id} ended: {result.end_reason or 'caller hung up'}]")
    return 0

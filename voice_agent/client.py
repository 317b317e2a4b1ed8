"""`voice-agent call`: play a WAV file to a running server as a caller, record what it heard."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from voice_agent.audio.resample import resample
from voice_agent.audio.wav import read_wav, write_wav
from voice_agent.callers import NativeClient
from voice_agent.transports.native import AudioFormat

SAMPLE_RATE = 16000


async def call_wav(
    url: str,
    wav: Path,
    *,
    agent: str | None = None,
    out_wav: Path | None = None,
    tail_ms: float = 4000,
    out: TextIO | None = None,
) -> NativeClient:
    """Stream `wav` in real time, then wait until the agent has been quiet for `tail_ms`."""
    pcm, rate = read_wav(wav)
    if rate != SAMPLE_RATE:
        pcm = resample(pcm, rate, SAMPLE_RATE)
    caller = NativeClient(url, agent=agent, audio=AudioFormat("pcm16", SAMPLE_RATE), timeout=600)
    async with caller:
        await caller.send_audio(pcm)
        # The agent answers the last words during this silence; then wait for it to finish.
        await caller.send_silence(int(tail_ms))
        await caller.wait_silence_after_audio(tail_ms)
        await caller.stop()
    if out is not None:
        out.write(transcript(caller) + f"[call {caller.call_id} ended]\n")
    if out_wav is not None:
        write_wav(out_wav, caller.audio_played(), SAMPLE_RATE)
    return caller


def transcript(caller: NativeClient) -> str:
    """The call as lines: the caller's final transcripts and each agent reply, in order."""
    lines: list[str] = []
    reply = None
    for event in caller.events:
        if event.get("type") == "transcript" and event.get("final"):
            lines.append(f"caller> {event['text']}")
            reply = None
        elif event.get("type") == "agent_text":
            if reply is not None and event.get("reply_id") == reply:
                lines[-1] += event["text"]
            else:
                lines.append(f"agent> {event['text']}")
                reply = event.get("reply_id")
    return "".join(line + "\n" for line in lines)


async def main_call(url: str, wav: Path, out_wav: Path | None, agent: str | None) -> int:
    await call_wav(url, wav, agent=agent, out_wav=out_wav, out=sys.stdout)
    return 0

"""Watching a call a real peer makes, from the test's side: the pipeline it starts, its audit
events as they happen, and what a peer recorded of the agent cut into its spoken parts and
transcribed."""

from __future__ import annotations

import asyncio
import wave
from pathlib import Path

import numpy as np

from tests.support.speech_eval import transcribe
from voice_agent.audio.resample import resample
from voice_agent.engines.stt import SttConfig, make_stt
from voice_agent.engines.stt.scoring import spoken_words
from voice_agent.pipeline.driver import CallPipeline
from voice_agent.runtime.audit import AuditEvent
from voice_agent.server.app import VoiceServer


async def new_pipeline(server: VoiceServer, known: set[str]) -> CallPipeline:
    async with asyncio.timeout(15):
        while not set(server.pipelines) - known:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # a condition wait: until baresip's call has started
    (call_id,) = set(server.pipelines) - known
    return server.pipelines[call_id]


class CallAudit:
    """A live call's audit events as they happen, to wait on."""

    def __init__(self, pipeline: CallPipeline) -> None:
        self.queue: asyncio.Queue[AuditEvent] = asyncio.Queue()
        pipeline.session.audit.subscribe(self.queue.put_nowait)

    async def until(self, kind: str, timeout_s: float = 30.0) -> AuditEvent:
        async with asyncio.timeout(timeout_s):
            while (event := await self.queue.get()).type != kind:
                pass
        return event


def spoken_parts(pcm: bytes, rate: int = 8000) -> list[bytes]:
    """The stretches of a recording between pauses of 600 ms or more, as 16 kHz PCM."""
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float32)
    frame = rate // 50
    loud = [
        float(np.sqrt(np.mean(samples[i : i + frame] ** 2))) > 300
        for i in range(0, len(samples) - frame, frame)
    ]
    parts, start, quiet = [], None, 0
    for index, is_loud in enumerate([*loud, *([False] * 30)]):
        if is_loud:
            start = index if start is None else start
            quiet = 0
        elif start is not None:
            quiet += 1
            if quiet >= 30:
                end = index - quiet + 1
                parts.append(resample(pcm[start * frame * 2 : end * frame * 2], rate, 16000))
                start, quiet = None, 0
    return parts


def recorded(path: Path) -> bytes:
    """The frames of a WAV a peer recorded (8 kHz 16-bit mono)."""
    with wave.open(str(path)) as recording:
        return recording.readframes(recording.getnframes())


async def words_in(*recordings: bytes) -> list[str]:
    """What Whisper tiny.en hears in each 8 kHz recording, part by part, as spoken words."""
    stt = make_stt(SttConfig(provider="whisper", model="tiny.en", processes=1))
    try:
        heard = []
        for pcm in recordings:
            parts = [await transcribe(stt, part) for part in spoken_parts(pcm)]
            heard.append(" ".join(spoken_words(" ".join(parts))))
        return heard
    finally:
        await stt.aclose()

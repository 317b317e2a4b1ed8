"""Hold audio: what a caller hears while the agent works on a turn longer than `hold.after_s`
(a slow function, a tool call, a transfer under way) before its answer, so the line is never
dead air that makes them hang up or talk over the answer.

The audio goes to the transport as the agent's does but is not the agent's: the call core
never sees it, so nothing of it is committed or counted as heard, and the moment the answer's
first audio is ready (or the turn ends, or the caller hangs up) the transport's clear drops
what is still queued. It is sent a little ahead of playout (LEAD_MS), not all at once, so the
clear has little to drop and a transport's buffer never fills with it.
"""

from __future__ import annotations

import functools

from voice_agent.audio.codec import CarrierFormat
from voice_agent.audio.resample import resample
from voice_agent.audio.wav import read_wav

CHUNK_MS = 100  # sent every CHUNK_MS
LEAD_MS = 300  # this much ahead of playout at the start


@functools.lru_cache(maxsize=16)
def _pcm(path: str) -> tuple[bytes, int]:
    return read_wav(path)


class HoldLoop:
    """The hold audio in the call's format, looped: `next_chunk` gives the next `ms` of it."""

    def __init__(self, path: str, carrier: CarrierFormat) -> None:
        pcm, rate = _pcm(path)
        if rate != carrier.sample_rate:
            pcm = resample(pcm, rate, carrier.sample_rate)
        self.audio = carrier.encode(pcm) or carrier.encode(bytes(2))
        self.carrier = carrier
        self._at = 0

    def next_chunk(self, ms: int) -> bytes:
        size = int(self.carrier.bytes_per_ms * ms)
        size -= size % self.carrier.sample_bytes
        out = bytearray()
        while len(out) < size:
            take = min(size - len(out), len(self.audio) - self._at)
            out += self.audio[self._at : self._at + take]
            self._at = (self._at + take) % len(self.audio)
        return bytes(out)

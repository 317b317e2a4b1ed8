"""A carrier's audio format (encoding and rate) and the conversions to and from PCM16."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from voice_agent.audio.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

Encoding = Literal["pcm16", "mulaw", "alaw"]


def _same(data: bytes) -> bytes:
    return data


_DECODERS: dict[str, Callable[[bytes], bytes]] = {
    "pcm16": _same,
    "mulaw": ulaw_decode,
    "alaw": alaw_decode,
}
_ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "pcm16": _same,
    "mulaw": ulaw_encode,
    "alaw": alaw_encode,
}


@dataclass(frozen=True)
class CarrierFormat:
    encoding: Encoding
    sample_rate: int

    @property
    def sample_bytes(self) -> int:
        return 2 if self.encoding == "pcm16" else 1

    @property
    def bytes_per_ms(self) -> float:
        return self.sample_rate * self.sample_bytes / 1000

    def decode(self, data: bytes) -> bytes:
        """Carrier bytes -> PCM16 at the carrier's rate."""
        return _DECODERS[self.encoding](data)

    @property
    def decoder(self) -> Callable[[bytes], bytes]:
        """`decode` as a plain function, for a caller that decodes every frame of a call."""
        return _DECODERS[self.encoding]

    def encode(self, pcm: bytes) -> bytes:
        """PCM16 at the carrier's rate -> carrier bytes."""
        return _ENCODERS[self.encoding](pcm)

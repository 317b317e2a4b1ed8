"""The sizes the audio of one Exotel media message may have (multiples of 320 bytes and of a 20 ms
frame, 3.2 KB to 100 KB, at its sample rate), and audio of any length cut to them."""

from __future__ import annotations

import math
from dataclasses import dataclass

SAMPLE_RATES = (8000, 16000, 24000)
DEFAULT_SAMPLE_RATE = 8000
# Exotel's rules for the audio of one outbound media message.
CHUNK_MULTIPLE_BYTES = 320
MIN_CHUNK_BYTES = 3200
MAX_CHUNK_BYTES = 100_000
FRAME_MS = 20


@dataclass(frozen=True, slots=True)
class ChunkLimits:
    """Sizes (bytes) the audio of one outbound media message may have at a sample rate."""

    multiple: int
    min_bytes: int
    max_bytes: int

    def valid(self, size: int) -> bool:
        return size % self.multiple == 0 and self.min_bytes <= size <= self.max_bytes

    def round_up(self, size: int) -> int:
        return max(self.min_bytes, -(-size // self.multiple) * self.multiple)


def chunk_limits(sample_rate: int = DEFAULT_SAMPLE_RATE) -> ChunkLimits:
    """Multiples of 320 bytes and of a 20 ms frame, from 3200 bytes to 100 000."""
    if sample_rate not in SAMPLE_RATES:
        raise ValueError(f"sample rate {sample_rate} is not one of {SAMPLE_RATES}")
    multiple = math.lcm(CHUNK_MULTIPLE_BYTES, sample_rate * 2 * FRAME_MS // 1000)
    return ChunkLimits(
        multiple,
        -(-MIN_CHUNK_BYTES // multiple) * multiple,
        MAX_CHUNK_BYTES // multiple * multiple,
    )


def media_chunks(
    pcm: bytes, *, sample_rate: int = DEFAULT_SAMPLE_RATE, chunk_bytes: int | None = None
) -> list[bytes]:
    """`pcm` of any length as chunks Exotel takes: `chunk_bytes` each (by default the smallest
    allowed), the last one grown to a valid size with silence. A short remainder joins the
    chunk before it (or takes audio from it, when the two do not fit one message), so that
    less than 320 bytes of silence (one 20 ms frame at 16 and 24 kHz) is ever added to audio
    longer than one chunk."""
    limits = chunk_limits(sample_rate)
    chunk = chunk_bytes or limits.min_bytes
    if not limits.valid(chunk):
        raise ValueError(
            f"chunk_bytes {chunk} is not a multiple of {limits.multiple} from "
            f"{limits.min_bytes} to {limits.max_bytes} (at {sample_rate} Hz)"
        )
    multiple = limits.multiple
    pieces = [pcm[i : i + chunk] for i in range(0, len(pcm), chunk)]
    if pieces and len(pieces[-1]) < chunk:
        last = pieces.pop()
        aligned = -(-len(last) // multiple) * multiple
        if pieces and chunk + aligned <= limits.max_bytes:
            last = pieces.pop() + last
        elif pieces and aligned < limits.min_bytes:
            # Too big to join (chunk_bytes near the maximum): take whole multiples from the
            # chunk before it instead, which stays far above the minimum.
            move = -(-(limits.min_bytes - aligned) // multiple) * multiple
            before = pieces.pop()
            pieces.append(before[:-move])
            last = before[-move:] + last
        size = limits.round_up(len(last))
        pieces.append(last + bytes(size - len(last)))
    return pieces

"""Cutting PCM16 byte streams into fixed-size frames, plus frame-size, level and silence helpers."""

from __future__ import annotations

import math

import numpy as np

from voice_agent.audio._audioop import audioop

__all__ = ["Framer", "frame_bytes", "frame_rms", "rms_dbfs", "silence"]


def frame_bytes(sample_rate: int, frame_ms: int) -> int:
    """Bytes in one PCM16 mono frame of `frame_ms` at `sample_rate` (640 for 16 kHz, 20 ms)."""
    samples, remainder = divmod(sample_rate * frame_ms, 1000)
    if sample_rate <= 0 or frame_ms <= 0 or remainder:
        raise ValueError(
            f"{frame_ms} ms at {sample_rate} Hz is not a whole, positive number of samples"
        )
    return 2 * samples


def silence(ms: int, sample_rate: int) -> bytes:
    """Digital silence (zero samples) lasting `ms` at `sample_rate`."""
    return bytes(frame_bytes(sample_rate, ms))


def frame_rms(pcm: bytes) -> int:
    """RMS amplitude of native-endian PCM16 samples (0 to 32767): a fraction of a microsecond for
    a 20 ms frame, cheap enough for every frame of every call."""
    return int(audioop.rms(pcm, 2))


def rms_dbfs(pcm: bytes) -> float:
    """RMS level of PCM16 samples in dB relative to full scale (a full-scale square wave is 0 dBFS,
    a full-scale sine about -3 dBFS); -inf for empty or all-zero input."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    if samples.size == 0:
        return -math.inf
    mean_square = float(np.dot(samples, samples)) / samples.size
    if mean_square == 0.0:
        return -math.inf
    return 10.0 * math.log10(mean_square / (32768.0 * 32768.0))


class Framer:
    """Re-chunks arbitrary byte chunks into frames of exactly `frame_bytes` bytes."""

    def __init__(self, frame_bytes: int) -> None:
        if frame_bytes <= 0:
            raise ValueError(f"frame_bytes must be positive, got {frame_bytes}")
        self.frame_bytes = frame_bytes
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes held back because they do not make a whole frame yet."""
        return len(self._buffer)

    def push(self, data: bytes) -> list[bytes]:
        """Add `data` and return every frame now complete, oldest first."""
        size = self.frame_bytes
        if not self._buffer:
            # Carriers usually deliver whole frames: skip the buffer entirely then.
            if len(data) == size:
                return [bytes(data)]
            whole = len(data) - len(data) % size
            frames = [bytes(data[i : i + size]) for i in range(0, whole, size)]
            self._buffer += data[whole:]
            return frames
        self._buffer += data
        whole = len(self._buffer) - len(self._buffer) % size
        if not whole:
            return []
        view = memoryview(self._buffer)
        frames = [bytes(view[i : i + size]) for i in range(0, whole, size)]
        view.release()
        # Deleting from the front of a bytearray only moves its start pointer: no quadratic copy.
        del self._buffer[:whole]
        return frames

    def flush(self, pad: bool = False) -> bytes:
        """Return and clear the pending partial frame; with `pad`, zero-filled to a whole frame.

        Returns b"" when nothing is pending.
        """
        rest = bytes(self._buffer)
        self._buffer.clear()
        if pad and rest:
            rest += bytes(self.frame_bytes - len(rest))
        return rest

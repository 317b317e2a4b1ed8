"""Reading and writing mono PCM16 WAV files with the standard library's `wave` module."""

from __future__ import annotations

import os
import wave

__all__ = ["read_wav", "write_wav"]


def read_wav(path: str | os.PathLike[str]) -> tuple[bytes, int]:
    """Return the samples of a mono 16-bit PCM WAV file as PCM16 little-endian bytes and its rate.

    Raises ValueError naming the file for anything else (stereo, 8/24/32-bit, float, compressed).
    """
    name = os.fspath(path)
    try:
        with wave.open(name, "rb") as wav:
            channels = wav.getnchannels()
            width = wav.getsampwidth()
            rate = wav.getframerate()
            if channels != 1 or width != 2:
                raise ValueError(
                    f"{name}: expected mono 16-bit PCM, got {channels} channel(s) "
                    f"of {8 * width}-bit samples"
                )
            return wav.readframes(wav.getnframes()), rate
    except (wave.Error, EOFError) as error:
        raise ValueError(f"{name}: not a PCM WAV file ({error})") from error


def write_wav(path: str | os.PathLike[str], pcm: bytes, sample_rate: int) -> None:
    """Write PCM16 little-endian mono samples as a WAV file."""
    if len(pcm) % 2:
        raise ValueError(f"PCM16 data must have an even number of bytes, got {len(pcm)}")
    with wave.open(os.fspath(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm)

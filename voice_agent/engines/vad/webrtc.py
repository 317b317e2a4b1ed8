"""Voice activity detection with the WebRTC GMM detector (py-webrtcvad) on 20 ms frames."""

from __future__ import annotations

# webrtcvad's C module itself: its Python `Vad` class only forwards to these functions, and
# this runs for every frame of every call.
import _webrtcvad

__all__ = ["WebRtcVad"]

_RATES = (8000, 16000, 32000, 48000)
# WebRTC's detector holds "speech" for a few frames after sustained speech ends (its overhang:
# 7 frames of 20 ms in modes 0-1, 5 in modes 2-3, vad_core.c). Measured on the joe fixtures at
# 8 kHz, the last "speech" frame ends 140-300 ms (modes 0-1) and 100-240 ms (modes 2-3) after
# the last frame above -45 dBFS; the overhang is the part that is always there.
_RELEASE_MS = {0: 140, 1: 140, 2: 100, 3: 100}


class WebRtcVad:
    """WebRTC VAD for one call. Cheap: ~1 KB of state, created in microseconds."""

    frame_ms = 20

    def __init__(self, aggressiveness: int = 2, sample_rate: int = 16000) -> None:
        if aggressiveness not in (0, 1, 2, 3):
            raise ValueError(f"webrtcvad aggressiveness must be 0-3, got {aggressiveness!r}")
        if sample_rate not in _RATES:
            raise ValueError(f"webrtcvad supports {_RATES} Hz, got {sample_rate}")
        self.sample_rate = sample_rate
        self.aggressiveness = aggressiveness
        self.release_ms = _RELEASE_MS[aggressiveness]
        self._samples = sample_rate * self.frame_ms // 1000
        self._bytes = 2 * self._samples
        self._vad = _new_detector(aggressiveness)

    def is_speech(self, frame: bytes) -> bool:
        if len(frame) != self._bytes:
            raise ValueError(
                f"webrtcvad at {self.sample_rate} Hz needs {self.frame_ms} ms frames of "
                f"{self._bytes} bytes, got {len(frame)} bytes"
            )
        return bool(_webrtcvad.process(self._vad, self.sample_rate, frame, self._samples))

    def reset(self) -> None:
        # The detector adapts its noise model as it goes; a new call must start from scratch.
        self._vad = _new_detector(self.aggressiveness)


def _new_detector(aggressiveness: int) -> object:
    detector = _webrtcvad.create()
    _webrtcvad.init(detector)
    _webrtcvad.set_mode(detector, aggressiveness)
    return detector

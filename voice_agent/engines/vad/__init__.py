"""Voice activity detectors: the Vad interface, VadConfig, make_vad, and the webrtcvad engine
(silero lives in voice_agent.engines.vad.silero and is imported only when configured)."""

from voice_agent.engines.vad.base import Vad, VadConfig, VadProvider, make_vad
from voice_agent.engines.vad.webrtc import WebRtcVad

__all__ = ["Vad", "VadConfig", "VadProvider", "WebRtcVad", "make_vad"]

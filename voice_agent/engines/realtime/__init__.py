"""A speech-to-speech model over the Realtime protocol (OpenAI's, and servers that speak it)."""

from voice_agent.engines.realtime.formats import AudioFormat, format_for
from voice_agent.engines.realtime.model_session import (
    AudioOut,
    FunctionCallOut,
    ModelOutput,
    RealtimeError,
    RealtimeSettings,
    RealtimeSocket,
    ResponseEnd,
    TranscriptOut,
)

__all__ = [
    "AudioFormat",
    "AudioOut",
    "FunctionCallOut",
    "ModelOutput",
    "RealtimeError",
    "RealtimeSettings",
    "RealtimeSocket",
    "ResponseEnd",
    "TranscriptOut",
    "format_for",
]

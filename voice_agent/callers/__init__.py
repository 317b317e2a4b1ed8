"""Callers for tests, benchmarks and `voice-agent call`: TwilioClient plays Twilio's side of a
Media Stream, NativeClient the native `/ws` protocol; both play the server's audio on a clock.
base.py holds what they share."""

from voice_agent.callers.base import (
    Clear,
    Clock,
    EchoedMark,
    ManualClock,
    RealClock,
    ReceivedAudio,
    client_frame,
)
from voice_agent.callers.native import NativeClient
from voice_agent.callers.twilio import TwilioClient

__all__ = [
    "Clear",
    "Clock",
    "EchoedMark",
    "ManualClock",
    "NativeClient",
    "RealClock",
    "ReceivedAudio",
    "TwilioClient",
    "client_frame",
]

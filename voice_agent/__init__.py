"""voice_agent: a real-time voice agent server with an offline-first agent runtime."""

__version__ = "0.1.0"

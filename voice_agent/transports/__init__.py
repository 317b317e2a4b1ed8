"""Wire protocols of the voice gateway, sans-I/O: Twilio Media Streams (`twilio`) and the native
`/ws` protocol (`native`). Adapters feed them received messages and send what they build."""

from voice_agent.transports.errors import ProtocolError, ProtocolWarning

__all__ = ["ProtocolError", "ProtocolWarning"]

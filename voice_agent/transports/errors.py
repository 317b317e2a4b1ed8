"""Protocol errors and warnings of the wire codecs: fatal errors carry a WebSocket close code."""

from __future__ import annotations

from dataclasses import dataclass

from voice_agent.errors import VoiceAgentError

# RFC 6455 close codes the codecs use.
PROTOCOL_ERROR = 1002  # a message out of order, malformed, or missing a required field
UNSUPPORTED_DATA = 1003  # a frame type or audio format this endpoint does not take
POLICY_VIOLATION = 1008  # well formed, but beyond a documented limit
MESSAGE_TOO_BIG = 1009  # a message larger than the endpoint's maximum
TRY_AGAIN_LATER = 1013  # admission control refused the call: the server is busy

# A close frame's payload is at most 125 bytes, two of which hold the code.
MAX_CLOSE_REASON_BYTES = 123


def close_reason(text: str) -> str:
    """`text` cut to fit a close frame, on a UTF-8 character boundary, marked with an ellipsis."""
    data = text.encode()
    if len(data) <= MAX_CLOSE_REASON_BYTES:
        return text
    cut = data[: MAX_CLOSE_REASON_BYTES - 3].decode(errors="ignore")
    return cut + "…"


class ProtocolError(VoiceAgentError):
    """The peer broke the protocol: the adapter closes the WebSocket with `code` and `close_reason`.

    `kind` is a stable snake_case name for the failure (the native protocol's `error` event code);
    `reason` is the whole human-readable explanation, which may be longer than a close frame holds.
    """

    def __init__(self, code: int, reason: str, *, kind: str = "protocol_error") -> None:
        self.code = code
        self.reason = reason
        self.kind = kind
        super().__init__(f"{reason} (close code {code})")

    @property
    def close_reason(self) -> str:
        return close_reason(self.reason)


@dataclass(frozen=True, slots=True)
class ProtocolWarning:
    """A message was dropped but the stream goes on: log it (the native adapter also reports it)."""

    kind: str
    message: str

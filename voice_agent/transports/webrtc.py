"""WebRTC signalling and playout as sans-I/O code (docs/protocol.md, "WebRTC").

Signalling runs over a WebSocket at `/rtc`: the browser sends one `offer` (non-trickle: its ICE
candidates are in the SDP), the server answers with `answer`. Events then flow on the data
channel the browser opened, in the same JSON as the native `/ws` protocol, plus the browser's
`playout` reports. `RtpPlayout` is the server's model of what the browser has played: the RTP
send clock plus the playout delay the browser reports, so marks fire when their audio was heard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from voice_agent.audio.playout import MAX_PLAYOUT_DELAY_MS
from voice_agent.audio.playout import RtpPlayout as RtpPlayout
from voice_agent.transports.errors import (
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
)
from voice_agent.transports.json_fields import json_message

MAX_SIGNAL_CHARS = 65_536  # an SDP offer from a browser is 2 to 8 kB
MAX_CHANNEL_CHARS = 4096
DTMF_DIGITS = frozenset("0123456789*#ABCD")


@dataclass(frozen=True, slots=True)
class Offer:
    sdp: str
    agent: str | None
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Hangup:
    pass


@dataclass(frozen=True, slots=True)
class Playout:
    delay_ms: float


@dataclass(frozen=True, slots=True)
class Dtmf:
    digit: str


def _malformed(reason: str) -> ProtocolError:
    return ProtocolError(PROTOCOL_ERROR, reason, kind="malformed_message")


def _object(text: str, limit: int, where: str) -> dict[str, Any]:
    return json_message(text, limit, loads=json.loads, what=f"{where} message")


def check_offer_sdp(sdp: str) -> None:
    """What aiortc would reject less clearly: not an SDP at all, or no audio to talk with."""
    lines = sdp.replace("\r\n", "\n").split("\n")
    if not lines or lines[0].strip() != "v=0":
        raise ProtocolError(
            PROTOCOL_ERROR, 'offer: sdp is not a session description (no "v=0")', kind="bad_sdp"
        )
    media = [line.split()[0][2:] for line in lines if line.startswith("m=") and line.split()]
    if "audio" not in media:
        found = ", ".join(media) or "no media at all"
        raise ProtocolError(
            UNSUPPORTED_DATA,
            f"offer: sdp has no audio (found {found}); add a microphone track before the offer",
            kind="no_audio",
        )


def parse_signal(text: str | bytes) -> Offer | Hangup | ProtocolWarning:
    """One message from the browser on `/rtc`."""
    if isinstance(text, bytes):
        raise ProtocolError(
            UNSUPPORTED_DATA, "binary frame: /rtc messages are JSON text", kind="binary_frame"
        )
    message = _object(text, MAX_SIGNAL_CHARS, "signalling")
    kind = message.get("type")
    if kind == "offer":
        sdp = message.get("sdp")
        if not isinstance(sdp, str) or not sdp.strip():
            raise ProtocolError(PROTOCOL_ERROR, "offer: sdp must be a string", kind="bad_sdp")
        check_offer_sdp(sdp)
        agent = message.get("agent")
        if agent is not None and (not isinstance(agent, str) or not agent):
            raise ProtocolError(
                PROTOCOL_ERROR, "offer: agent must be a non-empty string", kind="invalid_offer"
            )
        args = message.get("args", {})
        if not isinstance(args, dict):
            raise ProtocolError(
                PROTOCOL_ERROR, "offer: args must be a JSON object", kind="invalid_offer"
            )
        return Offer(sdp, agent, args)
    if kind == "hangup":
        return Hangup()
    if not isinstance(kind, str):
        raise _malformed('signalling message has no "type" string')
    return ProtocolWarning("unknown_message", f"unknown message type {kind[:40]!r} ignored")


def parse_channel(text: str | bytes) -> Playout | Dtmf | Hangup | ProtocolWarning:
    """One message from the browser on the data channel: never fatal, the call goes on."""
    if isinstance(text, bytes):
        return ProtocolWarning("invalid_message", "binary data channel message ignored")
    try:
        message = _object(text, MAX_CHANNEL_CHARS, "data channel")
    except ProtocolError as error:
        return ProtocolWarning(error.kind, f"{error.reason} (ignored)")
    kind = message.get("type")
    if kind == "playout":
        delay = message.get("delay_ms")
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not delay >= 0:
            return ProtocolWarning(
                "invalid_message", "playout: delay_ms must be a number >= 0 (ignored)"
            )
        return Playout(min(float(delay), MAX_PLAYOUT_DELAY_MS))
    if kind == "dtmf":
        digit = message.get("digit")
        if not isinstance(digit, str) or digit not in DTMF_DIGITS:
            return ProtocolWarning(
                "invalid_message", "dtmf: digit must be one key: 0-9, *, #, A-D (ignored)"
            )
        return Dtmf(digit)
    if kind == "hangup":
        return Hangup()
    return ProtocolWarning("unknown_message", f"unknown message type {str(kind)[:40]!r} ignored")


def answer_event(sdp: str, call_id: str) -> str:
    return json.dumps({"type": "answer", "sdp": sdp, "call_id": call_id})


def error_event(code: str, message: str) -> str:
    return json.dumps({"type": "error", "code": code, "message": message})

"""WebRTC signalling and playout as sans-I/O code (docs/protocol.md, "WebRTC").

Signalling runs over a WebSocket at `/rtc`: the browser sends one `offer` (non-trickle: its ICE
candidates are in the SDP), the server answers with `answer`. Events then flow on the data
channel the browser opened, in the same JSON as the native `/ws` protocol, plus the browser's
`playout` reports. `RtpPlayout` is the server's model of what the browser has played: the RTP
send clock plus the playout delay the browser reports, so marks fire when their audio was heard.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from voice_agent.transports.errors import (
    MESSAGE_TOO_BIG,
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
)

MAX_SIGNAL_CHARS = 65_536  # an SDP offer from a browser is 2 to 8 kB
MAX_CHANNEL_CHARS = 4096
DTMF_DIGITS = frozenset("0123456789*#ABCD")
# Before the browser's first report: a typical WebRTC jitter buffer on a quiet network.
DEFAULT_PLAYOUT_DELAY_MS = 60.0
MAX_PLAYOUT_DELAY_MS = 2000.0


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
    if len(text) > limit:
        raise ProtocolError(
            MESSAGE_TOO_BIG,
            f"{where} message of {len(text)} characters exceeds the {limit} limit",
            kind="message_too_big",
        )
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise _malformed(f"{where} message is not valid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise _malformed(f"{where} message is not a JSON object")
    return message


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


class RtpPlayout:
    """The agent's outgoing audio, paced in frames, and when each mark's audio has been heard.

    Audio and marks are queued as the pipeline sends them; `next_frame` hands the RTP sender one
    frame per tick. A mark is heard once its last byte has been sent and the browser's playout
    delay has passed. `clear` drops what has not been sent; what is already in flight still plays
    in the browser, but the call core has cut its playback by then and ignores those marks.
    """

    def __init__(self, sample_rate: int, frame_ms: int = 20, sample_bytes: int = 2) -> None:
        self.frame_bytes = sample_rate * sample_bytes * frame_ms // 1000
        self.frame_ms = frame_ms
        self.delay_ms = DEFAULT_PLAYOUT_DELAY_MS
        self._silence = bytes(self.frame_bytes)
        self._buffer = bytearray()
        self._queued = 0  # bytes ever queued, minus what clear dropped
        self._sent = 0  # bytes ever sent
        self._marks: deque[tuple[int, str]] = deque()  # (byte position it follows, name)
        self._in_flight: deque[tuple[float, str]] = deque()  # (heard at ms, name)

    @property
    def pending_ms(self) -> float:
        """Audio queued but not yet sent."""
        return len(self._buffer) / self.frame_bytes * self.frame_ms

    def audio(self, data: bytes) -> None:
        self._buffer += data
        self._queued += len(data)

    def mark(self, name: str) -> None:
        self._marks.append((self._queued, name))

    def report_delay(self, delay_ms: float) -> None:
        self.delay_ms = min(max(0.0, delay_ms), MAX_PLAYOUT_DELAY_MS)

    def clear(self) -> None:
        self._queued -= len(self._buffer)
        self._buffer.clear()
        self._marks.clear()
        self._in_flight.clear()

    def next_frame(self, now_ms: float) -> tuple[bytes, list[str]]:
        """The frame to send now (silence when there is nothing to say), and the marks heard."""
        if self._buffer:
            frame = bytes(self._buffer[: self.frame_bytes])
            del self._buffer[: self.frame_bytes]
            if len(frame) < self.frame_bytes:
                frame += self._silence[len(frame) :]
            self._sent += self.frame_bytes
            self._queued = max(self._queued, self._sent)
            # A mark is heard when its last byte, sent in this frame, has played out.
            heard_at = now_ms + self.frame_ms + self.delay_ms
        else:
            frame = self._silence
            self._sent = self._queued
            heard_at = now_ms + self.delay_ms
        while self._marks and self._marks[0][0] <= self._sent:
            self._in_flight.append((heard_at, self._marks.popleft()[1]))
        heard: list[str] = []
        while self._in_flight and self._in_flight[0][0] <= now_ms:
            heard.append(self._in_flight.popleft()[1])
        return frame, heard

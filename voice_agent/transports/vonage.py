"""Vonage Voice API WebSockets as a sans-I/O codec: Vonage's JSON text events and binary audio
frames in, typed events out; the binary frames, `notify` and `clear` it takes back.

What this follows:

* Vonage's "WebSockets" guide, https://developer.vonage.com/en/voice/voice-api/concepts/websockets
  (formerly .../guides/websockets), in the text of its last public source (the Markdown of
  Nexmo/nexmo-developer, `_documentation/en/voice/voice-api/guides/websockets.md`, and its
  `concepts/websockets.md` copy): the `websocket:connected` first message, the binary frame
  sizes, `websocket:dtmf`, and that audio written faster than real time is buffered. The live
  page has been rewritten since; only its opening was in the stored copies searched.
* The `clear` / `websocket:cleared` and `notify` / `websocket:notify` messages, which that
  source does not have: as the current concept page is transcribed in the AsyncAPI description
  api-evangelist/vonage `asyncapi/vonage-asyncapi.yml` (version 2026.05, "x-last-validated
  2026-05-29", generated from that page and the NCCO reference); independent clients (Pipecat's
  Vonage serializer and others) handle the same four names.
* The buffer size: the "Play audio into a WebSocket" tutorial,
  https://developer.vonage.com/en/tutorials/play-audio-into-a-websocket/create-the-websocket/node
  ("Vonage will only buffer 3072 messages which should be enough for around 60 seconds of
  audio ... implement a delay of 18-19ms between each message"); the old guide said 1024
  messages (about 20 seconds).
* The NCCO `connect` websocket endpoint: the guide, the NCCO reference's endpoint table
  (Nexmo/station `_modals/voice/guides/ncco-reference/endpoint.md`: `uri`, `content-type`,
  `headers`) and Vonage's SDKs (Vonage/vonage-node-sdk `WebsocketBitrate` and
  `WebsocketAuthorization`; 24 kHz added in Q4 2025, Vonage/vonage-ruby-sdk#341 of 2025-11-25
  and vonage-python-sdk#342).

The protocol:

* Vonage is the WebSocket client; the first message is TEXT:
  `{"event":"websocket:connected","content-type":"audio/l16;rate=16000", ...}` where the rest
  are the NCCO endpoint's `headers`, flattened to the top level (no `headers` key).
* Then BINARY frames of 16-bit signed little-endian linear PCM, mono, 20 ms each: 320 bytes at
  8 kHz, 640 at 16 kHz (960 at 24 kHz), interleaved with TEXT events:
  `{"event":"websocket:dtmf","digit":"5","duration":260}` (one digit per key press, duration in
  ms), `{"event":"websocket:cleared"}` (the answer to `clear`) and
  `{"event":"websocket:notify","payload":{...}}` (a `notify`'s payload echoed once the audio
  sent before it has played).
* Audio back is BINARY frames of the same format, each exactly one 20 ms frame. They may be
  written faster than real time: Vonage buffers them (3072 frames, about a minute) and plays
  them in order.
* `{"action":"clear"}` drops the buffered audio; Vonage answers `websocket:cleared`.
  `{"action":"notify","payload":{...}}` asks for `websocket:notify` with that payload once the
  audio written before it has played: the mark of other carriers. This codec's marks are
  `{"action":"notify","payload":{"name":"<mark>"}}`.
* Hang-up is the socket closing; there is no stop event on the socket (the `disconnected`
  status goes to the NCCO's eventUrl webhook, not down the WebSocket).

Ambiguous or unverified in the documentation:

* Whether a `notify` queued before a `clear` is ever answered (Twilio returns such marks, this
  page does not say): the endpoint must treat every mark sent before a clear as settled by it.
* What Vonage does beyond its buffer (drop or close); the endpoint should keep well under a
  minute of audio unplayed (see `MAX_BUFFERED_FRAMES`).
* The DTMF event's shape: the guide shows `digit` and `duration` at the top level; some clients
  also read a nested `dtmf` object. Both are taken.
* `headers` is limited to 512 bytes in the guide (other sources say 2000).
* The close code Vonage uses when the caller hangs up is not documented.

Connect snippet (answer webhook response):

```json
[
  {
    "action": "connect",
    "eventType": "synchronous",
    "eventUrl": ["https://example.com/vonage/events"],
    "from": "447700900000",
    "endpoint": [
      {
        "type": "websocket",
        "uri": "wss://voice.example.com/vonage",
        "content-type": "audio/l16;rate=16000",
        "headers": {"agent": "concierge", "uuid": "<uuid of the answer webhook>", "lang": "en"}
      }
    ]
  }
]
```

`agent` in the headers chooses the agent, `uuid` (copy it from the answer webhook's query)
names the call, every other header is an agent arg. An endpoint may add
`"authorization": {"type": "vonage"}` (Vonage then sends the JWT it signs webhooks with as
`Authorization: Bearer ...` in the opening handshake) or `{"type": "custom", "value": "..."}`
(that header value verbatim): the server's handshake check, not this codec's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from voice_agent.audio.codec import CarrierFormat
from voice_agent.transports.errors import (
    POLICY_VIOLATION,
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
)
from voice_agent.transports.json_fields import json_message
from voice_agent.transports.json_fields import malformed as _malformed
from voice_agent.transports.state import StreamState

ENCODING = "audio/l16"
SAMPLE_RATES = (8000, 16000, 24000)
CONTENT_TYPES = tuple(f"{ENCODING};rate={rate}" for rate in SAMPLE_RATES)
FRAME_MS = 20  # every binary message, both ways
# What Vonage holds of audio written ahead of playout (the tutorial; 1024 in the old guide).
MAX_BUFFERED_FRAMES = 3072
MAX_BUFFERED_MS = MAX_BUFFERED_FRAMES * FRAME_MS
MAX_HEADERS_BYTES = 512  # the NCCO endpoint's `headers`, per the guide
# Vonage sends one 20 ms frame per message; ten are still plausible for a batching peer.
MAX_FRAME_MS = 200
MAX_MESSAGE_CHARS = 16_384
# For the server's `websockets` max_size: above the codec's own limits (a 200 ms frame at
# 24 kHz is 9600 bytes), so the codec's clearer 1009 reason is the one a peer normally sees.
WEBSOCKET_MAX_SIZE = 4 * MAX_MESSAGE_CHARS
DTMF_DIGITS = frozenset("0123456789*#ABCD")
AGENT_HEADER = "agent"
CALL_ID_HEADER = "uuid"
MARK_KEY = "name"  # the key of a notify payload this codec's marks use

Message = bytes | str


def frame_bytes(sample_rate: int) -> int:
    """Bytes of one 20 ms frame of 16-bit mono PCM: 320 at 8 kHz, 640 at 16 kHz."""
    return sample_rate * 2 * FRAME_MS // 1000


def content_type_rate(value: str) -> int | None:
    """The sample rate of an `audio/l16;rate=N` content type (any case, spaces allowed), or None
    for anything else."""
    mime, _, params = value.partition(";")
    if mime.strip().lower() != ENCODING:
        return None
    rate = None
    for param in params.split(";"):
        key, _, raw = param.partition("=")
        if key.strip().lower() == "rate":
            raw = raw.strip()
            rate = int(raw) if raw.isascii() and raw.isdigit() else None
    return rate if rate in SAMPLE_RATES else None


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connected:
    """`websocket:connected`: the audio format and the NCCO endpoint's headers."""

    content_type: str
    sample_rate: int
    headers: dict[str, Any] = field(default_factory=dict)  # every field but event, content-type

    @property
    def frame_bytes(self) -> int:
        return frame_bytes(self.sample_rate)

    @property
    def carrier(self) -> CarrierFormat:
        return CarrierFormat("pcm16", self.sample_rate)

    @property
    def call_id(self) -> str | None:
        """The `uuid` header, if the NCCO passed the call's uuid along."""
        value = self.headers.get(CALL_ID_HEADER)
        return value if isinstance(value, str) and value else None

    @property
    def agent(self) -> str | None:
        """The agent the `agent` header names, if any."""
        value = self.headers.get(AGENT_HEADER)
        return value if isinstance(value, str) and value else None

    @property
    def agent_args(self) -> dict[str, str]:
        """Every other header: strings as they are, other JSON values as compact JSON."""
        return {
            key: value if isinstance(value, str) else _compact(value)
            for key, value in self.headers.items()
            if key not in (AGENT_HEADER, CALL_ID_HEADER)
        }


# Not frozen: built 50 times a second per call.
@dataclass(slots=True)
class Audio:
    payload: bytes  # 16-bit little-endian PCM at the connection's rate


@dataclass(frozen=True, slots=True)
class Dtmf:
    digit: str
    duration_ms: int | None


@dataclass(frozen=True, slots=True)
class Notify:
    """The audio written before a `notify` has played; its payload comes back as sent."""

    payload: dict[str, Any]

    @property
    def name(self) -> str | None:
        """The mark's name when the notify is one of `mark_message`'s."""
        value = self.payload.get(MARK_KEY)
        return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class Cleared:
    """Vonage emptied its playback buffer after a `clear`."""


VonageEvent = Connected | Audio | Dtmf | Notify | Cleared | ProtocolWarning


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _shown(value: object) -> str:
    return json.dumps(value, default=str)[:40]


def _duration(fields: Mapping[str, Any], path: str) -> int | None:
    value = fields.get("duration")
    if value is None:
        return None
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise _malformed(f"{path} is not a non-negative integer (got {_shown(value)})")


class VonageStream:
    """One Vonage WebSocket: feed it each message, get events back; frame the audio going out.

    Order enforced: `websocket:connected` first (anything else before it, and a second one,
    raise ProtocolError), then binary audio and text events in any order. Fatal problems raise
    `ProtocolError` (close the socket with its code and `close_reason`); harmless ones come
    back as a `ProtocolWarning` event. The outbound side turns audio of any length into whole
    20 ms frames, holding the remainder until more comes or a mark or `flush_audio` pads it.
    """

    def __init__(
        self,
        *,
        max_message_chars: int = MAX_MESSAGE_CHARS,
        max_frame_ms: int = MAX_FRAME_MS,
    ) -> None:
        self.max_message_chars = max_message_chars
        self.max_frame_ms = max_frame_ms
        self.state = StreamState.NEW
        self.connected: Connected | None = None
        self.max_binary_bytes = 0  # set by websocket:connected
        self._frame = 0
        self._pending = bytearray()

    @property
    def frame_bytes(self) -> int:
        if not self._frame:
            raise RuntimeError("no websocket:connected yet: the audio format is not known")
        return self._frame

    # -- inbound -------------------------------------------------------------------------------

    def receive(self, message: Message) -> list[VonageEvent]:
        if isinstance(message, str):
            return self.receive_text(message)
        return self.receive_bytes(message)

    def audio_payload(self, data: bytes) -> bytes | None:
        """`data` when it is a well-formed audio frame of this connected stream (the 50 a second
        path: no event, no list); None for anything else, untouched: hand that to
        `receive_bytes`, which explains the problem."""
        size = len(data)
        if 0 < size <= self.max_binary_bytes and not size & 1:
            return data
        return None

    def receive_bytes(self, data: bytes) -> list[VonageEvent]:
        size = len(data)
        if self.connected is None:
            raise ProtocolError(
                PROTOCOL_ERROR,
                f"binary frame of {size} bytes before websocket:connected",
                kind="out_of_order",
            )
        if size > self.max_binary_bytes:
            raise ProtocolError(
                POLICY_VIOLATION,
                f"binary frame of {size} bytes exceeds {self.max_binary_bytes} "
                f"({self.max_frame_ms} ms of {self.connected.content_type})",
                kind="payload_too_large",
            )
        if not size:
            return [ProtocolWarning("empty_payload", "empty binary frame")]
        if size & 1:
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"binary frame of {size} bytes is not whole 16-bit samples",
                kind="invalid_payload",
            )
        return [Audio(bytes(data))]

    def receive_text(self, text: str) -> list[VonageEvent]:
        message = json_message(text, self.max_message_chars)
        event = message.get("event")
        if not isinstance(event, str):
            raise _malformed('message has no "event" string')
        if event == "websocket:connected":
            return [self._connected(message)]
        if self.state is StreamState.NEW:
            raise ProtocolError(
                PROTOCOL_ERROR, f"{event[:40]} before websocket:connected", kind="out_of_order"
            )
        if event == "websocket:dtmf":
            return self._dtmf(message)
        if event == "websocket:notify":
            payload = message.get("payload")
            if not isinstance(payload, dict):
                missing = payload is None
                raise _malformed(
                    f"websocket:notify payload is {'missing' if missing else 'not an object'}"
                )
            return [Notify(payload)]
        if event == "websocket:cleared":
            return [Cleared()]
        # Vonage adds events over time; a new one must not end a caller's call.
        return [ProtocolWarning("unknown_event", f"unknown event {event[:40]!r} ignored")]

    def _connected(self, message: Mapping[str, Any]) -> Connected:
        if self.state is not StreamState.NEW:
            raise ProtocolError(PROTOCOL_ERROR, "second websocket:connected", kind="out_of_order")
        content_type = message.get("content-type")
        if not isinstance(content_type, str) or not content_type:
            missing = content_type is None
            raise _malformed(
                f"websocket:connected content-type is "
                f"{'missing' if missing else 'not a non-empty string'}"
            )
        rate = content_type_rate(content_type)
        if rate is None:
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"content-type {content_type[:40]!r} is not one of {', '.join(CONTENT_TYPES)}",
                kind="unsupported_media_format",
            )
        headers = {k: v for k, v in message.items() if k not in ("event", "content-type")}
        self.connected = Connected(content_type, rate, headers)
        self.state = StreamState.CONNECTED
        self._frame = frame_bytes(rate)
        self.max_binary_bytes = rate * 2 * self.max_frame_ms // 1000
        return self.connected

    def _dtmf(self, message: Mapping[str, Any]) -> list[VonageEvent]:
        nested = message.get("dtmf")
        fields, prefix = (nested, "dtmf.") if isinstance(nested, dict) else (message, "")
        digit = fields.get("digit")
        if not isinstance(digit, str) or not digit:
            state = "missing" if digit is None else "not a non-empty string"
            raise _malformed(f"websocket:dtmf {prefix}digit is {state}")
        duration = _duration(fields, f"websocket:dtmf {prefix}duration")
        if digit not in DTMF_DIGITS:
            return [ProtocolWarning("invalid_dtmf", f"digit {digit[:10]!r} ignored")]
        return [Dtmf(digit, duration)]

    # -- outbound ------------------------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        """Audio held back for want of a whole frame."""
        return len(self._pending)

    def audio_messages(self, pcm: bytes) -> list[bytes]:
        """`pcm` (16-bit mono at the connection's rate, any length) as whole 20 ms frames; the
        remainder waits for the next call, a mark or `flush_audio`."""
        frame = self.frame_bytes
        pending = self._pending
        pending += pcm
        whole = len(pending) - len(pending) % frame
        if not whole:
            return []
        frames = [bytes(pending[i : i + frame]) for i in range(0, whole, frame)]
        del pending[:whole]
        return frames

    def flush_audio(self) -> list[bytes]:
        """The held remainder as one frame padded with silence, if there is one."""
        if not self._pending:
            return []
        frame = self.frame_bytes
        data = bytes(self._pending) + bytes(frame - len(self._pending))
        self._pending.clear()
        return [data]

    def mark_messages(self, name: str) -> list[Message]:
        """What makes Vonage answer `websocket:notify` `{"name": name}` once all the audio given
        so far has played: the padded remainder, then the notify."""
        return [*self.flush_audio(), mark_message(name)]

    def clear_messages(self) -> list[Message]:
        """Drop the held remainder and everything Vonage has buffered."""
        self._pending.clear()
        return [clear_message()]


# -- builders ------------------------------------------------------------------------------------


def frames(pcm: bytes, sample_rate: int) -> list[bytes]:
    """`pcm` of any length as 20 ms frames, the last padded with silence."""
    size = frame_bytes(sample_rate)
    out = [pcm[i : i + size] for i in range(0, len(pcm), size)]
    if out and len(out[-1]) < size:
        out[-1] = out[-1] + bytes(size - len(out[-1]))
    return out


def notify_message(payload: Mapping[str, Any]) -> str:
    """Ask Vonage to send `websocket:notify` with `payload` once the audio before it has played."""
    return f'{{"action":"notify","payload":{_compact(dict(payload))}}}'


def mark_message(name: str) -> str:
    return notify_message({MARK_KEY: name})


def clear_message() -> str:
    """Drop the audio Vonage has buffered; it answers `websocket:cleared`."""
    return '{"action":"clear"}'

"""Telnyx Media Streaming (bidirectional, RTP mode) as a sans-I/O codec: Telnyx's JSON text
messages in, typed events out, and the `media` / `mark` / `clear` messages Telnyx takes back.

Shaped like `voice_agent.transports.twilio`, so its adapter (gateways/carriers.py) reads like
Twilio's.

What this follows (read from the stored copies of Telnyx's pages; none shows a date or a
document version, the protocol's own version is the `"version": "1.0.0"` of `connected`):

* "Stream call media over WebSocket", the AsyncAPI reference of the socket,
  https://developers.telnyx.com/api-reference/websockets/stream-call-media-over-websocket
  (its YAML: https://telnyx-openapi-ng.s3.us-east-1.amazonaws.com/media-streaming/
  media-streaming.yml): the connection flow, the `start` example with `stream_id`,
  `start.call_control_id`, `call_session_id`, `from`, `to`, `tags`, `client_state`,
  `custom_parameters` and `media_format` {encoding, sample_rate, channels}; "Media frame order
  is not guaranteed. Use `media.chunk`, `media.timestamp`, and `sequence_number` to order
  frames"; outbound RTP chunks of 20 ms to 30 s; the connected frame's
  `connected.x-telnyx-streaming-auth-token` (also sent as that WebSocket header).
* "Media Streaming over WebSockets",
  https://developers.telnyx.com/docs/voice/programmable-voice/media-streaming (and its older
  copy under /docs/v2/voice/programmable_voice/resources/media_streaming/): the `media`,
  `stop`, `dtmf` (with `occurred_at`), `error` (codes 100002-100005) and `mark` examples, the
  outbound `{"event": "media", "media": {"payload": ...}}`, `{"event": "clear"}` and
  `{"event": "mark", "mark": {"name": ...}}`, the codec list (PCMU 8 kHz default, PCMA,
  G722, OPUS, AMR-WB, L16 16 kHz), "the chunk number can be used to reorder the events".
* TeXML `<Stream>`: https://developers.telnyx.com/docs/voice/programmable-voice/texml-verbs/
  stream (attributes `url`, `track`, `name`, `codec`, `bidirectionalMode` mp3|rtp,
  `bidirectionalCodec`, `bidirectionalSamplingRate`, `statusCallback`, `statusCallbackMethod`;
  child `<Parameter name= value=>`, "included in the start message").
* Call Control `streaming_start`:
  https://developers.telnyx.com/api-reference/call-commands/streaming-start, and the
  parameter names as Telnyx's generated SDKs spell them (team-telnyx/telnyx-ruby
  `lib/telnyx/models/calls/action_start_streaming_params.rb`, telnyx-python
  `types/calls/action_start_streaming_params.py`): `stream_url`, `stream_track`,
  `stream_codec`, `stream_bidirectional_mode`, `stream_bidirectional_codec`,
  `stream_bidirectional_sampling_rate`, `stream_bidirectional_target_legs`,
  `stream_auth_token`, `custom_parameters` (a list of {name, value}), `client_state`.

Connect a call (TeXML; `<Start>` returns at once, so something must hold the call open):

    <?xml version="1.0" encoding="UTF-8"?>
    <Response>
      <Start>
        <Stream url="wss://HOST/telnyx" track="inbound_track" codec="PCMU"
                bidirectionalMode="rtp" bidirectionalCodec="PCMU"
                bidirectionalSamplingRate="8000">
          <Parameter name="agent" value="booking"/>
          <Parameter name="customer" value="12345"/>
        </Stream>
      </Start>
      <Pause length="3600"/>
    </Response>

or with Call Control, `POST https://api.telnyx.com/v2/calls/{call_control_id}/actions/
streaming_start` (the same fields are taken by `actions/answer` and `POST /v2/calls`):

    {"stream_url": "wss://HOST/telnyx", "stream_track": "inbound_track",
     "stream_codec": "PCMU", "stream_bidirectional_mode": "rtp",
     "stream_bidirectional_codec": "PCMU", "stream_bidirectional_sampling_rate": 8000,
     "stream_auth_token": "...",
     "custom_parameters": [{"name": "agent", "value": "booking"},
                           {"name": "customer", "value": "12345"}]}

Agent selection: the custom parameter `agent` (TeXML `<Parameter name="agent">`, Call Control
`custom_parameters`) names the agent, every other one is an agent arg (`Start.agent`,
`Start.agent_args`), as twilio.Start does. `client_state` (base64, meant for webhooks) is kept
as is in `Start.client_state` and not interpreted.

Decisions, and what the documents leave open:

* Reordering: `media.chunk` orders each track's frames (a `ChunkReorder` per track). In-order
  chunks pass straight through; a chunk after a gap is held until the gap fills or
  `REORDER_WINDOW` (5) chunks are held, then the gap is given up for lost. Five 20 ms frames
  is 100 ms: reordering cannot happen on the TCP connection itself, only where Telnyx
  dispatches frames, which swaps neighbours; 100 ms of extra delay only while a chunk is
  missing stays under the turn-taking's resolution, and a lost chunk never stalls the call.
  The first chunk of a track is taken as the start of its numbering (a chunk older than it
  counts as late); a chunk more than `CHUNK_RESET_DISTANCE` below the expected one is taken as
  a restarted counter. Duplicates and chunks older than the window are dropped with a warning.
  `sequence_number` is read but not checked: it counts every event, and those are unordered.
* Documents disagree on `media_format.encoding`: "PCMU" now, "audio/x-mulaw" in the older
  page's example; both spellings (and PCMA / audio/x-alaw, L16 / audio/x-l16) are taken. L16's
  byte order is not stated anywhere; it is taken as little-endian (what Telnyx-using
  open-source serializers assume), i.e. this server's pcm16. The TeXML page lists no L16 for
  `codec` / `bidirectionalCodec` while Call Control and the streaming guide do.
* The outbound codec is set on the call (`stream_bidirectional_codec` / `bidirectionalCodec`,
  sampling rate likewise), not announced on the socket: `start.media_format` describes only
  what Telnyx sends. Configure both sides alike (the snippets do); `media_message` then sends
  the start's format back.
* `stream_bidirectional_target_legs` (both / self / opposite; the CLI shows `opposite` as the
  default) is described only as "which call legs should receive the bidirectional stream
  audio": the snippets leave it at its default.
* `start` must come first (after an optional `connected`), once. A media frame before `start`
  is dropped with a warning, up to `MAX_EARLY_MEDIA` of them (the order of frames is not
  guaranteed), then it is an error; dtmf and mark before start are errors. A `stop` always ends
  the call, whatever it holds; the reorder windows are flushed before it.
* `error` frames become `StreamError` events (the call goes on; Telnyx decides whether to
  stop). Limits: see `MAX_MESSAGE_CHARS`, `MAX_MEDIA_PAYLOAD_BYTES`; Telnyx's own limits are
  on what it is sent (20 ms to 30 s per RTP media message, one bidirectional stream per call).
* Telnyx sends no hang-up on the socket other than `stop`, and takes none: ending a call is
  Call Control's `actions/hangup` (or, with TeXML, whatever follows the `<Pause>`).
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from voice_agent.transports.chunk_reorder import REORDER_WINDOW, ChunkReorder
from voice_agent.transports.custom_parameters import AgentInParameters
from voice_agent.transports.errors import (
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
)
from voice_agent.transports.json_fields import json_object as _object
from voice_agent.transports.json_fields import json_text as _text
from voice_agent.transports.json_fields import loose_texts
from voice_agent.transports.json_fields import malformed as _malformed
from voice_agent.transports.json_stream import JsonMediaStream
from voice_agent.transports.state import StreamState

# encoding as Telnyx names it (either spelling) -> this server's CarrierFormat encoding.
ENCODINGS: dict[str, str] = {
    "PCMU": "mulaw",
    "AUDIO/X-MULAW": "mulaw",
    "PCMA": "alaw",
    "AUDIO/X-ALAW": "alaw",
    "L16": "pcm16",
    "AUDIO/X-L16": "pcm16",
}
SAMPLE_RATES: dict[str, tuple[int, ...]] = {
    "mulaw": (8000,),
    "alaw": (8000,),
    "pcm16": (8000, 16000),
}
CHANNELS = 1
INBOUND_TRACK = "inbound"  # the caller's audio; "outbound" is what the call plays
# 200 ms of 16 kHz L16 (400 ms of 8 kHz L16, 1.6 s of G.711): Telnyx sends 20 ms frames.
MAX_MEDIA_PAYLOAD_BYTES = 6400
# A start carries tags, client_state and custom parameters besides the call's ids.
MAX_MESSAGE_CHARS = 32_768
# For the server's `websockets` max_size: above the codec's own limit even for non-ASCII text.
WEBSOCKET_MAX_SIZE = 4 * MAX_MESSAGE_CHARS
MAX_TRACKS = 2  # inbound and outbound: the tracks `both_tracks` streams
MAX_EARLY_MEDIA = REORDER_WINDOW  # media frames before start dropped before it is an error
MIN_OUTBOUND_MS = 20  # Telnyx takes RTP media messages of 20 ms to 30 s
MAX_OUTBOUND_MS = 30_000
DTMF_DIGITS = frozenset("0123456789*#ABCD")
AUTH_TOKEN_FIELD = "x-telnyx-streaming-auth-token"


@dataclass(frozen=True, slots=True)
class MediaFormat:
    encoding: str  # as Telnyx sent it: "PCMU", "PCMA", "L16" (or "audio/x-mulaw", ...)
    sample_rate: int
    channels: int

    @property
    def carrier_encoding(self) -> str:
        """This server's name for it: "mulaw", "alaw" or "pcm16" (little-endian)."""
        return ENCODINGS[self.encoding.upper()]

    @property
    def bytes_per_ms(self) -> float:
        width = 2 if self.carrier_encoding == "pcm16" else 1
        return self.sample_rate * width * self.channels / 1000


@dataclass(frozen=True, slots=True)
class Connected:
    version: str
    auth_token: str | None = None  # connected.x-telnyx-streaming-auth-token, if configured


@dataclass(frozen=True, slots=True)
class Start(AgentInParameters):
    sequence: int
    stream_id: str
    call_control_id: str
    call_session_id: str
    media_format: MediaFormat
    from_: str = ""
    to: str = ""
    user_id: str = ""
    client_state: str = ""  # base64, as given to Call Control; not interpreted
    tags: tuple[str, ...] = ()
    custom_parameters: dict[str, str] = field(default_factory=dict)

    @property
    def call_id(self) -> str:
        return self.call_control_id


@dataclass(slots=True)
class Media:
    sequence: int
    chunk: int
    timestamp_ms: int
    track: str
    payload: bytes  # RTP payload in the start's media format, base64-decoded


@dataclass(frozen=True, slots=True)
class Dtmf:
    sequence: int
    digit: str
    occurred_at: str = ""  # Telnyx's timestamp of the key press (events may come unordered)


@dataclass(frozen=True, slots=True)
class Mark:
    """Telnyx finished playing (or a `clear` dropped) the audio sent before the mark `name`."""

    sequence: int
    name: str


@dataclass(frozen=True, slots=True)
class StreamError:
    """An `error` frame: 100002 unknown_error, 100003 malformed_frame, 100004 invalid_media,
    100005 rate_limit_reached (the codes the streaming guide lists)."""

    code: int
    title: str
    detail: str


@dataclass(frozen=True, slots=True)
class Stop:
    """The stream ended: the call hung up, or streaming was stopped."""

    sequence: int
    call_control_id: str
    user_id: str = ""


TelnyxEvent = Connected | Start | Media | Dtmf | Mark | StreamError | Stop | ProtocolWarning


def _optional_text(parent: Mapping[str, Any], key: str, path: str) -> str:
    value = parent.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _malformed(f"{path} is not a string")
    return value


def _integer(parent: Mapping[str, Any], key: str, path: str) -> int:
    # Telnyx sends numbers as strings ("sequence_number": "4"); plain integers are taken too.
    value = parent.get(key)
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if value is None:
        raise _malformed(f"{path} is missing")
    raise _malformed(f"{path} is not a non-negative integer (got {json.dumps(value)[:40]})")


def _string_map(parent: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    value = parent.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _malformed(f"{path} is not an object")
    for name, item in value.items():
        if not isinstance(item, str):
            raise _malformed(f"{path}.{name[:40]} is not a string")
    return dict(value)


class TelnyxStream(JsonMediaStream[TelnyxEvent]):
    """One Media Streaming WebSocket's inbound side: feed it each text message, get events back.

    Order enforced: an optional `connected`, then exactly one `start`, then `media`, `dtmf`,
    `mark`, `error` and finally `stop`. Fatal problems raise `ProtocolError` (close the socket
    with its code and `close_reason`); harmless ones come back as a `ProtocolWarning` event in
    the list. Media comes out in chunk order per track (`ChunkReorder`).
    """

    PROTOCOL = "Telnyx Media Streaming"

    def __init__(
        self,
        *,
        max_message_chars: int = MAX_MESSAGE_CHARS,
        max_payload_bytes: int = MAX_MEDIA_PAYLOAD_BYTES,
        reorder_window: int = REORDER_WINDOW,
    ) -> None:
        super().__init__(max_message_chars=max_message_chars, max_payload_bytes=max_payload_bytes)
        self.reorder_window = reorder_window
        self.connected: Connected | None = None
        self.start: Start | None = None
        self._stream_id = ""
        self._tracks: dict[str, ChunkReorder[Media]] = {}
        self._early_media = 0

    @property
    def stream_id(self) -> str:
        if self.start is None:
            raise RuntimeError("the stream has not started: no stream_id yet")
        return self.start.stream_id

    # -- inbound -------------------------------------------------------------------------------

    def media_payload(self, text: str) -> bytes | None:
        """The audio of `text` when it is a well-formed inbound-track media message of this
        started stream that goes out at once (in chunk order, nothing held): no event, no list.
        None for anything else, untouched: hand that message to `receive`."""
        if len(text) > self.max_message_chars or self.state is not StreamState.STARTED:
            return None
        try:
            message = orjson.loads(text)
            if message["event"] != "media" or message["stream_id"] != self._stream_id:
                return None
            media = message["media"]
            payload, chunk, timestamp = media["payload"], media["chunk"], media["timestamp"]
            sequence = message["sequence_number"]
            if (
                media["track"] != INBOUND_TRACK
                or not (chunk.__class__ is str and chunk.isascii() and chunk.isdigit())
                or not (timestamp.__class__ is str and timestamp.isascii() and timestamp.isdigit())
                or not (sequence.__class__ is str and sequence.isascii() and sequence.isdigit())
                or not 0 < len(payload) <= self._max_payload_chars
            ):
                return None
            number = int(chunk)
            reorder = self._tracks.get(INBOUND_TRACK)
            if reorder is not None and not reorder.takes_now(number):
                return None
            data = binascii.a2b_base64(payload, strict_mode=True)
            if not 0 < len(data) <= self.max_payload_bytes:
                return None
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
            return None
        if reorder is None:
            reorder = self._tracks[INBOUND_TRACK] = self._new_reorder()
        reorder.advance(number)
        return data

    def _event(self, event: str, message: Mapping[str, Any]) -> list[TelnyxEvent] | None:
        if event == "connected":
            return [self._connected(message)]
        if event == "start":
            return [self._start(message)]
        if event == "dtmf":
            return self._dtmf(message)
        if event == "mark":
            return self._mark(message)
        if event == "error":
            return [self._error(message)]
        if event == "stop":
            return self._stop(message)
        return None

    def _new_reorder(self) -> ChunkReorder[Media]:
        return ChunkReorder[Media](window=self.reorder_window)

    def _check_stream(self, message: Mapping[str, Any], event: str) -> int:
        """The message's sequence_number, once its stream_id is checked to be this stream's."""
        stream_id = message.get("stream_id")
        if stream_id != self._stream_id:
            if stream_id is None:
                raise _malformed(f"{event} message has no stream_id")
            raise ProtocolError(
                PROTOCOL_ERROR,
                f"stream_id {str(stream_id)[:40]!r} is not this stream's {self._stream_id!r}",
                kind="wrong_stream",
            )
        return _integer(message, "sequence_number", "sequence_number")

    def _media(self, message: Mapping[str, Any]) -> list[TelnyxEvent]:
        if self.state is not StreamState.STARTED:
            self._early_media += 1
            if self._early_media > MAX_EARLY_MEDIA:
                raise ProtocolError(
                    PROTOCOL_ERROR,
                    f"media message before start ({self._early_media} of them)",
                    kind="out_of_order",
                )
            return [ProtocolWarning("before_start", "media message before start dropped")]
        sequence = self._check_stream(message, "media")
        media = _object(message, "media", "media")
        data = self._payload(media)
        chunk = _integer(media, "chunk", "media.chunk")
        timestamp = _integer(media, "timestamp", "media.timestamp")
        track = _text(media, "track", "media.track")
        reorder = self._tracks.get(track)
        if reorder is None:
            if len(self._tracks) >= MAX_TRACKS:
                return [ProtocolWarning("unknown_track", f"media of track {track[:20]!r} ignored")]
            reorder = self._tracks[track] = self._new_reorder()
        return _audible(reorder.push(Media(sequence, chunk, timestamp, track, data)))

    def _connected(self, message: Mapping[str, Any]) -> Connected:
        if self.state is not StreamState.NEW:
            raise ProtocolError(
                PROTOCOL_ERROR, f"connected message after {self.state.value}", kind="out_of_order"
            )
        self.state = StreamState.CONNECTED
        version = message.get("version")
        body = message.get("connected")
        token = body.get(AUTH_TOKEN_FIELD) if isinstance(body, dict) else None
        self.connected = Connected(
            version if isinstance(version, str) else "",
            token if isinstance(token, str) else None,
        )
        return self.connected

    def _start(self, message: Mapping[str, Any]) -> Start:
        if self.state is StreamState.STARTED:
            raise ProtocolError(PROTOCOL_ERROR, "second start message", kind="out_of_order")
        sequence = _integer(message, "sequence_number", "sequence_number")
        stream_id = _text(message, "stream_id", "stream_id")
        start = _object(message, "start", "start")
        call_control_id = _text(start, "call_control_id", "start.call_control_id")
        tags = start.get("tags", [])
        if tags is None:
            tags = []
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise _malformed("start.tags is not a list of strings")
        fmt = _object(start, "media_format", "start.media_format")
        encoding = _text(fmt, "encoding", "start.media_format.encoding")
        sample_rate = _integer(fmt, "sample_rate", "start.media_format.sample_rate")
        channels = (
            CHANNELS
            if fmt.get("channels") is None
            else _integer(fmt, "channels", "start.media_format.channels")
        )
        media_format = MediaFormat(encoding, sample_rate, channels)
        carrier = ENCODINGS.get(encoding.upper())
        if carrier is None or sample_rate not in SAMPLE_RATES[carrier] or channels != CHANNELS:
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"media_format {encoding[:20]} {sample_rate} Hz x{channels} is not PCMU/PCMA"
                " 8000 or L16 8000/16000 Hz mono",
                kind="unsupported_media_format",
            )
        self.start = Start(
            sequence=sequence,
            stream_id=stream_id,
            call_control_id=call_control_id,
            call_session_id=_optional_text(start, "call_session_id", "start.call_session_id"),
            media_format=media_format,
            from_=_optional_text(start, "from", "start.from"),
            to=_optional_text(start, "to", "start.to"),
            user_id=_optional_text(start, "user_id", "start.user_id"),
            client_state=_optional_text(start, "client_state", "start.client_state"),
            tags=tuple(tags),
            custom_parameters=_string_map(start, "custom_parameters", "start.custom_parameters"),
        )
        self.state = StreamState.STARTED
        self._stream_id = stream_id
        return self.start

    def _dtmf(self, message: Mapping[str, Any]) -> list[TelnyxEvent]:
        self._require_started("dtmf")
        sequence = self._check_stream(message, "dtmf")
        dtmf = _object(message, "dtmf", "dtmf")
        digit = _text(dtmf, "digit", "dtmf.digit")
        occurred_at = _optional_text(message, "occurred_at", "occurred_at")
        if digit not in DTMF_DIGITS:
            return [ProtocolWarning("invalid_dtmf", f"dtmf.digit {digit[:10]!r} ignored")]
        return [Dtmf(sequence, digit, occurred_at)]

    def _mark(self, message: Mapping[str, Any]) -> list[TelnyxEvent]:
        self._require_started("mark")
        sequence = self._check_stream(message, "mark")
        mark = _object(message, "mark", "mark")
        return [Mark(sequence, _text(mark, "name", "mark.name"))]

    def _error(self, message: Mapping[str, Any]) -> StreamError:
        # Reported whatever state the stream is in, and never fatal here: it is Telnyx's news.
        payload = message.get("payload")
        payload = payload if isinstance(payload, dict) else {}
        code = payload.get("code")
        if isinstance(code, str) and code.isascii() and code.isdigit():
            code = int(code)
        title, detail = payload.get("title"), payload.get("detail")
        return StreamError(
            code if type(code) is int else 0,
            title[:200] if isinstance(title, str) else "",
            detail[:500] if isinstance(detail, str) else "",
        )

    def _stop(self, message: Mapping[str, Any]) -> list[TelnyxEvent]:
        # Whatever it holds, a stop ends the call: that is the right outcome either way.
        events: list[TelnyxEvent] = []
        for reorder in self._tracks.values():
            events.extend(_audible(reorder.flush()))
        self.state = StreamState.STOPPED
        sequence = message.get("sequence_number")
        number = sequence if type(sequence) is int else 0
        if isinstance(sequence, str) and sequence.isascii() and sequence.isdigit():
            number = int(sequence)
        events.append(Stop(number, *loose_texts(message, "stop", ("call_control_id", "user_id"))))
        return events

    # -- outbound ------------------------------------------------------------------------------

    def media_message(self, payload: bytes) -> str:
        """Audio for Telnyx to play, in the call's bidirectional codec (set to the start's)."""
        return media_message(payload)

    def mark_message(self, name: str) -> str:
        return mark_message(name)

    def clear_message(self) -> str:
        return clear_message()


def _audible(items: list[Media | ProtocolWarning]) -> list[TelnyxEvent]:
    """Media with no audio becomes a warning (it still took its place in the chunk order)."""
    out: list[TelnyxEvent] = []
    for item in items:
        if isinstance(item, Media) and not item.payload:
            out.append(ProtocolWarning("empty_payload", f"media chunk {item.chunk} has no audio"))
        else:
            out.append(item)
    return out


def media_message(payload: bytes) -> str:
    """`{"event":"media","media":{"payload":...}}`: an RTP payload (no RTP header) of 20 ms to
    30 s in the call's `stream_bidirectional_codec`."""
    return (
        '{"event":"media","media":{"payload":"'
        + binascii.b2a_base64(payload, newline=False).decode()
        + '"}}'
    )


def mark_message(name: str) -> str:
    """Ask Telnyx to send `mark` `name` back once the audio sent before it has played."""
    return f'{{"event":"mark","mark":{{"name":{json.dumps(name)}}}}}'


def clear_message() -> str:
    """Stop what is playing and drop the queue; Telnyx then returns every queued mark."""
    return '{"event":"clear"}'

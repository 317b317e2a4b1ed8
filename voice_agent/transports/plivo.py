"""Plivo Audio Streams (bidirectional) as a sans-I/O codec: Plivo's JSON text messages in, typed
events out, and the `playAudio` / `checkpoint` / `clearAudio` messages Plivo takes back.

Shaped like `voice_agent.transports.twilio`, so its adapter (gateways/carriers.py) reads like
Twilio's:
`checkpoint` is Twilio's `mark` and its answer `playedStream` comes out as a `Mark` event;
`clearAudio` is `clear`.

What this follows (read from the stored copies of Plivo's pages; none shows a date or version):

* "Stream Event Protocol", https://plivo.com/docs/voice/audio-streaming/audio-streaming: the
  messages from Plivo (start, media, dtmf, playedStream, clearedAudio) and to it (playAudio,
  checkpoint, clearAudio, sendDTMF); the `start` example with `sequenceNumber`, `start.callId`,
  `start.streamId`, `start.accountId`, `start.tracks`, `start.mediaFormat` {encoding,
  sampleRate} and a top-level `extra_headers` string ("userId=12345;sessionId=abc-xyz").
* "Audio Streaming Protocol Reference", https://www.plivo.com/docs/voice-agents/
  audio-streaming/concepts/audio-streaming-reference: the `media` example (`sequenceNumber` a
  number, top-level `streamId`, `media.track`, `media.timestamp` a string of Unix
  milliseconds, `media.chunk` a number, `media.payload`, and `extra_headers` again).
* The XML element: https://docs.plivo.com/docs/voice/xml/audiostream and
  https://docs.plivo.com/docs/voice/xml/audio-streaming (attributes `bidirectional`,
  `audioTrack`, `streamTimeout`, `statusCallbackUrl`, `statusCallbackMethod`, `contentType`
  audio/x-l16;rate=8000 | audio/x-l16;rate=16000 | audio/x-mulaw;rate=8000, `extraHeaders`,
  `keepCallAlive`; the WebSocket URL is the element's text).
* The events to Plivo: .../audiostream/stream-events-to-plivo/play-audio-event (`playAudio`,
  `media.contentType` audio/x-l16 | audio/x-mulaw, `media.sampleRate` 8000 | 16000 for l16 and
  8000 for mulaw, `media.payload`), .../checkpoint-event (`checkpoint` with `streamId` and
  `name`; Plivo answers `playedStream` with the same `name` once the audio queued before it
  has played), .../clear-audio-stream (`clearAudio` with `streamId`; the answer, per
  https://support.plivo.com/hc/en-us/articles/32800291247001, is
  `{"sequenceNumber": 0, "event": "clearedAudio", "streamId": ...}`); `sendDTMF`, listed with
  them on the Stream Event Protocol page: `{"event": "sendDTMF", "dtmf": "12#"}`, Plivo playing
  the keys into the call (the shape Plivo's own agent-transport library sends; no streamId).
* https://plivo.com/docs/voice/audio-streaming/best-practices and .../overview-doc: the stream's
  lifecycle (StartStream / StopStream / DroppedStream) goes to `statusCallbackUrl`, not the
  socket; "When the call ends or streaming stops, the WebSocket connection closes."

Connect a call (the answer URL's XML):

    <?xml version="1.0" encoding="UTF-8"?>
    <Response>
      <Stream bidirectional="true" keepCallAlive="true" audioTrack="inbound"
              contentType="audio/x-mulaw;rate=8000"
              extraHeaders="agent=booking,customer=12345">wss://HOST/plivo</Stream>
    </Response>

Agent selection: `extraHeaders` comes back as `extra_headers` in `start` (the documented field
name); its `agent` names the agent, every other key is an agent arg (`Start.agent`,
`Start.agent_args`), as twilio.Start does. The XML reference allows only [A-Za-z0-9] in it (512
bytes at most), so agent names and arg values there must be alphanumeric.

Decisions, and what the documents leave open:

* `extra_headers`' format: the XML and API pages give `test1=12,test2=123`, the event pages
  show `userId=12345;sessionId=abc-xyz`, and Plivo-compatible carriers send `"{}"`; all three
  are read (`,` or `;` between pairs, or a JSON object in the string), so is an object.
* No `stop` event is documented on the socket: the call's end is the WebSocket closing, so an
  endpoint must treat a close as the hang-up. A `stop` message (which Plivo's own
  agent-transport library handles) is still taken as `Stop`.
* The checkpoint answer is `playedStream` in the reference pages and `played` in a support
  article (https://support.plivo.com/hc/en-us/articles/32800564168345); both are taken as
  `Mark`. `playedStream` "will only be emitted if the preceding events were played
  successfully": unlike Twilio's marks, checkpoints dropped by `clearAudio` may never come back,
  so a caller of this codec must not wait for them after a clear.
* `sequenceNumber` is read but not checked for gaps: the documented `clearedAudio` carries 0.
  `streamId` is checked when present (the reference puts it on media; the dtmf and
  playedStream examples of Plivo-compatible peers omit it). Chunks arrive in order over the
  one TCP connection and are passed on as they come.
* `sampleRate` is a number in the playAudio page and a string ("8000") in the XML page's
  example; this sends the number and reads either. The L16 byte order is not stated; it is
  taken as little-endian (Plivo's own agent-transport library decodes and encodes it so), this
  server's pcm16. Plivo asks not to switch codecs between playAudio events: the stream's
  encoders send the start's format.
* `keepCallAlive`: the XML reference says later XML elements run only after the stream
  disconnects; the overview says the call ends when streaming stops if it is false. With it
  true and nothing after `<Stream>`, closing the socket ends the call.
* Order enforced: exactly one `start` first, then the rest; media, dtmf, playedStream and
  clearedAudio before it are errors (Plivo sends start "immediately when the WebSocket
  connection is established", and TCP keeps order); a `stop` before it still ends the call.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from voice_agent.transports.errors import (
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
)
from voice_agent.transports.json_fields import json_object as _object
from voice_agent.transports.json_fields import json_text as _text
from voice_agent.transports.json_fields import malformed as _malformed
from voice_agent.transports.json_stream import JsonMediaStream
from voice_agent.transports.state import StreamState

MULAW = "audio/x-mulaw"
L16 = "audio/x-l16"
# contentType -> (this server's CarrierFormat encoding, the sample rates Plivo takes for it).
CONTENT_TYPES: dict[str, tuple[str, tuple[int, ...]]] = {
    MULAW: ("mulaw", (8000,)),
    L16: ("pcm16", (8000, 16000)),
}
INBOUND_TRACK = "inbound"
# 200 ms of 16 kHz L16 (400 ms of 8 kHz L16, 800 ms of mu-law) in one media message.
MAX_MEDIA_PAYLOAD_BYTES = 6400
# Every media message repeats extra_headers (up to 512 bytes) besides the payload.
MAX_MESSAGE_CHARS = 16_384
# For the server's `websockets` max_size: above the codec's own limit even for non-ASCII text.
WEBSOCKET_MAX_SIZE = 4 * MAX_MESSAGE_CHARS
MAX_EXTRA_HEADERS = 32  # key=value pairs read from extra_headers (512 bytes hold fewer)
DTMF_DIGITS = frozenset("0123456789*#ABCD")
AGENT_HEADER = "agent"


@dataclass(frozen=True, slots=True)
class MediaFormat:
    encoding: str  # as Plivo sent it: "audio/x-mulaw" or "audio/x-l16"
    sample_rate: int

    @property
    def content_type(self) -> str:
        """The `contentType` of playAudio for this format: the encoding without parameters."""
        return self.encoding.split(";", 1)[0].strip().lower()

    @property
    def carrier_encoding(self) -> str:
        """This server's name for it: "mulaw" or "pcm16" (little-endian)."""
        return CONTENT_TYPES[self.content_type][0]

    @property
    def bytes_per_ms(self) -> float:
        return self.sample_rate * (2 if self.carrier_encoding == "pcm16" else 1) / 1000


@dataclass(frozen=True, slots=True)
class Start:
    sequence: int
    stream_id: str
    call_id: str
    account_id: str
    tracks: tuple[str, ...]
    media_format: MediaFormat
    extra_headers: dict[str, str] = field(default_factory=dict)

    @property
    def agent(self) -> str | None:
        """The agent the `agent` key of the XML's `extraHeaders` names, if any."""
        return self.extra_headers.get(AGENT_HEADER)

    @property
    def agent_args(self) -> dict[str, str]:
        """Every other extra header: the agent's args."""
        return {k: v for k, v in self.extra_headers.items() if k != AGENT_HEADER}


@dataclass(slots=True)
class Media:
    sequence: int
    chunk: int
    timestamp_ms: int  # Unix milliseconds, as Plivo stamps it
    track: str
    payload: bytes  # raw audio in the start's media format, base64-decoded


@dataclass(frozen=True, slots=True)
class Dtmf:
    sequence: int
    digit: str
    track: str = ""


@dataclass(frozen=True, slots=True)
class Mark:
    """`playedStream`: the audio sent before the checkpoint `name` has played to the caller."""

    sequence: int
    name: str


@dataclass(frozen=True, slots=True)
class Cleared:
    """`clearedAudio`: Plivo dropped the audio it had queued (checkpoints in it may not return)."""

    sequence: int


@dataclass(frozen=True, slots=True)
class Stop:
    """A `stop` message (not documented: Plivo ends a stream by closing the socket)."""

    sequence: int


PlivoEvent = Start | Media | Dtmf | Mark | Cleared | Stop | ProtocolWarning


def _integer(parent: Mapping[str, Any], key: str, path: str) -> int:
    # Plivo sends numbers (sequenceNumber, chunk) and digit strings (timestamp, at times
    # sampleRate); both are taken.
    value = parent.get(key)
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if value is None:
        raise _malformed(f"{path} is missing")
    raise _malformed(f"{path} is not a non-negative integer (got {json.dumps(value)[:40]})")


def _sequence(message: Mapping[str, Any]) -> int:
    """sequenceNumber if it is there (0 otherwise: Plivo's own clearedAudio example has 0)."""
    if message.get("sequenceNumber") is None:
        return 0
    return _integer(message, "sequenceNumber", "sequenceNumber")


def parse_extra_headers(value: object) -> dict[str, str]:
    """`extra_headers` as the start carries it: "a=1,b=2", "a=1;b=2", a JSON object in a
    string, or an object. Raises ProtocolError naming the field for anything else."""
    if value is None or value == "":
        return {}
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            raise _malformed("extra_headers is not a valid JSON object") from None
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, str):
        pairs = []
        for part in value.replace(";", ",").split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, item = part.partition("=")
            if not sep or not key.strip():
                raise _malformed(f"extra_headers entry {part[:40]!r} is not key=value")
            pairs.append((key.strip(), item.strip()))
    else:
        raise _malformed("extra_headers is not a string or an object")
    if len(pairs) > MAX_EXTRA_HEADERS:
        raise _malformed(f"extra_headers has {len(pairs)} entries, more than {MAX_EXTRA_HEADERS}")
    headers: dict[str, str] = {}
    for key, item in pairs:
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise _malformed(f"extra_headers.{str(key)[:40]} is not a string")
        headers[str(key)] = str(item)
    return headers


class PlivoStream(JsonMediaStream[PlivoEvent]):
    """One Audio Stream WebSocket's inbound side: feed it each text message, get events back.

    Order enforced: exactly one `start` first, then `media`, `dtmf`, `playedStream`,
    `clearedAudio`. Fatal problems raise `ProtocolError` (close the socket with its code and
    `close_reason`); harmless ones come back as a `ProtocolWarning` event in the list. Once
    `start` is in, `media_message` / `mark_message` / `clear_message` address this stream.
    """

    PROTOCOL = "Plivo Audio Stream"

    def __init__(
        self,
        *,
        max_message_chars: int = MAX_MESSAGE_CHARS,
        max_payload_bytes: int = MAX_MEDIA_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(max_message_chars=max_message_chars, max_payload_bytes=max_payload_bytes)
        self.start: Start | None = None
        self._stream_id = ""
        self._media_prefix = ""

    @property
    def stream_id(self) -> str:
        if self.start is None:
            raise RuntimeError("the stream has not started: no streamId yet")
        return self.start.stream_id

    # -- inbound -------------------------------------------------------------------------------

    def media_payload(self, text: str) -> bytes | None:
        """The audio of `text` when it is a well-formed inbound-track media message of this
        started stream: no event, no list. None for anything else, untouched: hand that message
        to `receive`, which handles it and explains any problem."""
        if len(text) > self.max_message_chars or self.state is not StreamState.STARTED:
            return None
        try:
            message = orjson.loads(text)
            if message["event"] != "media":
                return None
            if message.get("streamId", self._stream_id) != self._stream_id:
                return None
            media = message["media"]
            payload, chunk, timestamp = media["payload"], media["chunk"], media["timestamp"]
            if (
                media["track"] != INBOUND_TRACK
                or not (
                    (chunk.__class__ is int and chunk >= 0)
                    or (chunk.__class__ is str and chunk.isascii() and chunk.isdigit())
                )
                or not (timestamp.__class__ is str and timestamp.isascii() and timestamp.isdigit())
                or not 0 < len(payload) <= self._max_payload_chars
            ):
                return None
            sequence = message.get("sequenceNumber")
            if sequence is not None and not (sequence.__class__ is int and sequence >= 0):
                return None
            data = binascii.a2b_base64(payload, strict_mode=True)
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
            return None
        return data if 0 < len(data) <= self.max_payload_bytes else None

    def _event(self, event: str, message: Mapping[str, Any]) -> list[PlivoEvent] | None:
        if event == "start":
            return [self._start(message)]
        if event == "dtmf":
            return self._dtmf(message)
        if event in ("playedStream", "played"):
            return self._played(message, event)
        if event == "clearedAudio":
            self._require_started(event)
            self._check_stream(message)
            return [Cleared(_sequence(message))]
        if event == "stop":
            self.state = StreamState.STOPPED
            sequence = message.get("sequenceNumber")
            return [Stop(sequence if type(sequence) is int and sequence >= 0 else 0)]
        return None

    def _check_stream(self, message: Mapping[str, Any]) -> None:
        stream_id = message.get("streamId")
        if stream_id is not None and stream_id != self._stream_id:
            raise ProtocolError(
                PROTOCOL_ERROR,
                f"streamId {str(stream_id)[:40]!r} is not this stream's {self._stream_id!r}",
                kind="wrong_stream",
            )

    def _media(self, message: Mapping[str, Any]) -> list[PlivoEvent]:
        self._require_started("media")
        self._check_stream(message)
        sequence = _sequence(message)
        media = _object(message, "media", "media")
        data = self._payload(media)
        chunk = _integer(media, "chunk", "media.chunk")
        timestamp = _integer(media, "timestamp", "media.timestamp")
        track = _text(media, "track", "media.track")
        if not data:
            return [ProtocolWarning("empty_payload", f"media chunk {chunk} has no audio")]
        return [Media(sequence, chunk, timestamp, track, data)]

    def _start(self, message: Mapping[str, Any]) -> Start:
        if self.state is StreamState.STARTED:
            raise ProtocolError(PROTOCOL_ERROR, "second start message", kind="out_of_order")
        sequence = _sequence(message)
        start = _object(message, "start", "start")
        stream_id = _text(start, "streamId", "start.streamId")
        call_id = _text(start, "callId", "start.callId")
        account_id = start.get("accountId", "")
        if not isinstance(account_id, str):
            raise _malformed("start.accountId is not a string")
        tracks = start.get("tracks", [])
        if not isinstance(tracks, list) or not all(isinstance(t, str) for t in tracks):
            raise _malformed("start.tracks is not a list of strings")
        fmt = _object(start, "mediaFormat", "start.mediaFormat")
        media_format = MediaFormat(
            _text(fmt, "encoding", "start.mediaFormat.encoding"),
            _integer(fmt, "sampleRate", "start.mediaFormat.sampleRate"),
        )
        known = CONTENT_TYPES.get(media_format.content_type)
        if known is None or media_format.sample_rate not in known[1]:
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"mediaFormat {media_format.encoding[:30]} {media_format.sample_rate} Hz is not"
                f" {MULAW} 8000 or {L16} 8000/16000 Hz",
                kind="unsupported_media_format",
            )
        # The documented place is beside "start"; inside it is read too, should a peer put it there.
        raw_headers = message.get("extra_headers", start.get("extra_headers"))
        self.start = Start(
            sequence=sequence,
            stream_id=stream_id,
            call_id=call_id,
            account_id=account_id,
            tracks=tuple(tracks),
            media_format=media_format,
            extra_headers=parse_extra_headers(raw_headers),
        )
        self.state = StreamState.STARTED
        self._stream_id = stream_id
        self._media_prefix = (
            f'{{"event":"playAudio","media":{{"contentType":"{media_format.content_type}",'
            f'"sampleRate":{media_format.sample_rate},"payload":"'
        )
        return self.start

    def _dtmf(self, message: Mapping[str, Any]) -> list[PlivoEvent]:
        self._require_started("dtmf")
        self._check_stream(message)
        dtmf = _object(message, "dtmf", "dtmf")
        digit = _text(dtmf, "digit", "dtmf.digit")
        track = dtmf.get("track")
        if digit not in DTMF_DIGITS:
            return [ProtocolWarning("invalid_dtmf", f"dtmf.digit {digit[:10]!r} ignored")]
        return [Dtmf(_sequence(message), digit, track if isinstance(track, str) else "")]

    def _played(self, message: Mapping[str, Any], event: str) -> list[PlivoEvent]:
        self._require_started(event)
        self._check_stream(message)
        return [Mark(_sequence(message), _text(message, "name", "name"))]

    # -- outbound ------------------------------------------------------------------------------

    def media_message(self, audio: bytes) -> str:
        """`playAudio` for this stream, in the start's format, with the JSON around it built
        once."""
        if not self._media_prefix:
            raise RuntimeError("the stream has not started: no media format yet")
        return self._media_prefix + binascii.b2a_base64(audio, newline=False).decode() + '"}}'

    def mark_message(self, name: str) -> str:
        """`checkpoint` `name`: Plivo answers `playedStream` once the audio before it played."""
        return checkpoint_message(self.stream_id, name)

    def clear_message(self) -> str:
        """`clearAudio`: Plivo drops its queued audio and answers `clearedAudio`."""
        return clear_audio_message(self.stream_id)


def play_audio_message(audio: bytes, content_type: str = MULAW, sample_rate: int = 8000) -> str:
    """`{"event":"playAudio","media":{"contentType":...,"sampleRate":...,"payload":...}}`."""
    known = CONTENT_TYPES.get(content_type)
    if known is None or sample_rate not in known[1]:
        raise ValueError(f"Plivo does not take {content_type} at {sample_rate} Hz")
    return (
        f'{{"event":"playAudio","media":{{"contentType":"{content_type}",'
        f'"sampleRate":{sample_rate},"payload":"'
        + binascii.b2a_base64(audio, newline=False).decode()
        + '"}}'
    )


def checkpoint_message(stream_id: str, name: str) -> str:
    sid, label = json.dumps(stream_id), json.dumps(name)
    return f'{{"event":"checkpoint","streamId":{sid},"name":{label}}}'


def clear_audio_message(stream_id: str) -> str:
    return f'{{"event":"clearAudio","streamId":{json.dumps(stream_id)}}}'


def send_dtmf_message(digits: str) -> str:
    """`sendDTMF`: Plivo plays `digits` (0-9, *, #, A-D) into the call as keypad tones."""
    if not digits or not set(digits) <= DTMF_DIGITS:
        raise ValueError(f"Plivo sends only the keys 0-9, *, # and A-D, not {digits!r}")
    return f'{{"event":"sendDTMF","dtmf":{json.dumps(digits)}}}'

"""Twilio Media Streams (bidirectional) as a sans-I/O codec: Twilio's JSON text messages in,
typed events out, and the `media` / `mark` / `clear` messages Twilio takes back."""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson

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

ENCODING = "audio/x-mulaw"
SAMPLE_RATE = 8000
CHANNELS = 1
FRAME_BYTES = 160  # 20 ms of 8 kHz mu-law, what Twilio sends in every media message
# Twilio sends 160 bytes; up to ten frames in one message is still plausible for a
# Twilio-compatible peer that batches, anything beyond is not a phone line.
MAX_MEDIA_PAYLOAD_BYTES = 1600
MAX_MESSAGE_CHARS = 16_384
# For the server's `websockets` max_size: above the codec's own limit even for non-ASCII text, so
# the codec's clearer 1009 reason is the one a peer normally sees.
WEBSOCKET_MAX_SIZE = 4 * MAX_MESSAGE_CHARS
DTMF_DIGITS = frozenset("0123456789*#ABCD")


@dataclass(frozen=True, slots=True)
class MediaFormat:
    encoding: str
    sample_rate: int
    channels: int


@dataclass(frozen=True, slots=True)
class Connected:
    protocol: str
    version: str


@dataclass(frozen=True, slots=True)
class Start(AgentInParameters):
    sequence: int
    stream_sid: str
    call_sid: str
    account_sid: str
    tracks: tuple[str, ...]
    media_format: MediaFormat
    custom_parameters: dict[str, str] = field(default_factory=dict)

    @property
    def call_id(self) -> str:
        return self.call_sid


# Not frozen: a frozen dataclass sets each field through object.__setattr__, which made
# building one a fifth of the cost of parsing a media message (50 of them a second per call).
@dataclass(slots=True)
class Media:
    sequence: int
    chunk: int
    timestamp_ms: int
    track: str
    payload: bytes  # 8 kHz mu-law, base64-decoded


@dataclass(frozen=True, slots=True)
class Dtmf:
    sequence: int
    digit: str
    track: str


@dataclass(frozen=True, slots=True)
class Mark:
    """Twilio finished playing (or a `clear` dropped) the audio sent before the mark `name`."""

    sequence: int
    name: str


@dataclass(frozen=True, slots=True)
class Stop:
    """The stream ended: the caller hung up, or the call left the `<Connect><Stream>`."""

    sequence: int
    account_sid: str
    call_sid: str


TwilioEvent = Connected | Start | Media | Dtmf | Mark | Stop | ProtocolWarning


def _integer(parent: Mapping[str, Any], key: str, path: str) -> int:
    # Twilio sends numbers as strings ("sequenceNumber": "2"); plain integers are taken as well.
    value = parent.get(key)
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if value is None:
        raise _malformed(f"{path} is missing")
    raise _malformed(f"{path} is not an integer (got {json.dumps(value)[:40]})")


class TwilioStream(JsonMediaStream[TwilioEvent]):
    """One Media Stream's inbound side: feed it each text message, get events back.

    Order enforced: an optional `connected`, then exactly one `start`, then `media`, `dtmf`,
    `mark` and finally `stop`. Fatal problems raise `ProtocolError` (close the socket with its
    code and `close_reason`); harmless ones come back as a `ProtocolWarning` event in the list.
    Once `start` is in, `media_message` / `mark_message` / `clear_message` address this stream.
    """

    PROTOCOL = "Twilio Media Streams"

    def __init__(
        self,
        *,
        max_message_chars: int = MAX_MESSAGE_CHARS,
        max_payload_bytes: int = MAX_MEDIA_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(max_message_chars=max_message_chars, max_payload_bytes=max_payload_bytes)
        self.start: Start | None = None
        self._last_sequence = 0  # set by start
        self._media_prefix = ""
        self._stream_sid = ""

    @property
    def stream_sid(self) -> str:
        if self.start is None:
            raise RuntimeError("the stream has not started: no streamSid yet")
        return self.start.stream_sid

    # -- inbound -------------------------------------------------------------------------------

    def media_payload(self, text: str) -> bytes | None:
        """The audio of `text` when it is a well-formed, in-order media message of this started
        stream (50 a second per call: this path makes no event and no list); None for anything
        else, untouched: hand that message to `receive`, which handles it and explains any
        problem."""
        if len(text) > self.max_message_chars:
            return None
        try:
            message = orjson.loads(text)
            if message["event"] != "media":
                return None
            return self._media_audio(message)
        except (ValueError, KeyError, TypeError):
            return None

    def _event(self, event: str, message: Mapping[str, Any]) -> list[TwilioEvent] | None:
        if event == "connected":
            return [self._connected(message)]
        if event == "start":
            return self._start(message)
        if event == "dtmf":
            return self._dtmf(message)
        if event == "mark":
            return self._mark(message)
        if event == "stop":
            return self._stop(message)
        return None

    def _sequenced(self, message: Mapping[str, Any], event: str) -> tuple[int, list[TwilioEvent]]:
        """The message's sequenceNumber, checked against its streamSid and the previous one."""
        sequence = _integer(message, "sequenceNumber", "sequenceNumber")
        sid = message.get("streamSid")
        if sid != self._stream_sid:
            if sid is None:
                raise _malformed(f"{event} message has no streamSid")
            raise ProtocolError(
                PROTOCOL_ERROR,
                f"streamSid {str(sid)[:40]!r} is not this stream's {self._stream_sid!r}",
                kind="wrong_stream",
            )
        warnings: list[TwilioEvent] = []
        last = self._last_sequence
        if sequence != last + 1:
            # TCP keeps order, so a gap means Twilio dropped messages; the call can go on.
            what = f"{sequence - last - 1} missing" if sequence > last else "out of order"
            warnings.append(
                ProtocolWarning("sequence_gap", f"sequenceNumber {sequence} after {last}: {what}")
            )
        self._last_sequence = max(last, sequence)
        return sequence, warnings

    def _media(self, message: Mapping[str, Any]) -> list[TwilioEvent]:
        audio = self._media_audio(message)
        if audio is None:
            return self._media_checked(message)
        media = message["media"]
        chunk, timestamp = int(media["chunk"]), int(media["timestamp"])
        return [Media(self._last_sequence, chunk, timestamp, media["track"], audio)]

    def _media_audio(self, message: Mapping[str, Any]) -> bytes | None:
        """The common case in one pass with no helper calls: the payload of an in-order media
        message, or None for anything unusual, which takes the checked path that gives the
        precise error. Changes nothing unless it returns audio."""
        try:
            media = message["media"]
            payload = media["payload"]
            sequence = message["sequenceNumber"]
            chunk = media["chunk"]
            timestamp = media["timestamp"]
            track = media["track"]
            if (
                self.state is StreamState.STARTED
                and message["streamSid"] == self._stream_sid
                and sequence.isdigit()
                and chunk.isdigit()
                and timestamp.isdigit()
                and sequence.isascii()
                and chunk.isascii()
                and timestamp.isascii()
                and track.__class__ is str
                and track
                and 0 < len(payload) <= self._max_payload_chars
            ):
                data = binascii.a2b_base64(payload, strict_mode=True)
                number = int(sequence)
                if number == self._last_sequence + 1 and 0 < len(data) <= self.max_payload_bytes:
                    self._last_sequence = number
                    return data
        except (KeyError, TypeError, AttributeError, ValueError, binascii.Error):
            pass
        return None

    def _media_checked(self, message: Mapping[str, Any]) -> list[TwilioEvent]:
        self._require_started("media")
        sequence, events = self._sequenced(message, "media")
        media = _object(message, "media", "media")
        data = self._payload(media)
        chunk = _integer(media, "chunk", "media.chunk")
        timestamp = _integer(media, "timestamp", "media.timestamp")
        track = _text(media, "track", "media.track")
        if not data:
            events.append(ProtocolWarning("empty_payload", f"media chunk {chunk} has no audio"))
            return events
        events.append(Media(sequence, chunk, timestamp, track, data))
        return events

    def _payload_limit_note(self) -> str:
        return f"{self.max_payload_bytes // 8} ms of 8 kHz mu-law"

    def _connected(self, message: Mapping[str, Any]) -> Connected:
        if self.state is not StreamState.NEW:
            raise ProtocolError(
                PROTOCOL_ERROR, f"connected message after {self.state.value}", kind="out_of_order"
            )
        self.state = StreamState.CONNECTED
        # protocol and version are informative only; Twilio has only ever sent "Call" / "1.0.0".
        protocol = message.get("protocol")
        version = message.get("version")
        return Connected(
            protocol if isinstance(protocol, str) else "",
            version if isinstance(version, str) else "",
        )

    def _start(self, message: Mapping[str, Any]) -> list[TwilioEvent]:
        if self.state is StreamState.STARTED:
            raise ProtocolError(PROTOCOL_ERROR, "second start message", kind="out_of_order")
        sequence = _integer(message, "sequenceNumber", "sequenceNumber")
        start = _object(message, "start", "start")
        stream_sid = _text(start, "streamSid", "start.streamSid")
        call_sid = _text(start, "callSid", "start.callSid")
        account_sid = _text(start, "accountSid", "start.accountSid")
        tracks = start.get("tracks")
        if not isinstance(tracks, list) or not all(isinstance(t, str) for t in tracks):
            raise _malformed("start.tracks is not a list of strings")
        params = start.get("customParameters", {})
        if not isinstance(params, dict):
            raise _malformed("start.customParameters is not an object")
        for key, value in params.items():
            if not isinstance(value, str):
                raise _malformed(f"start.customParameters.{key[:40]} is not a string")
        fmt = _object(start, "mediaFormat", "start.mediaFormat")
        media_format = MediaFormat(
            _text(fmt, "encoding", "start.mediaFormat.encoding"),
            _integer(fmt, "sampleRate", "start.mediaFormat.sampleRate"),
            _integer(fmt, "channels", "start.mediaFormat.channels"),
        )
        if media_format != MediaFormat(ENCODING, SAMPLE_RATE, CHANNELS):
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"mediaFormat {media_format.encoding} {media_format.sample_rate} Hz "
                f"x{media_format.channels} is not {ENCODING} {SAMPLE_RATE} Hz mono",
                kind="unsupported_media_format",
            )
        self.start = Start(
            sequence=sequence,
            stream_sid=stream_sid,
            call_sid=call_sid,
            account_sid=account_sid,
            tracks=tuple(tracks),
            media_format=media_format,
            custom_parameters=dict(params),
        )
        self.state = StreamState.STARTED
        self._stream_sid = stream_sid
        self._last_sequence = sequence
        self._media_prefix = _media_prefix(stream_sid)
        return [self.start]

    def _dtmf(self, message: Mapping[str, Any]) -> list[TwilioEvent]:
        self._require_started("dtmf")
        sequence, events = self._sequenced(message, "dtmf")
        dtmf = _object(message, "dtmf", "dtmf")
        digit = _text(dtmf, "digit", "dtmf.digit")
        track = _text(dtmf, "track", "dtmf.track")
        if digit not in DTMF_DIGITS:
            events.append(ProtocolWarning("invalid_dtmf", f"dtmf.digit {digit[:10]!r} ignored"))
        else:
            events.append(Dtmf(sequence, digit, track))
        return events

    def _mark(self, message: Mapping[str, Any]) -> list[TwilioEvent]:
        self._require_started("mark")
        sequence, events = self._sequenced(message, "mark")
        mark = _object(message, "mark", "mark")
        events.append(Mark(sequence, _text(mark, "name", "mark.name")))
        return events

    def _stop(self, message: Mapping[str, Any]) -> list[TwilioEvent]:
        if self.state is not StreamState.STARTED:
            # The caller can hang up before the stream starts: there is nothing to check it
            # against, and ending the call is the right outcome whatever it holds.
            self.state = StreamState.STOPPED
            sequence = message.get("sequenceNumber")
            number = int(sequence) if isinstance(sequence, str) and sequence.isdecimal() else 0
            return [Stop(number, *loose_texts(message, "stop", ("accountSid", "callSid")))]
        sequence, events = self._sequenced(message, "stop")
        stop = _object(message, "stop", "stop")
        events.append(
            Stop(
                sequence,
                _text(stop, "accountSid", "stop.accountSid"),
                _text(stop, "callSid", "stop.callSid"),
            )
        )
        self.state = StreamState.STOPPED
        return events

    # -- outbound ------------------------------------------------------------------------------

    def media_message(self, ulaw: bytes) -> str:
        """`media_message` for this stream, with the JSON around the payload built once."""
        if not self._media_prefix:
            raise RuntimeError("the stream has not started: no streamSid yet")
        return self._media_prefix + binascii.b2a_base64(ulaw, newline=False).decode() + '"}}'

    def mark_message(self, name: str) -> str:
        return mark_message(self.stream_sid, name)

    def clear_message(self) -> str:
        return clear_message(self.stream_sid)


@lru_cache(maxsize=4096)
def _media_prefix(stream_sid: str) -> str:
    return f'{{"event":"media","streamSid":{json.dumps(stream_sid)},"media":{{"payload":"'


def media_message(stream_sid: str, ulaw: bytes) -> str:
    """Audio for Twilio to play: 8 kHz mu-law without any header, any length."""
    # Base64 needs no JSON escaping, so the text around it is a constant per stream.
    return _media_prefix(stream_sid) + binascii.b2a_base64(ulaw, newline=False).decode() + '"}}'


def mark_message(stream_sid: str, name: str) -> str:
    """Ask Twilio to send `mark` `name` back once the audio sent before it has played."""
    sid, label = json.dumps(stream_sid), json.dumps(name)
    return f'{{"event":"mark","streamSid":{sid},"mark":{{"name":{label}}}}}'


def clear_message(stream_sid: str) -> str:
    """Drop the audio Twilio has queued; Twilio then returns every pending mark."""
    return f'{{"event":"clear","streamSid":{json.dumps(stream_sid)}}}'

"""Exotel's Voicebot applet (bidirectional AgentStream) as a sans-I/O codec: Exotel's JSON text
messages in, typed events out, and the `media` / `mark` / `clear` messages it takes back, the
audio cut into the chunk sizes Exotel requires.

What this follows:

* "Working with the Stream and Voicebot Applet",
  https://developer.exotel.com/docs/agentstream/stream-voicebot-applet, and "WebSocket
  protocol", https://developer.exotel.com/docs/agentstream/websocket-protocol, in their Markdown
  source (rahulkumar-exo/exotel-docs, `docs/agentstream/stream-voicebot-applet.md` and
  `websocket-protocol.md`): the event shapes both ways, the sample rates and the chunk
  rules.
* Its earlier version, the support article https://support.exotel.com/support/solutions/articles/
  3000108630-working-with-the-stream-and-voicebot-applet (the chunk rules, worded "Minimum chunk
  size: 3.2k [100ms data] / Maximum chunk size: 100k / Chunk size should always be in multiple
  of 320 bytes"), and Exotel's own samples (exotel/voice-streaming `python/app.py`,
  exotel/Agent-Stream `docs/AGENTSTREAM_WSS_PROTOCOL.md`).

The protocol (the Voicebot applet; the Stream applet is the same inbound, with no dtmf, mark
or audio back):

* Exotel is the WebSocket client and sends only TEXT, JSON objects with an `event`:
  `connected`, then `start` (`sequence_number`, `stream_sid`, and under `start`: `stream_sid`,
  `call_sid`, `account_sid`, `from`, `to`, `custom_parameters` (the applet URL's query
  parameters, at most three), `media_format` {`encoding`, `sample_rate`, `bit_rate`}), then
  `media` (`media.chunk`, `media.timestamp` in ms, `media.payload`: base64 of 16-bit mono
  little-endian PCM, about 100 ms a message), `dtmf` (`dtmf.digit`, `dtmf.duration`), `mark`
  (`mark.name`: audio sent before that mark has played) and `stop` (`stop.reason`: `stopped`
  when the applet ended, `callended` when the caller hung up).
* Back: `{"event":"media","stream_sid":...,"media":{"payload":"<base64>"}}`, whose raw audio
  must be a multiple of 320 bytes, at least 3200 and at most 100 KB;
  `{"event":"mark","stream_sid":...,"mark":{"name":...}}`, echoed when the audio before it has
  played; `{"event":"clear","stream_sid":...}`, which drops the chunks not yet started (a chunk
  that has started plays to its end, so the chunk size is the barge-in latency).
* Sample rate 8000 (default), 16000 or 24000, chosen with `?sample-rate=16000` on the applet
  URL and stated in `start.media_format.sample_rate`.
* Hang-up: `stop` with reason `callended` (and then, presumably, the close: the documents say
  only that `stop` is "sent when the stream ends"). The server ends its side by closing the
  socket (exotel/Agent-Stream: "Close the socket to hang up"): the flow moves on to the applet
  after the Voicebot (a Hangup applet, or none, ends the call).

Ambiguous in the documentation, and what this codec does:

* Numbers are strings in one page (`"sequence_number": "1"`, `"chunk": "2"`) and integers in
  the other (`"sequence_number": 1, "chunk": 2`): both are taken. The field reference lists
  every field but `event` as optional: only `start.call_sid` and a stream sid are required here,
  and sequence numbers are checked when present.
* `media_format` differs between pages and real traffic: encoding `raw`, `audio/x-raw` or
  `base64`; bit_rate `16`, `128` or `128kbps`. Only an encoding naming mu-law or A-law is
  refused (a Beta page says the default is mu-law; the pages this follows say slin).
* "3.2k [100ms data]" is 100 ms only at 16 kHz: 3200 bytes of 8 kHz 16-bit audio is 200 ms.
  The byte counts are taken as the rule. At 16 and 24 kHz the documents say nothing more; this
  codec keeps chunks whole 20 ms frames as well (multiples of 640 / 960 bytes), at least 3200
  bytes, at most 100 000.
* Whether marks pending at a `clear` are echoed (Twilio does) is not said: the endpoint must
  treat marks sent before a clear as settled by it.
* Whether Exotel limits how far ahead of playout audio may be sent is not said; nothing
  documents a buffer limit.
* Whether `sample-rate` counts as one of the three custom parameters, and whether it shows in
  `custom_parameters`, is not said: it is never taken as an agent arg.
* Outbound `stream_sid` is listed as optional; it is always sent (Pipecat's serializer sends
  `streamSid` instead, which the documents do not show).

Applet configuration (App Bazaar, the call flow's Voicebot applet):

* URL: `wss://voice.example.com/exotel?agent=concierge&lang=en` (add `&sample-rate=16000` for
  16 kHz); at most three custom parameters, 256 characters in all. `agent` chooses the agent,
  the others are its args. Or an https URL answering `{"url": "wss://..."}` per call.
* Authentication: Basic auth in the URL (`wss://<key>:<token>@voice.example.com/exotel`, sent
  as an Authorization header), or IP whitelisting through Exotel support.
* Record: optional. Next applet: a Hangup (or a Passthru) - the stream closes before it runs.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from voice_agent.audio.codec import CarrierFormat
from voice_agent.transports.errors import (
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
)
from voice_agent.transports.exotel_chunks import (
    DEFAULT_SAMPLE_RATE,
    SAMPLE_RATES,
    ChunkLimits,
    chunk_limits,
)
from voice_agent.transports.json_fields import json_object as _object
from voice_agent.transports.json_fields import loose_texts
from voice_agent.transports.json_fields import malformed as _malformed
from voice_agent.transports.json_stream import JsonMediaStream
from voice_agent.transports.state import StreamState

# Exotel sends about 100 ms a message; a second is far beyond any peer that is Exotel.
MAX_MEDIA_MS = 1000
MAX_MESSAGE_CHARS = 65_536  # a second of 24 kHz audio in base64 is 64 000 characters
# For the server's `websockets` max_size: above the codec's own limit even for non-ASCII text.
WEBSOCKET_MAX_SIZE = 4 * MAX_MESSAGE_CHARS
DTMF_DIGITS = frozenset("0123456789*#ABCD")
AGENT_PARAMETER = "agent"
SAMPLE_RATE_PARAMETER = "sample-rate"  # the applet URL's own parameter, not an agent arg
STOP_REASONS = frozenset({"stopped", "callended"})
_NOT_PCM = ("mulaw", "ulaw", "pcmu", "alaw", "pcma", "g711")


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MediaFormat:
    encoding: str
    sample_rate: int
    bit_rate: str  # informational only: the documents disagree on its unit


@dataclass(frozen=True, slots=True)
class Connected:
    custom_parameters: dict[str, str] = field(default_factory=dict)  # a Beta page puts them here


@dataclass(frozen=True, slots=True)
class Start:
    sequence: int | None
    stream_sid: str
    call_sid: str
    account_sid: str
    from_: str
    to: str
    media_format: MediaFormat
    custom_parameters: dict[str, str] = field(default_factory=dict)

    @property
    def call_id(self) -> str:
        return self.call_sid

    @property
    def sample_rate(self) -> int:
        return self.media_format.sample_rate

    @property
    def carrier(self) -> CarrierFormat:
        return CarrierFormat("pcm16", self.sample_rate)

    @property
    def agent(self) -> str | None:
        """The agent the applet URL's `agent=` parameter names, if any."""
        return self.custom_parameters.get(AGENT_PARAMETER) or None

    @property
    def agent_args(self) -> dict[str, str]:
        """Every other custom parameter but `sample-rate`: the agent's args."""
        skip = (AGENT_PARAMETER, SAMPLE_RATE_PARAMETER)
        return {k: v for k, v in self.custom_parameters.items() if k not in skip}


# Not frozen: built ten times a second per call.
@dataclass(slots=True)
class Media:
    sequence: int | None
    chunk: int | None
    timestamp_ms: int | None
    payload: bytes  # 16-bit little-endian PCM at the stream's rate, base64-decoded


@dataclass(frozen=True, slots=True)
class Dtmf:
    sequence: int | None
    digit: str
    duration_ms: int | None


@dataclass(frozen=True, slots=True)
class Mark:
    """Exotel finished playing the audio sent before the mark `name`."""

    sequence: int | None
    name: str


@dataclass(frozen=True, slots=True)
class Stop:
    """The stream ended: `callended` (the caller hung up) or `stopped` (the applet ended)."""

    sequence: int | None
    call_sid: str
    account_sid: str
    reason: str

    @property
    def caller_hung_up(self) -> bool:
        return self.reason == "callended"


ExotelEvent = Connected | Start | Media | Dtmf | Mark | Stop | ProtocolWarning


def _shown(value: object) -> str:
    return json.dumps(value, default=str)[:40]


def _text(parent: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> str:
    value = parent.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        missing = value is None
        raise _malformed(f"{path} is {'missing' if missing else 'not a non-empty string'}")
    return value


def _number(parent: Mapping[str, Any], key: str, path: str) -> int | None:
    """An optional non-negative integer, sent as a number or a string of digits."""
    value = parent.get(key)
    if value is None:
        return None
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise _malformed(f"{path} is not a non-negative integer (got {_shown(value)})")


def _parameters(value: object, path: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _malformed(f"{path} is not an object")
    params: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, str):
            params[key] = item
        elif isinstance(item, int | float) and not isinstance(item, bool):
            params[key] = str(item)  # a URL's parameter, however Exotel typed it
        else:
            raise _malformed(f"{path}.{key[:40]} is not a string")
    return params


class ExotelStream(JsonMediaStream[ExotelEvent]):
    """One Voicebot stream: feed it each text message, get events back; chunk the audio going out.

    Order enforced: an optional `connected`, then one `start`, then `media`, `dtmf`, `mark` and
    finally `stop`. Fatal problems raise `ProtocolError` (close the socket with its code and
    `close_reason`); harmless ones come back as a `ProtocolWarning` event. Once `start` is in,
    the outbound side cuts audio of any length into chunks Exotel takes (`chunk_bytes`, by
    default the smallest allowed: 3200 bytes, 200 ms at 8 kHz), holding the remainder until more
    comes or a mark or `flush_media` pads it.

    `sample_rate` is the applet URL's `sample-rate` (8000 if it has none): the rate assumed
    when `start` has no `media_format.sample_rate`; when it has one, that one is used.
    """

    PROTOCOL = "Exotel stream"

    def __init__(
        self,
        *,
        sample_rate: int = DEFAULT_SAMPLE_RATE,
        chunk_bytes: int | None = None,
        max_message_chars: int = MAX_MESSAGE_CHARS,
        max_media_ms: int = MAX_MEDIA_MS,
    ) -> None:
        chunk_limits(sample_rate)  # refuses a rate Exotel does not have
        if chunk_bytes is not None and chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes {chunk_bytes} is not positive")
        self.default_sample_rate = sample_rate
        self.requested_chunk_bytes = chunk_bytes
        self.max_media_ms = max_media_ms
        # The payload's limit is max_media_ms at the rate the start states.
        super().__init__(max_message_chars=max_message_chars, max_payload_bytes=0)
        self.connected: Connected | None = None
        self.start: Start | None = None
        self._stream_sid = ""
        self._last_sequence: int | None = None
        self._limits: ChunkLimits | None = None
        self._chunk = 0
        self._pending = bytearray()

    @property
    def stream_sid(self) -> str:
        if self.start is None:
            raise RuntimeError("the stream has not started: no stream_sid yet")
        return self.start.stream_sid

    @property
    def chunk_bytes(self) -> int:
        if not self._chunk:
            raise RuntimeError("the stream has not started: the sample rate is not known")
        return self._chunk

    # -- inbound -------------------------------------------------------------------------------

    def _event(self, event: str, message: Mapping[str, Any]) -> list[ExotelEvent] | None:
        # Exotel adds events (a Beta page describes `silence`): those are warnings.
        if event == "connected":
            return [self._connected(message)]
        if event == "start":
            return [self._start(message)]
        if event == "dtmf":
            return self._dtmf(message)
        if event == "mark":
            return self._mark(message)
        if event == "stop":
            return self._stop(message)
        return None

    def _sequenced(
        self, message: Mapping[str, Any], event: str
    ) -> tuple[int | None, list[ExotelEvent]]:
        """The message's sequence_number, and its stream_sid checked when it has one."""
        sid = message.get("stream_sid")
        if sid is not None and sid != self._stream_sid:
            raise ProtocolError(
                PROTOCOL_ERROR,
                f"stream_sid {_shown(sid)} is not this stream's {self._stream_sid!r}",
                kind="wrong_stream",
            )
        sequence = _number(message, "sequence_number", f"{event} sequence_number")
        warnings: list[ExotelEvent] = []
        last = self._last_sequence
        if sequence is not None:
            if last is not None and sequence != last + 1:
                # TCP keeps order, so a gap means Exotel dropped messages; the call goes on.
                what = f"{sequence - last - 1} missing" if sequence > last else "out of order"
                warnings.append(
                    ProtocolWarning(
                        "sequence_gap", f"sequence_number {sequence} after {last}: {what}"
                    )
                )
            self._last_sequence = sequence if last is None else max(last, sequence)
        return sequence, warnings

    def _connected(self, message: Mapping[str, Any]) -> Connected:
        if self.state is not StreamState.NEW:
            raise ProtocolError(
                PROTOCOL_ERROR, f"connected message after {self.state.value}", kind="out_of_order"
            )
        params = _parameters(message.get("custom_parameters"), "connected custom_parameters")
        self.connected = Connected(params)
        self.state = StreamState.CONNECTED
        return self.connected

    def _start(self, message: Mapping[str, Any]) -> Start:
        if self.state is StreamState.STARTED:
            raise ProtocolError(PROTOCOL_ERROR, "second start message", kind="out_of_order")
        sequence = _number(message, "sequence_number", "start sequence_number")
        start = _object(message, "start", "start")
        stream_sid = start.get("stream_sid", message.get("stream_sid"))
        if not isinstance(stream_sid, str) or not stream_sid:
            missing = stream_sid is None
            raise _malformed(
                f"start.stream_sid is {'missing' if missing else 'not a non-empty string'}"
            )
        call_sid = _text(start, "call_sid", "start.call_sid")
        account_sid = _text(start, "account_sid", "start.account_sid", required=False)
        from_ = _text(start, "from", "start.from", required=False)
        to = _text(start, "to", "start.to", required=False)
        params = _parameters(start.get("custom_parameters"), "start.custom_parameters")
        if not params and self.connected is not None:
            params = dict(self.connected.custom_parameters)
        media_format = self._media_format(start.get("media_format"))
        self.start = Start(
            sequence=sequence,
            stream_sid=stream_sid,
            call_sid=call_sid,
            account_sid=account_sid,
            from_=from_,
            to=to,
            media_format=media_format,
            custom_parameters=params,
        )
        self.state = StreamState.STARTED
        self._stream_sid = stream_sid
        self._last_sequence = sequence
        rate = media_format.sample_rate
        self._limit_payload(rate * 2 * self.max_media_ms // 1000)
        self._limits = limits = chunk_limits(rate)
        # The nearest size Exotel takes at the rate start states (the one asked for was chosen
        # before it was known).
        chunk = limits.round_up(self.requested_chunk_bytes or limits.min_bytes)
        self._chunk = min(chunk, limits.max_bytes)
        return self.start

    def _media_format(self, value: object) -> MediaFormat:
        if value is None:
            return MediaFormat("", self.default_sample_rate, "")
        if not isinstance(value, dict):
            raise _malformed("start.media_format is not an object")
        encoding = _text(value, "encoding", "start.media_format.encoding", required=False)
        if any(name in encoding.lower() for name in _NOT_PCM):
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"start.media_format.encoding {encoding[:40]!r} is not 16-bit linear PCM",
                kind="unsupported_media_format",
            )
        rate = _number(value, "sample_rate", "start.media_format.sample_rate")
        if rate is None:
            rate = self.default_sample_rate
        if rate not in SAMPLE_RATES:
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"start.media_format.sample_rate {rate} is not one of "
                f"{', '.join(map(str, SAMPLE_RATES))}",
                kind="unsupported_media_format",
            )
        bit_rate = value.get("bit_rate")
        return MediaFormat(encoding, rate, "" if bit_rate is None else str(bit_rate)[:40])

    def _media(self, message: Mapping[str, Any]) -> list[ExotelEvent]:
        self._require_started("media")
        sequence, events = self._sequenced(message, "media")
        media = _object(message, "media", "media")
        data = self._payload(media)
        chunk = _number(media, "chunk", "media.chunk")
        timestamp = _number(media, "timestamp", "media.timestamp")
        if not data:
            events.append(ProtocolWarning("empty_payload", f"media chunk {chunk} has no audio"))
            return events
        if len(data) & 1:
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"media.payload of {len(data)} bytes is not whole 16-bit samples",
                kind="invalid_payload",
            )
        events.append(Media(sequence, chunk, timestamp, data))
        return events

    def _payload_limit_note(self) -> str:
        return f"{self.max_media_ms} ms of 16-bit audio"

    def _dtmf(self, message: Mapping[str, Any]) -> list[ExotelEvent]:
        self._require_started("dtmf")
        sequence, events = self._sequenced(message, "dtmf")
        nested = message.get("dtmf")
        # The pages show {"dtmf": {"digit", "duration"}}; a Beta page a top-level "digit".
        fields, prefix = (nested, "dtmf.") if isinstance(nested, dict) else (message, "dtmf ")
        digit = _text(fields, "digit", f"{prefix}digit")
        duration = _number(fields, "duration", f"{prefix}duration")
        if digit not in DTMF_DIGITS:
            events.append(ProtocolWarning("invalid_dtmf", f"dtmf digit {digit[:10]!r} ignored"))
        else:
            events.append(Dtmf(sequence, digit, duration))
        return events

    def _mark(self, message: Mapping[str, Any]) -> list[ExotelEvent]:
        self._require_started("mark")
        sequence, events = self._sequenced(message, "mark")
        mark = _object(message, "mark", "mark")
        events.append(Mark(sequence, _text(mark, "name", "mark.name")))
        return events

    def _stop(self, message: Mapping[str, Any]) -> list[ExotelEvent]:
        if self.state is not StreamState.STARTED:
            # The caller can hang up before the stream starts: nothing to check it against,
            # and ending the call is the right outcome whatever it holds.
            self.state = StreamState.STOPPED
            sequence = message.get("sequence_number")
            number = sequence if type(sequence) is int else None
            fields = loose_texts(message, "stop", ("call_sid", "account_sid", "reason"))
            return [Stop(number, *fields)]
        sequence, events = self._sequenced(message, "stop")
        stop = message.get("stop")
        if stop is not None and not isinstance(stop, dict):
            raise _malformed("stop is not an object")
        stop = stop or {}
        reason = _text(stop, "reason", "stop.reason", required=False)
        if reason and reason not in STOP_REASONS:
            events.append(ProtocolWarning("unknown_reason", f"stop.reason {reason[:40]!r}"))
        events.append(
            Stop(
                sequence,
                _text(stop, "call_sid", "stop.call_sid", required=False),
                _text(stop, "account_sid", "stop.account_sid", required=False),
                reason,
            )
        )
        self.state = StreamState.STOPPED
        return events

    # -- outbound ------------------------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        """Audio held back for want of a whole chunk."""
        return len(self._pending)

    def media_messages(self, pcm: bytes) -> list[str]:
        """`pcm` (16-bit mono at the stream's rate, any length) as media messages of
        `chunk_bytes` each; the remainder waits for the next call, a mark or `flush_media`."""
        chunk = self.chunk_bytes
        pending = self._pending
        pending += pcm
        whole = len(pending) - len(pending) % chunk
        if not whole:
            return []
        sid = self.stream_sid
        out = [media_message(sid, bytes(pending[i : i + chunk])) for i in range(0, whole, chunk)]
        del pending[:whole]
        return out

    def flush_media(self) -> list[str]:
        """The held remainder as one media message, padded with silence to a size Exotel takes
        (at least 3200 bytes)."""
        if not self._pending:
            return []
        assert self._limits is not None  # chunk_bytes is set with it
        size = self._limits.round_up(len(self._pending))
        data = bytes(self._pending) + bytes(size - len(self._pending))
        self._pending.clear()
        return [media_message(self.stream_sid, data)]

    def mark_messages(self, name: str) -> list[str]:
        """What makes Exotel send `mark` `name` back once all the audio given so far has played:
        the padded remainder, then the mark."""
        return [*self.flush_media(), mark_message(self.stream_sid, name)]

    def clear_messages(self) -> list[str]:
        """Drop the held remainder and the chunks Exotel has not started playing."""
        self._pending.clear()
        return [clear_message(self.stream_sid)]


# -- builders ------------------------------------------------------------------------------------


def media_message(stream_sid: str, audio: bytes) -> str:
    """Audio for Exotel to play, as given: see `media_chunks` for the sizes it takes."""
    payload = binascii.b2a_base64(audio, newline=False).decode()
    sid = json.dumps(stream_sid)
    return f'{{"event":"media","stream_sid":{sid},"media":{{"payload":"{payload}"}}}}'


def mark_message(stream_sid: str, name: str) -> str:
    """Ask Exotel to send `mark` `name` back once the audio sent before it has played."""
    sid, label = json.dumps(stream_sid), json.dumps(name)
    return f'{{"event":"mark","stream_sid":{sid},"mark":{{"name":{label}}}}}'


def clear_message(stream_sid: str) -> str:
    """Drop the audio Exotel has queued but not started playing."""
    return f'{{"event":"clear","stream_sid":{json.dumps(stream_sid)}}}'

"""Asterisk's WebSocket channel driver (chan_websocket) as a sans-I/O codec: its TEXT control
events in, typed events out; its BINARY media checked; the commands it takes built in the
control-message form the connection uses.

What this follows, read from Asterisk's own sources (github.com/asterisk/asterisk, tags named
below) and its documentation (asterisk/documentation, docs/Configuration/Channel-Drivers/
WebSocket.md, the "WebSocket" channel driver page of docs.asterisk.org):

* `channels/chan_websocket.c` at the tags 20.16.0 (the first release, as are 21.11.0, 22.6.0
  and 23.0.0), 20.17.0, 20.18.0 and 20.19.0 and on master at f0c1c1a7b7 (after 23.4.0 /
  22.10.0 / 20.20.0), the diffs between them and 21.11.0..21.12.3;
  `channels/chan_websocket_doc.xml`, `configs/samples/chan_websocket.conf.sample`,
  `configs/samples/websocket_client.conf.sample`, `res/res_websocket_client.c` and the client
  handshake in `res/res_http_websocket.c`, on master; WebSocket.md at b7adbc41.
* Asterisk dials `WebSocket/<connection>[/<options>]`, connects as the WebSocket client to the
  `uri` of `[<connection>]` in websocket_client.conf (`connection_type = per_call_config`), adds
  the `v(name=value,...)` dial option's parameters to its query string, and sends MEDIA_START as
  its first message. Media flows as BINARY messages in the channel's format; everything else is
  a TEXT message.

Control events from Asterisk, and what differs between releases:

==========================  ==============================================================
MEDIA_START                 connection_id, channel, format, optimal_frame_size, ptime in every
                            release; channel_id since 20.17.0 / 22.7.0 / 23.1.0 (never on 21);
                            channel_variables (the WebSocket channel's variables, inherited
                            `_`/`__` ones included) in the JSON form only
DTMF_END                    digit (channel_id from 20.17.0 / 22.7.0 / 23.1.0)
MEDIA_XOFF / MEDIA_XON      the queue holds 900 frames / fell below 800 (Asterisk drops
                            messages arriving while it holds 1000)
STATUS                      answer to GET_STATUS: queue_length, xon_level, xoff_level,
                            queue_full, bulk_media, media_paused
MEDIA_BUFFERING_COMPLETED   after STOP_MEDIA_BUFFERING, with its correlation id
QUEUE_DRAINED               once after REPORT_QUEUE_DRAINED, when the queue empties
MEDIA_MARK_PROCESSED        a MARK_MEDIA reached the head of the queue: everything sent before
                            it has gone to the caller (20.18.0 / 22.8.0 / 23.2.0 and later)
ERROR                       error_text (20.18.0 / 22.8.0 / 23.2.0 and later)
==========================  ==============================================================

Also by release: 20.18.0 / 22.8.0 / 23.2.0 read the socket on the channel thread and hang up
on a frame type they do not take; 20.19.0 / 22.9.0 / 23.3.0 stopped padding a short frame with
silence (and added SET_MEDIA_DIRECTION, the `d()` option); 20.20.0 / 22.10.0 / 23.4.0 take
fragmented (CONTINUATION) messages. None of it matters to a peer that sends whole frames in
unfragmented messages, as this server does.

There is no HANGUP event: Asterisk hangs up by closing the WebSocket (code 1000, or the
channel's WebSocket hang-up cause). Commands to Asterisk: ANSWER, HANGUP, MARK_MEDIA
[correlation id], FLUSH_MEDIA, START_MEDIA_BUFFERING, STOP_MEDIA_BUFFERING [correlation id],
GET_STATUS, REPORT_QUEUE_DRAINED, PAUSE_MEDIA, CONTINUE_MEDIA (SET_MEDIA_DIRECTION, JSON only,
since 20.19.0 / 22.9.0 / 23.3.0, is not built here). An unknown command is only logged by
Asterisk: before 20.18.0 / 22.8.0 / 23.2.0, and on every 21.x, MARK_MEDIA is such a command
and no MEDIA_MARK_PROCESSED ever comes back (`MediaStart.marks_supported`).

Two control-message forms, chosen by Asterisk's `control_message_format` in
chan_websocket.conf `[global]` or the `f(json|plain-text)` dial option (20.18.0 / 22.8.0 /
23.2.0 and later; plain text before, and the default still):

* plain text: `MEDIA_START connection_id:c1 channel:WebSocket/c1/0x1 channel_id:1761245643.1
  format:ulaw optimal_frame_size:160 ptime:20`; an event's word, then `name:value` pairs
  (`error_text:` takes the rest of the line); MEDIA_MARK_PROCESSED and
  MEDIA_BUFFERING_COMPLETED carry their id as a bare word. Commands: the word, a space and the
  argument (`MARK_MEDIA m1`).
* JSON: `{"event":"MEDIA_START","connection_id":...,"channel_variables":{...}}`, every event
  with "channel_id"; commands `{"command":"MARK_MEDIA","correlation_id":"m1"}`.

Asterisk reads commands in its configured form only, so the server answers in the form of the
MEDIA_START it got (`AsteriskStream`). Asterisk ignores a TEXT message over 128 bytes, and a
JSON command it cannot parse gets an ERROR; a BINARY message over 65500 bytes closes the
socket. Media Asterisk gets must come in whole frames of optimal_frame_size bytes (without
START_MEDIA_BUFFERING it drops a message's partial frame). FLUSH_MEDIA empties the queue and
with it the marks still in it: those are never reported (chan_websocket.c, handle_command's
FLUSH_MEDIA frees every queued frame, the marks' too; unlike Twilio's `clear`).

Formats taken (`ast_format_get_name` of Asterisk's builtin codecs, main/codec_builtin.c):
ulaw and alaw at 8 kHz (160-byte frames), slin at 8 kHz (320) and slin16 at 16 kHz (640),
signed linear being Asterisk's host byte order: little-endian on x86-64 and arm64.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from voice_agent.audio.codec import CarrierFormat, Encoding
from voice_agent.transports.asterisk_commands import (
    JSON,
    PLAIN,
    ControlForm,
    answer,
    flush_media,
    get_status,
    hangup,
    mark_media,
)
from voice_agent.transports.errors import (
    MESSAGE_TOO_BIG,
    POLICY_VIOLATION,
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
)
from voice_agent.transports.json_fields import malformed as _malformed
from voice_agent.transports.state import StreamState

# MEDIA_START carries every channel variable in JSON: allow plenty, within the server's limit.
MAX_CONTROL_CHARS = 65_536
# For the server's `websockets` max_size: above the codec's own limit even for non-ASCII text,
# so the codec's clearer 1009 reason is the one a peer normally sees.
WEBSOCKET_MAX_SIZE = 4 * MAX_CONTROL_CHARS
# Asterisk sends one frame per message (20 ms); a second of audio is far beyond any peer that
# is Asterisk and still small.
MAX_MEDIA_MS = 1000
DTMF_DIGITS = frozenset("0123456789*#ABCD")

# Asterisk's QUEUE_LENGTH_XOFF_LEVEL / QUEUE_LENGTH_XON_LEVEL / QUEUE_LENGTH_MAX, in frames.
XOFF_LEVEL = 900
XON_LEVEL = 800
QUEUE_MAX = 1000

# Channel variables (JSON MEDIA_START) that choose the agent and its args, like the URL's
# `agent=` and other query parameters: `Set(__VOICE_AGENT=booking)` before Dial.
AGENT_VARIABLE = "VOICE_AGENT"
ARG_VARIABLE_PREFIX = "VOICE_AGENT_ARG_"


@dataclass(frozen=True, slots=True)
class MediaFormat:
    """One Asterisk format the server takes: its name, the carrier encoding and rate."""

    name: str
    encoding: Encoding
    sample_rate: int

    @property
    def sample_bytes(self) -> int:
        return 2 if self.encoding == "pcm16" else 1

    def frame_bytes(self, ptime_ms: int) -> int:
        return self.sample_rate * self.sample_bytes * ptime_ms // 1000


FORMATS: dict[str, MediaFormat] = {
    "ulaw": MediaFormat("ulaw", "mulaw", 8000),
    "alaw": MediaFormat("alaw", "alaw", 8000),
    "slin": MediaFormat("slin", "pcm16", 8000),
    "slin16": MediaFormat("slin16", "pcm16", 16000),
}


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MediaStart:
    """The call's media is set up; the first message of every connection."""

    form: ControlForm
    connection_id: str
    channel: str
    channel_id: str | None  # the channel's unique id; None in plain text before 20.17.0
    format: str
    optimal_frame_size: int  # bytes of one frame: send media in multiples of it
    ptime: int  # ms of one frame
    channel_variables: dict[str, str] = field(default_factory=dict)  # JSON form only

    @property
    def media(self) -> MediaFormat:
        return FORMATS[self.format]

    @property
    def carrier(self) -> CarrierFormat:
        return CarrierFormat(self.media.encoding, self.media.sample_rate)

    @property
    def marks_supported(self) -> bool | None:
        """Whether Asterisk answers MARK_MEDIA: True in JSON (both came in 20.18.0 / 22.8.0 /
        23.2.0), False in plain text without channel_id (before 20.17.0), None otherwise: plain
        text looks the same in the releases with and without marks."""
        if self.form == JSON:
            return True
        return None if self.channel_id else False

    def variable(self, name: str) -> str | None:
        """A channel variable by name, whether it was set as NAME, _NAME or __NAME (Asterisk
        lists inherited variables under the name they were set with)."""
        for key in (name, f"_{name}", f"__{name}"):
            if key in self.channel_variables:
                return self.channel_variables[key]
        return None

    @property
    def agent(self) -> str | None:
        """The agent the VOICE_AGENT channel variable names, if any."""
        return self.variable(AGENT_VARIABLE) or None

    @property
    def agent_args(self) -> dict[str, str]:
        """Args from VOICE_AGENT_ARG_<name> channel variables."""
        args: dict[str, str] = {}
        for key, value in self.channel_variables.items():
            bare = key.lstrip("_")
            if bare.startswith(ARG_VARIABLE_PREFIX) and len(bare) > len(ARG_VARIABLE_PREFIX):
                args[bare[len(ARG_VARIABLE_PREFIX) :]] = value
        return args


@dataclass(frozen=True, slots=True)
class DtmfEnd:
    digit: str
    channel_id: str | None = None


@dataclass(frozen=True, slots=True)
class MediaXoff:
    """Asterisk's queue is nearly full: send no more media until MediaXon."""

    channel_id: str | None = None


@dataclass(frozen=True, slots=True)
class MediaXon:
    channel_id: str | None = None


@dataclass(frozen=True, slots=True)
class MarkProcessed:
    """The MARK_MEDIA with correlation id `id` reached the head of Asterisk's queue: the media
    sent before it has gone out to the caller."""

    id: str
    channel_id: str | None = None


@dataclass(frozen=True, slots=True)
class BufferingCompleted:
    id: str
    channel_id: str | None = None


@dataclass(frozen=True, slots=True)
class QueueDrained:
    channel_id: str | None = None


@dataclass(frozen=True, slots=True)
class Status:
    queue_length: int
    xon_level: int
    xoff_level: int
    queue_full: bool
    bulk_media: bool
    media_paused: bool
    channel_id: str | None = None


@dataclass(frozen=True, slots=True)
class Error:
    """Asterisk refused a command (a JSON command it could not parse, one not allowed in
    passthrough mode or in the call's media direction)."""

    text: str
    channel_id: str | None = None


AsteriskEvent = (
    MediaStart
    | DtmfEnd
    | MediaXoff
    | MediaXon
    | MarkProcessed
    | BufferingCompleted
    | QueueDrained
    | Status
    | Error
)


_EVENT_NAMES: dict[type, str] = {
    MediaStart: "MEDIA_START",
    DtmfEnd: "DTMF_END",
    MediaXoff: "MEDIA_XOFF",
    MediaXon: "MEDIA_XON",
    MarkProcessed: "MEDIA_MARK_PROCESSED",
    BufferingCompleted: "MEDIA_BUFFERING_COMPLETED",
    QueueDrained: "QUEUE_DRAINED",
    Status: "STATUS",
    Error: "ERROR",
}


# -- parsing -------------------------------------------------------------------------------------


def _shown(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)[:40]


def _text(fields: Mapping[str, Any], key: str, event: str, *, required: bool = True) -> str:
    value = fields.get(key)
    if value is None:
        if required:
            raise _malformed(f"{event} has no {key}")
        return ""
    if not isinstance(value, str):
        raise _malformed(f"{event} {key} is not a string (got {_shown(value)})")
    return value


def _integer(fields: Mapping[str, Any], key: str, event: str, default: int | None = None) -> int:
    # Plain text carries every value as text; JSON has numbers.
    value = fields.get(key)
    if value is None:
        if default is None:
            raise _malformed(f"{event} has no {key}")
        return default
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise _malformed(f"{event} {key} is not a whole number (got {_shown(value)})")


def _boolean(fields: Mapping[str, Any], key: str, event: str) -> bool:
    value = fields.get(key, False)
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return value == "true"
    raise _malformed(f"{event} {key} is not true or false (got {_shown(value)})")


def _plain_fields(rest: str) -> tuple[dict[str, str], str]:
    """The `name:value` pairs of a plain-text event, and any bare words before the first pair.
    `error_text:` is free text to the end of the line (chan_websocket prints it last)."""
    fields: dict[str, str] = {}
    bare: list[str] = []
    words = rest.split()
    for index, word in enumerate(words):
        name, colon, value = word.partition(":")
        if colon and name == "error_text":
            fields[name] = " ".join([value, *words[index + 1 :]]).strip()
            break
        if colon and name and not fields.get(name):
            fields[name] = value
        elif not fields:
            bare.append(word)
    return fields, " ".join(bare)


def _parse_plain(text: str) -> tuple[str, dict[str, Any], str]:
    event, _, rest = text.partition(" ")
    fields, bare = _plain_fields(rest)
    return event, dict(fields), bare


def _parse_json(text: str) -> tuple[str, dict[str, Any], str]:
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise _malformed(f"control message is not valid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise _malformed("JSON control message is not an object")
    event = message.get("event")
    if not isinstance(event, str) or not event:
        raise _malformed('JSON control message has no "event" string')
    return event, message, ""


def _channel_variables(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _malformed("MEDIA_START channel_variables is not an object")
    variables: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(item, str):
            raise _malformed(f"MEDIA_START channel variable {key[:40]!r} is not a string")
        variables[key] = item
    return variables


def _media_start(form: ControlForm, fields: Mapping[str, Any]) -> MediaStart:
    name = _text(fields, "format", "MEDIA_START")
    media = FORMATS.get(name)
    if media is None:
        raise ProtocolError(
            UNSUPPORTED_DATA,
            f"format {name[:20]!r} is not supported: dial with c(ulaw), c(alaw), c(slin) or "
            "c(slin16)",
            kind="unsupported_media_format",
        )
    # Every release sends ptime; the documentation's example omits it. 20 ms is the default
    # packetization of all four formats.
    ptime = _integer(fields, "ptime", "MEDIA_START", default=20)
    frame = _integer(fields, "optimal_frame_size", "MEDIA_START")
    if not 10 <= ptime <= 140 or ptime % 10:
        raise _malformed(f"MEDIA_START ptime {ptime} is not 10 to 140 ms in steps of 10")
    if frame != media.frame_bytes(ptime):
        # chan_websocket computes it from the codec exactly so; anything else is a peer whose
        # media this server would frame wrongly.
        raise ProtocolError(
            UNSUPPORTED_DATA,
            f"optimal_frame_size {frame} does not fit {name} at {ptime} ms "
            f"({media.frame_bytes(ptime)} bytes; passthrough mode is not supported)",
            kind="unsupported_media_format",
        )
    channel_id = _text(fields, "channel_id", "MEDIA_START", required=False) or None
    return MediaStart(
        form=form,
        connection_id=_text(fields, "connection_id", "MEDIA_START", required=False),
        channel=_text(fields, "channel", "MEDIA_START", required=False),
        channel_id=channel_id,
        format=name,
        optimal_frame_size=frame,
        ptime=ptime,
        channel_variables=_channel_variables(fields.get("channel_variables")),
    )


def parse_control(text: str) -> AsteriskEvent | ProtocolWarning:
    """One TEXT message from Asterisk, in either form (a JSON one starts with `{`; a plain-text
    one with its event's word).

    Raises ProtocolError (with a WebSocket close code) for a message that is too long or
    malformed; an event this codec does not know, or an unusable DTMF digit, comes back as a
    ProtocolWarning: Asterisk adds events over time, and none of them must end a call.
    """
    if len(text) > MAX_CONTROL_CHARS:
        raise ProtocolError(
            MESSAGE_TOO_BIG,
            f"control message of {len(text)} characters exceeds the {MAX_CONTROL_CHARS} limit",
            kind="message_too_big",
        )
    stripped = text.strip()
    if not stripped:
        raise _malformed("empty control message")
    form: ControlForm = JSON if stripped[0] in "{[" else PLAIN
    if form == JSON:
        event, fields, bare = _parse_json(stripped)
    else:
        event, fields, bare = _parse_plain(stripped)
    channel_id = _text(fields, "channel_id", event, required=False) or None
    if event == "MEDIA_START":
        return _media_start(form, fields)
    if event == "DTMF_END":
        digit = _text(fields, "digit", event)
        if digit.upper() not in DTMF_DIGITS or len(digit) != 1:
            return ProtocolWarning("invalid_dtmf", f"DTMF_END digit {digit[:10]!r} ignored")
        return DtmfEnd(digit.upper(), channel_id)
    if event == "MEDIA_XOFF":
        return MediaXoff(channel_id)
    if event == "MEDIA_XON":
        return MediaXon(channel_id)
    if event == "MEDIA_MARK_PROCESSED":
        mark = bare if form == PLAIN else _text(fields, "correlation_id", event, required=False)
        return MarkProcessed(mark, channel_id)
    if event == "MEDIA_BUFFERING_COMPLETED":
        done = bare if form == PLAIN else _text(fields, "correlation_id", event, required=False)
        return BufferingCompleted(done, channel_id)
    if event == "QUEUE_DRAINED":
        return QueueDrained(channel_id)
    if event == "STATUS":
        return Status(
            queue_length=_integer(fields, "queue_length", event),
            xon_level=_integer(fields, "xon_level", event, default=XON_LEVEL),
            xoff_level=_integer(fields, "xoff_level", event, default=XOFF_LEVEL),
            queue_full=_boolean(fields, "queue_full", event),
            bulk_media=_boolean(fields, "bulk_media", event),
            media_paused=_boolean(fields, "media_paused", event),
            channel_id=channel_id,
        )
    if event == "ERROR":
        return Error(_text(fields, "error_text", event, required=False), channel_id)
    return ProtocolWarning("unknown_event", f"unknown event {event[:40]!r} ignored")


# -- one connection ------------------------------------------------------------------------------


class AsteriskStream:
    """One chan_websocket connection's inbound side, and its commands in the connection's form.

    The first message must be MEDIA_START (Asterisk sends it as soon as it has connected);
    media before it is dropped with a warning, any other event before it and a second
    MEDIA_START raise ProtocolError. After it, `receive_bytes` checks media against the
    format's limits and the builders speak the form MEDIA_START came in.
    """

    def __init__(self) -> None:
        self.state = StreamState.NEW
        self.start: MediaStart | None = None
        self.max_media_bytes = 0  # set by MEDIA_START

    @property
    def form(self) -> ControlForm:
        if self.start is None:
            raise RuntimeError("no MEDIA_START yet: the control-message form is not known")
        return self.start.form

    def receive_text(self, text: str) -> list[AsteriskEvent | ProtocolWarning]:
        event = parse_control(text)
        if isinstance(event, MediaStart):
            if self.start is not None:
                raise ProtocolError(PROTOCOL_ERROR, "second MEDIA_START", kind="out_of_order")
            self.start = event
            self.state = StreamState.STARTED
            media = event.media
            self.max_media_bytes = media.sample_rate * media.sample_bytes * MAX_MEDIA_MS // 1000
            return [event]
        if self.start is None:
            name = (
                event.message if isinstance(event, ProtocolWarning) else _EVENT_NAMES[type(event)]
            )
            raise ProtocolError(PROTOCOL_ERROR, f"{name} before MEDIA_START", kind="out_of_order")
        return [event]

    def receive_bytes(self, data: bytes) -> list[bytes | ProtocolWarning]:
        """The caller's audio in the channel's format, or a warning for media to drop."""
        if self.start is None:
            return [ProtocolWarning("media_before_start", f"{len(data)} bytes before MEDIA_START")]
        if len(data) > self.max_media_bytes:
            raise ProtocolError(
                POLICY_VIOLATION,
                f"media message of {len(data)} bytes exceeds {self.max_media_bytes} "
                f"({MAX_MEDIA_MS} ms of {self.start.format})",
                kind="payload_too_large",
            )
        if not data:
            return [ProtocolWarning("empty_payload", "empty media message")]
        sample = self.start.media.sample_bytes
        if len(data) % sample:
            # Half a sample would shift every later one: keep whole samples only.
            data = data[: len(data) - len(data) % sample]
        return [data]

    def answer_message(self) -> str:
        return answer(self.form)

    def hangup_message(self) -> str:
        return hangup(self.form)

    def mark_message(self, correlation_id: str) -> str:
        return mark_media(self.form, correlation_id)

    def flush_message(self) -> str:
        return flush_media(self.form)

    def status_message(self) -> str:
        return get_status(self.form)

"""jambonz's `listen` verb with streaming bidirectional audio as a sans-I/O codec: the call's
attributes and its binary L16 audio in, typed events out; the binary audio, `mark`, `killAudio`
and `disconnect` jambonz takes back.

What this follows:

* The `listen` page of the jambonz documentation, https://docs.jambonz.org/docs/webhooks/listen/
  (source: jambonz/next-static-site `markdown/docs/webhooks/listen.md`), and its newer rendering
  https://docs.jambonz.org/verbs/verbs/listen: the subprotocol, the first text frame, the verb's
  options, DTMF, both bidirectional modes, and the `disconnect`, `killAudio`, `mark` and
  `clearMarks` commands.
* The code that implements it: jambonz/jambonz-feature-server `lib/tasks/listen.js` at v0.9.8
  (2026-07; what the first frame holds, the DTMF frame, `playDone`) and
  jambonz/freeswitch-modules `mod_audio_fork/lws_glue.cpp` and `audio_pipe.cpp` at 1.2.33
  (2024-10; the streaming playout buffer, marks, the end-of-stream frame). Streaming audio came
  in freeswitch-modules 1.1.2 (2024-03-31, #28), marks in 1.2.29 (2024-09-04, #102): jambonz
  releases from 0.9.2 (2024-10-18) on should have both. Newer jambonz media servers (and later
  freeswitch-modules, not in the copies read) may differ in the details noted below.

The protocol:

* jambonz is the WebSocket client and asks for subprotocol `audio.jambonz.org` (what the
  documentation names and jambonz's FreeSWITCH sets in MOD_AUDIO_FORK_SUBPROTOCOL_NAME;
  mod_audio_fork's own default, and what jambonz's Node SDK accepts, is `audio.drachtio.org`:
  take either, and answer with the one asked for). Its first message is TEXT:
  one JSON object of the call's attributes (callSid, direction, from, to, callId, callStatus,
  accountSid, applicationSid, ...) plus `sampleRate` and `mixType`, with the listen verb's
  `metadata` merged in at the top level (listen.js: `Object.assign({sampleRate, mixType},
  callInfo, metadata)`; there is no `metadata` key).
* Then BINARY frames of 16-bit little-endian PCM at `sampleRate` (8000 by default; 16000, 24000,
  48000 or 64000), one channel for `mixType` mono or mixed, two interleaved for stereo.
* TEXT from jambonz afterwards: `{"event":"dtmf","dtmf":"2","duration":"1600"}` with
  `passDtmf: true` (duration in RTP timestamp units); `{"type":"mark","data":{"name":...,
  "event":"playout"}}` when a mark's audio has played, `"event":"cleared"` when `killAudio`
  dropped it; `{"type":"playDone","data":{"id":...}}` after a non-streaming `playAudio`.
* Audio back, with `bidirectionalAudio: {enabled: true, streaming: true, sampleRate: N}`: BINARY
  frames of 16-bit little-endian PCM at N, any length; jambonz buffers them without limit and
  plays them in order, resampled to the call's rate. Commands as TEXT:
  `{"type":"killAudio"}` (drop what is buffered; pending marks come back `cleared`),
  `{"type":"mark","data":{"name":...}}` (at most 30 pending; more are dropped silently),
  `{"type":"clearMarks"}` (forget pending marks: no events for them) and
  `{"type":"disconnect"}` (end the listen verb).
* Non-streaming mode (the default, `streaming: false`; binary audio is then discarded): the whole
  prompt as `{"type":"playAudio","data":{"audioContent":"<base64>","audioContentType":"raw",
  "sampleRate":16000}}`, at most 10 queued, each answered `playDone`. `play_audio_message`
  builds it; the stream's outbound side is the streaming mode.
* Newer releases also have a `stream` verb, the same protocol under another name (jambonz's SDKs
  serve both with one handler).
* Hang-up: when the listen verb ends (the caller hung up, `maxLength`, `finishOnKey`, a
  `disconnect`), jambonz sends an empty binary frame and closes the socket. The server ends the
  verb with `disconnect` or by closing the socket; the call then goes on to the application's
  next verb (none, or `hangup`, ends it).

Found in the code, not the documentation, and handled here:

* mod_audio_fork holds streamed audio in a pre-buffer until it has 1280 samples (times the
  ratio of the playback rate to the call's, at least 1) and 640 after that, and reports a mark
  as played when its playout buffer is empty, even while the pre-buffer still holds audio. So
  the last short piece of a reply would play only with the next reply, after its mark had
  fired. This codec sends each binary message at least that long (assuming an 8 kHz call, the
  largest threshold) and pads the last piece before a mark with silence.
* `killAudio` empties the playout buffer, not the pre-buffer: the same rule keeps the
  pre-buffer empty between messages, so nothing stale plays after a barge-in.
* After `killAudio` mod_audio_fork keeps the cleared marks' names to skip their markers, but
  their markers went with the buffer: the next marks' markers are matched to those names and
  not reported (1.2.33). An endpoint must not wait forever for a mark sent after a `killAudio`.
* Mark names go back in JSON built by string concatenation, unescaped: this codec only sends
  names of letters, digits, `.`, `_` and `-`.
* The documentation's examples disagree with the code in places: `"sampleRate": "16000"` (a
  string; mod_audio_fork reads a number, and plays a string as 16 kHz), `bdirectionalAudio`
  (a typo for `bidirectionalAudio`), `{"type":"playDone"}` (the code adds `data.id`), and
  jambonz's Python SDK sends marks as `{"type":"mark","name":...}`, which mod_audio_fork
  ignores (it reads `data.name`). This codec follows the code.
* mod_audio_fork copies the first frame into 8192 bytes: a longer one (large customerData or
  metadata) arrives cut and is not JSON.

Connect snippet (a verb of the application's webhook response):

```json
{
  "verb": "listen",
  "url": "wss://voice.example.com/jambonz",
  "sampleRate": 16000,
  "mixType": "mono",
  "passDtmf": true,
  "bidirectionalAudio": {"enabled": true, "streaming": true, "sampleRate": 16000},
  "metadata": {"agent": "concierge", "args": {"lang": "en"}},
  "actionHook": "/listen-ended"
}
```

`metadata.agent` chooses the agent and `metadata.args` (an object of strings) are its args;
`bidirectionalAudio.sampleRate` should equal `sampleRate` (without it mod_audio_fork plays the
audio at the call's own rate, which the server does not know).
"""

from __future__ import annotations

import binascii
import json
import re
from collections import deque
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

SUBPROTOCOL = "audio.jambonz.org"
SUBPROTOCOLS = (SUBPROTOCOL, "audio.drachtio.org")  # the endpoint should accept either
SAMPLE_RATES = (8000, 16000, 24000, 48000, 64000)  # the listen verb's sampleRate
PLAYBACK_RATES = (8000, 16000, 24000, 32000, 48000, 64000)  # bidirectionalAudio / playAudio
MIX_TYPES = frozenset({"mono", "mixed", "stereo"})
MONO_MIX_TYPES = frozenset({"mono", "mixed"})  # one channel: what the server takes
MAX_MARKS = 30  # mod_audio_fork MAX_MARKS: pending marks past it are dropped unreported
MAX_QUEUED_PLAY_AUDIO = 10
# mod_audio_fork's pre-buffer, in samples at the playback rate for an 8 kHz call.
PREBUFFER_FIRST_SAMPLES = 320 * 4
PREBUFFER_SAMPLES = 320 * 2
ASSUMED_CALL_RATE = 8000  # the largest pre-buffer: a narrowband call
MAX_MESSAGE_MS = 1000  # the longest binary message this codec sends
# jambonz sends what it has buffered: normally 20 ms, up to its buffer (2 s, at most 5) when
# the socket was slow.
MAX_AUDIO_MS = 5000
MAX_MESSAGE_CHARS = 65_536
WEBSOCKET_MAX_SIZE = 4 * MAX_MESSAGE_CHARS
DTMF_DIGITS = frozenset("0123456789*#ABCD")
AGENT_KEY = "agent"
ARGS_KEY = "args"
MARK_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")

Message = bytes | str


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """The first text frame: the call's attributes, the audio's rate and channels, and the
    listen verb's metadata, all at the top level of `attributes`."""

    call_sid: str
    sample_rate: int
    mix_type: str
    attributes: dict[str, Any] = field(default_factory=dict)

    def _text(self, key: str) -> str | None:
        value = self.attributes.get(key)
        return value if isinstance(value, str) and value else None

    @property
    def call_id(self) -> str:
        return self.call_sid

    @property
    def direction(self) -> str | None:
        return self._text("direction")

    @property
    def from_(self) -> str | None:
        return self._text("from")

    @property
    def to(self) -> str | None:
        return self._text("to")

    @property
    def account_sid(self) -> str | None:
        return self._text("accountSid")

    @property
    def carrier(self) -> CarrierFormat:
        return CarrierFormat("pcm16", self.sample_rate)

    @property
    def agent(self) -> str | None:
        """The agent the listen verb's `metadata.agent` names, if any."""
        return self._text(AGENT_KEY)

    @property
    def agent_args(self) -> dict[str, str]:
        """`metadata.args`: strings as they are, other JSON values as compact JSON."""
        args = self.attributes.get(ARGS_KEY)
        if not isinstance(args, dict):
            return {}
        return {
            str(key): value if isinstance(value, str) else _compact(value)
            for key, value in args.items()
        }


# Not frozen: built 50 times a second per call.
@dataclass(slots=True)
class Audio:
    payload: bytes  # 16-bit little-endian PCM at the start's sample rate


@dataclass(frozen=True, slots=True)
class Dtmf:
    digit: str
    duration: int | None  # RTP timestamp units (1/8000 s for RFC 4733 events at 8 kHz)


@dataclass(frozen=True, slots=True)
class Mark:
    """The audio sent before the mark `name` has played, or a `killAudio` dropped it."""

    name: str
    event: str  # "playout" or "cleared"

    @property
    def cleared(self) -> bool:
        return self.event == "cleared"


@dataclass(frozen=True, slots=True)
class PlayDone:
    """A non-streaming `playAudio` finished."""

    id: str | None


@dataclass(frozen=True, slots=True)
class Stop:
    """The listen verb ended: jambonz's empty binary frame before it closes the socket."""


JambonzEvent = Start | Audio | Dtmf | Mark | PlayDone | Stop | ProtocolWarning


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _shown(value: object) -> str:
    return json.dumps(value, default=str)[:40]


def _number(value: object) -> int | None:
    """A non-negative integer sent as a number or a string of digits; None for anything else."""
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def _mark_name(name: str) -> str:
    if not MARK_NAME.fullmatch(name):
        raise ValueError(
            f"mark name {name[:70]!r} is not 1-64 letters, digits, '.', '_' or '-' "
            "(jambonz echoes it unescaped)"
        )
    return name


class JambonzStream:
    """One listen socket: feed it each message, get events back; shape the audio going out.

    Order enforced: the call's attributes first (binary audio before them, and a first text
    frame that is not them, raise ProtocolError), then audio and events; an empty binary frame
    is jambonz's last (`Stop`). Fatal problems raise `ProtocolError` (close the socket with its
    code and `close_reason`); harmless ones come back as a `ProtocolWarning` event.

    Outbound (the streaming mode): audio of any length goes out as binary messages of at least
    mod_audio_fork's pre-buffer (see the module's notes), the remainder held until more comes or
    a mark or `flush_audio` pads it. `playback_rate` is the verb's `bidirectionalAudio.sampleRate`
    (by default the start's `sampleRate`, which the snippet sets it to).
    """

    def __init__(
        self,
        *,
        playback_rate: int | None = None,
        call_rate: int = ASSUMED_CALL_RATE,
        max_message_chars: int = MAX_MESSAGE_CHARS,
        max_audio_ms: int = MAX_AUDIO_MS,
    ) -> None:
        if playback_rate is not None and playback_rate not in PLAYBACK_RATES:
            raise ValueError(f"playback rate {playback_rate} is not one of {PLAYBACK_RATES}")
        self.requested_playback_rate = playback_rate
        self.call_rate = call_rate
        self.max_message_chars = max_message_chars
        self.max_audio_ms = max_audio_ms
        self.state = StreamState.NEW
        self.start: Start | None = None
        self.max_binary_bytes = 0  # set by start
        self.playback_rate = 0  # set by start
        self._factor = 1
        self._threshold = 0  # bytes the next binary message must reach
        self._max_message = 0
        self._pending = bytearray()
        self._marks: deque[str] = deque()

    # -- inbound -------------------------------------------------------------------------------

    def receive(self, message: Message) -> list[JambonzEvent]:
        if isinstance(message, str):
            return self.receive_text(message)
        return self.receive_bytes(message)

    def audio_payload(self, data: bytes) -> bytes | None:
        """`data` when it is a well-formed audio frame of this started stream (the 50 a second
        path: no event, no list); None for anything else, untouched: hand that to
        `receive_bytes`."""
        size = len(data)
        if self.state is StreamState.STARTED and 0 < size <= self.max_binary_bytes:
            if not size & 1:
                return data
        return None

    def receive_bytes(self, data: bytes) -> list[JambonzEvent]:
        size = len(data)
        if self.state is StreamState.NEW:
            raise ProtocolError(
                PROTOCOL_ERROR,
                f"binary frame of {size} bytes before the call's attributes",
                kind="out_of_order",
            )
        if self.state is StreamState.STOPPED:
            return [ProtocolWarning("after_stop", f"binary frame of {size} bytes after the end")]
        if not size:
            # mod_audio_fork's graceful shutdown: an empty frame, then the close.
            self.state = StreamState.STOPPED
            return [Stop()]
        if size > self.max_binary_bytes:
            raise ProtocolError(
                POLICY_VIOLATION,
                f"binary frame of {size} bytes exceeds {self.max_binary_bytes} "
                f"({self.max_audio_ms} ms at {self.start.sample_rate if self.start else 0} Hz)",
                kind="payload_too_large",
            )
        if size & 1:
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"binary frame of {size} bytes is not whole 16-bit samples",
                kind="invalid_payload",
            )
        return [Audio(bytes(data))]

    def receive_text(self, text: str) -> list[JambonzEvent]:
        message = json_message(text, self.max_message_chars)
        if self.state is StreamState.NEW:
            return [self._start(message)]
        if self.state is StreamState.STOPPED:
            return [ProtocolWarning("after_stop", "text message after the end ignored")]
        kind = message.get("type")
        if kind is not None:
            if not isinstance(kind, str):
                raise _malformed(f'"type" is not a string (got {_shown(kind)})')
            if kind == "mark":
                return self._mark(message)
            if kind == "playDone":
                data = message.get("data")
                ident = data.get("id") if isinstance(data, dict) else None
                return [PlayDone(str(ident) if ident is not None else None)]
            return [ProtocolWarning("unknown_type", f"unknown type {kind[:40]!r} ignored")]
        event = message.get("event")
        if not isinstance(event, str):
            raise _malformed('message has neither a "type" nor an "event" string')
        if event == "dtmf":
            return self._dtmf(message)
        return [ProtocolWarning("unknown_event", f"unknown event {event[:40]!r} ignored")]

    def _start(self, message: Mapping[str, Any]) -> Start:
        call_sid = message.get("callSid")
        if not isinstance(call_sid, str) or not call_sid:
            state = "missing" if call_sid is None else "not a non-empty string"
            raise _malformed(f"the first message's callSid is {state}")
        raw_rate = message.get("sampleRate")
        rate = _number(raw_rate)
        if rate is None:
            state = "missing" if raw_rate is None else f"not an integer (got {_shown(raw_rate)})"
            raise _malformed(f"the first message's sampleRate is {state}")
        if rate not in SAMPLE_RATES:
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"sampleRate {rate} is not one of {', '.join(map(str, SAMPLE_RATES))}",
                kind="unsupported_media_format",
            )
        mix = message.get("mixType", "mono")
        if not isinstance(mix, str) or mix not in MIX_TYPES:
            raise _malformed(f"the first message's mixType {_shown(mix)} is not mono/mixed/stereo")
        if mix not in MONO_MIX_TYPES:
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"mixType {mix}: two channels; the listen verb must use mono",
                kind="unsupported_media_format",
            )
        self.start = Start(call_sid, rate, mix, dict(message))
        self.state = StreamState.STARTED
        self.max_binary_bytes = rate * 2 * self.max_audio_ms // 1000
        # Every listen sampleRate is a playback rate too.
        self.playback_rate = playback = self.requested_playback_rate or rate
        self._factor = max(1, playback // self.call_rate)
        self._threshold = 2 * PREBUFFER_FIRST_SAMPLES * self._factor
        # Whole samples, and whole groups of `factor` samples, which mod_audio_fork downsamples
        # together (a partial group would stay in its pre-buffer).
        group = 2 * self._factor
        self._max_message = max(playback * 2 * MAX_MESSAGE_MS // 1000 // group * group, group)
        return self.start

    def _dtmf(self, message: Mapping[str, Any]) -> list[JambonzEvent]:
        digit = message.get("dtmf")
        if not isinstance(digit, str) or not digit:
            state = "missing" if digit is None else "not a non-empty string"
            raise _malformed(f"dtmf event's dtmf is {state}")
        raw = message.get("duration")
        duration = _number(raw)
        if raw is not None and duration is None:
            raise _malformed(f"dtmf event's duration is not an integer (got {_shown(raw)})")
        if digit not in DTMF_DIGITS:
            return [ProtocolWarning("invalid_dtmf", f"dtmf {digit[:10]!r} ignored")]
        return [Dtmf(digit, duration)]

    def _mark(self, message: Mapping[str, Any]) -> list[JambonzEvent]:
        data = message.get("data")
        if not isinstance(data, dict):
            raise _malformed(f"mark data is {'missing' if data is None else 'not an object'}")
        name = data.get("name")
        if not isinstance(name, str) or not name:
            state = "missing" if name is None else "not a non-empty string"
            raise _malformed(f"mark data.name is {state}")
        event = data.get("event", "playout")
        if event not in ("playout", "cleared"):
            raise _malformed(f"mark data.event {_shown(event)} is not playout or cleared")
        try:
            self._marks.remove(name)
        except ValueError:
            pass  # not one of ours, or cleared by clearMarks: reported all the same
        return [Mark(name, event)]

    # -- outbound ------------------------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        """Audio held back until it fills a message mod_audio_fork plays at once."""
        return len(self._pending)

    @property
    def marks_outstanding(self) -> int:
        """Marks sent and not yet reported: keep it under MAX_MARKS, or jambonz drops them."""
        return len(self._marks)

    def _require_started(self) -> None:
        if self.start is None:
            raise RuntimeError("the stream has not started: the playback rate is not known")

    def audio_messages(self, pcm: bytes) -> list[bytes]:
        """`pcm` (16-bit mono at the playback rate, any length) as binary messages, each at
        least mod_audio_fork's pre-buffer and about MAX_MESSAGE_MS at most; the remainder
        waits for the next call, a mark or `flush_audio`."""
        self._require_started()
        pending = self._pending
        pending += pcm
        if len(pending) < self._threshold:
            return []
        group = 2 * self._factor
        whole = len(pending) // group * group
        later = 2 * PREBUFFER_SAMPLES * self._factor
        out: list[bytes] = []
        start = 0
        while whole - start >= self._threshold:
            avail = whole - start
            # MAX_MESSAGE_MS at most, unless what would be left could not make a message.
            size = avail if avail < self._max_message + later else self._max_message
            out.append(bytes(pending[start : start + size]))
            start += size
            self._threshold = later
        del pending[:start]
        return out

    def flush_audio(self) -> list[bytes]:
        """The held remainder as one message, padded with silence to the pre-buffer size, so that
        mod_audio_fork plays all of it before it reports the next mark."""
        self._require_started()
        if not self._pending:
            return []
        group = 2 * self._factor
        size = max(self._threshold, -(-len(self._pending) // group) * group)
        data = bytes(self._pending) + bytes(size - len(self._pending))
        self._pending.clear()
        self._threshold = 2 * PREBUFFER_SAMPLES * self._factor
        return [data]

    def mark_messages(self, name: str) -> list[Message]:
        """What makes jambonz send `mark` `name` back once all the audio given so far has played:
        the padded remainder, then the mark."""
        message = mark_message(name)
        self._marks.append(name)
        return [*self.flush_audio(), message]

    def clear_messages(self) -> list[Message]:
        """Drop the held remainder and everything jambonz has buffered; pending marks come back
        `cleared`."""
        self._pending.clear()
        return [kill_audio_message()]

    def clear_marks_messages(self) -> list[Message]:
        """Forget the pending marks: jambonz reports none of them."""
        self._marks.clear()
        return [clear_marks_message()]

    def disconnect_message(self) -> str:
        return disconnect_message()


# -- builders ------------------------------------------------------------------------------------


def mark_message(name: str) -> str:
    """Ask jambonz to send `mark` `name` back when playout reaches this point of the stream."""
    return f'{{"type":"mark","data":{{"name":"{_mark_name(name)}"}}}}'


def kill_audio_message() -> str:
    """Stop the playout and drop the buffered audio; pending marks come back `cleared`."""
    return '{"type":"killAudio"}'


def clear_marks_message() -> str:
    return '{"type":"clearMarks"}'


def disconnect_message() -> str:
    """End the listen verb: jambonz closes the socket and runs the application's next verb."""
    return '{"type":"disconnect"}'


def play_audio_message(
    pcm: bytes, sample_rate: int, *, id: str | None = None, queue_play: bool = False
) -> str:
    """A whole prompt for the non-streaming mode (`bidirectionalAudio.streaming` false): raw
    16-bit PCM at `sample_rate`, answered by `playDone` with `id`. Without `queue_play` it
    interrupts what is playing; with it, it waits its turn (at most 10 queued)."""
    if sample_rate not in PLAYBACK_RATES:
        raise ValueError(f"sample rate {sample_rate} is not one of {PLAYBACK_RATES}")
    data: dict[str, Any] = {
        "audioContent": binascii.b2a_base64(pcm, newline=False).decode(),
        "audioContentType": "raw",
        "sampleRate": sample_rate,  # a number: mod_audio_fork reads valueint
    }
    if id is not None:
        data["id"] = id
    if queue_play:
        data["queuePlay"] = True
    return _compact({"type": "playAudio", "data": data})

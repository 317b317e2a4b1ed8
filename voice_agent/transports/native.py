"""The native `/ws` protocol as a sans-I/O codec: a JSON `start`, binary audio and JSON control
messages in, typed events out; builders for the server's JSON events (docs/protocol.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import ErrorDetails

from voice_agent.transports.errors import (
    MESSAGE_TOO_BIG,
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
)
from voice_agent.transports.json_fields import json_message
from voice_agent.transports.state import StreamState

SAMPLE_RATES = (8000, 16000, 24000, 48000)
ENCODINGS = ("pcm16", "mulaw", "alaw")
MAX_TEXT_MESSAGE_CHARS = 65_536
MAX_AUDIO_FRAME_MS = 1000  # one binary frame holds at most this much audio
# For the server's `websockets` max_size: above both codec limits (non-ASCII text included), so
# the codec's clearer 1009 reason is the one a client normally sees.
WEBSOCKET_MAX_SIZE = 4 * MAX_TEXT_MESSAGE_CHARS
DTMF_DIGITS = frozenset("0123456789*#ABCD")
_JSON_SEPARATORS = (",", ":")


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """Mono audio both ways: pcm16 is signed 16-bit little-endian; mulaw and alaw are 8 kHz."""

    encoding: str = "pcm16"
    sample_rate: int = 16000

    @property
    def sample_width(self) -> int:
        return 2 if self.encoding == "pcm16" else 1

    @property
    def bytes_per_second(self) -> int:
        return self.sample_rate * self.sample_width

    def bytes_for_ms(self, ms: int) -> int:
        return self.bytes_per_second * ms // 1000

    def as_json(self) -> dict[str, Any]:
        return {"encoding": self.encoding, "sample_rate": self.sample_rate}


@dataclass(frozen=True, slots=True)
class Start:
    agent: str | None  # None: the server's default agent
    args: dict[str, Any] = field(default_factory=dict)
    audio: AudioFormat = AudioFormat()


@dataclass(slots=True)  # not frozen, for the same reason as twilio.Media
class Audio:
    data: bytes  # whole samples in the stream's format


@dataclass(frozen=True, slots=True)
class Dtmf:
    digit: str


@dataclass(frozen=True, slots=True)
class Mark:
    """The client played the audio sent before the server's mark `name` (or a clear dropped it)."""

    name: str


@dataclass(frozen=True, slots=True)
class Stop:
    """The client hung up."""


NativeEvent = Start | Audio | Dtmf | Mark | Stop | ProtocolWarning


# -- validation models ---------------------------------------------------------------------------


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _AudioSpec(_Message):
    encoding: Literal["pcm16", "mulaw", "alaw"] = "pcm16"
    sample_rate: Literal[8000, 16000, 24000, 48000] = 16000

    @field_validator("sample_rate")
    @classmethod
    def _companded_at_8k(cls, value: int, info: ValidationInfo) -> int:
        encoding = info.data.get("encoding")
        if encoding in ("mulaw", "alaw") and value != 8000:
            raise ValueError(f"must be 8000 for {encoding}")
        return value


class _StartMessage(_Message):
    type: Literal["start"]
    agent: str | None = Field(default=None, min_length=1, max_length=128)
    args: dict[str, Any] = Field(default_factory=dict)
    audio: _AudioSpec = Field(default_factory=_AudioSpec)


class _DtmfMessage(_Message):
    type: Literal["dtmf"]
    digit: str

    @field_validator("digit")
    @classmethod
    def _one_key(cls, value: str) -> str:
        if value not in DTMF_DIGITS:
            raise ValueError("must be one key: 0-9, *, #, A-D")
        return value


class _MarkMessage(_Message):
    type: Literal["mark"]
    name: str = Field(min_length=1, max_length=256)


class _StopMessage(_Message):
    type: Literal["stop"]


_FORMAT_FIELDS = {("audio", "encoding"), ("audio", "sample_rate")}

_CONTROL: dict[str, type[_Message]] = {
    "dtmf": _DtmfMessage,
    "mark": _MarkMessage,
    "stop": _StopMessage,
}


_PROBLEMS = {
    "string_type": "must be a string",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "string_too_short": "must have at least {min_length} characters",
    "string_too_long": "must have at most {max_length} characters",
}


def _describe(error: ErrorDetails) -> str:
    """One pydantic error as `field: problem (got value)`, in the protocol's own words."""
    where = ".".join(str(part) for part in error["loc"])
    kind = error["type"]
    given = error.get("input")
    if kind == "missing":
        return f"{where} is required"
    if kind == "extra_forbidden":
        return f"{where} is not a field of this message"
    ctx = error.get("ctx", {})
    if kind == "literal_error":
        problem = f"must be {ctx.get('expected', 'another value')}"
    elif kind == "string_too_short" and ctx.get("min_length") == 1:
        problem = "must not be empty"
    elif kind in _PROBLEMS:
        problem = _PROBLEMS[kind].format(**ctx)
    else:
        problem = error["msg"].removeprefix("Value error, ")
        problem = problem[:1].lower() + problem[1:]
    shown = json.dumps(given) if isinstance(given, str | int | float | bool) else None
    if shown is not None and len(shown) > 40:
        shown = shown[:39] + "…"
    text = f"{where} {problem}" if where else problem
    return f"{text} (got {shown})" if shown is not None else text


def _explain(message_type: str, exc: ValidationError) -> str:
    return f"{message_type}: " + "; ".join(_describe(e) for e in exc.errors())


class NativeStream:
    """One `/ws` connection's inbound side: feed it each message, get events back.

    The first message must be a JSON `start`; after it, binary audio frames of any size and JSON
    control messages. Fatal problems raise `ProtocolError` (send its `kind` and `reason` as an
    `error` event, then close with its code); a bad control message is dropped as a
    `ProtocolWarning` (send it as an `error` event and go on).
    """

    def __init__(self, *, max_text_chars: int = MAX_TEXT_MESSAGE_CHARS) -> None:
        self.max_text_chars = max_text_chars
        self.state = StreamState.NEW
        self.start: Start | None = None
        self._max_frame_bytes = 0
        self._odd_byte = b""

    @property
    def audio(self) -> AudioFormat:
        if self.start is None:
            raise RuntimeError("the stream has not started: no audio format yet")
        return self.start.audio

    def receive_bytes(self, data: bytes) -> list[NativeEvent]:
        if self.state is StreamState.NEW:
            raise ProtocolError(
                PROTOCOL_ERROR, "audio before the start message", kind="out_of_order"
            )
        if self.state is StreamState.STOPPED:
            return [ProtocolWarning("after_stop", "audio after stop ignored")]
        if len(data) > self._max_frame_bytes:
            raise ProtocolError(
                MESSAGE_TOO_BIG,
                f"audio frame of {len(data)} bytes exceeds {self._max_frame_bytes} "
                f"({MAX_AUDIO_FRAME_MS} ms)",
                kind="message_too_big",
            )
        if self._odd_byte:
            data = self._odd_byte + data
            self._odd_byte = b""
        # pcm16 frames may split a sample; the half is kept for the next frame.
        if len(data) % 2 and self.start is not None and self.start.audio.sample_width == 2:
            data, self._odd_byte = data[:-1], data[-1:]
        return [Audio(data)] if data else []

    def receive_text(self, text: str) -> list[NativeEvent]:
        message = json_message(text, self.max_text_chars, loads=json.loads)
        kind = message.get("type")
        if self.state is StreamState.NEW:
            if kind != "start":
                got = f"{kind[:40]!r}" if isinstance(kind, str) else "a message without type"
                raise ProtocolError(
                    PROTOCOL_ERROR,
                    f"expected a start message first, got {got}",
                    kind="out_of_order",
                )
            return [self._start(message)]
        if self.state is StreamState.STOPPED:
            return [ProtocolWarning("after_stop", f"{str(kind)[:40]} message after stop ignored")]
        if kind == "start":
            raise ProtocolError(PROTOCOL_ERROR, "second start message", kind="out_of_order")
        model = _CONTROL.get(kind) if isinstance(kind, str) else None
        if model is None:
            # Newer clients may send types this server does not know: reported, not fatal.
            what = (
                f"unknown message type {kind[:40]!r}"
                if isinstance(kind, str)
                else "message without a type"
            )
            return [ProtocolWarning("unknown_message", f"{what} ignored")]
        try:
            parsed = model.model_validate(message)
        except ValidationError as exc:
            return [ProtocolWarning("invalid_message", _explain(str(kind), exc) + " (ignored)")]
        if isinstance(parsed, _DtmfMessage):
            return [Dtmf(parsed.digit)]
        if isinstance(parsed, _MarkMessage):
            return [Mark(parsed.name)]
        self.state = StreamState.STOPPED
        return [Stop()]

    def _start(self, message: Mapping[str, Any]) -> Start:
        try:
            parsed = _StartMessage.model_validate(message)
        except ValidationError as exc:
            # A well-formed request for a format this server does not speak is "unsupported".
            audio_only = all(e["loc"][:2] in _FORMAT_FIELDS for e in exc.errors())
            code, kind = (
                (UNSUPPORTED_DATA, "unsupported_audio")
                if audio_only
                else (PROTOCOL_ERROR, "invalid_start")
            )
            raise ProtocolError(code, _explain("start", exc), kind=kind) from None
        audio = AudioFormat(parsed.audio.encoding, parsed.audio.sample_rate)
        self.start = Start(parsed.agent, dict(parsed.args), audio)
        self.state = StreamState.STARTED
        self._max_frame_bytes = audio.bytes_for_ms(MAX_AUDIO_FRAME_MS)
        return self.start


# -- server events -------------------------------------------------------------------------------


def _event(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=_JSON_SEPARATORS, ensure_ascii=False)


def server_event(payload: dict[str, Any]) -> str:
    """One of the server's events as the pipeline gives it (call_id and timings may be other
    than JSON types: they go as their text)."""
    return json.dumps(payload, separators=_JSON_SEPARATORS, ensure_ascii=False, default=str)


def started_event(call_id: str, *, agent: str | None = None) -> str:
    payload: dict[str, Any] = {"type": "started", "call_id": call_id}
    if agent is not None:
        payload["agent"] = agent
    return _event(payload)


def transcript_event(text: str, *, final: bool) -> str:
    """What the caller said: partial hypotheses while they speak, then the final text."""
    return _event({"type": "transcript", "final": final, "text": text})


def agent_text_event(reply_id: str, text: str) -> str:
    """A piece of the agent's reply `reply_id`, sent as its audio is sent."""
    return _event({"type": "agent_text", "reply_id": reply_id, "text": text})


def mark_event(name: str) -> str:
    return _event({"type": "mark", "name": name})


def clear_event() -> str:
    return '{"type":"clear"}'


def state_event(changes: Mapping[str, Mapping[str, Any]], *, source: str | None = None) -> str:
    """Changes to the agent's state variables: `{"key": {"old": ..., "new": ...}}`."""
    payload: dict[str, Any] = {"type": "state", "changes": {k: dict(v) for k, v in changes.items()}}
    if source is not None:
        payload["source"] = source
    return _event(payload)


def turn_metrics_event(metrics: Mapping[str, Any]) -> str:
    return _event({"type": "turn_metrics", "metrics": dict(metrics)})


def error_event(code: str, message: str) -> str:
    return _event({"type": "error", "code": code, "message": message})


def end_event(reason: str) -> str:
    return _event({"type": "end", "reason": reason})

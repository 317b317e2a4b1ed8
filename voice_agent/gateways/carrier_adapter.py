"""What every WebSocket media stream is to a call, whatever the carrier: the `Carrier` adapter
one stream's driver (carrier_call.py) talks to, and the few things a call needs from the
carrier's events (`CallEvent`).

An adapter reads one call's codec (voice_agent.transports.<carrier>) as CallEvents, builds the
messages the carrier takes (audio, marks, a clear, a goodbye, what the peer is told of a
problem) and does to the call what the carrier can (a transfer, keys). A new carrier is its
codec, an adapter in carriers.py (or a module of its own beside it) and one line in its
registry there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast
from urllib.parse import parse_qsl, urlsplit

from voice_agent.audio.codec import CarrierFormat, Encoding
from voice_agent.callcontrol.apis import CallControlApis
from voice_agent.gateways.media_socket import Message
from voice_agent.runtime.call_control import CallTransfer
from voice_agent.transports.errors import ProtocolWarning

QUERY_AGENT = "agent"
QUERY_TOKEN = "token"  # the API token, never an arg


# ---- what a carrier's events mean to a call ------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallStart:
    agent: str | None
    args: dict[str, str]
    call_id: str | None
    carrier: CarrierFormat


@dataclass(frozen=True, slots=True)
class Heard:
    audio: bytes  # the caller's audio in the call's CarrierFormat


@dataclass(frozen=True, slots=True)
class Played:
    name: str


@dataclass(frozen=True, slots=True)
class Key:
    digit: str


@dataclass(frozen=True, slots=True)
class HungUp:
    reason: str


@dataclass(frozen=True, slots=True)
class Note:
    """Something the carrier said that changes nothing (a warning, an error report, a clear
    confirmed): logged and kept in the call's audit."""

    kind: str
    text: str


CallEvent = CallStart | Heard | Played | Key | HungUp | Note


def warning_note(warning: ProtocolWarning) -> Note:
    return Note(warning.kind, warning.message)


def carrier_format(encoding: str, sample_rate: int) -> CarrierFormat:
    return CarrierFormat(cast(Encoding, encoding), sample_rate)


def agent_and_args(
    request_path: str, agent: str | None, args: dict[str, str]
) -> tuple[str | None, dict[str, str]]:
    """The carrier's own agent and args first, then the stream URL's query string."""
    params = dict(parse_qsl(urlsplit(request_path).query, keep_blank_values=True))
    params.pop(QUERY_TOKEN, None)
    query_agent = params.pop(QUERY_AGENT, None) or None
    return agent or query_agent, {**params, **args}


def needs_api(what: str, carrier: str) -> str:
    """Why `what` (transfers, keys) cannot go through `carrier`'s API: it is not configured."""
    name = carrier.lower()  # the stream's path and the config key alike
    return f"{what} on /{name} need {carrier}'s API: set carriers.{name}"


class Framer:
    """Audio in whole frames, `max_bytes` at most per piece; the rest waits for more or a
    flush, which pads it with silence to a whole frame."""

    def __init__(self, frame_bytes: int, max_bytes: int, silence: bytes) -> None:
        self.frame_bytes = frame_bytes
        self.max_bytes = max_bytes - max_bytes % frame_bytes
        self._silence = silence
        self._pending = bytearray()

    def push(self, data: bytes) -> list[bytes]:
        pending = self._pending
        pending += data
        whole = len(pending) - len(pending) % self.frame_bytes
        step = self.max_bytes
        out = [bytes(pending[i : min(i + step, whole)]) for i in range(0, whole, step)]
        del pending[:whole]
        return out

    def flush(self) -> list[bytes]:
        if not self._pending:
            return []
        short = self.frame_bytes - len(self._pending)
        data = bytes(self._pending) + self._silence * short
        self._pending.clear()
        return [data]

    def drop(self) -> None:
        self._pending.clear()


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


class Carrier:
    """One call's codec, read as CallEvents; after the start, the messages the carrier takes,
    and what it can do to the call (a transfer, keys)."""

    transport: ClassVar[str]
    # The carrier can do something to the call (transfer it, at least try): /ws cannot.
    controls_calls: ClassVar[bool] = True
    sends_keys: ClassVar[bool] = False  # keys_on_stream or send_digits can work
    # The carrier may never report a mark sent after a clear: the server's estimate of when
    # its audio played stands in (carrier_call._MarkClock).
    marks_by_clock: ClassVar[bool] = False

    def receive(self, message: Message) -> list[CallEvent]:
        raise NotImplementedError

    def fast_audio(self, message: Message) -> bytes | None:
        """The caller's audio in `message` if it is a plain in-order media message (the path 50
        messages a second take), else None and `receive` handles it."""
        return None

    def audio_messages(self, data: bytes) -> list[Message]:
        raise NotImplementedError

    def mark_messages(self, name: str) -> list[Message]:
        raise NotImplementedError

    def clear_messages(self) -> list[Message]:
        raise NotImplementedError

    def event_messages(self, payload: dict[str, Any]) -> list[Message]:
        """The server's own events (transcripts, state): most carriers have no place for them."""
        return []

    def started_messages(self, call_id: str, agent: str | None) -> list[Message]:
        """What the peer is told once its call has started."""
        return []

    def tell_peer(self, kind: str, text: str) -> list[Message]:
        """What the peer is told of a problem: a protocol error before the close, a refusal, a
        warning. Carriers have no such message; the log and the audit have it."""
        return []

    def goodbye_messages(self) -> list[Message]:
        return []

    async def transfer(self, apis: CallControlApis, transfer: CallTransfer) -> str | None:
        """Hand the call over; None once the carrier took it, else why not."""
        return f"the {self.transport} stream cannot transfer calls"

    def keys_on_stream(self, digits: str) -> list[Message] | None:
        """The messages that press `digits` on the stream itself; None: not this way."""
        return None

    async def send_digits(self, apis: CallControlApis, digits: str) -> str | None:
        """Press `digits` through the carrier's API; None once it took them, else why not."""
        return f"the {self.transport} stream cannot send keys"

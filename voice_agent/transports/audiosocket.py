"""Asterisk AudioSocket as a sans-I/O codec: the bytes of one TCP connection in, typed events
out, and the few messages a server sends back.

The protocol, as Asterisk implements it (followed from the asterisk/asterisk sources:
`include/asterisk/res_audiosocket.h`, `res/res_audiosocket.c`, `apps/app_audiosocket.c` and
`channels/chan_audiosocket.c` at tags 18.26.4, 19.8.1, 20.14.0, 20.17.0, 21.9.0, 21.12.0,
22.4.0, 22.7.0, 23.0.0, 23.1.0 and master of 2026-04; and the protocol page
https://docs.asterisk.org/Configuration/Channel-Drivers/AudioSocket/):

Every message is a 3-byte header, the kind (1 byte) and the payload length (16-bit unsigned,
big-endian), then the payload. Kinds, and the Asterisk releases that have them:

====  ======================================================  ===============================
kind  payload                                                 Asterisk
====  ======================================================  ===============================
0x00  none: hang up (closing the socket means the same)       all (18+)
0x01  the call's UUID, 16 bytes binary; always the first      all (18+)
0x03  one DTMF digit, ASCII; Asterisk to server only          20.14, 21.9, 22.4, 23.0 and later
0x10  signed linear 16-bit little-endian mono, 8 kHz          all (18+)
0x11  the same at 12 kHz                                      20.17, 21.12, 22.7, 23.1 and later
0x12  16 kHz; 0x13 24 kHz; 0x14 32 kHz; 0x15 44.1 kHz;       20.17, 21.12, 22.7, 23.1 and later
      0x16 48 kHz; 0x17 96 kHz; 0x18 192 kHz
0xff  an error; optional payload: an error code byte          defined in the header since 20.14;
      (Asterisk's: bit-packed 0x01 hangup of the calling      no Asterisk version sends it
      party, 0x02 frame forwarding error, 0x04 memory error)
====  ======================================================  ===============================

The higher rates came with "res_audiosocket: add message types for all slin sample rates"
(master ff0523a3d0, October 2025). An earlier draft of that change, documented for a while in
asterisk/documentation PR 158, gave 0x11 to 16 kHz; no release shipped it: every tag from
20.17.0, 21.12.0, 22.7.0 and 23.1.0 on has 0x11 = 12 kHz, 0x12 = 16 kHz, and this module
follows them. The `AudioSocket()` application always sends 0x10 (it sets the channel to
slin); `Dial(AudioSocket/host:port/uuid/c(slin16))` picks another rate. Before those releases
every audio frame went out as 0x10 whatever the codec, so with `Dial` on an older Asterisk
give `c(slin)`: a 0x10 frame of mu-law bytes cannot be told apart from slin.

Asterisk sends one frame per 20 ms (320 bytes at 8 kHz) and plays what a server sends as it
arrives, with no buffer: a server paces its audio itself. Asterisk 20.14, 21.9, 22.4, 23.0 and
later end the call on any kind from the server other than audio and hang-up, and on an empty
audio payload; 18 and 19 skip such messages. So a server only ever sends audio (of the kind
Asterisk sends) and 0x00.

Why a reader of our own: the format is a 3-byte type-length header, a dozen lines to parse,
and no Python library for it exists (PyPI's `audiosocket` is an unrelated 2012 network-audio
package; the AudioSocket projects there are whole voice-agent applications). The rules that
matter here (the UUID first, bounds on what a phone line can plausibly send, one rate per
call) would be ours anyway.

Limits: the 16-bit length allows 65,535 bytes, but an audio message is at most
MAX_AUDIO_MS (100 ms; Asterisk sends 20 ms, and a 30 or 60 ms ptime still fits) of its rate,
a UUID exactly 16 bytes, a DTMF digit 1 byte, a hang-up or error at most
MAX_CONTROL_PAYLOAD_BYTES. A header announcing more is refused as soon as its 3 bytes are in,
so the reader never buffers more than one message's worth (`max_buffered_bytes`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Final

from voice_agent.transports.errors import (
    MESSAGE_TOO_BIG,
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
)

HEADER_BYTES: Final = 3
MAX_PAYLOAD_BYTES: Final = 0xFFFF  # what the 16-bit length field can say

KIND_HANGUP: Final = 0x00
KIND_UUID: Final = 0x01
KIND_DTMF: Final = 0x03
KIND_AUDIO: Final = 0x10  # slin, 8 kHz: the only audio kind before 20.17 / 21.12 / 22.7 / 23.1
KIND_ERROR: Final = 0xFF

# Audio kind -> sample rate of its signed linear 16-bit mono payload.
AUDIO_KINDS: Final[dict[int, int]] = {
    0x10: 8000,
    0x11: 12000,
    0x12: 16000,
    0x13: 24000,
    0x14: 32000,
    0x15: 44100,
    0x16: 48000,
    0x17: 96000,
    0x18: 192000,
}
AUDIO_KIND_FOR_RATE: Final[dict[int, int]] = {rate: kind for kind, rate in AUDIO_KINDS.items()}

SAMPLE_BYTES: Final = 2
FRAME_MS: Final = 20  # what Asterisk sends, and what a server sends back
MAX_AUDIO_MS: Final = 100
UUID_BYTES: Final = 16
MAX_CONTROL_PAYLOAD_BYTES: Final = 64
DTMF_DIGITS: Final = frozenset("0123456789*#ABCD")

# Asterisk's documented error codes, bit-packed in the error message's payload byte.
ASTERISK_ERRORS: Final[dict[int, str]] = {
    0x01: "hangup of calling party",
    0x02: "frame forwarding error",
    0x04: "memory (allocation) error",
}

_NAMES: Final[dict[int, str]] = {
    KIND_HANGUP: "hang-up",
    KIND_UUID: "UUID",
    KIND_DTMF: "DTMF",
    KIND_ERROR: "error",
    **{kind: f"{rate / 1000:g} kHz audio" for kind, rate in AUDIO_KINDS.items()},
}


def kind_name(kind: int) -> str:
    """A message kind as a log line says it: `16 kHz audio (0x12)`, `unknown (0x42)`."""
    return f"{_NAMES.get(kind, 'unknown')} (0x{kind:02x})"


def max_audio_payload(kind: int, max_audio_ms: int = MAX_AUDIO_MS) -> int:
    """The longest audio payload of `kind` the reader takes: `max_audio_ms` of its rate."""
    frame = AUDIO_KINDS[kind] * SAMPLE_BYTES * max_audio_ms // 1000
    return min(frame - frame % SAMPLE_BYTES, MAX_PAYLOAD_BYTES - 1)


def frame_bytes(sample_rate: int, frame_ms: int = FRAME_MS) -> int:
    """Bytes of one `frame_ms` frame of slin at `sample_rate` (320 for 20 ms at 8 kHz)."""
    return sample_rate * SAMPLE_BYTES * frame_ms // 1000


# ---- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Uuid:
    """The first message: the call's id, as canonical UUID text (lowercase, hyphenated)."""

    call_id: str


# Not frozen: a frozen dataclass sets each field through object.__setattr__, a cost paid on
# every 20 ms frame of every call.
@dataclass(slots=True)
class Audio:
    pcm: bytes  # signed 16-bit little-endian mono
    sample_rate: int

    @property
    def kind(self) -> int:
        return AUDIO_KIND_FOR_RATE[self.sample_rate]


@dataclass(frozen=True, slots=True)
class Dtmf:
    digit: str


@dataclass(frozen=True, slots=True)
class Hangup:
    pass


@dataclass(frozen=True, slots=True)
class Error:
    """The peer reported an error; `code` is its payload's first byte, None without one."""

    code: int | None

    @property
    def description(self) -> str:
        if self.code is None:
            return "AudioSocket error without a code"
        known = [text for bit, text in ASTERISK_ERRORS.items() if self.code & bit]
        if self.code & ~sum(ASTERISK_ERRORS):
            known.append("application-specific")
        return f"AudioSocket error 0x{self.code:02x} ({', '.join(known) or 'no flag set'})"


AudioSocketEvent = Uuid | Audio | Dtmf | Hangup | Error | ProtocolWarning


class AudioSocketProtocolError(ProtocolError):
    """What `feed` raises: the problem, and the events its data held before it (a DTMF or the
    UUID that came in the same TCP read as a bad message still count)."""

    def __init__(self, error: ProtocolError, events: list[AudioSocketEvent]) -> None:
        super().__init__(error.code, error.reason, kind=error.kind)
        self.events = events


# ---- the reader -----------------------------------------------------------------------------


class AudioSocketReader:
    """One connection's inbound bytes -> events, whatever the TCP reads' boundaries.

    `feed` takes any number of bytes: a message split over several reads is held until it is
    whole, several messages in one read all come out, in order. Order enforced: the UUID
    first (a hang-up or an error may come before it: they end the connection anyway), one
    UUID only, then audio of a single kind (the call's rate does not change) and DTMF. After a
    hang-up nothing more is read. Problems raise `AudioSocketProtocolError`, a
    `ProtocolError` (its `kind` a stable name, its `reason` the explanation) that also holds
    the events decoded before the problem; once raised, every later `feed` raises it again,
    with no events.
    """

    def __init__(self, *, max_audio_ms: int = MAX_AUDIO_MS) -> None:
        self.max_audio_ms = max_audio_ms
        self._limits = {kind: max_audio_payload(kind, max_audio_ms) for kind in AUDIO_KINDS}
        self._buffer = bytearray()
        self._call_id: str | None = None
        self._audio_kind: int | None = None
        self._hung_up = False
        self._failed: ProtocolError | None = None

    @property
    def call_id(self) -> str | None:
        return self._call_id

    @property
    def audio_kind(self) -> int | None:
        """The kind of the audio received so far (None before the first audio message)."""
        return self._audio_kind

    @property
    def hung_up(self) -> bool:
        return self._hung_up

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete message held for the next `feed`."""
        return len(self._buffer)

    @property
    def max_buffered_bytes(self) -> int:
        """The most `buffered_bytes` can be: a header and the largest payload, less a byte."""
        return HEADER_BYTES + max(max(self._limits.values()), MAX_CONTROL_PAYLOAD_BYTES) - 1

    def feed(self, data: bytes) -> list[AudioSocketEvent]:
        if self._failed is not None:
            raise AudioSocketProtocolError(self._failed, [])
        if self._hung_up:
            return []
        if self._buffer:
            self._buffer += data
            data = bytes(self._buffer)
            self._buffer.clear()
        events: list[AudioSocketEvent] = []
        offset, end = 0, len(data)
        try:
            while end - offset >= HEADER_BYTES:
                kind = data[offset]
                length = data[offset + 1] << 8 | data[offset + 2]
                # Checked on the header alone: a bad length is refused before its payload is
                # waited for, so nothing unbounded is ever buffered.
                self._check_header(kind, length)
                start = offset + HEADER_BYTES
                if end - start < length:
                    break
                offset = start + length
                event = self._message(kind, data[start:offset])
                if event is not None:
                    events.append(event)
                if self._hung_up:
                    return events
        except ProtocolError as error:
            self._failed = error
            self._buffer.clear()
            raise AudioSocketProtocolError(error, events) from None
        if offset < end:
            self._buffer += data[offset:]
        return events

    def _check_header(self, kind: int, length: int) -> None:
        limit = self._limits.get(kind)
        if limit is not None:  # audio: the common case first
            if self._call_id is None:
                raise _before_uuid(kind)
            if length > limit:
                raise ProtocolError(
                    MESSAGE_TOO_BIG,
                    f"{kind_name(kind)} message of {length} bytes exceeds {limit} "
                    f"({self.max_audio_ms} ms at {AUDIO_KINDS[kind]} Hz)",
                    kind="payload_too_large",
                )
            if length % SAMPLE_BYTES:
                raise ProtocolError(
                    PROTOCOL_ERROR,
                    f"{kind_name(kind)} message of {length} bytes is not whole 16-bit samples",
                    kind="bad_audio",
                )
            if self._audio_kind is not None and kind != self._audio_kind:
                raise ProtocolError(
                    UNSUPPORTED_DATA,
                    f"{kind_name(kind)} message after {kind_name(self._audio_kind)} audio: "
                    "the sample rate cannot change during a call",
                    kind="rate_changed",
                )
            return
        if kind == KIND_UUID:
            if self._call_id is not None:
                raise ProtocolError(
                    PROTOCOL_ERROR,
                    f"second UUID message (the call is {self._call_id})",
                    kind="out_of_order",
                )
            if length != UUID_BYTES:
                raise ProtocolError(
                    PROTOCOL_ERROR,
                    f"UUID message of {length} bytes: a UUID is {UUID_BYTES} bytes",
                    kind="bad_uuid",
                )
        elif kind == KIND_DTMF:
            if self._call_id is None:
                raise _before_uuid(kind)
            if length != 1:
                raise ProtocolError(
                    PROTOCOL_ERROR,
                    f"DTMF message of {length} bytes: a digit is 1 byte",
                    kind="bad_dtmf",
                )
        elif kind in (KIND_HANGUP, KIND_ERROR):
            if length > MAX_CONTROL_PAYLOAD_BYTES:
                raise ProtocolError(
                    MESSAGE_TOO_BIG,
                    f"{kind_name(kind)} message of {length} bytes exceeds "
                    f"{MAX_CONTROL_PAYLOAD_BYTES}",
                    kind="payload_too_large",
                )
        else:
            raise ProtocolError(
                UNSUPPORTED_DATA,
                f"unknown message kind 0x{kind:02x} (with a {length}-byte payload)",
                kind="unknown_kind",
            )

    def _message(self, kind: int, payload: bytes) -> AudioSocketEvent | None:
        rate = AUDIO_KINDS.get(kind)
        if rate is not None:
            self._audio_kind = kind
            # An empty frame carries nothing (Asterisk 18 skips them on its side too).
            return Audio(payload, rate) if payload else None
        if kind == KIND_UUID:
            self._call_id = str(uuid.UUID(bytes=payload))
            return Uuid(self._call_id)
        if kind == KIND_DTMF:
            digit = chr(payload[0])
            if digit not in DTMF_DIGITS:
                # One odd key press must not end a caller's call.
                return ProtocolWarning("invalid_dtmf", f"DTMF digit 0x{payload[0]:02x} ignored")
            return Dtmf(digit)
        if kind == KIND_HANGUP:
            self._hung_up = True
            return Hangup()
        return Error(payload[0] if payload else None)  # KIND_ERROR: the header check passed


def _before_uuid(kind: int) -> ProtocolError:
    return ProtocolError(
        PROTOCOL_ERROR,
        f"{kind_name(kind)} message before the UUID: the first message must be the UUID "
        f"(kind 0x{KIND_UUID:02x})",
        kind="out_of_order",
    )


# ---- encoders -------------------------------------------------------------------------------


def message(kind: int, payload: bytes = b"") -> bytes:
    """Any message: the 3-byte header, then `payload`."""
    if not 0 <= kind <= 0xFF:
        raise ValueError(f"kind {kind} is not a byte")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    return bytes((kind, len(payload) >> 8, len(payload) & 0xFF)) + payload


def audio_header(length: int, kind: int = KIND_AUDIO) -> bytes:
    """The header of an audio message of `length` bytes: for a sender that reuses it."""
    if kind not in AUDIO_KINDS:
        raise ValueError(f"{kind_name(kind)} is not an audio kind")
    if not 0 < length <= MAX_PAYLOAD_BYTES or length % SAMPLE_BYTES:
        raise ValueError(f"an audio payload of {length} bytes cannot be sent")
    return bytes((kind, length >> 8, length & 0xFF))


def audio_message(pcm: bytes, kind: int = KIND_AUDIO) -> bytes:
    """Audio for Asterisk to play at once: slin of `kind`'s rate, 20 ms per message at best.

    Asterisk 20.14 / 21.9 / 22.4 / 23.0 and later end the call on an empty audio message, so
    one cannot be made.
    """
    return audio_header(len(pcm), kind) + pcm


def hangup_message() -> bytes:
    """Ask Asterisk to hang up; it then closes the socket (every version since 18)."""
    return bytes((KIND_HANGUP, 0, 0))


def uuid_message(call_id: str) -> bytes:
    """What Asterisk sends first (for test clients and load generators)."""
    return message(KIND_UUID, uuid.UUID(call_id).bytes)


def dtmf_message(digit: str) -> bytes:
    """A key press as Asterisk 20.14 / 21.9 / 22.4 / 23.0 and later report it (for test
    clients and load generators)."""
    if digit not in DTMF_DIGITS:
        raise ValueError(f"{digit!r} is not a DTMF digit")
    return message(KIND_DTMF, digit.encode("ascii"))

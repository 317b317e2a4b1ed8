"""Key presses of a phone call: RFC 4733 telephone-event packets in RTP, and the bodies of SIP
INFO requests (application/dtmf-relay, application/dtmf) that some PBXes send instead. Sans-I/O.

What is covered: the event payload (RFC 4733 section 2.3), events 0-15, the DTMF keys (section
3.2); a receiver reporting each key press once, telling presses apart by their RTP timestamp
(every packet of an event carries the timestamp of its start, sections 2.5.1.2 and 2.5.1.4,
the end retransmissions included), so a lost or missing marker bit changes nothing; a sender's
payloads for one key: progress packets with a growing duration (2.5.1.2), then the end packet
three times (2.5.1.4).

Not covered: other tones (events above 15, RFC 4734) are ignored; redundant events in RFC 2198
RED packets; segments of events longer than the 16-bit duration (section 2.5.1.3); reporting
durations, as the agent only wants which key. The SIP INFO formats have no RFC: the key=value
lines of application/dtmf-relay are read as deployed PBXes write them.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from voice_agent.errors import VoiceAgentError

if TYPE_CHECKING:
    from voice_agent.sip.rtp import RtpPacket

EVENT_DIGITS = "0123456789*#ABCD"  # events 0-15 (RFC 4733 section 3.2)
EVENT_BYTES = 4
CLOCK_RATE = 8000  # telephone-event runs at the audio's clock rate: 8000 Hz with G.711
END_REPEATS = 3  # section 2.5.1.4
MAX_VOLUME = 63  # 6 bits, -dBm0 (section 2.3)

# Event, E/R/volume, duration (section 2.3).
_EVENT = struct.Struct("!BBH")
# Timestamps of the presses already reported, so a late packet of a long press that comes
# after a newer press is still recognised; a handful covers any reordering a call sees. Not
# "older than the newest is stale": a B2BUA that bridges a new leg under the same SSRC sends
# timestamps that jump back, and its presses are real.
_RECENT_EVENTS = 8
_NUMERIC_SIGNALS = {str(event): digit for event, digit in enumerate(EVENT_DIGITS)}


class DtmfError(VoiceAgentError):
    """A telephone-event payload we cannot read; the message says what is wrong."""


@dataclass(slots=True, frozen=True)
class TelephoneEvent:
    """One telephone-event payload: event number, end bit, volume (-dBm0), duration in
    timestamp units (1/8000 s) since the event's start."""

    event: int
    end: bool
    volume: int
    duration: int

    @property
    def digit(self) -> str | None:
        return EVENT_DIGITS[self.event] if self.event < len(EVENT_DIGITS) else None


def parse_event(payload: bytes) -> TelephoneEvent:
    """A telephone-event payload (section 2.3). Raises DtmfError."""
    if len(payload) != EVENT_BYTES:
        raise DtmfError(f"telephone-event payload of {len(payload)} bytes, not {EVENT_BYTES}")
    event, flags, duration = _EVENT.unpack_from(payload)
    return TelephoneEvent(event, bool(flags & 0x80), flags & 0x3F, duration)


class DtmfReceiver:
    """The key presses of one incoming stream, each reported once.

    feed() takes every packet of the telephone-event payload type (the caller has filtered by
    payload type) and returns the key on the first packet of a press that arrives, whichever
    one it is, and None for every other packet. State is a few timestamps: bounded."""

    __slots__ = ("_recent", "_ssrc", "ignored")

    def __init__(self) -> None:
        self._ssrc: int | None = None
        self._recent: deque[int] = deque(maxlen=_RECENT_EVENTS)
        self.ignored = 0  # unreadable payloads and non-DTMF events

    def feed(self, packet: RtpPacket) -> str | None:
        """The key this packet starts, or None. Never raises: network input that is not a
        DTMF event is counted in `ignored`."""
        payload = packet.payload
        # Inlined parse_event: this runs for every packet of every press.
        if len(payload) != EVENT_BYTES or payload[0] >= len(EVENT_DIGITS):
            self.ignored += 1
            return None
        if packet.ssrc != self._ssrc:
            # A new source has its own random timestamps (RFC 3550 section 5.1).
            self._ssrc = packet.ssrc
            self._recent.clear()
        timestamp = packet.timestamp
        if timestamp in self._recent:
            return None
        self._recent.append(timestamp)
        return EVENT_DIGITS[payload[0]]


def event_payloads(
    digit: str, *, duration_ms: int = 100, packet_ms: int = 20, volume: int = 10
) -> list[bytes]:
    """The payloads an RFC 4733 sender emits for one key, one every packet_ms: progress packets
    whose duration grows by packet_ms each (section 2.5.1.2), then the end packet, holding the
    whole duration, three times (2.5.1.4). Raises ValueError for a key that is not DTMF."""
    if len(digit) != 1 or digit.upper() not in EVENT_DIGITS:
        raise ValueError(f"{digit!r} is not a DTMF key (one of {EVENT_DIGITS})")
    if packet_ms <= 0:
        raise ValueError(f"packet_ms {packet_ms} is not positive")
    if not 0 <= volume <= MAX_VOLUME:
        raise ValueError(f"volume {volume} is outside 0-{MAX_VOLUME} (-dBm0)")
    step = packet_ms * CLOCK_RATE // 1000
    packets = max(1, -(-duration_ms // packet_ms))  # the last one may cover a part packet
    total = packets * step
    if duration_ms <= 0 or total > 0xFFFF:
        raise ValueError(
            f"duration {duration_ms} ms in {packet_ms} ms packets does not fit the 16-bit"
            f" duration field ({0xFFFF} samples at {CLOCK_RATE} Hz)"
        )
    event = EVENT_DIGITS.index(digit.upper())
    payloads = [_EVENT.pack(event, volume, step * n) for n in range(1, packets)]
    payloads.extend([_EVENT.pack(event, 0x80 | volume, total)] * END_REPEATS)
    return payloads


# The keypad's two frequencies (ITU-T Q.23): row, column.
_ROWS = {"123A": 697, "456B": 770, "789C": 852, "*0#D": 941}
_COLUMNS = {"147*": 1209, "2580": 1336, "369#": 1477, "ABCD": 1633}
TONE_LEVEL = 0.25  # of full scale per frequency: about -15 dBm0 each, inside Q.24's range


def tone_pcm(digit: str, duration_ms: int = 100, sample_rate: int = CLOCK_RATE) -> bytes:
    """One key as in-band audio (16-bit mono PCM): for a far end that took no telephone-event,
    whose IVR then listens for the tones themselves."""
    key = digit.upper()
    row = next((f for keys, f in _ROWS.items() if key in keys), None)
    column = next((f for keys, f in _COLUMNS.items() if key in keys), None)
    if row is None or column is None or len(key) != 1:
        raise ValueError(f"{digit!r} is not a DTMF key (one of {EVENT_DIGITS})")
    count = sample_rate * duration_ms // 1000
    scale = TONE_LEVEL * 32767
    samples = [
        int(
            scale
            * (
                math.sin(2 * math.pi * row * n / sample_rate)
                + math.sin(2 * math.pi * column * n / sample_rate)
            )
        )
        for n in range(count)
    ]
    return struct.pack(f"<{count}h", *samples)


def parse_dtmf_relay(body: bytes) -> str | None:
    """The key of an application/dtmf-relay INFO body ("Signal=5\\r\\nDuration=160"), or None
    when it has none. Keys of the lines in any case, spaces around '=' allowed; Signal may be
    the key itself or its event number (10 is '*', 11 is '#', as PBXes write them). Never
    raises."""
    text = body.decode("utf-8", "replace")
    for line in text.splitlines():
        name, equals, value = line.partition("=")
        if equals and name.strip().lower() == "signal":
            return _key(value)
    return None


def parse_dtmf_body(content_type: str, body: bytes) -> str | None:
    """The key of a SIP INFO body by its Content-Type: application/dtmf-relay (key=value
    lines) or application/dtmf (the key alone); None for other types or no key. Never
    raises."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/dtmf-relay":
        return parse_dtmf_relay(body)
    if media == "application/dtmf":
        return _key(body.decode("utf-8", "replace"))
    return None


def _key(value: str) -> str | None:
    value = value.strip().upper()
    if len(value) == 1 and value in EVENT_DIGITS:
        return value
    return _NUMERIC_SIGNALS.get(value)

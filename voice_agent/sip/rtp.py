"""RTP for G.711 phone calls (RFC 3550 section 5.1, RFC 3551 sections 4.5.14 and 6), sans-I/O:
datagrams in and out as bytes, time passed in as `now_ms` by the caller.

What is covered: the fixed header, the CSRC list (skipped), the header extension (section 5.3.1,
skipped by its length), padding (the P bit and the count in the last octet), version 2 only;
RTCP sharing the port (RFC 5761 section 4) told apart by payload type and refused, so the
caller drops it; an outgoing stream with random initial sequence number, timestamp and SSRC
(section 5.1); telephone-event packets sharing that stream (RFC 4733, built in dtmf.py); and a
drift-free 20 ms pacing clock. Payload types are G.711 mu-law 0 and A-law 8 at 8000 Hz, 160
samples (bytes) per 20 ms packet (RFC 3551 section 4.5.14).

Not covered, as a user agent taking G.711 calls needs none of it: RTCP itself (reports are not
read or sent), SSRC collision detection (section 8.2), the source validation with probation of
appendix A.1 (the jitter buffer in jitter.py does its own sequence tracking), mixers and
translators (section 7), and SRTP.

Every problem with a datagram raises RtpError saying what is wrong with it; the caller drops
the datagram (section 5.1 leaves unreadable packets to be discarded).
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

from voice_agent.errors import VoiceAgentError
from voice_agent.sip.dtmf import event_payloads

RTP_VERSION = 2
HEADER_BYTES = 12
PCMU = 0
PCMA = 8
CLOCK_RATE = 8000
SAMPLES_PER_PACKET = 160  # 20 ms at 8000 Hz; G.711 has one byte per sample
FRAME_MS = 20.0

# Version/P/X/CC, M/PT, sequence number, timestamp, SSRC (section 5.1).
_HEADER = struct.Struct("!BBHII")
# Profile-defined 16 bits and the extension's length in 32-bit words (section 5.3.1).
_EXTENSION = struct.Struct("!HH")
# RFC 5761 section 4: RTCP packet types 192-223 sit where marker and payload type are, so payload
# types 64-95 are not used by RTP on a shared port; this covers SR/RR/SDES/BYE/APP (72-76) and
# the feedback and XR types after them.
_RTCP_TYPES = range(64, 96)


class RtpError(VoiceAgentError):
    """A datagram that is not an RTP packet we can read; the message says what is wrong."""


@dataclass(slots=True)
class RtpPacket:
    """One RTP packet, its header fields as numbers and its payload with padding removed."""

    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    marker: bool
    payload: bytes


def parse_rtp(data: bytes) -> RtpPacket:
    """One RTP packet from a datagram (section 5.1). Raises RtpError."""
    size = len(data)
    if size < HEADER_BYTES:
        raise RtpError(f"RTP packet of {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    first, second, sequence, timestamp, ssrc = _HEADER.unpack_from(data)
    if first >> 6 != RTP_VERSION:
        raise RtpError(f"RTP packet of version {first >> 6}, not {RTP_VERSION}")
    payload_type = second & 0x7F
    if payload_type in _RTCP_TYPES:
        raise RtpError(f"RTCP packet (type {second}) on the RTP port, not RTP")
    start = HEADER_BYTES + 4 * (first & 0x0F)
    if first & 0x10:
        if size < start + 4:
            raise RtpError(
                f"RTP packet of {size} bytes with {first & 0x0F} CSRCs and the X bit,"
                f" shorter than the {start + 4} bytes its header extension starts at"
            )
        _, words = _EXTENSION.unpack_from(data, start)
        start += 4 + 4 * words
    if size < start:
        raise RtpError(f"RTP packet of {size} bytes, shorter than its {start}-byte header")
    end = size
    if first & 0x20:
        # The count includes its own octet (section 5.1), so 0 is as wrong as too many.
        padding = data[-1]
        if padding == 0 or padding > size - start:
            raise RtpError(
                f"RTP packet padding of {padding} bytes, with {size - start} bytes after"
                f" the {start}-byte header"
            )
        end -= padding
    return RtpPacket(payload_type, sequence, timestamp, ssrc, bool(second & 0x80), data[start:end])


def build_rtp(packet: RtpPacket) -> bytes:
    """The datagram for `packet`: a 12-byte header (no CSRCs, no extension, no padding)."""
    second = packet.payload_type | 0x80 if packet.marker else packet.payload_type
    return (
        _HEADER.pack(0x80, second, packet.sequence, packet.timestamp, packet.ssrc) + packet.payload
    )


class RtpSender:
    """One outgoing RTP stream: its SSRC, the next sequence number and timestamp.

    packet() is the audio path: each call advances the sequence number by one and the timestamp
    by samples_per_packet. raw() sends anything else on the same stream (telephone events share
    the audio's SSRC and sequence numbering, RFC 4733), and skip() moves the media clock on
    without sending, for a hold pause or frames the Pacer dropped, so the far end sees the gap
    in time rather than audio played late."""

    __slots__ = ("_marker_type", "_payload_type", "_sequence", "_ssrc", "_step", "_timestamp")

    def __init__(
        self,
        payload_type: int,
        *,
        ssrc: int | None = None,
        samples_per_packet: int = SAMPLES_PER_PACKET,
        rng: random.Random | None = None,
    ) -> None:
        _check_payload_type(payload_type)
        if samples_per_packet <= 0:
            raise ValueError(f"samples_per_packet {samples_per_packet} is not positive")
        if ssrc is not None and not 0 <= ssrc <= 0xFFFFFFFF:
            raise ValueError(f"SSRC {ssrc} does not fit 32 bits")
        # Section 5.1: random initial values, so a known-plaintext attack on an encrypted
        # stream has less to go on; the system's source unless a test injects its own.
        source = rng if rng is not None else random.SystemRandom()
        self._payload_type = payload_type
        self._marker_type = payload_type | 0x80
        self._step = samples_per_packet
        self._sequence = source.getrandbits(16)
        self._timestamp = source.getrandbits(32)
        self._ssrc = source.getrandbits(32) if ssrc is None else ssrc

    @property
    def payload_type(self) -> int:
        return self._payload_type

    def use_payload_type(self, payload_type: int) -> None:
        """Send audio under another payload type from the next packet (a re-INVITE's codec);
        the stream, its sequence numbers and timestamps go on."""
        _check_payload_type(payload_type)
        self._payload_type = payload_type
        self._marker_type = payload_type | 0x80

    @property
    def ssrc(self) -> int:
        return self._ssrc

    @property
    def sequence(self) -> int:
        """The sequence number the next packet gets."""
        return self._sequence

    @property
    def timestamp(self) -> int:
        """The timestamp the next audio packet gets: the media clock's now."""
        return self._timestamp

    def packet(self, payload: bytes, *, marker: bool = False) -> bytes:
        """An audio packet; marker on the first packet of a talkspurt (RFC 3551 section 4.1)."""
        sequence = self._sequence
        timestamp = self._timestamp
        data = (
            _HEADER.pack(
                0x80,
                self._marker_type if marker else self._payload_type,
                sequence,
                timestamp,
                self._ssrc,
            )
            + payload
        )
        self._sequence = (sequence + 1) & 0xFFFF
        self._timestamp = (timestamp + self._step) & 0xFFFFFFFF
        return data

    def raw(self, payload_type: int, payload: bytes, timestamp: int, marker: bool = False) -> bytes:
        """A packet of another payload type on this stream: advances the sequence number only,
        as the timestamp is the caller's (a telephone event keeps its start's, RFC 4733)."""
        sequence = self._sequence
        second = payload_type | 0x80 if marker else payload_type
        data = _HEADER.pack(0x80, second, sequence, timestamp & 0xFFFFFFFF, self._ssrc) + payload
        self._sequence = (sequence + 1) & 0xFFFF
        return data

    def skip(self, samples: int) -> None:
        """Move the media clock on by `samples` without sending."""
        if samples < 0:
            raise ValueError(f"cannot skip {samples} samples back")
        self._timestamp = (self._timestamp + samples) & 0xFFFFFFFF

    def event_packets(
        self,
        digit: str,
        payload_type: int,
        *,
        duration_ms: int = 100,
        packet_ms: int = 20,
        volume: int = 10,
    ) -> list[bytes]:
        """The RFC 4733 packets for one key press on this stream, to send one per packet_ms in
        place of audio: all carry the media clock's now as timestamp and the first has the
        marker (section 2.5.1.2); the timestamp then moves on by the time they take, so the
        audio after them continues the clock."""
        _check_payload_type(payload_type)
        payloads = event_payloads(
            digit, duration_ms=duration_ms, packet_ms=packet_ms, volume=volume
        )
        start = self._timestamp
        packets = [
            self.raw(payload_type, payload, start, marker=index == 0)
            for index, payload in enumerate(payloads)
        ]
        self.skip(len(payloads) * packet_ms * CLOCK_RATE // 1000)
        return packets


def _check_payload_type(payload_type: int) -> None:
    if not 0 <= payload_type <= 127:
        raise ValueError(f"payload type {payload_type} does not fit 7 bits")
    if payload_type in _RTCP_TYPES:
        raise ValueError(f"payload type {payload_type} would read as RTCP (RFC 5761 section 4)")

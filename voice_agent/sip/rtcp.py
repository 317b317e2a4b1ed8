"""RTCP packets (RFC 3550 section 6), sans-I/O: the compound packets a call's media sends and
reads. What is read: sender reports (SR, 200) and receiver reports (RR, 201) with their report
blocks, source descriptions (SDES, 202) for the CNAME, BYE (203); other types (APP, RFC 4585's
feedback) are skipped by their length. What is built: an SR (or an RR while we have sent
nothing) with one report block about the caller's stream, then an SDES with our CNAME, as
section 6.1 wants every compound packet to start. RFC 5761's test of whether a datagram on a
multiplexed port is RTCP: its second byte (RTCP's packet type) is 192 to 223.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from voice_agent.errors import VoiceAgentError

VERSION = 2
SR = 200
RR = 201
SDES = 202
BYE = 203
CNAME = 1
_HEADER = struct.Struct("!BBH")
_BLOCK = struct.Struct("!IB3sIIII")
_SENDER = struct.Struct("!IIIII")  # NTP seconds, NTP fraction, RTP timestamp, packets, octets
NTP_EPOCH_OFFSET_S = 2_208_988_800  # 1900-01-01 to 1970-01-01


class RtcpError(VoiceAgentError):
    """A datagram that is not a well-formed RTCP compound packet; the message says where."""


@dataclass(frozen=True)
class ReportBlock:
    """Section 6.4.1: what one source's receiver saw of another's stream."""

    ssrc: int  # whose stream this is about
    fraction_lost: int  # of 256, since the last report
    cumulative_lost: int  # may be negative (duplicates)
    highest_sequence: int  # extended: cycles in the upper 16 bits
    jitter: int  # in timestamp units
    last_sr: int  # the middle 32 bits of the NTP time of the last SR received from `ssrc`
    delay_since_last_sr: int  # in 1/65536 s


@dataclass
class RtcpReport:
    """What one compound packet said."""

    ssrc: int = 0  # its sender's
    sender_ntp: int | None = None  # an SR's 64-bit NTP time
    sender_packets: int | None = None
    sender_octets: int | None = None
    blocks: list[ReportBlock] = field(default_factory=list)
    cname: str | None = None
    bye: bool = False


def is_rtcp(data: bytes) -> bool:
    """RFC 5761 section 4: on a port carrying both, RTCP's second byte is 192..223 (RTP's
    marker bit and payload type never make that with the dynamic types in use)."""
    return len(data) >= 2 and 192 <= data[1] <= 223


def parse_rtcp(data: bytes) -> RtcpReport:
    """Read a compound packet; RtcpError names what is wrong (section 6.1's checks: version 2,
    lengths that add up, SR or RR first)."""
    report = RtcpReport()
    offset = 0
    first = True
    while offset < len(data):
        if len(data) - offset < 4:
            raise RtcpError(f"{len(data) - offset} stray bytes after packet at {offset}")
        flags, packet_type, words = _HEADER.unpack_from(data, offset)
        if flags >> 6 != VERSION:
            raise RtcpError(f"version {flags >> 6} at byte {offset}, not 2")
        end = offset + (words + 1) * 4
        if end > len(data):
            raise RtcpError(f"packet type {packet_type} at {offset} runs past the datagram")
        if first and packet_type not in (SR, RR):
            raise RtcpError(f"a compound packet starts with type {packet_type}, not SR or RR")
        body = data[offset + 4 : end]
        if flags & 0x20:  # padding: its count is the packet's last byte
            pad = body[-1] if body else 0
            if pad == 0 or pad > len(body):
                raise RtcpError(f"padding of {pad} bytes in a packet of {len(body) + 4}")
            body = body[:-pad]
        count = flags & 0x1F
        if packet_type in (SR, RR):
            _read_report(report, packet_type, count, body, first)
        elif packet_type == SDES:
            report.cname = report.cname or _read_cname(body)
        elif packet_type == BYE:
            report.bye = True
        first = False
        offset = end
    if first:
        raise RtcpError("an empty datagram")
    return report


def _read_report(report: RtcpReport, kind: int, count: int, body: bytes, first: bool) -> None:
    head = 4 + (_SENDER.size if kind == SR else 0)
    if len(body) < head + count * _BLOCK.size:
        raise RtcpError(f"{'SR' if kind == SR else 'RR'} of {len(body)} bytes for {count} blocks")
    (ssrc,) = struct.unpack_from("!I", body)
    if first:
        report.ssrc = ssrc
    if kind == SR:
        seconds, fraction, _, packets, octets = _SENDER.unpack_from(body, 4)
        report.sender_ntp = seconds << 32 | fraction
        report.sender_packets, report.sender_octets = packets, octets
    for index in range(count):
        ssrc_n, fraction_lost, lost, highest, jitter, lsr, dlsr = _BLOCK.unpack_from(
            body, head + index * _BLOCK.size
        )
        cumulative = int.from_bytes(lost, "big", signed=True)
        report.blocks.append(
            ReportBlock(ssrc_n, fraction_lost, cumulative, highest, jitter, lsr, dlsr)
        )


def _read_cname(body: bytes) -> str | None:
    """The first chunk's CNAME item (section 6.5.1), if it has one."""
    at = 4  # past the chunk's SSRC
    while at + 2 <= len(body):
        item, length = body[at], body[at + 1]
        if item == 0:
            return None
        if item == CNAME:
            return body[at + 2 : at + 2 + length].decode("utf-8", errors="replace")
        at += 2 + length
    return None


def ntp_time(wall_s: float) -> int:
    """A Unix time as the 64-bit NTP timestamp of section 4."""
    seconds = wall_s + NTP_EPOCH_OFFSET_S
    whole = int(seconds)
    return whole << 32 | int((seconds - whole) * 2**32) & 0xFFFFFFFF


def middle_32(ntp: int) -> int:
    """The middle 32 bits of an NTP timestamp: what LSR carries (section 6.4.1)."""
    return (ntp >> 16) & 0xFFFFFFFF


@dataclass(frozen=True)
class SenderInfo:
    ntp: int
    rtp_timestamp: int
    packets: int
    octets: int


def build_report(
    ssrc: int,
    cname: str,
    *,
    sender: SenderInfo | None,
    blocks: list[ReportBlock],
) -> bytes:
    """An SR (with `sender`) or RR, its report blocks, then an SDES with our CNAME."""
    parts = [struct.pack("!I", ssrc)]
    if sender is not None:
        parts.append(
            _SENDER.pack(
                sender.ntp >> 32,
                sender.ntp & 0xFFFFFFFF,
                sender.rtp_timestamp & 0xFFFFFFFF,
                sender.packets & 0xFFFFFFFF,
                sender.octets & 0xFFFFFFFF,
            )
        )
    for block in blocks[:31]:
        lost = max(-(2**23), min(2**23 - 1, block.cumulative_lost))
        parts.append(
            _BLOCK.pack(
                block.ssrc,
                block.fraction_lost & 0xFF,
                lost.to_bytes(3, "big", signed=True),
                block.highest_sequence & 0xFFFFFFFF,
                block.jitter & 0xFFFFFFFF,
                block.last_sr & 0xFFFFFFFF,
                block.delay_since_last_sr & 0xFFFFFFFF,
            )
        )
    report = b"".join(parts)
    kind = SR if sender is not None else RR
    first = _HEADER.pack(VERSION << 6 | len(blocks[:31]), kind, len(report) // 4) + report
    name = cname.encode("utf-8")[:255]
    chunk = struct.pack("!IBB", ssrc, CNAME, len(name)) + name
    chunk += b"\x00" * (4 - len(chunk) % 4)  # the null item ending the list, then to a word
    sdes = _HEADER.pack(VERSION << 6 | 1, SDES, len(chunk) // 4) + chunk
    return first + sdes


def build_bye(ssrc: int) -> bytes:
    return _HEADER.pack(VERSION << 6 | 1, BYE, 1) + struct.pack("!I", ssrc)

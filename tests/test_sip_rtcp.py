"""RTCP (RFC 3550 section 6, RFC 5761) in voice_agent/sip/rtcp.py and rtp_reception.py,
sans-I/O: compound packets read and written byte for byte as the RFC lays them out, the
caller's stream counted as Appendix A has it (loss, wrap-around, a restarted sender), and the
round trip from the caller's report of our report.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import replace
from typing import Any

import pytest

from tests.test_sip_srtp import KEY_80
from voice_agent.observability.metrics import ServerMetrics
from voice_agent.sip.media import RtpSession
from voice_agent.sip.rtcp import (
    ReportBlock,
    RtcpError,
    SenderInfo,
    build_bye,
    build_report,
    is_rtcp,
    middle_32,
    ntp_time,
    parse_rtcp,
)
from voice_agent.sip.rtp import RtpPacket, build_rtp
from voice_agent.sip.rtp_reception import Reception
from voice_agent.sip.sdes import SrtpKeys, SrtpTransform, choose
from voice_agent.sip.sdp import SECURE_RTP, negotiate, parse_sdp

WALL_S = 1_800_000_000.25  # 2027, a quarter second past


def test_a_sender_report_reads_back_as_written() -> None:
    block = ReportBlock(0xCA11E5, 12, 340, 0x1_0005, 77, 0xAABBCCDD, 65536)
    sender = SenderInfo(ntp_time(WALL_S), 160_000, 1000, 160_000)
    data = build_report(0xFEED, "agent@voice-agent", sender=sender, blocks=[block])
    assert len(data) % 4 == 0
    assert data[0] >> 6 == 2 and data[1] == 200  # version 2, SR first
    report = parse_rtcp(data)
    assert report.ssrc == 0xFEED
    assert report.sender_ntp == sender.ntp
    assert (report.sender_packets, report.sender_octets) == (1000, 160_000)
    assert report.blocks == [block]
    assert report.cname == "agent@voice-agent"


def test_a_receiver_report_before_we_sent_anything_and_a_bye() -> None:
    data = build_report(7, "x", sender=None, blocks=[]) + build_bye(7)
    assert data[1] == 201
    report = parse_rtcp(data)
    assert report.sender_ntp is None and report.blocks == [] and report.bye


def test_negative_cumulative_loss_from_duplicates_survives_the_24_bit_field() -> None:
    block = ReportBlock(1, 0, -3, 10, 0, 0, 0)
    report = parse_rtcp(build_report(2, "c", sender=None, blocks=[block]))
    assert report.blocks[0].cumulative_lost == -3


def test_ntp_time_is_seconds_since_1900_and_lsr_its_middle() -> None:
    ntp = ntp_time(WALL_S)
    assert ntp >> 32 == int(WALL_S) + 2_208_988_800
    assert abs((ntp & 0xFFFFFFFF) / 2**32 - 0.25) < 1e-9
    assert middle_32(ntp) == ((int(WALL_S) + 2_208_988_800) & 0xFFFF) << 16 | 0x4000


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "empty"),
        (b"\x80\xc9\x00", "stray"),
        (b"\x40\xc9\x00\x01" + b"\x00" * 4, "version 1"),
        (b"\x80\xc9\x00\x05" + b"\x00" * 4, "runs past"),
        (b"\x81\xca\x00\x01" + b"\x00" * 4, "starts with type 202"),
        (b"\x81\xc9\x00\x01" + b"\x00" * 4, "for 1 blocks"),
        (b"\xa0\xc9\x00\x01" + b"\x00" * 3 + b"\x09", "padding"),
    ],
)
def test_what_is_not_rtcp_is_refused_saying_where(data: bytes, why: str) -> None:
    with pytest.raises(RtcpError, match=why):
        parse_rtcp(data)


def test_unknown_packet_types_in_a_compound_are_skipped_by_their_length() -> None:
    app = struct.pack("!BBHI4s", 0x80, 204, 2, 7, b"TEST")  # APP, section 6.7
    data = build_report(9, "c", sender=None, blocks=[]) + app
    assert parse_rtcp(data).ssrc == 9


def test_rtcp_and_rtp_on_one_port_are_told_apart() -> None:
    """RFC 5761 section 4: the second byte. G.711 (0, 8), telephone-event (101) and the
    marker bit never reach 192..223."""
    assert is_rtcp(build_report(1, "c", sender=None, blocks=[]))
    for payload_type in (0, 8, 101):
        for marker in (False, True):
            packet = RtpPacket(payload_type, 1, 160, 5, marker, b"\xff" * 160)
            assert not is_rtcp(build_rtp(packet))


# ---- the caller's stream, measured -----------------------------------------------------------


def feed(reception: Reception, sequences: list[int], *, ssrc: int = 5) -> None:
    for sequence in sequences:
        reception.packet(ssrc, sequence)


def test_a_stream_without_loss_reports_none() -> None:
    reception = Reception()
    feed(reception, list(range(100, 150)))
    block = reception.block(1000, jitter_ms=2.5)
    assert block is not None
    assert (block.fraction_lost, block.cumulative_lost) == (0, 0)
    assert block.highest_sequence == 149
    assert block.jitter == 20  # 2.5 ms in 8 kHz timestamp units


def test_lost_packets_and_the_fraction_since_the_last_report() -> None:
    reception = Reception()
    feed(reception, [s for s in range(0, 100) if s % 10 != 3])  # 10 of 100 lost
    first = reception.block(2000, 0)
    assert first is not None
    assert first.cumulative_lost == 10
    assert first.fraction_lost == (10 << 8) // 100
    for sequence in range(100, 200):
        reception.packet(5, sequence)
    second = reception.block(4000, 0)
    assert second is not None
    assert second.fraction_lost == 0  # nothing lost in this interval
    assert second.cumulative_lost == 10


def test_the_sequence_number_wraps_into_the_cycles() -> None:
    reception = Reception()
    feed(reception, [65534, 65535, 0, 1, 2])
    block = reception.block(100, 0)
    assert block is not None
    assert block.highest_sequence == 1 << 16 | 2
    assert block.cumulative_lost == 0


def test_a_late_packet_moves_nothing_and_a_stray_jump_is_not_taken() -> None:
    reception = Reception()
    feed(reception, [10, 11, 13, 12, 14])  # 12 late
    assert reception.extended_max == 14 and reception.lost == 0
    reception.packet(5, 30_000)  # one stray far jump
    assert reception.extended_max == 14


def test_a_sender_that_restarts_its_sequence_is_followed() -> None:
    reception = Reception()
    feed(reception, [100, 101, 102])
    reception.packet(5, 40_000)
    reception.packet(5, 40_001)  # the next in the new run: a restart
    assert reception.extended_max == 40_001 and reception.lost == 0


def test_the_round_trip_from_the_callers_report_of_ours() -> None:
    """Section 6.4.1: we sent an SR at T; the caller held it 0.5 s and reported; its report
    comes 0.1 s after that: the round trip is 0.1 s (its hold time taken out)."""
    reception = Reception()
    sent_ntp = ntp_time(WALL_S)
    block = ReportBlock(0xFEED, 5, 2, 100, 40, middle_32(sent_ntp), 32768)  # DLSR 0.5 s
    data = build_report(0xCA11, "caller", sender=None, blocks=[block])
    reception.report(parse_rtcp(data), 0xFEED, now_ms=0, wall_s=WALL_S + 0.6)
    assert reception.round_trip_ms is not None
    assert abs(reception.round_trip_ms - 100) < 0.1
    assert (reception.remote_fraction_lost, reception.remote_cumulative_lost) == (5, 2)
    assert reception.reports == 1


def test_our_report_carries_the_callers_last_sr_and_the_delay_since() -> None:
    reception = Reception()
    feed(reception, [1, 2, 3])
    caller_ntp = ntp_time(WALL_S)
    sr = build_report(0xCA11, "c", sender=SenderInfo(caller_ntp, 0, 3, 480), blocks=[])
    reception.report(parse_rtcp(sr), 0xFEED, now_ms=1000, wall_s=WALL_S)
    block = reception.block(3000, 0)
    assert block is not None
    assert block.last_sr == middle_32(caller_ntp)
    assert block.delay_since_last_sr == 2 * 65536


# ---- one call's RTCP, in its media (voice_agent/sip/media.py) ----------------------------------

CALLER = ("198.51.100.7", 40000)
OFFER = (
    b"v=0\r\no=- 1 1 IN IP4 198.51.100.7\r\ns=-\r\nc=IN IP4 198.51.100.7\r\nt=0 0\r\n"
    b"m=audio 40000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
    b"a=rtpmap:101 telephone-event/8000\r\n"
)
SPEECH = b"\x7f" * 160


def media_for(offer: bytes = OFFER, **kwargs: Any) -> RtpSession:
    return RtpSession(negotiate(parse_sdp(offer)), signalling_host=CALLER[0], **kwargs)


def rtp(sequence: int, ssrc: int = 0xCA11) -> bytes:
    return build_rtp(RtpPacket(0, sequence, sequence * 160, ssrc, False, SPEECH))


def the_callers_report(block: ReportBlock | None = None) -> bytes:
    sender = SenderInfo(ntp_time(WALL_S), 0, 1, 160)
    blocks = [block] if block is not None else []
    return build_report(0xCA11, "caller@phone", sender=sender, blocks=blocks)


def test_our_reports_go_to_the_rtcp_port_every_five_seconds_or_so() -> None:
    """The first after half the interval (section 6.2), then 2.5 to 7.5 s apart; an SR once we
    have sent, its block saying what we lost of the caller's stream; to the SDP's port + 1."""
    media = media_for()
    assert media.rtcp_destination == (CALLER[0], 40001)
    times, reports = [], []
    sequence = 0
    for tick in range(0, 30_000, 20):
        if tick % 200 != 100:  # one packet in ten lost
            media.receive(rtp(sequence), CALLER, tick)
        sequence += 1
        media.next_packet(tick)
        data = media.next_rtcp(tick)
        if data is not None:
            times.append(tick)
            reports.append(parse_rtcp(data))
    assert times[0] == 2500
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps and all(2500 <= gap <= 7500 for gap in gaps)
    last = reports[-1]
    assert last.sender_packets is not None and last.sender_packets > 1000
    (block,) = last.blocks
    assert block.ssrc == 0xCA11
    assert abs(block.cumulative_lost - (block.highest_sequence + 1) / 10) <= 2
    assert 20 <= block.fraction_lost <= 31  # about 10% of 256
    assert last.cname is not None and last.cname.endswith("@voice-agent")


def test_the_callers_rtcp_is_read_on_either_port_and_reaches_the_record() -> None:
    media = media_for()
    media.receive(rtp(1), CALLER, 0)
    report = the_callers_report(ReportBlock(media.sender.ssrc, 64, 12, 500, 160, 0, 0))
    media.receive(report, CALLER, 100)  # on the RTP port: told apart by its type
    media.receive_rtcp(report, (CALLER[0], 40001), 200)  # on the RTCP port
    summary = media.report()
    assert summary["rtcp_received"] == 2 and summary["unreadable"] == 0
    assert summary["caller_reported_lost"] == 12
    assert summary["caller_reported_fraction_lost"] == 0.25
    assert summary["caller_reported_jitter_ms"] == 20.0
    assert media.rtcp_destination == (CALLER[0], 40001)  # where the caller's came from


def test_a_strangers_rtcp_is_not_read_and_garbage_is_counted() -> None:
    media = media_for()
    media.receive_rtcp(the_callers_report(), ("203.0.113.66", 40001), 0)
    media.receive_rtcp(b"\x80\xc9\x00\x09junk", (CALLER[0], 40001), 0)
    summary = media.report()
    assert summary["rtcp_received"] == 0 and summary["rtcp_unreadable"] == 1
    assert summary["foreign"] == 1


def test_under_rtcp_mux_our_reports_go_to_the_rtp_port() -> None:
    media = media_for(OFFER + b"a=rtcp-mux\r\n")
    assert media.rtcp_destination == CALLER


def test_the_line_is_silent_until_rtp_or_rtcp_comes() -> None:
    media = media_for()
    assert media.silent_for_ms(1000) == 0
    assert media.silent_for_ms(31_000) == 30_000
    media.receive_rtcp(the_callers_report(), (CALLER[0], 40001), 31_000)
    assert media.silent_for_ms(32_000) == 1000
    media.receive(rtp(1), CALLER, 40_000)
    assert media.silent_for_ms(40_500) == 500


def test_srtcp_both_ways_on_an_srtp_call() -> None:
    offer = OFFER.replace(b"RTP/AVP", b"RTP/SAVP") + (
        b"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + KEY_80.encode() + b"\r\n"
    )
    parsed = parse_sdp(offer)
    keys = choose(parsed.streams[0].crypto)
    assert keys is not None
    media = RtpSession(
        replace(negotiate(parsed, protocols=SECURE_RTP), srtp=keys), signalling_host=CALLER[0]
    )
    phone = SrtpTransform(SrtpKeys(keys.suite, keys.tag, remote=keys.local, local=keys.remote))
    media.receive_rtcp(phone.protect_rtcp(the_callers_report()), (CALLER[0], 40001), 0)
    media.receive_rtcp(the_callers_report(), (CALLER[0], 40001), 10)  # plain: refused
    summary = media.report()
    assert (summary["rtcp_received"], summary["rtcp_unreadable"]) == (1, 1)
    assert media.next_rtcp(0) is None  # the schedule starts: the first in 2.5 s
    ours = media.next_rtcp(2500)
    assert ours is not None
    assert parse_rtcp(phone.unprotect_rtcp(ours)).ssrc == media.sender.ssrc
    with pytest.raises(RtcpError):
        parse_rtcp(ours)  # what goes on the wire is not plain RTCP (SRTCP appends its index)


def test_the_callers_jitter_loss_and_round_trip_go_to_the_metrics() -> None:
    metrics = ServerMetrics(process_metrics=False)
    report = {"stream_expected": 1000, "stream_lost": 20, "jitter_ms": 12.0, "round_trip_ms": 80.0}
    metrics.sip_media_report(report)
    metrics.sip_media_report({"stream_expected": 0, "round_trip_ms": None})  # heard nothing
    text = metrics.render()[0].decode()
    assert 'voice_agent_sip_caller_loss_ratio_bucket{le="0.01"} 0.0' in text
    assert 'voice_agent_sip_caller_loss_ratio_bucket{le="0.02"} 1.0' in text
    assert "voice_agent_sip_caller_loss_ratio_count 1.0" in text
    assert 'voice_agent_sip_caller_jitter_seconds_bucket{le="0.02"} 1.0' in text
    assert 'voice_agent_sip_caller_jitter_seconds_bucket{le="0.01"} 0.0' in text
    assert "voice_agent_sip_round_trip_seconds_count 1.0" in text

"""RTP for phone calls (voice_agent/sip/rtp.py, jitter.py, dtmf.py): real G.711 and RFC 4733
captures from Debian's sip-tester parsed, the jitter buffer's reordering, loss and bounds, the
pacer's drift-free clock, key presses reported once, and no datagram that breaks the parser."""

from __future__ import annotations

import itertools
import random
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voice_agent.audio.pacing import Pacer, PhasedPacer
from voice_agent.errors import VoiceAgentError
from voice_agent.sip.dtmf import (
    EVENT_DIGITS,
    DtmfError,
    DtmfReceiver,
    TelephoneEvent,
    event_payloads,
    parse_dtmf_body,
    parse_dtmf_relay,
    parse_event,
)
from voice_agent.sip.jitter import MAX_JUMP, JitterBuffer
from voice_agent.sip.rtp import (
    PCMA,
    PCMU,
    RtpError,
    RtpPacket,
    RtpSender,
    build_rtp,
    parse_rtp,
)

# Debian's sip-tester ships its pcaps here (older layouts had a pcap/ folder).
PCAP_DIRS = [Path("/usr/share/sip-tester"), Path("/usr/share/sip-tester/pcap")]
TELEPHONE_EVENT = 101


def _pcap(name: str) -> Path:
    for folder in PCAP_DIRS:
        if (folder / name).is_file():
            return folder / name
    # Never a silent skip: scripts/test installs Debian's sip-tester.
    raise AssertionError(f"{name} is missing: scripts/test installs sip-tester")


def _udp_payloads(path: Path) -> list[bytes]:
    """The UDP payloads of a classic pcap file of IPv4 over Ethernet or Linux cooked capture."""
    data = path.read_bytes()
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        order = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        order = ">"
    else:
        raise AssertionError(f"{path} is not a pcap file (magic {magic.hex()})")
    (link_type,) = struct.unpack_from(order + "I", data, 20)
    # Link type 1 is Ethernet (EtherType at 12, IP at 14); 113 is Linux cooked (16-byte header).
    link = {1: (12, 14), 113: (14, 16)}
    assert link_type in link, f"{path}: link type {link_type}"
    type_at, ip_at = link[link_type]
    payloads = []
    offset = 24
    while offset + 16 <= len(data):
        _, _, captured, _ = struct.unpack_from(order + "IIII", data, offset)
        frame = data[offset + 16 : offset + 16 + captured]
        offset += 16 + captured
        (ether_type,) = struct.unpack_from("!H", frame, type_at)
        if ether_type != 0x0800 or frame[ip_at + 9] != 17:
            continue  # not IPv4, or not UDP
        udp = ip_at + (frame[ip_at] & 0x0F) * 4
        (length,) = struct.unpack_from("!H", frame, udp + 4)
        payloads.append(frame[udp + 8 : udp + length])
    return payloads


def _packet(
    sequence: int,
    payload: bytes = b"",
    *,
    ssrc: int = 0x1234,
    timestamp: int | None = None,
    payload_type: int = PCMU,
    marker: bool = False,
) -> RtpPacket:
    stamp = (sequence * 160) & 0xFFFFFFFF if timestamp is None else timestamp
    return RtpPacket(payload_type, sequence & 0xFFFF, stamp, ssrc, marker, payload)


def _audio(sequence: int) -> bytes:
    return sequence.to_bytes(4, "big")


# --- rtp.py: parsing and building ---------------------------------------------------------


def test_a_built_packet_parses_back() -> None:
    packet = RtpPacket(PCMA, 65535, 0xFFFFFFF0, 0xDEADBEEF, True, bytes(range(160)))
    data = build_rtp(packet)
    assert len(data) == 172 and data[:2] == b"\x80\x88"
    assert parse_rtp(data) == packet


@given(
    payload_type=st.sampled_from([0, 8, 18, 96, 101, 127]),
    sequence=st.integers(0, 0xFFFF),
    timestamp=st.integers(0, 0xFFFFFFFF),
    ssrc=st.integers(0, 0xFFFFFFFF),
    marker=st.booleans(),
    payload=st.binary(max_size=200),
)
def test_any_packet_round_trips(
    payload_type: int, sequence: int, timestamp: int, ssrc: int, marker: bool, payload: bytes
) -> None:
    packet = RtpPacket(payload_type, sequence, timestamp, ssrc, marker, payload)
    assert parse_rtp(build_rtp(packet)) == packet


def test_csrcs_a_header_extension_and_padding_are_skipped() -> None:
    header = struct.pack("!BBHII", 0x80 | 0x20 | 0x10 | 2, 0, 7, 1120, 99)
    csrcs = struct.pack("!II", 1, 2)
    extension = struct.pack("!HH", 0xBEDE, 2) + bytes(8)  # two 32-bit words of extension
    padding = b"\x00\x00\x03"
    packet = parse_rtp(header + csrcs + extension + b"audio" + padding)
    assert packet.payload == b"audio"
    assert (packet.sequence, packet.timestamp, packet.ssrc) == (7, 1120, 99)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x80\x00\x00\x01\x00\x00\x00", "RTP packet of 7 bytes, shorter than the 12-byte header"),
        (b"\x40" + bytes(11), "version 1, not 2"),
        (bytes(12), "version 0, not 2"),
        # An RTCP receiver report (packet type 201) muxed on the RTP port (RFC 5761).
        (b"\x81\xc9\x00\x07" + bytes(28), "RTCP packet (type 201)"),
        (b"\x80\xc8\x00\x06" + bytes(24), "RTCP packet (type 200)"),
        (b"\x82\x00" + bytes(14), "shorter than its 20-byte header"),  # two CSRCs, room for one
        (b"\x90\x00" + bytes(12), "shorter than the 16 bytes its header extension starts at"),
        (b"\x90\x00" + bytes(10) + b"\xbe\xde\x00\x02", "shorter than its 24-byte header"),
        (b"\xa0\x00" + bytes(10) + b"ab\x05", "padding of 5 bytes, with 3 bytes after"),
        (b"\xa0\x00" + bytes(10) + b"ab\x00", "padding of 0 bytes"),
    ],
)
def test_bad_packets_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(RtpError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_rtp(data)


def test_an_rtp_error_is_a_voice_agent_error() -> None:
    assert issubclass(RtpError, VoiceAgentError) and issubclass(DtmfError, VoiceAgentError)


def test_padding_that_is_the_whole_payload_leaves_it_empty() -> None:
    assert parse_rtp(b"\xa0\x00" + bytes(10) + b"\x00\x00\x03").payload == b""


@settings(max_examples=500)
@given(st.binary(max_size=120))
def test_random_bytes_raise_only_rtp_errors(data: bytes) -> None:
    try:
        packet = parse_rtp(data)
    except RtpError:
        return
    assert len(packet.payload) <= len(data) - 12


@settings(max_examples=300)
@given(st.binary(min_size=1, max_size=120))
def test_random_bytes_after_a_version_2_byte_raise_only_rtp_errors(data: bytes) -> None:
    # Most random first bytes fail on the version; these reach the CSRC, X and P paths.
    try:
        parse_rtp(bytes([0x80 | (data[0] & 0x3F)]) + data[1:])
    except RtpError:
        pass


# --- real captures: sip-tester's G.711 A-law and RFC 4733 pcaps ------------------------------


def test_every_packet_of_the_g711a_capture_parses() -> None:
    packets = [parse_rtp(data) for data in _udp_payloads(_pcap("g711a.pcap"))]
    assert len(packets) == 236
    assert {packet.payload_type for packet in packets} == {PCMA}
    assert len({packet.ssrc for packet in packets}) == 1
    # This capture packs 30 ms (240 samples, one byte each) per packet, not the usual 20 ms.
    assert {len(packet.payload) for packet in packets} == {240}
    for before, after in itertools.pairwise(packets):
        assert after.sequence == (before.sequence + 1) & 0xFFFF
        assert after.timestamp - before.timestamp == len(before.payload)
    assert packets[0].marker and not any(packet.marker for packet in packets[1:])


def test_the_g711a_capture_plays_through_the_jitter_buffer_unchanged() -> None:
    packets = [parse_rtp(data) for data in _udp_payloads(_pcap("g711a.pcap"))]
    buffer = JitterBuffer()
    played = []
    for tick, packet in enumerate(packets):
        buffer.push(packet, tick * 20.0)
        payload = buffer.pop(tick * 20.0)
        if payload is not None:
            played.append(payload)
    played.extend(buffer.drain())
    assert played == [packet.payload for packet in packets]
    assert buffer.stats.lost == buffer.stats.late == buffer.stats.duplicates == 0


def _events(name: str) -> list[RtpPacket]:
    packets = [parse_rtp(data) for data in _udp_payloads(_pcap(name))]
    assert {packet.payload_type for packet in packets} == {TELEPHONE_EVENT}
    return packets


def test_the_dtmf_capture_holds_one_press_of_1() -> None:
    packets = _events("dtmf_2833_1.pcap")
    events = [parse_event(packet.payload) for packet in packets]
    # Seven progress packets and the end packet three times, all of event 1 at one timestamp.
    assert len(packets) == 10 and {packet.timestamp for packet in packets} == {13280}
    assert {event.event for event in events} == {1}
    assert [event.end for event in events] == [False] * 7 + [True] * 3
    assert events[-1] == TelephoneEvent(event=1, end=True, volume=10, duration=2240)
    receiver = DtmfReceiver()
    assert [receiver.feed(packet) for packet in packets] == ["1"] + [None] * 9
    for packet in packets:
        packet.marker = False
    receiver = DtmfReceiver()
    assert "".join(digit for packet in packets if (digit := receiver.feed(packet))) == "1"


def test_every_dtmf_capture_in_a_row_gives_its_key_once_without_marker_bits() -> None:
    names = [f"dtmf_2833_{key}.pcap" for key in [*"0123456789", "star", "pound"]]
    receiver = DtmfReceiver()
    digits = []
    for name in names:
        for packet in _events(name):
            packet.marker = False
            digit = receiver.feed(packet)
            if digit is not None:
                digits.append(digit)
    assert "".join(digits) == "0123456789*#"


# --- rtp.py: the sender ---------------------------------------------------------------------


def test_a_sender_starts_at_random_values_and_counts_on() -> None:
    sender = RtpSender(PCMU, rng=random.Random(7))
    again = RtpSender(PCMU, rng=random.Random(7))
    other = RtpSender(PCMU, rng=random.Random(8))
    assert (sender.sequence, sender.timestamp, sender.ssrc) == (
        again.sequence,
        again.timestamp,
        again.ssrc,
    )
    assert (sender.sequence, sender.timestamp, sender.ssrc) != (
        other.sequence,
        other.timestamp,
        other.ssrc,
    )
    first = parse_rtp(sender.packet(b"\xff" * 160, marker=True))
    second = parse_rtp(sender.packet(b"\x7f" * 160))
    assert first.marker and not second.marker
    assert second.sequence == (first.sequence + 1) & 0xFFFF
    assert second.timestamp == (first.timestamp + 160) & 0xFFFFFFFF
    assert first.ssrc == second.ssrc == sender.ssrc and second.payload == b"\x7f" * 160


def test_without_an_rng_senders_differ() -> None:
    senders = [RtpSender(PCMA) for _ in range(4)]
    assert len({(sender.sequence, sender.timestamp, sender.ssrc) for sender in senders}) == 4


def test_sequence_and_timestamp_wrap() -> None:
    class Fixed(random.Random):
        def getrandbits(self, k: int) -> int:
            return (1 << k) - 1  # the last value before the wrap

    sender = RtpSender(PCMA, ssrc=5, rng=Fixed())
    first, second = (parse_rtp(sender.packet(b"x")) for _ in range(2))
    assert (first.sequence, first.timestamp, first.ssrc) == (0xFFFF, 0xFFFFFFFF, 5)
    assert (second.sequence, second.timestamp) == (0, 159)


def test_raw_advances_the_sequence_only_and_skip_the_timestamp_only() -> None:
    sender = RtpSender(PCMU, ssrc=1, rng=random.Random(1))
    sequence, timestamp = sender.sequence, sender.timestamp
    packet = parse_rtp(sender.raw(TELEPHONE_EVENT, b"\x05\x0a\x00\xa0", 1234, marker=True))
    assert (packet.payload_type, packet.timestamp, packet.marker) == (TELEPHONE_EVENT, 1234, True)
    assert packet.sequence == sequence and sender.sequence == (sequence + 1) & 0xFFFF
    assert sender.timestamp == timestamp
    sender.skip(8000)  # a one-second hold
    assert sender.timestamp == (timestamp + 8000) & 0xFFFFFFFF
    assert sender.sequence == (sequence + 1) & 0xFFFF
    with pytest.raises(ValueError):
        sender.skip(-1)


@pytest.mark.parametrize("payload_type", [-1, 128, 72, 76])
def test_a_sender_refuses_payload_types_that_cannot_be_rtp(payload_type: int) -> None:
    with pytest.raises(ValueError):
        RtpSender(payload_type)


def test_event_packets_share_the_stream_and_a_timestamp() -> None:
    sender = RtpSender(PCMU, ssrc=42, rng=random.Random(3))
    audio = parse_rtp(sender.packet(b"\xff" * 160))
    start = sender.timestamp
    packets = [parse_rtp(data) for data in sender.event_packets("7", TELEPHONE_EVENT)]
    after = parse_rtp(sender.packet(b"\xff" * 160))
    assert [packet.sequence for packet in [audio, *packets, after]] == [
        (audio.sequence + n) & 0xFFFF for n in range(len(packets) + 2)
    ]
    assert {packet.timestamp for packet in packets} == {start}
    assert [packet.marker for packet in packets] == [True] + [False] * (len(packets) - 1)
    assert {packet.ssrc for packet in packets} == {42}
    # The audio after the event goes on where the clock is: 7 packets of 20 ms later.
    assert after.timestamp == (start + 7 * 160) & 0xFFFFFFFF
    receiver = DtmfReceiver()
    assert [receiver.feed(packet) for packet in packets] == ["7"] + [None] * 6


# --- rtp.py: the pacer ----------------------------------------------------------------------


def test_the_pacer_does_not_drift_over_10000_frames_of_jittery_wake_ups() -> None:
    rng = random.Random(11)
    start = 1_000_000.0
    pacer = Pacer(start)
    now = start
    sent = 0
    while sent < 10_000:
        # The loop sleeps until the deadline and wakes 0-15 ms late, sometimes slightly early.
        now = max(now, pacer.next_deadline_ms + rng.uniform(-1.0, 15.0))
        assert pacer.lateness_ms(now) <= 15.0
        sent += pacer.due(now)
    assert pacer.dropped == 0
    # Frame n is due at start + n * 20 ms however the wake-ups fell: no accumulated error.
    assert pacer.next_deadline_ms == start + sent * 20.0
    assert abs(now - (start + (sent - 1) * 20.0)) <= 15.0


def test_the_pacer_catches_up_a_bounded_number_after_a_2_second_stall() -> None:
    pacer = Pacer(0.0)
    assert pacer.due(0.0) == 1 and pacer.due(5.0) == 0
    assert pacer.next_deadline_ms == 20.0
    assert pacer.lateness_ms(2020.0) == 2000.0
    assert pacer.due(2020.0) == 5  # 101 frames were due; the newest 5 go, the rest are dropped
    assert pacer.dropped == 96
    assert pacer.next_deadline_ms == 2040.0  # still on the 20 ms grid
    assert pacer.due(2030.0) == 0 and pacer.due(2040.0) == 1
    assert pacer.lateness_ms(2050.0) == -10.0


def test_a_pacer_frame_is_due_at_its_deadline_or_a_hair_before() -> None:
    pacer = Pacer(100.0, 30.0, early_ms=0.0)
    assert pacer.due(99.9) == 0 and pacer.due(100.0) == 1
    assert pacer.due(129.9) == 0 and pacer.due(130.0) == 1 and pacer.due(190.0) == 2


def test_a_wake_up_just_before_the_deadline_sends_instead_of_spinning() -> None:
    # uvloop wakes whole milliseconds: a timer for 120.0 can fire at 119.6. That frame is
    # due then, once; the next wake-up is armed for the next deadline, not the same one.
    pacer = Pacer(100.0)
    assert pacer.due(100.0) == 1
    assert pacer.due(118.9) == 0  # more than a millisecond early: not yet
    assert pacer.due(119.6) == 1 and pacer.next_deadline_ms == 140.0
    assert pacer.due(119.9) == 0


# --- jitter.py --------------------------------------------------------------------------------


def _play(buffer: JitterBuffer, arrivals: list[list[int]]) -> list[bytes | None]:
    """Each tick pushes that tick's sequence numbers, then pops once."""
    out = []
    for tick, sequences in enumerate(arrivals):
        for sequence in sequences:
            buffer.push(_packet(sequence, _audio(sequence)), tick * 20.0)
        out.append(buffer.pop(tick * 20.0))
    return out


def test_reordered_packets_come_out_in_order() -> None:
    buffer = JitterBuffer()
    out = _play(buffer, [[1], [3], [2], [5], [4], [6], [], [], [], []])
    assert out == [None, None] + [_audio(n) for n in range(1, 7)] + [None, None]
    assert buffer.stats.reordered == 2 and buffer.stats.lost == 0


def test_a_lost_packet_gives_one_none_then_playout_goes_on() -> None:
    buffer = JitterBuffer()
    arrivals = [[n] for n in range(10) if n != 5] + [[], [], []]
    out = _play(buffer, arrivals)
    assert out[:2] == [None, None]
    assert out[2:12] == [_audio(n) for n in range(5)] + [None] + [_audio(n) for n in range(6, 10)]
    assert buffer.stats.lost == buffer.stats.concealed == 1 and buffer.stats.underruns == 0


def test_a_gap_of_several_packets_is_skipped_in_one_tick() -> None:
    buffer = JitterBuffer()
    out = _play(buffer, [[1], [2], [3], [], [], [], [7], [8], [9], []])
    assert out == [
        None,
        None,
        _audio(1),
        _audio(2),
        _audio(3),
        None,
        None,
        None,
        _audio(7),
        _audio(8),
    ]
    # Tick 5 found it empty (an underrun), 6 and 7 built the depth again, and 8 went on from 7:
    # the ticks without audio were the gap's, none added for it.
    assert buffer.stats.underruns == 1 and buffer.stats.lost == 3
    assert buffer.stats.concealed == 0  # no tick of the gap was a loss once it was known


def test_duplicates_and_late_packets_are_dropped_and_counted() -> None:
    buffer = JitterBuffer()
    out = _play(buffer, [[1], [2, 2], [3, 1], [4, 1], [5], [6], [7]])
    assert [payload for payload in out if payload] == [_audio(n) for n in range(1, 6)]
    assert buffer.stats.duplicates == 2  # 2 again while held, 1 again while held
    assert buffer.stats.late == 1  # 1 once more, after it was played
    assert buffer.stats.received == 10


def test_a_packet_after_its_turn_was_skipped_is_late() -> None:
    buffer = JitterBuffer()
    _play(buffer, [[1], [2], [4], [5], [6], [3]])
    assert buffer.stats.lost == 1 and buffer.stats.late == 1


def test_the_sequence_number_wraps_from_65535_to_0() -> None:
    buffer = JitterBuffer()
    sequences = [65533, 65534, 0, 65535, 1, 2, 3]
    out = _play(buffer, [[n] for n in sequences] + [[]] * 3)
    expected = [65533, 65534, 65535, 0, 1, 2, 3]
    assert [payload for payload in out if payload] == [_audio(n) for n in expected]
    assert buffer.stats.late == buffer.stats.lost == 0 and buffer.stats.reordered == 1


def test_an_ssrc_change_starts_the_buffer_again() -> None:
    buffer = JitterBuffer()
    _play(buffer, [[n] for n in range(6)])
    buffer.push(_packet(9000, b"new0", ssrc=0x5678), 200.0)
    assert len(buffer) == 2 and buffer.stats.resets == 0  # one packet is not yet a stream
    buffer.push(_packet(9001, b"new1", ssrc=0x5678), 220.0)
    assert buffer.stats.resets == 1 and buffer.stats.dropped == 2 and len(buffer) == 2
    assert buffer.buffering
    buffer.push(_packet(9002, b"new2", ssrc=0x5678), 240.0)
    assert [buffer.pop(240.0), buffer.pop(260.0)] == [b"new0", b"new1"]


def test_a_sequence_jump_starts_the_buffer_again() -> None:
    buffer = JitterBuffer()
    _play(buffer, [[n] for n in range(6)])
    jump = 5 + MAX_JUMP + 1
    buffer.push(_packet(jump, b"a"), 200.0)
    buffer.push(_packet(jump + 1, b"b"), 220.0)
    buffer.push(_packet(jump + 2, b"c"), 240.0)
    assert buffer.stats.resets == 1 and buffer.stats.late == 0
    assert [buffer.pop(240.0), buffer.pop(260.0), buffer.pop(280.0)] == [b"a", b"b", b"c"]


def test_a_single_stray_packet_does_not_reset_the_stream() -> None:
    buffer = JitterBuffer()
    out = _play(buffer, [[1], [2], [3], [4, 30_000], [5], [6], [7, 40_000], [8]])
    assert [payload for payload in out if payload] == [_audio(n) for n in range(1, 7)]
    assert buffer.stats.resets == 0 and buffer.stats.strays == 1


def test_a_stream_shorter_than_the_depth_still_plays() -> None:
    buffer = JitterBuffer()
    buffer.push(_packet(1, b"only"), 0.0)
    assert [buffer.pop(t) for t in (0.0, 20.0, 40.0, 60.0)] == [None, None, None, b"only"]


def test_the_delay_of_a_burst_after_a_stall_is_cut_back() -> None:
    buffer = JitterBuffer()
    _play(buffer, [[n] for n in range(5)])
    for n in range(5, 40):  # a 700 ms stall, then everything at once
        buffer.push(_packet(n, _audio(n)), 800.0)
    first = buffer.pop(800.0)
    # Only depth packets of delay stay: 37, 38, 39; 3 to 36 go.
    assert first == _audio(37) and len(buffer) == 2
    assert buffer.stats.dropped == 34 and buffer.stats.lost == 0


def test_drain_gives_what_is_held_in_order() -> None:
    buffer = JitterBuffer(depth=5)
    for n in (4, 2, 3, 7):
        buffer.push(_packet(n, _audio(n)), 0.0)
    assert buffer.drain() == [_audio(n) for n in (2, 3, 4, 7)]
    assert len(buffer) == 0 and buffer.drain() == []


def test_a_flood_of_random_packets_stays_bounded() -> None:
    rng = random.Random(5)
    buffer = JitterBuffer(max_packets=50)
    base = 0
    for i in range(10_000):
        base += rng.choice([0, 1, 1, 2])
        if rng.random() < 0.05:
            packet = _packet(rng.getrandbits(16), b"x", ssrc=rng.choice([1, 2, 3]))
        else:
            packet = _packet(base + rng.randint(-120, 120), b"x", ssrc=0x1234)
        buffer.push(packet, i * 0.5)
        assert len(buffer) <= 50
        if i % 40 == 0:
            buffer.pop(i * 0.5)
    stats = buffer.stats
    assert stats.received == 10_000 and stats.duplicates > 0 and stats.dropped > 0


def test_perfect_arrivals_have_no_jitter_and_uneven_ones_some() -> None:
    steady = JitterBuffer()
    _play(steady, [[n] for n in range(50)])
    assert steady.stats.jitter_ms == 0.0
    uneven = JitterBuffer()
    rng = random.Random(2)
    for n in range(200):
        uneven.push(_packet(n, b"x"), n * 20.0 + rng.uniform(0.0, 10.0))
        uneven.pop(n * 20.0)
    assert 1.0 < uneven.stats.jitter_ms < 10.0


def test_a_buffer_refuses_nonsense_sizes() -> None:
    for kwargs in ({"depth": 0}, {"depth": 5, "max_packets": 4}, {"depth": 3, "max_delay": 3}):
        with pytest.raises(ValueError):
            JitterBuffer(**kwargs)


# --- dtmf.py: RFC 4733 ------------------------------------------------------------------------


def _press(digit: str, timestamp: int, *, sequence: int = 100, ssrc: int = 9) -> list[RtpPacket]:
    return [
        _packet(sequence + n, payload, timestamp=timestamp, ssrc=ssrc, payload_type=101)
        for n, payload in enumerate(event_payloads(digit))
    ]


def test_the_end_packet_sent_three_times_reports_once() -> None:
    receiver = DtmfReceiver()
    packets = _press("5", 8000)
    end = packets[-1]
    assert parse_event(end.payload).end
    assert [receiver.feed(packet) for packet in [end, end, end]] == ["5", None, None]
    assert all(receiver.feed(packet) is None for packet in packets)


def test_the_same_key_pressed_twice_reports_twice() -> None:
    receiver = DtmfReceiver()
    packets = _press("9", 8000) + _press("9", 9600, sequence=110)
    assert [d for packet in packets if (d := receiver.feed(packet))] == ["9", "9"]


def test_a_late_packet_of_an_earlier_press_is_not_reported_again() -> None:
    receiver = DtmfReceiver()
    first, second = _press("1", 8000), _press("2", 40_000, sequence=110)
    assert receiver.feed(first[0]) == "1" and receiver.feed(second[0]) == "2"
    assert receiver.feed(first[-1]) is None and receiver.feed(second[-1]) is None
    # An unseen timestamp behind the newest is a press all the same: a bridged leg's clock.
    assert receiver.feed(_press("3", 20_000)[0]) == "3"


def test_a_new_source_starts_its_own_timestamps() -> None:
    receiver = DtmfReceiver()
    assert receiver.feed(_press("4", 8000)[0]) == "4"
    assert receiver.feed(_press("4", 8000, ssrc=10)[0]) == "4"


def test_non_dtmf_events_and_bad_payloads_are_ignored() -> None:
    receiver = DtmfReceiver()
    tone = _packet(1, bytes([32, 0x0A, 0, 160]), timestamp=100, payload_type=101)  # answer tone
    short = _packet(2, b"\x01\x0a", timestamp=200, payload_type=101)
    assert receiver.feed(tone) is None and receiver.feed(short) is None
    assert receiver.ignored == 2


def test_event_payloads_grow_then_end_three_times() -> None:
    events = [parse_event(payload) for payload in event_payloads("#", duration_ms=100)]
    assert [(e.event, e.end, e.duration) for e in events] == [
        (11, False, 160),
        (11, False, 320),
        (11, False, 480),
        (11, False, 640),
        (11, True, 800),
        (11, True, 800),
        (11, True, 800),
    ]
    assert {event.volume for event in events} == {10} and events[0].digit == "#"
    assert len(event_payloads("a", duration_ms=50, packet_ms=20)) == 2 + 3  # 60 ms, rounded up


@pytest.mark.parametrize("digit", ["E", "", "12", "x"])
def test_event_payloads_refuse_what_is_not_a_key(digit: str) -> None:
    with pytest.raises(ValueError):
        event_payloads(digit)


def test_event_payloads_refuse_durations_the_field_cannot_hold() -> None:
    for kwargs in ({"duration_ms": 0}, {"duration_ms": 9000}, {"volume": 64}, {"packet_ms": 0}):
        with pytest.raises(ValueError):
            event_payloads("1", **kwargs)


def test_parse_event_reads_the_fields_and_refuses_other_sizes() -> None:
    assert parse_event(b"\x0b\x8a\x08\xc0") == TelephoneEvent(11, True, 10, 2240)
    assert parse_event(b"\x10\x00\x00\x00").digit is None
    for payload in (b"", b"\x01\x0a\x00", b"\x01\x0a\x00\xa0\x00"):
        with pytest.raises(DtmfError, match=f"payload of {len(payload)} bytes, not 4"):
            parse_event(payload)


def test_every_key_round_trips_through_the_receiver() -> None:
    receiver = DtmfReceiver()
    digits = []
    for index, digit in enumerate(EVENT_DIGITS):
        for packet in _press(digit, 8000 + index * 2000, sequence=index * 10):
            if (reported := receiver.feed(packet)) is not None:
                digits.append(reported)
    assert "".join(digits) == EVENT_DIGITS


# --- dtmf.py: SIP INFO bodies -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "digit"),
    [
        (b"Signal=5\r\nDuration=160\r\n", "5"),
        (b"signal= #\nduration=100", "#"),
        (b"SIGNAL = *\r\n", "*"),
        (b"Duration=160\r\nSignal=10\r\n", "*"),
        (b"Signal=11", "#"),
        (b"Signal=d\r\n", "D"),
        (b"Signal=\r\nDuration=160", None),
        (b"Duration=160\r\n", None),
        (b"Signal=E", None),
        (b"Signal=16", None),
        (b"", None),
        (b"\xff\xfe\x00garbage", None),
        (b"Signal", None),
    ],
)
def test_dtmf_relay_bodies(body: bytes, digit: str | None) -> None:
    assert parse_dtmf_relay(body) == digit


def test_info_bodies_dispatch_on_content_type() -> None:
    assert parse_dtmf_body("application/dtmf-relay", b"Signal=3\r\n") == "3"
    assert parse_dtmf_body("Application/DTMF-Relay; charset=utf-8", b"Signal=3") == "3"
    assert parse_dtmf_body("application/dtmf", b"7\r\n") == "7"
    assert parse_dtmf_body("application/dtmf", b"ab") is None
    assert parse_dtmf_body("application/sdp", b"Signal=3") is None


@given(st.binary(max_size=200), st.sampled_from(["application/dtmf-relay", "application/dtmf"]))
def test_info_bodies_never_raise(body: bytes, content_type: str) -> None:
    digit = parse_dtmf_body(content_type, body)
    assert digit is None or digit in EVENT_DIGITS


def test_the_phases_share_one_grid_a_quarter_frame_apart() -> None:
    pacer = PhasedPacer(100.0, 20.0, 4)
    assert pacer.next_deadline_ms == 100.0
    assert pacer.due(100.0) == [(0, 1)]
    assert pacer.next_deadline_ms == 105.0 and pacer.lateness_ms(107.0) == 2.0
    assert pacer.due(107.0) == [(1, 1)]
    assert pacer.due(115.0) == [(2, 1), (3, 1)]  # a late wake-up serves both phases it missed
    assert pacer.due(120.0) == [(0, 1)]
    assert pacer.dropped == 0
    pacer.due(1000.0)  # a stall: each phase drops what is past its catch-up
    assert pacer.dropped == sum(p.dropped for p in pacer.pacers) > 0

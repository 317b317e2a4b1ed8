"""One SIP call's RTP (voice_agent/sip/media.py) on a virtual clock, and what the SIP listener
decides before any socket (voice_agent/gateways/sip.py): which agent answers, with which args,
and the settings it refuses."""

from __future__ import annotations

import math
import socket
import struct
from typing import Any

import pytest

from voice_agent.audio.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from voice_agent.config import SipSettings
from voice_agent.errors import ConfigError, VoiceAgentError
from voice_agent.gateways.rtp_ports import RtpPorts
from voice_agent.gateways.sip import SipGateway
from voice_agent.gateways.sip_routes import route_call
from voice_agent.sip.media import RtpSession
from voice_agent.sip.message import parse_message
from voice_agent.sip.sdp import negotiate, parse_sdp

CALLER = ("198.51.100.7", 40000)
OFFER = (
    b"v=0\r\no=- 1 1 IN IP4 198.51.100.7\r\ns=-\r\nc=IN IP4 198.51.100.7\r\nt=0 0\r\n"
    b"m=audio 40000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
    b"a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15\r\n"
)
MU_SILENCE = b"\xff" * 160


def session() -> RtpSession:
    return RtpSession(negotiate(parse_sdp(OFFER)), signalling_host=CALLER[0])


def rtp(sequence: int, payload: bytes, *, payload_type: int = 0, ssrc: int = 7) -> bytes:
    return struct.pack(">BBHII", 0x80, payload_type, sequence, sequence * 160, ssrc) + payload


def test_packets_go_to_the_sdp_address_until_the_callers_come_from_elsewhere() -> None:
    media = session()
    assert media.destination == CALLER
    behind_nat = (CALLER[0], 61000)  # the same host, another port: a NAT's mapping
    media.receive(rtp(1, b"\x7f" * 160), behind_nat, 0)
    assert media.destination == behind_nat


def test_a_strangers_packets_are_not_heard_and_do_not_divert_ours() -> None:
    media = session()
    for n in range(20):
        media.receive(rtp(n, b"\x00" * 160), ("203.0.113.66", 5004), n * 20)
    assert media.stats.foreign == 20 and media.stats.received == 0
    assert media.destination == CALLER
    assert media.heard_audio(500) is None  # nothing to hear, not even silence yet


def test_bytes_that_read_as_rtp_of_another_payload_type_do_not_move_the_stream() -> None:
    media = session()
    media.receive(rtp(1, b"junk", payload_type=96), (CALLER[0], 9), 0)
    assert media.destination == CALLER and media.stats.other_payload == 1


def test_the_caller_is_heard_in_20_ms_steps_with_silence_while_nothing_comes() -> None:
    """A phone that suppresses silence sends nothing between words: the pipeline still gets
    20 ms a tick, so the caller's turn can end."""
    media = session()
    for n in range(3):
        media.receive(rtp(n, bytes([n + 1]) * 160), CALLER, n * 20)
    heard = [media.heard_audio(60 + t * 20) for t in range(6)]
    assert heard[:3] == [b"\x01" * 160, b"\x02" * 160, b"\x03" * 160]
    assert heard[3:] == [MU_SILENCE] * 3


def test_30_ms_packets_are_heard_at_the_rate_they_carry() -> None:
    """Two 30 ms packets cover three 20 ms ticks: the pipeline gets 60 ms, no silence."""
    media = session()
    for n in range(6):
        media.receive(rtp(n, bytes([n + 1]) * 240), CALLER, n * 30)
    got = b"".join(filter(None, (media.heard_audio(t * 20) for t in range(9))))
    assert got == b"".join(bytes([n + 1]) * 240 for n in range(6))


def test_a_key_press_is_one_digit_however_many_packets_carry_it() -> None:
    media = session()
    event = struct.pack(">BBH", 5, 10, 160)
    end = struct.pack(">BBH", 5, 0x80 | 10, 800)
    digits = [
        media.receive(struct.pack(">BBHII", 0x80, 101, n, 8000, 7) + payload, CALLER, n * 20)
        for n, payload in enumerate([event, event, end, end, end])
    ]
    assert digits == ["5", None, None, None, None]


def test_on_hold_nothing_is_sent_and_the_agents_audio_waits() -> None:
    media = session()
    media.playout.audio(b"\x11" * 320)
    hold = negotiate(parse_sdp(OFFER + b"a=sendonly\r\n"))
    assert hold.on_hold
    media.update(hold)
    assert media.next_packet(0) == (None, []) and media.destination is None
    media.update(negotiate(parse_sdp(OFFER)))
    packet, _ = media.next_packet(20)
    assert packet is not None and packet[12:] == b"\x11" * 160


def test_a_reinvite_to_a_law_is_sent_and_heard_in_it_while_the_pipeline_keeps_mu_law() -> None:
    """The call started in PCMU (the pipeline's law); a re-INVITE moved it to PCMA: the agent's
    frames go out as the A-law codes of the same samples under payload type 8, on the same
    stream, and the caller's A-law reaches the pipeline as mu-law. Back to PCMU: as before."""
    media = session()
    agent = bytes(range(0, 160))  # mu-law codes of many levels
    media.playout.audio(agent * 3)
    first, _ = media.next_packet(0)
    assert first is not None and first[1] & 0x7F == 0 and first[12:] == agent
    media.update(negotiate(parse_sdp(OFFER.replace(b"RTP/AVP 0 101", b"RTP/AVP 8 101"))))
    second, _ = media.next_packet(20)
    assert second is not None and second[1] & 0x7F == 8
    assert second[12:] == alaw_encode(ulaw_decode(agent))
    assert second[8:12] == first[8:12]  # the same SSRC
    assert struct.unpack("!H", second[2:4])[0] == (struct.unpack("!H", first[2:4])[0] + 1) % 65536
    caller = bytes(range(96, 256))  # A-law codes
    for n in range(1, 5):
        media.receive(rtp(n, caller, payload_type=8), CALLER, n * 20)
    heard = [media.heard_audio(100 + n * 20) for n in range(4)]
    assert ulaw_encode(alaw_decode(caller)) in heard
    media.update(negotiate(parse_sdp(OFFER)))
    third, _ = media.next_packet(40)
    assert third is not None and third[1] & 0x7F == 0 and third[12:] == agent


def test_the_agent_is_quiet_in_the_codecs_silence() -> None:
    media = session()
    packet, _ = media.next_packet(0)
    assert packet is not None and packet[12:] == MU_SILENCE


INVITE = (
    "INVITE sip:{user}@127.0.0.1 SIP/2.0\r\n"
    "Via: SIP/2.0/UDP 198.51.100.7;branch=z9hG4bK1\r\n"
    'From: "Ann" <sip:+14155550100@carrier.example>;tag=1\r\n'
    "To: <sip:{user}@127.0.0.1>\r\nCall-ID: c1\r\nCSeq: 1 INVITE\r\n"
    "{extra}Content-Length: 0\r\n\r\n"
)
AGENTS: dict[str, Any] = {"booking": object(), "concierge": object()}


def invite(user: str, extra: str = "") -> Any:
    return parse_message(INVITE.format(user=user, extra=extra).encode())


def test_the_dialled_user_part_names_the_agent_and_the_caller_is_in_the_args() -> None:
    route = route_call(invite("concierge"), SipSettings(), AGENTS)
    assert route is not None and route.agent == "concierge"
    assert route.args == {"caller": "+14155550100", "called": "concierge"}


def test_a_number_map_a_header_and_p_asserted_identity() -> None:
    settings = SipSettings(
        numbers={"+18005550199": "booking"},
        agent_header="X-Agent",
        headers={"X-Customer-Id": "customer_id"},
    )
    route = route_call(
        invite("+18005550199", "P-Asserted-Identity: <sip:+442071838750@trunk>\r\n"
               "X-Customer-Id: 4711\r\n"),
        settings, AGENTS,
    )  # fmt: skip
    assert route is not None and route.agent == "booking"
    assert route.args == {
        "caller": "+442071838750",
        "called": "+18005550199",
        "customer_id": "4711",
    }
    by_header = route_call(invite("+18005550199", "X-Agent: concierge\r\n"), settings, AGENTS)
    assert by_header is not None and by_header.agent == "concierge"
    assert route_call(invite("x", "X-Agent: nobody\r\n"), settings, AGENTS) is None  # 404


def test_an_unknown_user_part_goes_to_the_default_agent() -> None:
    route = route_call(invite("+15550000000"), SipSettings(), AGENTS)
    assert route is not None and route.agent is None


def free_even_range(count: int) -> int:
    """An odd base whose next `count` even ports are free now: the suite's other workers run
    SIP servers in the default range, which a fixed one here collided with."""
    for base in range(40001, 60000, 2 * count + 2):
        wanted = range(base + 1, base + 2 * count + 1)  # the pairs' ports and their RTCP + 1
        probes = []
        try:
            for number in wanted:
                probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                probes.append(probe)
                probe.bind(("127.0.0.1", number))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise AssertionError("no free range of UDP ports")


def test_rtp_ports_are_even_and_come_back() -> None:
    """Each call gets an even RTP port and RTCP's odd one above it; a released pair is free."""
    base = free_even_range(3)
    ports = RtpPorts(base, base + 5)  # base+1, base+3, base+5 even
    pairs = [ports.bind("127.0.0.1") for _ in range(3)]
    numbers = [(rtp.getsockname()[1], rtcp.getsockname()[1]) for rtp, rtcp in pairs]
    assert sorted(numbers) == [(base + 1, base + 2), (base + 3, base + 4), (base + 5, base + 6)]
    with pytest.raises(VoiceAgentError, match="no free RTP port"):
        ports.bind("127.0.0.1")
    for sock in pairs[0]:
        sock.close()
    ports.release(numbers[0][0])
    again = ports.bind("127.0.0.1")
    assert again[0].getsockname()[1] == numbers[0][0]
    for sock in [*again, *pairs[1], *pairs[2]]:
        sock.close()


def _gateway(settings: SipSettings, listen: str, secrets: dict[str, str] | None = None) -> Any:
    async def start_call(**_: Any) -> Any:
        raise AssertionError

    return SipGateway(
        settings, listen=listen, start_call=start_call, admit=lambda _: None, agents=AGENTS,
        secrets=secrets or {},
    )  # fmt: skip


def test_listening_on_every_address_needs_the_public_one() -> None:
    with pytest.raises(ConfigError, match=r"needs sip\.public_address") as caught:
        _gateway(SipSettings(), "0.0.0.0:5060")
    assert caught.value.key == "sip.public_address"
    assert _gateway(SipSettings(public_address="203.0.113.7"), "0.0.0.0:5060").public


def test_a_credential_naming_a_secret_that_is_not_set() -> None:
    settings = SipSettings(credentials={"trunk": "sip_password"})
    with pytest.raises(ConfigError, match="voice-agent secrets set sip_password") as caught:
        _gateway(settings, "127.0.0.1:5060")
    assert caught.value.key == "sip.credentials.trunk"


def _keys_heard(packets: list[bytes]) -> list[str]:
    """What a far end's RFC 4733 receiver makes of the packets sent."""
    far_end = RtpSession(negotiate(parse_sdp(OFFER)), signalling_host=CALLER[0])
    heard = [far_end.receive(p, CALLER, n * 20) for n, p in enumerate(packets)]
    return [digit for digit in heard if digit is not None]


def test_keys_go_out_as_telephone_events_while_the_agents_audio_waits() -> None:
    media = session()
    media.playout.audio(b"\x11" * 160)
    media.playout.mark("after-the-keys")
    media.send_digits("1#1")
    packets, marks = [], []
    for tick in range(60):
        packet, heard = media.next_packet(tick * 20)
        assert packet is not None
        packets.append(packet)
        marks += [(tick, name) for name in heard]
    # The same key twice is two presses: each has its own start timestamp.
    assert _keys_heard(packets) == ["1", "#", "1"]
    events = [p for p in packets if p[1] & 0x7F == 101]
    assert len(events) == 3 * (4 + 3)  # per key: 4 progress packets, then the end three times
    # Then the agent's audio, and its mark only after the keys and their gaps.
    first_audio = next(i for i, p in enumerate(packets) if p[12:] == b"\x11" * 160)
    assert first_audio == 3 * (4 + 3 + 5) and marks and marks[0][0] >= first_audio


def test_keys_are_tones_in_the_audio_without_telephone_event() -> None:
    plain = b"v=0\r\no=- 1 1 IN IP4 198.51.100.7\r\ns=-\r\nc=IN IP4 198.51.100.7\r\nt=0 0\r\n"
    media = RtpSession(
        negotiate(parse_sdp(plain + b"m=audio 40000 RTP/AVP 0\r\n")), signalling_host=CALLER[0]
    )
    media.send_digits("5")
    packets = [media.next_packet(tick * 20)[0] for tick in range(10)]
    assert all(p is not None and p[1] & 0x7F == 0 for p in packets)
    tone = [p for p in packets if p is not None and p[12:] != MU_SILENCE]
    assert len(tone) == 5  # 100 ms of the key, then silence
    pcm = ulaw_decode(b"".join(p[12:] for p in tone))
    assert goertzel_power(pcm, 770) > 50 * goertzel_power(pcm, 1000)  # row of 5
    assert goertzel_power(pcm, 1336) > 50 * goertzel_power(pcm, 1000)  # its column


def goertzel_power(pcm: bytes, frequency: float, rate: int = 8000) -> float:
    samples = struct.unpack(f"<{len(pcm) // 2}h", pcm)
    coefficient = 2 * math.cos(2 * math.pi * frequency / rate)
    before = before2 = 0.0
    for sample in samples:
        before, before2 = sample + coefficient * before - before2, before
    return before2**2 + before**2 - coefficient * before * before2

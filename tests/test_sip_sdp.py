"""SDP and offer/answer (voice_agent/sip/sdp.py): real offers (sipp's own, a carrier's, a
softphone's) negotiated and answered, hold re-offers, the delayed offer, and no body that
breaks the parser with anything but an SdpError."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voice_agent.sip.sdp import (
    MAX_MEDIA,
    MAX_SDP_BYTES,
    Codec,
    Negotiated,
    NoCommonCodec,
    SdpError,
    SessionDescription,
    build_answer,
    build_offer,
    negotiate,
    negotiate_answer,
    parse_sdp,
)

SIPP = shutil.which("sipp")


def sdp(text: str, newline: str = "\r\n") -> bytes:
    return "".join(f"{line.strip()}{newline}" for line in text.strip().splitlines()).encode()


# `sipp -sd uac_pcap` (SIPp 3.6.1), the INVITE's body with [local_ip] 127.0.0.1,
# [local_ip_type] 4 and [auto_media_port] 6000 (this scenario writes those keywords rather than
# [media_ip]/[media_port]; test_the_sipp_offers_are_sipps_own checks the copy).
SIPP_UAC_PCAP = sdp(
    """
    v=0
    o=user1 53655765 2353687637 IN IP4 127.0.0.1
    s=-
    c=IN IP4 127.0.0.1
    t=0 0
    m=audio 6000 RTP/AVP 8 101
    a=rtpmap:8 PCMA/8000
    a=rtpmap:101 telephone-event/8000
    a=fmtp:101 0-11,16
    """
)
# `sipp -sd uac`, with [local_ip] and [media_ip] 127.0.0.1, the *_type keywords 4, and
# [media_port] 6000.
SIPP_UAC = sdp(
    """
    v=0
    o=user1 53655765 2353687637 IN IP4 127.0.0.1
    s=-
    c=IN IP4 127.0.0.1
    t=0 0
    m=audio 6000 RTP/AVP 0
    a=rtpmap:0 PCMU/8000
    """
)
# What an SBC of a SIP trunk offers: G.711 both laws, G.729 without annex B, RFC 4733 events,
# bandwidth and RTCP lines we read past.
CARRIER = sdp(
    """
    v=0
    o=- 1693234762 1693234762 IN IP4 203.0.113.10
    s=SBC
    c=IN IP4 203.0.113.10
    b=AS:84
    t=0 0
    m=audio 16384 RTP/AVP 0 8 18 101
    b=TIAS:64000
    a=rtpmap:0 PCMU/8000
    a=rtpmap:8 PCMA/8000
    a=rtpmap:18 G729/8000
    a=fmtp:18 annexb=no
    a=rtpmap:101 telephone-event/8000
    a=fmtp:101 0-16
    a=ptime:20
    a=maxptime:40
    a=rtcp:16385
    a=sendrecv
    """
)
# A softphone (Linphone's shape), LF line endings: Opus first, then G.711 mu-law, and video.
SOFTPHONE = sdp(
    """
    v=0
    o=alice 2890844526 2890844526 IN IP4 192.0.2.55
    s=Talk
    c=IN IP4 192.0.2.55
    t=0 0
    a=rtcp-xr:rcvr-rtt=all:10000 stat-summary=loss,dup,jitt,TTL voip-metrics
    m=audio 7078 RTP/AVP 96 0 101
    a=rtpmap:96 opus/48000/2
    a=fmtp:96 useinbandfec=1
    a=rtpmap:101 telephone-event/8000
    a=rtcp-fb:* trr-int 1000
    m=video 9078 RTP/AVP 97 98
    c=IN IP4 192.0.2.56
    a=rtpmap:97 VP8/90000
    a=rtpmap:98 H264/90000
    a=fmtp:98 profile-level-id=42801F
    a=recvonly
    """,
    newline="\n",
)
OURS: dict[str, Any] = {
    "address": "198.51.100.7",
    "port": 40000,
    "session_id": "4711",
    "version": 1,
}


def answer_to(offer: bytes) -> tuple[Negotiated, bytes]:
    """Negotiate an offer and answer it; the answer must read back and settle the same way."""
    negotiated = negotiate(parse_sdp(offer))
    answer = build_answer(parse_sdp(offer), negotiated, **OURS)
    again = parse_sdp(answer)
    assert len(again.streams) == len(parse_sdp(offer).streams)
    assert negotiate(again).codec == negotiated.codec
    assert negotiate(again).telephone_event == negotiated.telephone_event
    assert again.origin_session_id == "4711" and again.origin_version == "1"
    return negotiated, answer


def lines(body: bytes) -> list[str]:
    assert body.endswith(b"\r\n") and b"\n" not in body.replace(b"\r\n", b"")
    return body.decode().split("\r\n")[:-1]


def test_sipps_uac_pcap_offer_is_answered_in_pcma_with_its_events() -> None:
    offer = parse_sdp(SIPP_UAC_PCAP)
    assert offer.origin_session_id == "53655765" and offer.origin_version == "2353687637"
    assert offer.connection == "127.0.0.1"
    (stream,) = offer.streams
    assert (stream.media, stream.port, stream.protocol, stream.formats) == (
        "audio",
        6000,
        "RTP/AVP",
        ("8", "101"),
    )
    assert stream.codecs == (
        Codec(8, "PCMA", 8000),
        Codec(101, "TELEPHONE-EVENT", 8000, "0-11,16"),
    )
    assert stream.direction == "sendrecv" and stream.ptime_ms is None
    negotiated, answer = answer_to(SIPP_UAC_PCAP)
    assert negotiated == Negotiated(
        remote_address="127.0.0.1",
        remote_port=6000,
        codec=Codec(8, "PCMA", 8000),
        telephone_event=Codec(101, "TELEPHONE-EVENT", 8000, "0-11,16"),
        direction="sendrecv",
        on_hold=False,
        ptime_ms=20,
        stream_index=0,
    )
    # No a=ptime offered, none answered: the offerer assumes the codec's 20 ms.
    assert lines(answer) == [
        "v=0",
        "o=voice-agent 4711 1 IN IP4 198.51.100.7",
        "s=voice-agent",
        "c=IN IP4 198.51.100.7",
        "t=0 0",
        "m=audio 40000 RTP/AVP 8 101",
        "a=rtpmap:8 PCMA/8000",
        "a=rtpmap:101 telephone-event/8000",
        "a=fmtp:101 0-11,16",
        "a=sendrecv",
    ]


def test_sipps_uac_offer_is_answered_in_pcmu() -> None:
    negotiated, answer = answer_to(SIPP_UAC)
    assert negotiated.codec == Codec(0, "PCMU", 8000) and negotiated.telephone_event is None
    assert (negotiated.remote_address, negotiated.remote_port) == ("127.0.0.1", 6000)
    assert "m=audio 40000 RTP/AVP 0" in lines(answer)
    assert not any(line.startswith("a=ptime") for line in lines(answer))


def test_the_sipp_offers_are_sipps_own() -> None:
    """The two offers above are what sipp's stock scenarios send, keywords substituted."""
    # Never a silent skip: scripts/test installs Debian's sip-tester.
    assert SIPP is not None, "sipp is missing: scripts/test installs sip-tester"
    values = {
        "local_ip": "127.0.0.1",
        "media_ip": "127.0.0.1",
        "local_ip_type": "4",
        "media_ip_type": "4",
        "media_port": "6000",
        "auto_media_port": "6000",
    }
    for scenario, expected in (("uac_pcap", SIPP_UAC_PCAP), ("uac", SIPP_UAC)):
        xml = subprocess.run(
            [SIPP, "-sd", scenario], capture_output=True, text=True, timeout=10, check=False
        ).stdout
        invite = xml.split("<![CDATA[", 1)[1].split("]]>", 1)[0]
        body = invite[invite.index("v=0") :]
        body = re.sub(r"\[(\w+)\]", lambda m: values[m[1]], body)
        assert sdp(body) == expected, scenario


def test_a_carriers_offer_takes_its_first_choice_and_keeps_ptime_and_events() -> None:
    offer = parse_sdp(CARRIER)
    assert [c.name for c in offer.streams[0].codecs] == ["PCMU", "PCMA", "G729", "TELEPHONE-EVENT"]
    assert offer.streams[0].codecs[2].fmtp == "annexb=no"
    negotiated, answer = answer_to(CARRIER)
    assert negotiated.codec.name == "PCMU" and negotiated.ptime_ms == 20
    assert negotiated.telephone_event == Codec(101, "TELEPHONE-EVENT", 8000, "0-16")
    assert (negotiated.remote_address, negotiated.remote_port) == ("203.0.113.10", 16384)
    assert lines(answer)[5:] == [
        "m=audio 40000 RTP/AVP 0 101",
        "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:101 telephone-event/8000",
        "a=fmtp:101 0-16",
        "a=ptime:20",
        "a=sendrecv",
    ]
    # Preference is the offerer's (RFC 3264 section 5.1), not our SUPPORTED order.
    assert negotiate(offer, ("PCMA", "PCMU")).codec.name == "PCMU"
    assert negotiate(offer, ("pcma",)).codec == Codec(8, "PCMA", 8000)
    # An offered ptime is what we packetize at.
    negotiated, answer = answer_to(CARRIER.replace(b"a=ptime:20", b"a=ptime:30"))
    assert negotiated.ptime_ms == 30 and "a=ptime:30" in lines(answer)


def test_rtcp_mux_offered_is_taken_and_an_rtcp_port_is_read() -> None:
    """RFC 5761 section 5.1.1: an offer's a=rtcp-mux is answered with it and RTCP goes to the
    RTP port; without it, RTCP goes to a=rtcp's port (RFC 3605), else the RTP port + 1."""
    muxed = CARRIER.replace(b"a=ptime:20", b"a=ptime:20\r\na=rtcp-mux")
    negotiated, answer = answer_to(muxed)
    assert negotiated.rtcp_mux and negotiated.rtcp_port == 16384
    assert "a=rtcp-mux" in lines(answer)
    negotiated, answer = answer_to(SIPP_UAC)
    assert not negotiated.rtcp_mux and negotiated.rtcp_port == 6001
    assert "a=rtcp-mux" not in lines(answer)
    moved = CARRIER.replace(b"a=rtcp:16385", b"a=rtcp:16500 IN IP4 203.0.113.10")
    negotiated, _ = answer_to(moved)
    assert negotiated.rtcp_port == 16500


def test_a_softphone_offer_gets_pcmu_and_its_video_rejected() -> None:
    offer = parse_sdp(SOFTPHONE)
    audio, video = offer.streams
    assert audio.codecs[0] == Codec(96, "OPUS", 48000, "useinbandfec=1", channels=2)
    assert video.media == "video" and video.connection == "192.0.2.56"  # its own c= wins
    assert video.direction == "recvonly" and audio.direction == "sendrecv"
    assert [c.name for c in video.codecs] == ["VP8", "H264"]
    negotiated, answer = answer_to(SOFTPHONE)
    assert negotiated.codec == Codec(0, "PCMU", 8000) and negotiated.stream_index == 0
    assert negotiated.telephone_event == Codec(101, "TELEPHONE-EVENT", 8000)
    assert lines(answer)[5:] == [
        "m=audio 40000 RTP/AVP 0 101",
        "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:101 telephone-event/8000",
        "a=sendrecv",
        "m=video 0 RTP/AVP 97 98",
    ]
    # Video first and audio second: the answer keeps the offer's order (RFC 3264 section 6).
    head, audio_part, video_part = SOFTPHONE.split(b"m=")
    swapped = head + b"m=" + video_part + b"m=" + audio_part
    negotiated, answer = answer_to(swapped)
    assert negotiated.stream_index == 1
    assert [line for line in lines(answer) if line.startswith("m=")] == [
        "m=video 0 RTP/AVP 97 98",
        "m=audio 40000 RTP/AVP 0 101",
    ]


@pytest.mark.parametrize(
    ("change", "direction", "answered"),
    [
        ((b"a=sendrecv", b"a=sendonly"), "sendonly", "a=recvonly"),
        ((b"a=sendrecv", b"a=inactive"), "inactive", "a=inactive"),
        ((b"c=IN IP4 203.0.113.10", b"c=IN IP4 0.0.0.0"), "sendrecv", "a=sendrecv"),
    ],
)
def test_a_hold_reoffer_is_seen_and_answered(
    change: tuple[bytes, bytes], direction: str, answered: str
) -> None:
    reoffer = CARRIER.replace(b"1693234762 1693234762", b"1693234762 1693234763")
    reoffer = reoffer.replace(*change)
    assert parse_sdp(reoffer).origin_version == "1693234763"  # a changed session (3264 s. 8)
    negotiated, answer = answer_to(reoffer)
    assert negotiated.on_hold and negotiated.direction == direction
    assert lines(answer)[-1] == answered
    # Taken off hold: the next re-offer is sendrecv to a real address again.
    assert not negotiate(parse_sdp(CARRIER)).on_hold


def test_directions_inherit_from_the_session_and_answer_per_section_6_1() -> None:
    recvonly = CARRIER.replace(b"a=sendrecv\r\n", b"").replace(b"t=0 0", b"t=0 0\r\na=recvonly")
    negotiated, answer = answer_to(recvonly)
    assert negotiated.direction == "recvonly" and not negotiated.on_hold
    assert lines(answer)[-1] == "a=sendonly"
    # The media level overrides the session level.
    both = CARRIER.replace(b"t=0 0", b"t=0 0\r\na=inactive")
    assert negotiate(parse_sdp(both)).direction == "sendrecv"


def test_an_ipv6_offer_and_an_ipv6_answer() -> None:
    offer = CARRIER.replace(b"IN IP4 203.0.113.10", b"IN IP6 2001:db8::10")
    negotiated = negotiate(parse_sdp(offer))
    assert negotiated.remote_address == "2001:db8::10"
    answer = build_answer(
        parse_sdp(offer), negotiated, address="2001:db8::7", port=40000, session_id="9", version=2
    )
    assert lines(answer)[1:4] == [
        "o=voice-agent 9 2 IN IP6 2001:db8::7",
        "s=voice-agent",
        "c=IN IP6 2001:db8::7",
    ]


def test_no_common_codec_says_what_was_offered() -> None:
    offer = SIPP_UAC.replace(b"RTP/AVP 0", b"RTP/AVP 111 9").replace(
        b"a=rtpmap:0 PCMU/8000", b"a=rtpmap:111 opus/48000/2\r\na=rtpmap:9 G722/8000"
    )
    with pytest.raises(NoCommonCodec) as caught:
        negotiate(parse_sdp(offer))
    assert str(caught.value) == (
        "offer has audio in OPUS/48000, G722/8000; this server takes PCMU, PCMA"
    )
    # G.711 over SRTP, or on a disabled stream, is not audio we take either.
    srtp = SIPP_UAC.replace(b"RTP/AVP", b"RTP/SAVP")
    with pytest.raises(NoCommonCodec, match="PCMU/8000 over RTP/SAVP; this server takes"):
        negotiate(parse_sdp(srtp))
    with pytest.raises(NoCommonCodec, match=r"PCMU/8000 \(disabled, port 0\)"):
        negotiate(parse_sdp(SIPP_UAC.replace(b"m=audio 6000", b"m=audio 0")))
    with pytest.raises(NoCommonCodec, match="formats 96 with no a=rtpmap"):
        negotiate(parse_sdp(SIPP_UAC.replace(b"RTP/AVP 0", b"RTP/AVP 96")))
    # Stereo or wideband "PCMU" is not G.711.
    with pytest.raises(NoCommonCodec, match="PCMU/16000"):
        negotiate(parse_sdp(SIPP_UAC.replace(b"PCMU/8000", b"PCMU/16000")))
    # A second audio stream that has G.711 is taken when the first has none.
    two = offer + b"m=audio 6002 RTP/AVP 8\r\n"
    assert negotiate(parse_sdp(two)).stream_index == 1


def test_no_audio_at_all_is_an_sdp_error_not_a_codec_mismatch() -> None:
    video = SOFTPHONE.split(b"m=audio")[0] + b"m=video" + SOFTPHONE.split(b"m=video")[1]
    with pytest.raises(SdpError, match="no audio stream") as caught:
        negotiate(parse_sdp(video))
    assert not isinstance(caught.value, NoCommonCodec)
    without_c = SIPP_UAC.replace(b"c=IN IP4 127.0.0.1\r\n", b"")
    with pytest.raises(SdpError, match="m=audio 6000 RTP/AVP stream has no c= line"):
        negotiate(parse_sdp(without_c))


def test_a_delayed_offer_round_trip() -> None:
    """An INVITE without SDP: our offer goes in the 200, the caller's answer in the ACK."""
    offer_bytes = build_offer(**OURS)
    assert lines(offer_bytes) == [
        "v=0",
        "o=voice-agent 4711 1 IN IP4 198.51.100.7",
        "s=voice-agent",
        "c=IN IP4 198.51.100.7",
        "t=0 0",
        "m=audio 40000 RTP/AVP 0 8 101",
        "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:8 PCMA/8000",
        "a=rtpmap:101 telephone-event/8000",
        "a=fmtp:101 0-16",
        "a=ptime:20",
        "a=sendrecv",
    ]
    ours = parse_sdp(offer_bytes)
    # Our own offer reads as an offer too (a re-INVITE answered with it).
    assert negotiate(ours).codec.name == "PCMU"
    answer = sdp(
        """
        v=0
        o=- 3827 3827 IN IP4 192.0.2.20
        s=-
        c=IN IP4 192.0.2.20
        t=0 0
        m=audio 30000 RTP/AVP 8 100
        a=rtpmap:8 PCMA/8000
        a=rtpmap:100 telephone-event/8000
        a=fmtp:100 0-15
        """
    )
    negotiated = negotiate_answer(ours, parse_sdp(answer))
    assert negotiated == Negotiated(
        remote_address="192.0.2.20",
        remote_port=30000,
        codec=Codec(8, "PCMA", 8000),
        # The answer's payload type for events is the one to send them with.
        telephone_event=Codec(100, "TELEPHONE-EVENT", 8000, "0-15"),
        direction="sendrecv",
        on_hold=False,
        ptime_ms=20,
        stream_index=0,
    )
    held = parse_sdp(build_offer(**OURS, direction="sendonly"))
    assert held.streams[0].direction == "sendonly"
    recvonly = answer.replace(b"t=0 0\r\n", b"t=0 0\r\na=recvonly\r\n")
    assert negotiate_answer(held, parse_sdp(recvonly)).direction == "recvonly"


def test_an_answer_we_cannot_use() -> None:
    ours = parse_sdp(build_offer(**OURS))
    g729 = CARRIER.replace(b"RTP/AVP 0 8 18 101", b"RTP/AVP 18")
    with pytest.raises(NoCommonCodec, match="answer has audio in G729/8000; we offered PCMU/8000"):
        negotiate_answer(ours, parse_sdp(g729))
    with pytest.raises(NoCommonCodec, match=r"rejected the audio stream \(port 0\)"):
        negotiate_answer(ours, parse_sdp(SIPP_UAC.replace(b"m=audio 6000", b"m=audio 0")))
    with pytest.raises(NoCommonCodec, match="RTP/SAVP"):
        negotiate_answer(ours, parse_sdp(SIPP_UAC.replace(b"RTP/AVP", b"RTP/SAVP")))
    video_only = SOFTPHONE.split(b"m=audio")[0] + b"m=video" + SOFTPHONE.split(b"m=video")[1]
    with pytest.raises(SdpError, match="answer has no audio stream"):
        negotiate_answer(ours, parse_sdp(video_only))


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"", "SDP is empty"),
        (
            b"o=- 1 1 IN IP4 10.0.0.1\r\nv=0\r\n",
            "SDP line 1 'o=- 1 1 IN IP4 10.0.0.1': an SDP starts with v=0",
        ),
        (b"v=1\r\n", "SDP line 1 'v=1': the version is not 0"),
        (b"V=0\r\n", "SDP line 1 'V=0': is not '<type>=<value>'"),
        (b"v=0\r\ns=-\r\n", "no o= line"),
        (
            SIPP_UAC.replace(b"m=audio 6000", b"m=audio 70000"),
            "SDP line 6 'm=audio 70000 RTP/AVP 0': port '70000' is not 0..65535",
        ),
        (SIPP_UAC.replace(b"m=audio 6000", b"m=audio -1"), "line 6 .*port '-1'"),
        (SIPP_UAC.replace(b"RTP/AVP 0", b"RTP/AVP 128"), "line 6 .*payload type '128'"),
        (SIPP_UAC.replace(b"RTP/AVP 0", b"RTP/AVP"), "line 6 .*is not '<media> <port>"),
        (
            SIPP_UAC.replace(b"a=rtpmap:0", b"a=rtpmap:x"),
            "SDP line 7 'a=rtpmap:x PCMU/8000': rtpmap is not '<0..127> <name>/<rate>",
        ),
        (SIPP_UAC.replace(b"PCMU/8000", b"PCMU"), "line 7 .*rtpmap is not"),
        (SIPP_UAC + b"a=rtpmap:0 PCMA/8000\r\n", "line 8 .*a second rtpmap for payload type 0"),
        (SIPP_UAC + b"a=fmtp:zz 0-16\r\n", "line 8 .*fmtp payload type 'zz'"),
        (SIPP_UAC + b"a=ptime:twenty\r\n", "line 8 .*ptime is not a positive number"),
        (SIPP_UAC + b"a=ptime:0\r\n", "line 8 .*ptime is not a positive number"),
        (SIPP_UAC + b"a=rtcp:0\r\n", "line 8 .*rtcp is not '<port 1..65535>"),
        (SIPP_UAC + b"a=rtcp:\r\n", "line 8 .*rtcp is not"),
        (SIPP_UAC + b"a=sendonly\r\na=recvonly\r\n", "line 9 .*recvonly after sendonly"),
        (SIPP_UAC.replace(b"c=IN IP4", b"c=IN IPX"), "line 4 .*is not 'IN IP4|IP6"),
        (SIPP_UAC.replace(b"127.0.0.1\r\nt", b"999.1.1.1\r\nt"), "line 4 .*not an IP4 address"),
        (SIPP_UAC.replace(b"o=user1 53655765", b"o=53655765"), "line 2 .*o= needs 6 fields"),
        (SIPP_UAC + b"o=- 1 1 IN IP4 10.0.0.1\r\n", "line 8 .*o= after an m= line"),
        (SIPP_UAC.replace(b"s=-", b"s=\xff"), "SDP line 3 is not UTF-8"),
        (SIPP_UAC.replace(b"s=-", b"s=a\rb"), "line 3 .*holds a CR or NUL"),
        (SIPP_UAC + b" a=sendonly\r\n", r"line 8 ' a=sendonly'"),
        # The line in the message is cut to 80 characters.
        (SIPP_UAC + b"a=rtpmap:0 " + b"x" * 200 + b"\r\n", "line 8 'a=rtpmap:0 x{69}': rtpmap"),
    ],
)
def test_malformed_sdp_names_its_line(body: bytes, problem: str) -> None:
    with pytest.raises(SdpError, match=problem.replace("|", r"\|")):
        parse_sdp(body)


def test_limits_of_size_and_streams() -> None:
    huge = SIPP_UAC + b"a=x-filler:" + b"y" * MAX_SDP_BYTES + b"\r\n"
    with pytest.raises(SdpError, match=f"SDP of {len(huge)} bytes, over the limit of 16384"):
        parse_sdp(huge)
    many = SIPP_UAC + b"m=video 0 RTP/AVP 31\r\n" * MAX_MEDIA
    with pytest.raises(SdpError, match="SDP line 71 'm=video 0 RTP/AVP 31': more than 64 m="):
        parse_sdp(many)
    assert len(parse_sdp(SIPP_UAC + b"m=video 0 RTP/AVP 31\r\n" * (MAX_MEDIA - 1)).streams) == 64


def test_what_the_parser_tolerates() -> None:
    # LF alone, trailing blanks and blank lines, unknown types and attributes, port counts,
    # multicast suffixes, a decimal ptime, names in any case, duplicate formats.
    body = (
        b"v=0\n\no=- 1 2 IN IP4 h.example\nx=whatever\nc=IN IP4 224.2.1.1/127/3  \n"
        b"m=AUDIO 6000/2 RTP/AVP 0 0 8 96 \na=RtpMap:8 pcma/8000\na=ptime:12.5\t\n"
        b"a=x-unknown\na=fmtp:96 a=b\n\n\n"
    )
    offer = parse_sdp(body)
    (stream,) = offer.streams
    assert offer.connection == stream.connection == "224.2.1.1"
    assert (stream.media, stream.port, stream.formats) == ("audio", 6000, ("0", "0", "8", "96"))
    assert [c.label for c in stream.codecs] == ["PCMU/8000", "PCMA/8000"]
    assert stream.ptime_ms == 13
    assert parse_sdp(b"v=0\r\no=- 1 2 IN IP4 h.example\r\n").streams == ()
    # Non-RTP streams: formats are tokens, no codecs.
    app = parse_sdp(SIPP_UAC + b"m=application 9 UDP/BFCP *\r\nm=image 0 udptl t38\r\n")
    assert [(s.formats, s.codecs) for s in app.streams[1:]] == [(("*",), ()), (("t38",), ())]


def test_build_checks_what_it_writes() -> None:
    offer = parse_sdp(SIPP_UAC)
    negotiated = negotiate(offer)
    # A line break or space in a field would make another line or field of the SDP.
    bad: list[dict[str, Any]] = [
        {"address": "10.0.0.1\r\nm=video", "port": 1, "session_id": "1", "version": 1},
        {"address": "10.0.0.1", "port": 0, "session_id": "1", "version": 1},
        {"address": "10.0.0.1", "port": 1, "session_id": "a b", "version": 1},
    ]
    for ours in bad:
        with pytest.raises(ValueError):
            build_answer(offer, negotiated, **ours)
        with pytest.raises(ValueError):
            build_offer(**ours)
    with pytest.raises(ValueError, match="stream 3 is not one of the offer's"):
        build_answer(offer, replace(negotiated, stream_index=3), **OURS)


SAMPLES = [SIPP_UAC_PCAP, SIPP_UAC, CARRIER, SOFTPHONE]


def _only_sdp_errors(body: bytes) -> None:
    """Parse, negotiate, answer and read the answer again: an SdpError anywhere, or all of it
    works and the answer settles on the same codec."""
    try:
        offer = parse_sdp(body)
    except SdpError:
        return
    assert isinstance(offer, SessionDescription)
    try:
        negotiated = negotiate(offer)
    except SdpError:
        return
    answer = parse_sdp(build_answer(offer, negotiated, **OURS))
    assert negotiate(answer).codec == negotiated.codec
    ours = parse_sdp(build_offer(**OURS))
    try:
        negotiate_answer(ours, offer)
    except SdpError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=400), st.text(max_size=400).map(str.encode)))
def test_random_bytes_raise_only_sdp_errors(noise: bytes) -> None:
    _only_sdp_errors(noise)
    _only_sdp_errors(b"v=0\r\n" + noise)
    _only_sdp_errors(SIPP_UAC + noise)


_LINE_NOISE = st.text(
    alphabet=st.sampled_from("=:/ .-\t0123456789abcmotvsAIPNRTVx\u0660\u00b2\u2028\x85é"),
    max_size=30,
)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    """A real offer with a few of its lines replaced, duplicated, dropped, cut or spliced."""
    lines = draw(st.sampled_from(SAMPLES)).decode().splitlines()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["replace", "duplicate", "drop", "cut", "splice", "field"]))
        if kind == "replace":
            lines[at] = lines[at][:2] + draw(_LINE_NOISE)
        elif kind == "duplicate":
            lines.insert(at, lines[at])
        elif kind == "drop" and len(lines) > 1:
            del lines[at]
        elif kind == "cut":
            lines[at] = lines[at][: draw(st.integers(0, len(lines[at])))]
        elif kind == "splice":
            cut = draw(st.integers(0, len(lines[at])))
            lines[at] = lines[at][:cut] + draw(_LINE_NOISE) + lines[at][cut:]
        else:
            fields = lines[at].split(" ")
            fields[draw(st.integers(0, len(fields) - 1))] = draw(_LINE_NOISE)
            lines[at] = " ".join(fields)
    return draw(st.sampled_from(["\r\n", "\n"])).join(lines).encode()


@settings(max_examples=1500, deadline=None)
@given(_mutated())
def test_mutated_offers_raise_only_sdp_errors(body: bytes) -> None:
    _only_sdp_errors(body)

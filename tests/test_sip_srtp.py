"""SRTP for SIP calls, sans-I/O: the `a=crypto` lines of an offer read and chosen (RFC 4568,
voice_agent/sip/sdes.py), the policy of when keys are taken (voice_agent/sip/offer.py, through
the user agent server), and one call's packets protected and checked (voice_agent/sip/media.py,
libsrtp through pylibsrtp). The calls from a real phone are in tests/test_sip_connections.py."""

from __future__ import annotations

import base64
import struct
from dataclasses import replace
from typing import Any

import pytest

from tests.test_sip_uas import CONNECTION, MEDIA_HOST, MEDIA_PORT, invite, make_uas, of_type
from voice_agent.audio.g711 import ulaw_encode
from voice_agent.observability.metrics import ServerMetrics
from voice_agent.sip.media import RtpSession
from voice_agent.sip.message import parse_message
from voice_agent.sip.offer import MediaSecurity
from voice_agent.sip.sdes import SrtpKeys, SrtpTransform, choose, read_crypto
from voice_agent.sip.sdp import SECURE_RTP, negotiate, parse_sdp
from voice_agent.sip.uas import IncomingCall, Refused, Send

# Fixed keys: the parameters' ids carry them, and xdist's workers must collect the same ids.
KEY_80 = base64.b64encode(bytes(range(30))).decode()
KEY_GCM = base64.b64encode(bytes(range(100, 128))).decode()


def savp_offer(*crypto: str, protocol: str = "RTP/SAVP") -> bytes:
    lines = [
        "v=0",
        "o=- 1 1 IN IP4 127.0.0.1",
        "s=phone",
        "c=IN IP4 127.0.0.1",
        "t=0 0",
        f"m=audio 30000 {protocol} 0 101",
        "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:101 telephone-event/8000",
        *(f"a=crypto:{line}" for line in crypto),
        "a=sendrecv",
    ]
    return ("\r\n".join(lines) + "\r\n").encode()


# ---- the a=crypto lines ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_80}",
        f"2 AES_CM_128_HMAC_SHA1_32 inline:{KEY_80}|2^31",
        f"3 AEAD_AES_128_GCM inline:{KEY_GCM}",
    ],
)
def test_the_suites_libsrtp_takes_are_read(line: str) -> None:
    offered = read_crypto(line)
    assert offered is not None and offered.tag == int(line[0])
    assert str(offered.key) not in repr(offered)  # a key never shows in a repr


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (f"1 F8_128_HMAC_SHA1_80 inline:{KEY_80}", "a suite libsrtp's binding lacks"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_80}|2^20", "a lifetime shorter than a call"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_80}|2^31|1:4", "an MKI"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_80} UNENCRYPTED_SRTP", "a session parameter"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_GCM}", "a key of the wrong length"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:not*base64", "a key that is not base64"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_80};inline:{KEY_80}", "two keys"),
        ("AES_CM_128_HMAC_SHA1_80", "no tag or key"),
    ],
)
def test_a_line_this_server_cannot_honour_is_passed_over(line: str, why: str) -> None:
    assert read_crypto(line) is None, why


def test_the_first_usable_line_is_chosen_in_the_offers_order() -> None:
    keys = choose(["1 F8_128_HMAC_SHA1_80 inline:x", f"2 AEAD_AES_128_GCM inline:{KEY_GCM}"])
    assert keys is not None and (keys.tag, keys.suite) == (2, "AEAD_AES_128_GCM")
    assert len(keys.local) == 28 and keys.local != keys.remote  # ours, made for this call


# ---- when keys are taken: the server's policy ---------------------------------------------------


def offered_over(transport: str, body: bytes, **security: Any) -> list[object]:
    uas = make_uas(stream_ports={"TLS": 5063}, media_security=MediaSecurity(**security))
    actions = uas.datagram(invite(transport=transport, body=body), CONNECTION, 0.0)
    incoming = of_type(actions, IncomingCall)
    if not incoming:
        return list(actions)
    return list(uas.accept(incoming[0].call_id, MEDIA_HOST, MEDIA_PORT, 0.0))


def test_an_srtp_offer_over_tls_is_answered_with_our_key_under_its_tag() -> None:
    actions = offered_over("TLS", savp_offer(f"7 AES_CM_128_HMAC_SHA1_80 inline:{KEY_80}"))
    (ok,) = [parse_message(a.data) for a in of_type(actions, Send)]
    answer = parse_sdp(ok.body)
    (stream,) = answer.streams
    assert stream.protocol == "RTP/SAVP"
    (line,) = stream.crypto
    assert line.startswith("7 AES_CM_128_HMAC_SHA1_80 inline:") and KEY_80 not in line


def test_an_srtp_offer_over_plain_signalling_is_refused_saying_why() -> None:
    body = savp_offer(f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_80}")
    (refused,) = of_type(offered_over("UDP", body), Refused)
    assert refused.status == 488 and "over TLS only" in refused.reason
    allowed = offered_over("UDP", body, keys_over_plain_signalling=True)
    assert [parse_message(a.data).status for a in of_type(allowed, Send)] == [200]


@pytest.mark.parametrize(
    ("body", "security", "reason"),
    [
        (savp_offer("1 F8_128_HMAC_SHA1_80 inline:x"), {}, "no a=crypto line this server takes"),
        (savp_offer(f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_80}"), {"srtp": "off"}, "srtp is off"),
        (savp_offer(protocol="RTP/AVP"), {"srtp": "required"}, "required: plain RTP offered"),
        (b"", {"srtp": "required"}, "send the SDP offer in the request"),
    ],
)
def test_what_the_policy_refuses_gets_488(
    body: bytes, security: dict[str, object], reason: str
) -> None:
    (refused,) = of_type(offered_over("TLS", body, **security), Refused)
    assert refused.status == 488 and reason in refused.reason, refused.reason


def test_a_plain_offer_carrying_keys_gets_srtp_best_effort() -> None:
    """What phones set to "SRTP optional" send: RTP/AVP with a=crypto lines. The answer keeps
    RTP/AVP and gives our key; both ends then protect."""
    body = savp_offer(f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_80}", protocol="RTP/AVP")
    (ok,) = [parse_message(a.data) for a in of_type(offered_over("TLS", body), Send)]
    (stream,) = parse_sdp(ok.body).streams
    assert stream.protocol == "RTP/AVP" and len(stream.crypto) == 1
    plain = savp_offer(protocol="RTP/AVP")
    (ok,) = [parse_message(a.data) for a in of_type(offered_over("TLS", plain), Send)]
    assert parse_sdp(ok.body).streams[0].crypto == ()


# ---- one call's packets -------------------------------------------------------------------------


def rtp(sequence: int, payload: bytes, ssrc: int = 0xFEED) -> bytes:
    return struct.pack("!BBHII", 0x80, 0, sequence, sequence * 160, ssrc) + payload


def test_a_calls_packets_are_protected_both_ways_and_forgeries_are_dropped() -> None:
    offer = parse_sdp(savp_offer("1 AES_CM_128_HMAC_SHA1_80 inline:" + KEY_80))
    keys = choose(offer.streams[0].crypto)
    assert keys is not None
    media = RtpSession(
        replace(negotiate(offer, protocols=SECURE_RTP), srtp=keys), signalling_host="127.0.0.1"
    )
    phone = SrtpTransform(SrtpKeys(keys.suite, keys.tag, remote=keys.local, local=keys.remote))
    source = ("127.0.0.1", 30000)
    speech = ulaw_encode(bytes(range(256)) * 2)[:160]
    sent = [phone.protect(rtp(sequence, speech)) for sequence in range(1, 6)]
    for packet in sent:
        media.receive(packet, source, 0.0)
    assert media.stats.received == 5
    media.receive(rtp(6, speech), source, 0.0)  # plain RTP on an SRTP call
    media.receive(sent[2], source, 0.0)  # a replay
    tampered = phone.protect(rtp(7, speech))
    media.receive(tampered[:-1] + bytes([tampered[-1] ^ 1]), source, 0.0)
    stats = media.stats
    assert (stats.received, stats.srtp_unauthentic, stats.srtp_replayed) == (5, 2, 1)
    packet, _ = media.next_packet(0.0)
    assert packet is not None
    plain = phone.unprotect(packet)
    assert plain is not None and len(plain) == 12 + 160
    assert packet[12:172] != plain[12:]  # what goes on the wire is not the audio


def test_what_srtp_dropped_on_a_call_is_counted_in_the_metrics() -> None:
    metrics = ServerMetrics(process_metrics=False)
    metrics.sip_media_report({"srtp": "AES_CM_128_HMAC_SHA1_80", "srtp_replayed": 2})
    metrics.sip_media_report({"srtp": None, "srtp_replayed": 0, "srtp_unauthentic": 0})
    metrics.sip_media_report({"srtp": "AEAD_AES_128_GCM", "srtp_unauthentic": 3})
    text = metrics.render()[0].decode()
    assert 'voice_agent_srtp_dropped_total{reason="replayed"} 2.0' in text
    assert 'voice_agent_srtp_dropped_total{reason="unauthentic"} 3.0' in text

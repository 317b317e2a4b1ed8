"""SIP messages (voice_agent/sip/message.py): a real peer's INVITE parsed and answered, the parts
of RFC 3261 section 7 a user agent server meets, and no datagram that breaks the parser."""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voice_agent.sip.message import (
    MAX_MESSAGE_BYTES,
    SipParseError,
    build_response,
    name_addr_uri,
    parse_message,
    uri_user,
)

SIPP = shutil.which("sipp")

INVITE = (
    b"INVITE sip:booking@127.0.0.1:5060 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 10.0.0.1:5062;branch=z9hG4bK776asdhds;rport\r\n"
    b"v: SIP/2.0/UDP proxy.example.com;branch=z9hG4bKproxy1,"
    b" SIP/2.0/UDP 10.0.0.9;branch=z9hG4bKx\r\n"
    b"Max-Forwards: 70\r\n"
    b'f: "Alice" <sip:+14155550100@carrier.example>;tag=1928301774\r\n'
    b"t: <sip:booking@127.0.0.1>\r\n"
    b"i: a84b4c76e66710@pc33.example.com\r\n"
    b"CSeq: 314159 INVITE\r\n"
    b"Subject: a folded\r\n"
    b"  header value\r\n"
    b"c: application/sdp\r\n"
    b"l: 4\r\n"
    b"\r\n"
    b"v=0\r\nthe rest of the datagram is not the body"
)


def test_an_invite_with_compact_forms_folding_and_several_vias() -> None:
    message = parse_message(INVITE)
    assert message.is_request and message.method == "INVITE"
    assert uri_user(message.uri or "") == "booking"
    assert message.call_id == "a84b4c76e66710@pc33.example.com"
    assert message.cseq == (314159, "INVITE")
    assert [via.branch for via in message.vias] == [
        "z9hG4bK776asdhds",
        "z9hG4bKproxy1",
        "z9hG4bKx",
    ]
    assert message.vias[0].sent_by == "10.0.0.1:5062" and "rport" in message.vias[0].params
    assert message.from_tag == "1928301774" and message.to_tag is None
    assert name_addr_uri(message.get("From") or "") == "sip:+14155550100@carrier.example"
    assert message.get("subject") == "a folded header value"
    assert message.body == b"v=0\r"  # Content-Length decides; the datagram's rest is dropped


def test_a_response_copies_what_the_request_says_and_tags_the_to() -> None:
    request = parse_message(INVITE)
    response = parse_message(
        build_response(request, 486, to_tag="srv1", headers=[("Retry-After", "30")])
    )
    assert response.status == 486 and response.reason == "Busy Here"
    assert response.get_all("via") == request.get_all("via")
    assert response.get("from") == request.get("from")
    assert response.to_tag == "srv1"
    assert response.call_id == request.call_id and response.cseq == request.cseq
    assert response.get("retry-after") == "30" and response.body == b""
    # A To that has a tag keeps it (a request inside a dialog).
    tagged = parse_message(INVITE.replace(b"t: <sip:booking@127.0.0.1>", b"t: <sip:b@h>;tag=x"))
    assert parse_message(build_response(tagged, 200, to_tag="other")).to_tag == "x"


@pytest.mark.parametrize(
    ("datagram", "problem"),
    [
        (b"INVITE sip:a@b SIP/2.0\r\nVia: x\r\n", "no empty line after the headers"),
        (b"INVITE sip:a@b SIP/3.0\r\n\r\n", "version 'SIP/3.0'"),
        (b"HELLO\r\n\r\n", "is not 'METHOD URI SIP/2.0'"),
        (b"SIP/2.0 abc OK\r\n\r\n", "is not 'SIP/2.0 CODE REASON'"),
        (b"OPTIONS sip:a@b SIP/2.0\r\nno colon here\r\n\r\n", "has no 'Name: value'"),
        (b"OPTIONS sip:a@b SIP/2.0\r\n  folded first\r\n\r\n", "a continuation line"),
        (b"OPTIONS sip:a@b SIP/2.0\r\nl: 10\r\n\r\nshort", "Content-Length 10 but only 5"),
        (b"OPTIONS sip:a@b SIP/2.0\r\nl: ten\r\n\r\n", "Content-Length 'ten'"),
        (b"OPTIONS sip:a@b SIP/2.0\r\nX: \xff\r\n\r\n", "headers are not UTF-8"),
        (b"x" * (MAX_MESSAGE_BYTES + 1), "over 65535"),
        (b"\r\n\r\n", "no start line"),
    ],
)
def test_a_bad_datagram_names_its_problem(datagram: bytes, problem: str) -> None:
    with pytest.raises(SipParseError, match=problem.replace("(", r"\(")):
        parse_message(datagram)


def test_headers_a_response_needs_are_checked_when_read() -> None:
    message = parse_message(b"OPTIONS sip:a@b SIP/2.0\r\nCSeq: one OPTIONS\r\n\r\n")
    with pytest.raises(SipParseError, match="no call-id header"):
        _ = message.call_id
    with pytest.raises(SipParseError, match="CSeq 'one OPTIONS' is not a number and a method"):
        _ = message.cseq


def test_leading_line_breaks_are_ignored() -> None:
    # Section 7.5: keep-alive CRLFs before a message.
    message = parse_message(b"\r\n\r\nOPTIONS sip:a@b SIP/2.0\r\nCall-ID: k\r\n\r\n")
    assert message.method == "OPTIONS" and message.call_id == "k"


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600), st.integers(min_value=0, max_value=len(INVITE)))
def test_no_datagram_breaks_the_parser(noise: bytes, cut: int) -> None:
    """Random bytes, and a real INVITE cut short or with bytes spliced in: a SipParseError
    or a message, never another exception."""
    for datagram in (noise, INVITE[:cut], INVITE[:cut] + noise + INVITE[cut:]):
        try:
            message = parse_message(datagram)
        except SipParseError:
            continue
        for name in ("call_id", "cseq", "vias", "from_tag", "to_tag"):
            try:
                getattr(message, name)
            except SipParseError:
                pass


async def test_sipps_invite_is_read_and_its_ack_matches_our_answer(tmp_path: Path) -> None:
    """sipp's stock UAC calls a bare UDP socket: its INVITE parses, the 486 built from it is a
    response sipp accepts as its transaction's (it ACKs it with the INVITE's branch)."""
    # Never a silent skip: scripts/test installs Debian's sip-tester.
    assert SIPP is not None, "sipp is missing: scripts/test installs sip-tester"
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.setblocking(False)
    port = server.getsockname()[1]
    loop = asyncio.get_running_loop()
    sipp = await asyncio.create_subprocess_exec(
        str(SIPP),
        "-sn",
        "uac",
        "-s",
        "booking",
        "-m",
        "1",
        "-timeout",
        "10s",
        "-nostdin",
        "-trace_err",
        "-error_file",
        str(tmp_path / "sipp_errors.log"),
        f"127.0.0.1:{port}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        data, peer = await asyncio.wait_for(loop.sock_recvfrom(server, 65536), 10)
        invite = parse_message(data)
        assert invite.method == "INVITE" and uri_user(invite.uri or "") == "booking"
        assert invite.get("content-type") == "application/sdp"
        assert b"m=audio" in invite.body and b"PCMU/8000" in invite.body
        await loop.sock_sendto(server, build_response(invite, 486, to_tag="vab1"), peer)
        while True:  # sipp may have retransmitted the INVITE meanwhile
            data, _ = await asyncio.wait_for(loop.sock_recvfrom(server, 65536), 10)
            ack = parse_message(data)
            if ack.method == "ACK":
                break
        assert ack.cseq == (invite.cseq[0], "ACK")
        assert ack.vias[0].branch == invite.vias[0].branch  # the same transaction (17.1.1.3)
        assert ack.to_tag == "vab1" and ack.call_id == invite.call_id
        await asyncio.wait_for(sipp.wait(), 15)
    finally:
        if sipp.returncode is None:
            sipp.kill()
            await sipp.wait()
        server.close()

"""The SIP user agent client (voice_agent/sip/uac.py), sans-I/O: outbound calls through a trunk
on a virtual clock. Every datagram the client sends is parsed back and checked against RFC 3261
(sections 8.1, 9.1, 12.1.2, 13.2.2, 17.1, 22.2); the trunk's and the callee's answers are built
here as a carrier's SBC would send them. Digest credentials are checked by the server side of
voice_agent.sip.auth, the oracle. Nothing sleeps: time is the `now_ms` each test passes in.

We are 192.0.2.1:5060 with media at 192.0.2.1:20000; the trunk is 192.0.2.10:5060; the callee's
Contact is 198.51.100.20:5070."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voice_agent.sip.auth import (
    Credentials,
    DigestAuthenticator,
    digest_authorization,
    parse_digest,
)
from voice_agent.sip.message import SipMessage, build_response, parse_message
from voice_agent.sip.sdp import parse_sdp
from voice_agent.sip.transaction import T1_MS, T2_MS, TIMEOUT_MS
from voice_agent.sip.uac import (
    Action,
    Answered,
    Dialing,
    DtmfReceived,
    Ended,
    Failed,
    MediaChanged,
    Ringing,
    Send,
    UacSettings,
    UserAgentClient,
    outcome_of,
)

US = ("192.0.2.1", 5060)
TRUNK: tuple[str, int] = ("192.0.2.10", 5060)
CALLEE: tuple[str, int] = ("198.51.100.20", 5070)
CALLEE_CONTACT = "<sip:+14155550123@198.51.100.20:5070>"
CALLEE_TAG = "callee77"
TARGET = "sip:+14155550123@trunk.example"
FROM = "sip:+14155550100@voice-agent.example"
CALL_ID = "out-1"
MEDIA_HOST, MEDIA_PORT = "192.0.2.1", 20000
REALM = "trunk.example"

A = TypeVar("A")


# ---- our side ------------------------------------------------------------------------------


def make_uac(**overrides: Any) -> UserAgentClient:
    """A client whose tags, branches and cnonces count up (id1, id2, ...)."""
    counter = itertools.count(1)
    settings_ = UacSettings(host=US[0], port=US[1], trunk=TRUNK, **overrides)
    return UserAgentClient(settings_, make_id=lambda: f"id{next(counter)}")


def of_type(actions: Iterable[Action], kind: type[A]) -> list[A]:
    return [action for action in actions if isinstance(action, kind)]


def sent(actions: Iterable[Action]) -> list[SipMessage]:
    return [parse_message(send.data) for send in of_type(actions, Send)]


def one_sent(actions: Iterable[Action]) -> SipMessage:
    messages = sent(actions)
    assert len(messages) == 1, [m.status or m.method for m in messages]
    return messages[0]


def methods(actions: Iterable[Action]) -> list[str | int | None]:
    return [m.method or m.status for m in sent(actions)]


def drive(uac: UserAgentClient, until_ms: float) -> list[tuple[float, Action]]:
    """Tick at every deadline the client names up to `until_ms`: what it did, and when."""
    done: list[tuple[float, Action]] = []
    while (deadline := uac.next_deadline_ms()) is not None and deadline <= until_ms:
        done.extend((deadline, action) for action in uac.tick(deadline))
    done.extend((until_ms, action) for action in uac.tick(until_ms))
    return done


def dialed(uac: UserAgentClient, now_ms: float = 0.0, **kwargs: Any) -> tuple[str, SipMessage]:
    actions = uac.dial(CALL_ID, TARGET, FROM, MEDIA_HOST, MEDIA_PORT, now_ms, **kwargs)
    dialing = actions[0]
    assert isinstance(dialing, Dialing)
    invite = one_sent(actions)
    assert invite.method == "INVITE"
    assert of_type(actions, Send)[0].addr == TRUNK
    return dialing.call_id, invite


# ---- the trunk's and the callee's side -------------------------------------------------------


def answer_sdp(formats: str = "8 101", rtpmaps: Sequence[str] = ("8 PCMA/8000",)) -> bytes:
    lines = [
        "v=0",
        "o=- 42 1 IN IP4 198.51.100.20",
        "s=SBC",
        "c=IN IP4 198.51.100.20",
        "t=0 0",
        f"m=audio 40000 RTP/AVP {formats}",
        *(f"a=rtpmap:{rtpmap}" for rtpmap in rtpmaps),
        "a=rtpmap:101 telephone-event/8000",
        "a=fmtp:101 0-16",
        "a=sendrecv",
    ]
    return ("\r\n".join(lines) + "\r\n").encode()


def response(
    invite: SipMessage,
    status: int,
    *,
    to_tag: str | None = CALLEE_TAG,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
) -> bytes:
    """The trunk's answer to what we sent (section 8.2.6)."""
    extra = list(headers)
    if body:
        extra.append(("Content-Type", "application/sdp"))
    return build_response(
        invite, status, to_tag=to_tag if status > 100 else None, headers=extra, body=body
    )


def ok(
    invite: SipMessage,
    *,
    to_tag: str = CALLEE_TAG,
    record_route: Sequence[str] = (),
    body: bytes | None = None,
) -> bytes:
    headers = [("Contact", CALLEE_CONTACT), *(("Record-Route", rr) for rr in record_route)]
    return response(
        invite, 200, to_tag=to_tag, headers=headers, body=answer_sdp() if body is None else body
    )


def answered(uac: UserAgentClient, **kwargs: Any) -> tuple[str, SipMessage, SipMessage]:
    """A call dialled and answered: its Call-ID, our INVITE and our ACK."""
    call_id, invite = dialed(uac)
    actions = uac.datagram(ok(invite, **kwargs), TRUNK, 100)
    ack = one_sent(actions)
    assert ack.method == "ACK"
    assert of_type(actions, Answered)
    return call_id, invite, ack


def callee_request(
    method: str,
    invite: SipMessage,
    *,
    cseq: int = 1,
    branch: str = "z9hG4bKcallee1",
    to_tag: str | None = None,
    body: bytes = b"",
    content_type: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    rport: bool = True,
) -> bytes:
    """A request of the callee in the dialog (section 12.2.1.1): From is the callee with its
    tag, To is our From with our tag (unless a test gives another)."""
    ours = invite.get("from") or ""
    if to_tag is not None:
        ours = ours.rpartition(";tag=")[0] + f";tag={to_tag}"
    lines = [
        f"{method} sip:192.0.2.1:5060 SIP/2.0",
        f"Via: SIP/2.0/UDP 198.51.100.20:5070;branch={branch}" + (";rport" if rport else ""),
        "Max-Forwards: 70",
        f"From: <sip:+14155550123@trunk.example>;tag={CALLEE_TAG}",
        f"To: {ours}",
        f"Call-ID: {invite.call_id}",
        f"CSeq: {cseq} {method}",
        f"Contact: {CALLEE_CONTACT}",
        *(f"{name}: {value}" for name, value in headers),
    ]
    if body:
        lines.append(f"Content-Type: {content_type or 'application/sdp'}")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def challenge_response(
    invite: SipMessage, authenticator: DigestAuthenticator, now_ms: float, status: int = 407
) -> bytes:
    name = "WWW-Authenticate" if status == 401 else "Proxy-Authenticate"
    headers = [(name, value) for _, value in authenticator.challenges(now_ms)]
    return response(invite, status, to_tag=f"trunk{status}", headers=headers)


def challenge_with(invite: SipMessage, status: int, challenge: str) -> bytes:
    name = "WWW-Authenticate" if status == 401 else "Proxy-Authenticate"
    return response(invite, status, to_tag="trunkx", headers=[(name, challenge)])


# ---- the INVITE (sections 8.1.1 and 13.2.1) --------------------------------------------------


def test_dial_sends_an_invite_built_as_section_8_1_1_with_our_offer() -> None:
    uac = make_uac()
    actions = uac.dial(CALL_ID, TARGET, FROM, MEDIA_HOST, MEDIA_PORT, 0)
    assert actions[0] == Dialing(CALL_ID, TARGET)
    invite = one_sent(actions)
    assert invite.uri == TARGET
    (via,) = invite.vias
    assert via.transport == "UDP" and via.sent_by == "192.0.2.1:5060"
    assert via.branch is not None and via.branch.startswith("z9hG4bK")
    assert "rport" in via.params and via.params["rport"] is None  # RFC 3581
    assert invite.get("max-forwards") == "70"
    assert invite.get("from") == f"<{FROM}>;tag=id1"
    assert invite.get("to") == f"<{TARGET}>" and invite.to_tag is None
    assert invite.call_id == CALL_ID and invite.cseq == (1, "INVITE")
    assert invite.get("contact") == "<sip:192.0.2.1:5060>"
    assert "INVITE" in (invite.get("allow") or "")
    assert invite.get("content-type") == "application/sdp"
    (audio,) = parse_sdp(invite.body).streams
    assert audio.port == MEDIA_PORT and audio.connection == MEDIA_HOST
    assert [(c.payload_type, c.name) for c in audio.codecs] == [
        (0, "PCMU"),
        (8, "PCMA"),
        (101, "TELEPHONE-EVENT"),
    ]


def test_the_call_id_is_the_hint_when_free_and_made_unique_otherwise() -> None:
    uac = make_uac()
    first, _ = dialed(uac)
    actions = uac.dial(CALL_ID, TARGET, FROM, MEDIA_HOST, MEDIA_PORT, 0)
    dialing = actions[0]
    assert isinstance(dialing, Dialing)
    assert first == CALL_ID and dialing.call_id != CALL_ID
    assert dialing.call_id.startswith(CALL_ID)
    odd = uac.dial("a b\r\nX: y", TARGET, FROM, MEDIA_HOST, MEDIA_PORT, 0)[0]
    assert isinstance(odd, Dialing) and "\r" not in odd.call_id and " " not in odd.call_id


def test_dial_takes_a_name_addr_from_extra_headers_and_a_per_call_trunk() -> None:
    uac = make_uac()
    other = ("203.0.113.5", 5080)
    actions = uac.dial(
        CALL_ID,
        TARGET,
        f'"Agent" <{FROM}>',
        MEDIA_HOST,
        MEDIA_PORT,
        0,
        trunk=other,
        headers=[("P-Asserted-Identity", f"<{FROM}>")],
    )
    invite = one_sent(actions)
    assert of_type(actions, Send)[0].addr == other
    assert invite.get("from") == f'"Agent" <{FROM}>;tag=id1'
    assert invite.get("p-asserted-identity") == f"<{FROM}>"


@pytest.mark.parametrize(
    ("target", "from_uri", "headers"),
    [
        ("sip:x@y\r\nX-Evil: 1", FROM, ()),
        ("http://example.com", FROM, ()),
        (TARGET, "not a uri", ()),
        (TARGET, f"<{FROM}>;tag=chosen", ()),
        (TARGET, FROM, [("X-A", "one\r\nX-B: two")]),
        (TARGET, FROM, [("Bad Name", "x")]),
    ],
)
def test_dial_refuses_values_that_would_not_make_a_valid_request(
    target: str, from_uri: str, headers: list[tuple[str, str]]
) -> None:
    uac = make_uac()
    with pytest.raises(ValueError):
        uac.dial(CALL_ID, target, from_uri, MEDIA_HOST, MEDIA_PORT, 0, headers=headers)
    assert uac.calls == {}


def test_dial_without_a_trunk_is_an_error() -> None:
    uac = UserAgentClient(UacSettings(host=US[0], port=US[1]))
    with pytest.raises(ValueError, match="trunk"):
        uac.dial(CALL_ID, TARGET, FROM, MEDIA_HOST, MEDIA_PORT, 0)


def test_past_max_calls_dial_fails_at_once_with_nothing_sent() -> None:
    uac = make_uac(max_calls=1)
    dialed(uac)
    actions = uac.dial("second", TARGET, FROM, MEDIA_HOST, MEDIA_PORT, 0)
    assert not of_type(actions, Send)
    (failed,) = of_type(actions, Failed)
    assert failed.status == 503 and len(uac.calls) == 1


# ---- the INVITE client transaction (section 17.1.1) ------------------------------------------


def test_the_invite_is_retransmitted_at_t1_doubling_until_timer_b_fails_the_call() -> None:
    """Timer A: T1, 2*T1, 4*T1 ... without the T2 cap (17.1.1.2); timer B at 64*T1: no answer
    from the trunk (408)."""
    uac = make_uac()
    call_id, invite = dialed(uac)
    done = drive(uac, 40_000)
    times = [t for t, action in done if isinstance(action, Send)]
    assert times == [500, 1500, 3500, 7500, 15500, 31500]
    assert [b - a for a, b in itertools.pairwise([0.0, *times])] == [T1_MS * 2**n for n in range(6)]
    for _, action in done:
        if isinstance(action, Send):
            assert action.addr == TRUNK and parse_message(action.data).vias == invite.vias
    failed = [(t, a) for t, a in done if isinstance(a, Failed)]
    assert failed == [(TIMEOUT_MS, Failed(call_id, 408, "no answer from the trunk", "no answer"))]
    drive(uac, 80_000)
    assert uac.calls == {} and uac.next_deadline_ms() is None


def test_a_provisional_response_stops_the_retransmissions_and_timer_b() -> None:
    uac = make_uac(ring_timeout_ms=120_000)
    _, invite = dialed(uac)
    assert uac.datagram(response(invite, 100), TRUNK, 200) == []
    assert uac.next_deadline_ms() == 120_000  # only the ring timeout is left
    assert drive(uac, 100_000) == []


# ---- 1xx and 2xx (section 13.2.2) ------------------------------------------------------------


def test_180_then_200_acks_in_the_dialog_and_reports_the_negotiated_codec() -> None:
    """13.2.2.4: the ACK has the INVITE's CSeq number, a new branch, the Contact as Request-URI
    and the Record-Route reversed as its Route (12.1.2), sent to the first route."""
    uac = make_uac()
    call_id, invite = dialed(uac)
    ringing = uac.datagram(response(invite, 180), TRUNK, 50)
    assert ringing == [Ringing(call_id, 180, None)]
    assert uac.datagram(response(invite, 180), TRUNK, 60) == []  # reported once
    record_route = ["<sip:198.51.100.2;lr>", "<sip:198.51.100.1;lr;transport=udp>"]
    actions = uac.datagram(ok(invite, record_route=record_route), TRUNK, 1000)
    ack = one_sent(actions)
    assert of_type(actions, Send)[0].addr == ("198.51.100.1", 5060)
    assert ack.method == "ACK" and ack.uri == "sip:+14155550123@198.51.100.20:5070"
    assert ack.cseq == (1, "ACK")
    assert ack.vias[0].branch not in (None, invite.vias[0].branch)
    assert ack.get_all("route") == list(reversed(record_route))
    assert ack.from_tag == invite.from_tag and ack.to_tag == CALLEE_TAG
    assert ack.call_id == call_id
    (event,) = of_type(actions, Answered)
    assert event.call_id == call_id
    assert event.negotiated.codec.name == "PCMA"
    assert (event.negotiated.remote_address, event.negotiated.remote_port) == (
        "198.51.100.20",
        40000,
    )
    assert event.negotiated.telephone_event is not None
    assert uac.calls[call_id].state == "established"
    assert uac.next_deadline_ms() is None  # nothing runs while the call is up


def test_a_183_with_sdp_reports_early_media() -> None:
    uac = make_uac()
    _, invite = dialed(uac)
    (event,) = uac.datagram(response(invite, 183, body=answer_sdp()), TRUNK, 50)
    assert isinstance(event, Ringing) and event.status == 183
    assert event.early_media is not None and event.early_media.codec.name == "PCMA"


def test_a_retransmitted_200_gets_the_same_ack_again_and_no_second_answer() -> None:
    uac = make_uac()
    _, invite = dialed(uac)
    first = uac.datagram(ok(invite), TRUNK, 100)
    again = uac.datagram(ok(invite), TRUNK, 600)
    assert of_type(again, Send) == of_type(first, Send)
    assert not of_type(again, Answered)


def test_a_200_without_a_usable_answer_is_acked_then_byed_and_fails_488() -> None:
    uac = make_uac()
    _, invite = dialed(uac)
    g729 = answer_sdp("18", ("18 G729/8000",))
    actions = uac.datagram(ok(invite, body=g729), TRUNK, 100)
    assert methods(actions) == ["ACK", "BYE"]
    (failed,) = of_type(actions, Failed)
    assert failed.status == 488 and failed.outcome == "failed"
    assert "G729" in failed.reason
    assert not of_type(actions, Answered)
    no_sdp = make_uac()
    _, invite = dialed(no_sdp)
    actions = no_sdp.datagram(ok(invite, body=b""), TRUNK, 100)
    assert methods(actions) == ["ACK", "BYE"] and of_type(actions, Failed)[0].status == 488


def test_a_2xx_of_a_second_fork_is_acked_and_byed() -> None:
    uac = make_uac()
    call_id, invite, _ = answered(uac)
    actions = uac.datagram(ok(invite, to_tag="fork2"), TRUNK, 200)
    ack, bye = sent(actions)
    assert (ack.method, bye.method) == ("ACK", "BYE")
    assert ack.to_tag == bye.to_tag == "fork2"
    assert not of_type(actions, Answered) and uac.calls[call_id].state == "established"
    assert methods(uac.datagram(ok(invite, to_tag="fork2"), TRUNK, 300)) == ["ACK"]


# ---- non-2xx final responses (section 17.1.1.3) ----------------------------------------------


def test_486_is_acked_with_the_invites_branch_and_fails_busy() -> None:
    uac = make_uac()
    call_id, invite = dialed(uac)
    busy = response(invite, 486)
    actions = uac.datagram(busy, TRUNK, 300)
    ack = one_sent(actions)
    assert of_type(actions, Send)[0].addr == TRUNK
    assert ack.method == "ACK" and ack.uri == invite.uri
    assert ack.vias == invite.vias  # the same branch: the INVITE's transaction
    assert ack.cseq == (1, "ACK") and ack.call_id == invite.call_id
    assert ack.get("from") == invite.get("from") and ack.to_tag == CALLEE_TAG
    assert of_type(actions, Failed) == [Failed(call_id, 486, "Busy Here", "busy")]
    # A retransmitted 486 gets the ACK again (timer D), and no second failure.
    again = uac.datagram(busy, TRUNK, 800)
    assert of_type(again, Send) == of_type(actions, Send) and not of_type(again, Failed)
    assert drive(uac, 300 + TIMEOUT_MS) == []
    assert uac.calls == {}


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (486, "busy"),
        (600, "busy"),
        (480, "no answer"),
        (408, "no answer"),
        (487, "no answer"),
        (404, "bad number"),
        (484, "bad number"),
        (604, "bad number"),
        (403, "refused"),
        (503, "failed"),
        (302, "failed"),
        (603, "failed"),
    ],
)
def test_final_statuses_map_to_outcomes(status: int, outcome: str) -> None:
    assert outcome_of(status) == outcome
    uac = make_uac()
    _, invite = dialed(uac)
    actions = uac.datagram(response(invite, status), TRUNK, 10)
    assert methods(actions) == ["ACK"]
    (failed,) = of_type(actions, Failed)
    assert (failed.status, failed.outcome) == (status, outcome)


# ---- digest authentication (section 22.2) ----------------------------------------------------


@pytest.mark.parametrize(
    ("status", "header"), [(407, "Proxy-Authorization"), (401, "Authorization")]
)
@pytest.mark.parametrize("algorithms", [("MD5", "SHA-256"), ("SHA-256",)])
def test_a_challenge_gets_one_authenticated_retry_that_the_server_verifies(
    status: int, header: str, algorithms: tuple[str, ...]
) -> None:
    authenticator = DigestAuthenticator(REALM, {"trunkuser": "s3cret"}, algorithms=algorithms)
    uac = make_uac()
    call_id, invite = dialed(uac, credentials=Credentials("trunkuser", "s3cret"))
    actions = uac.datagram(challenge_response(invite, authenticator, 100, status), TRUNK, 100)
    ack, retry = sent(actions)
    assert ack.method == "ACK" and ack.vias == invite.vias
    assert retry.method == "INVITE" and retry.cseq == (2, "INVITE")
    assert retry.vias[0].branch != invite.vias[0].branch
    assert retry.call_id == call_id and retry.from_tag == invite.from_tag
    assert retry.to_tag is None and retry.body == invite.body
    credentials = retry.get(header)
    assert authenticator.verify("INVITE", credentials, 150).ok  # the oracle
    params = parse_digest(credentials or "")
    assert params is not None
    assert params["uri"] == TARGET and params["qop"] == "auth" and params["nc"] == "00000001"
    assert params["algorithm"] == algorithms[0]  # the topmost challenge (RFC 8760 2.4)
    assert params["cnonce"]
    # The 2xx to the retry: its ACK has the retry's CSeq and the same credentials (13.2.2.4).
    answered_ = uac.datagram(ok(retry), TRUNK, 300)
    ack2 = one_sent(answered_)
    assert ack2.cseq == (2, "ACK") and ack2.get(header) == credentials
    assert of_type(answered_, Answered)


def test_a_second_challenge_fails_the_call_as_refused() -> None:
    authenticator = DigestAuthenticator(REALM, {"trunkuser": "right"})
    uac = make_uac()
    _, invite = dialed(uac, credentials=Credentials("trunkuser", "wrong"))
    _, retry = sent(uac.datagram(challenge_response(invite, authenticator, 0), TRUNK, 100))
    assert not authenticator.verify("INVITE", retry.get("proxy-authorization"), 150).ok
    actions = uac.datagram(challenge_response(retry, authenticator, 200), TRUNK, 200)
    ack = one_sent(actions)  # no third INVITE
    assert ack.method == "ACK" and ack.cseq == (2, "ACK")
    (failed,) = of_type(actions, Failed)
    assert failed.status == 407 and failed.outcome == "refused"
    # The first 407 retransmitted still gets its own ACK.
    assert methods(uac.datagram(challenge_response(invite, authenticator, 0), TRUNK, 300)) == [
        "ACK"
    ]


def test_a_stale_nonce_earns_one_more_try_and_no_more() -> None:
    """RFC 7616 section 3.3: stale=true means the password was right, the nonce old."""
    authenticator = DigestAuthenticator(REALM, {"u": "p"})
    uac = make_uac()
    _, invite = dialed(uac, credentials=Credentials("u", "p"))
    _, second = sent(uac.datagram(challenge_response(invite, authenticator, 0, 401), TRUNK, 10))
    stale = [("WWW-Authenticate", v) for _, v in authenticator.challenges(20, stale=True)]
    actions = uac.datagram(response(second, 401, to_tag="t2", headers=stale), TRUNK, 20)
    _, third = sent(actions)
    assert third.cseq == (3, "INVITE")
    assert authenticator.verify("INVITE", third.get("authorization"), 30).ok
    actions = uac.datagram(response(third, 401, to_tag="t3", headers=stale), TRUNK, 40)
    assert methods(actions) == ["ACK"] and of_type(actions, Failed)[0].outcome == "refused"


def test_a_challenge_without_credentials_or_that_we_cannot_answer_fails_refused() -> None:
    authenticator = DigestAuthenticator(REALM, {"u": "p"})
    uac = make_uac()
    _, invite = dialed(uac)
    actions = uac.datagram(challenge_response(invite, authenticator, 0, 401), TRUNK, 10)
    assert methods(actions) == ["ACK"]
    assert of_type(actions, Failed)[0].outcome == "refused"
    for challenge in (
        f'Digest realm="{REALM}", nonce="n", algorithm=SHA-512-256',
        f'Digest realm="{REALM}", nonce="n", qop="auth-int"',
        'Basic realm="x"',
        'Digest realm="other", nonce="n"',
    ):
        uac = make_uac()
        _, invite = dialed(uac, credentials=Credentials("u", "p", realm=REALM))
        actions = uac.datagram(challenge_with(invite, 407, challenge), TRUNK, 10)
        assert methods(actions) == ["ACK"], challenge
        assert of_type(actions, Failed)[0].outcome == "refused"


def test_a_challenge_without_qop_gets_rfc_2069_digest_and_opaque_back() -> None:
    value = digest_authorization(
        f'Digest realm="{REALM}", nonce="abc", opaque="xyz"',
        method="INVITE",
        uri=TARGET,
        credentials=Credentials("u", "p"),
        cnonce="c",
    )
    params = parse_digest(value or "")
    assert params is not None and "qop" not in params and "nc" not in params
    ha1 = hashlib.md5(f"u:{REALM}:p".encode()).hexdigest()
    ha2 = hashlib.md5(f"INVITE:{TARGET}".encode()).hexdigest()
    assert params["response"] == hashlib.md5(f"{ha1}:abc:{ha2}".encode()).hexdigest()
    assert params["opaque"] == "xyz" and params["algorithm"] == "MD5"


# ---- CANCEL (section 9.1) --------------------------------------------------------------------


def test_cancel_after_a_provisional_sends_cancel_then_acks_the_487() -> None:
    uac = make_uac()
    call_id, invite = dialed(uac)
    uac.datagram(response(invite, 180), TRUNK, 100)
    actions = uac.cancel(call_id, 2000)
    cancel = one_sent(actions)
    assert of_type(actions, Send)[0].addr == TRUNK
    assert cancel.method == "CANCEL" and cancel.uri == invite.uri
    assert cancel.vias == invite.vias and cancel.cseq == (1, "CANCEL")
    assert cancel.get("to") == invite.get("to") and cancel.get("from") == invite.get("from")
    assert cancel.call_id == call_id
    # Retransmitted (timer E) until its 200.
    assert methods(uac.tick(2000 + T1_MS)) == ["CANCEL"]
    assert uac.datagram(build_response(cancel, 200, to_tag=CALLEE_TAG), TRUNK, 2600) == []
    assert uac.tick(2000 + 3 * T1_MS) == []
    actions = uac.datagram(response(invite, 487), TRUNK, 2700)
    ack = one_sent(actions)
    assert ack.method == "ACK" and ack.vias == invite.vias
    (failed,) = of_type(actions, Failed)
    assert failed == Failed(call_id, 487, "cancelled by the agent", "cancelled")
    assert uac.cancel(call_id, 2800) == []


def test_hang_up_before_the_answer_cancels() -> None:
    uac = make_uac()
    call_id, invite = dialed(uac)
    uac.datagram(response(invite, 183), TRUNK, 100)
    assert methods(uac.hang_up(call_id, 200)) == ["CANCEL"]


def test_the_ring_timeout_cancels_and_the_487_fails_the_call_as_no_answer() -> None:
    uac = make_uac()
    _, invite = dialed(uac, ring_timeout_ms=20_000)
    uac.datagram(response(invite, 180), TRUNK, 100)
    done = drive(uac, 20_000)
    assert [(t, parse_message(a.data).method) for t, a in done if isinstance(a, Send)] == [
        (20_000, "CANCEL")
    ]
    (failed,) = of_type(uac.datagram(response(invite, 487), TRUNK, 20_100), Failed)
    assert failed.outcome == "no answer" and failed.reason == "no answer in 20 s"


def test_a_cancel_before_any_provisional_waits_for_one() -> None:
    """Section 9.1: no CANCEL before a provisional response."""
    uac = make_uac()
    call_id, invite = dialed(uac)
    assert uac.cancel(call_id, 100) == []
    assert methods(uac.datagram(response(invite, 100), TRUNK, 200)) == ["CANCEL"]


def test_a_cancel_with_no_response_at_all_ends_with_timer_b() -> None:
    uac = make_uac()
    call_id, _ = dialed(uac)
    uac.cancel(call_id, 100)
    done = drive(uac, 40_000)
    assert [a for _, a in done if isinstance(a, Failed)] == [
        Failed(call_id, 408, "no answer from the trunk", "cancelled")
    ]


def test_a_200_crossing_the_cancel_is_acked_and_byed() -> None:
    uac = make_uac()
    call_id, invite = dialed(uac)
    uac.datagram(response(invite, 180), TRUNK, 100)
    uac.cancel(call_id, 200)
    actions = uac.datagram(ok(invite), TRUNK, 250)
    assert methods(actions) == ["ACK", "BYE"]
    (failed,) = of_type(actions, Failed)
    assert failed.outcome == "cancelled" and not of_type(actions, Answered)


def test_no_final_response_after_the_cancel_ends_the_call_in_64_t1() -> None:
    uac = make_uac()
    call_id, invite = dialed(uac)
    uac.datagram(response(invite, 180), TRUNK, 100)
    uac.cancel(call_id, 1000)
    done = drive(uac, 1000 + TIMEOUT_MS)
    failed = [(t, a) for t, a in done if isinstance(a, Failed)]
    assert len(failed) == 1 and failed[0][0] == 1000 + TIMEOUT_MS
    assert failed[0][1].status == 408 and failed[0][1].outcome == "cancelled"


# ---- in the dialog -------------------------------------------------------------------------


def test_the_callee_hanging_up_gets_200_and_ends_the_call() -> None:
    uac = make_uac()
    call_id, invite, _ = answered(uac)
    bye = callee_request("BYE", invite, branch="z9hG4bKbye1")
    actions = uac.datagram(bye, CALLEE, 5000)
    reply = one_sent(actions)
    assert reply.status == 200 and reply.cseq == (1, "BYE")
    assert of_type(actions, Send)[0].addr == CALLEE  # rport: the source (RFC 3581)
    assert reply.vias[0].params["received"] == CALLEE[0]
    assert reply.vias[0].params["rport"] == str(CALLEE[1])
    assert of_type(actions, Ended) == [Ended(call_id, "callee hung up")]
    again = uac.datagram(bye, CALLEE, 5500)  # retransmitted: the same 200, no second end
    assert of_type(again, Send) == of_type(actions, Send) and not of_type(again, Ended)
    assert uac.hang_up(call_id, 6000) == []
    drive(uac, 5000 + TIMEOUT_MS)
    assert uac.calls == {}


def test_hang_up_sends_our_bye_retransmitted_until_its_200() -> None:
    """Section 15 and 12.2.1.1: From ours, To the callee's with its tag, the next CSeq, the
    remote target as Request-URI, the route set as Route."""
    uac = make_uac()
    call_id, invite, ack = answered(uac, record_route=["<sip:198.51.100.1;lr>"])
    actions = uac.hang_up(call_id, 10_000)
    bye = one_sent(actions)
    assert of_type(actions, Send)[0].addr == ("198.51.100.1", 5060)
    assert of_type(actions, Ended) == [Ended(call_id, "agent ended the call")]
    assert bye.method == "BYE" and bye.uri == "sip:+14155550123@198.51.100.20:5070"
    assert bye.get_all("route") == ["<sip:198.51.100.1;lr>"]
    assert bye.cseq == (2, "BYE") and bye.call_id == call_id
    assert bye.from_tag == invite.from_tag and bye.to_tag == CALLEE_TAG
    assert bye.get("from") == invite.get("from")
    assert bye.vias[0].branch not in (invite.vias[0].branch, ack.vias[0].branch)
    done = drive(uac, 14_000)
    times = [t for t, a in done if isinstance(a, Send)]
    assert times == [10_500, 11_500, 13_500]
    assert uac.datagram(build_response(bye, 200), CALLEE, 14_000) == []
    assert drive(uac, 10_000 + TIMEOUT_MS) == []
    assert uac.calls == {}


def test_an_unanswered_bye_stops_after_64_t1_with_t2_capped_retransmissions() -> None:
    uac = make_uac()
    call_id, _, _ = answered(uac)
    uac.hang_up(call_id, 0)
    times = [t for t, a in drive(uac, 60_000) if isinstance(a, Send)]
    gaps = [b - a for a, b in itertools.pairwise([0.0, *times])]
    assert gaps[:4] == [T1_MS, 2 * T1_MS, 4 * T1_MS, T2_MS] and max(gaps) == T2_MS
    assert times[-1] < TIMEOUT_MS
    assert uac.calls == {}


def test_a_challenged_bye_is_sent_once_more_with_credentials() -> None:
    authenticator = DigestAuthenticator(REALM, {"u": "p"})
    uac = make_uac()
    call_id, invite = dialed(uac, credentials=Credentials("u", "p"))
    uac.datagram(ok(invite), TRUNK, 100)
    bye = one_sent(uac.hang_up(call_id, 1000))
    challenge = [(n, v) for n, v in authenticator.challenges(1100)]
    actions = uac.datagram(build_response(bye, 401, headers=challenge), CALLEE, 1100)
    again = one_sent(actions)
    assert again.method == "BYE" and again.cseq == (3, "BYE")
    assert authenticator.verify("BYE", again.get("authorization"), 1200).ok
    params = parse_digest(again.get("authorization") or "")
    assert params is not None and params["uri"] == again.uri
    assert uac.datagram(build_response(again, 401, headers=challenge), CALLEE, 1300) == []


def test_info_dtmf_from_the_callee_is_a_digit() -> None:
    uac = make_uac()
    call_id, invite, _ = answered(uac)
    relay = callee_request(
        "INFO",
        invite,
        branch="z9hG4bKinfo1",
        body=b"Signal=5\r\nDuration=160\r\n",
        content_type="application/dtmf-relay",
    )
    actions = uac.datagram(relay, CALLEE, 2000)
    assert one_sent(actions).status == 200
    assert of_type(actions, DtmfReceived) == [DtmfReceived(call_id, "5")]
    plain = callee_request(
        "INFO", invite, cseq=2, branch="z9hG4bKinfo2", body=b"#", content_type="application/dtmf"
    )
    assert of_type(uac.datagram(plain, CALLEE, 2100), DtmfReceived) == [DtmfReceived(call_id, "#")]
    other = callee_request(
        "INFO", invite, cseq=3, branch="z9hG4bKinfo3", body=b"x", content_type="text/plain"
    )
    actions = uac.datagram(other, CALLEE, 2200)
    assert one_sent(actions).status == 200 and not of_type(actions, DtmfReceived)


def test_other_requests_in_the_dialog_get_what_the_uas_would_give() -> None:
    uac = make_uac()
    call_id, invite, _ = answered(uac)
    options = one_sent(uac.datagram(callee_request("OPTIONS", invite, cseq=1), CALLEE, 10))
    assert options.status == 200 and "BYE" in (options.get("allow") or "")
    cases = [
        (callee_request("SUBSCRIBE", invite, cseq=2, branch="z9hG4bKs"), 405),
        (callee_request("FOO", invite, cseq=3, branch="z9hG4bKf"), 501),
        (callee_request("BYE", invite, cseq=4, branch="z9hG4bKw", to_tag="nottag"), 481),
        (callee_request("INFO", invite, cseq=1, branch="z9hG4bKold"), 500),
        (
            callee_request("INFO", invite, cseq=5, branch="z9hG4bKr", headers=[("Require", "foo")]),
            420,
        ),
    ]
    for data, status in cases:
        actions = uac.datagram(data, CALLEE, 20)
        assert one_sent(actions).status == status
        assert not of_type(actions, Ended)
    assert uac.calls[call_id].state == "established"
    assert uac.datagram(callee_request("ACK", invite, cseq=9), CALLEE, 30) == []


def test_a_reinvite_from_the_callee_is_answered_and_its_200_resent_until_the_ack() -> None:
    uac = make_uac()
    call_id, invite, _ = answered(uac)
    hold = answer_sdp().replace(b"a=sendrecv", b"a=sendonly")
    reinvite = callee_request("INVITE", invite, cseq=2, branch="z9hG4bKre2", body=hold)
    actions = uac.datagram(reinvite, CALLEE, 1000)
    reply = one_sent(actions)
    assert reply.status == 200 and reply.to_tag == invite.from_tag
    (audio,) = parse_sdp(reply.body).streams
    assert audio.direction == "recvonly" and audio.port == MEDIA_PORT
    (changed,) = of_type(actions, MediaChanged)
    assert changed.call_id == call_id and changed.negotiated.on_hold
    assert of_type(uac.datagram(reinvite, CALLEE, 1100), Send) == of_type(actions, Send)
    assert methods(uac.tick(1000 + T1_MS)) == [200]
    assert (
        uac.datagram(callee_request("ACK", invite, cseq=2, branch="z9hG4bKa2"), CALLEE, 1600) == []
    )
    assert uac.next_deadline_ms() is None
    g729 = answer_sdp("18", ("18 G729/8000",))
    bad = callee_request("INVITE", invite, cseq=3, branch="z9hG4bKre3", body=g729)
    assert one_sent(uac.datagram(bad, CALLEE, 2000)).status == 488
    assert uac.calls[call_id].state == "established"


def test_a_reinvite_200_never_acked_ends_the_call_with_a_bye() -> None:
    """Section 13.3.1.4: no ACK for our 2xx in 64*T1; a second re-INVITE meanwhile gets 500
    with Retry-After (14.2)."""
    uac = make_uac()
    call_id, invite, _ = answered(uac)
    reinvite = callee_request("INVITE", invite, cseq=2, branch="z9hG4bKre2", body=answer_sdp())
    uac.datagram(reinvite, CALLEE, 0)
    second = callee_request("INVITE", invite, cseq=3, branch="z9hG4bKre3", body=answer_sdp())
    busy = one_sent(uac.datagram(second, CALLEE, 100))
    assert busy.status == 500 and busy.get("retry-after") == "1"
    done = drive(uac, TIMEOUT_MS)
    assert [a for _, a in done if isinstance(a, Ended)] == [
        Ended(call_id, "no ACK to our 200 (re-INVITE)")
    ]
    assert [parse_message(a.data).method for _, a in done if isinstance(a, Send)][-1] == "BYE"


def test_record_route_values_on_one_line_are_split_and_reversed() -> None:
    uac = make_uac()
    call_id, _, ack = answered(
        uac, record_route=['<sip:198.51.100.2;lr>, "p1" <sip:198.51.100.1;lr>']
    )
    assert ack.get_all("route") == ['"p1" <sip:198.51.100.1;lr>', "<sip:198.51.100.2;lr>"]
    assert of_type(uac.hang_up(call_id, 10), Send)[0].addr == ("198.51.100.1", 5060)


def test_responses_go_to_the_via_port_without_rport() -> None:
    uac = make_uac()
    _, invite, _ = answered(uac)
    options = callee_request("OPTIONS", invite, rport=False)
    actions = uac.datagram(options, ("198.51.100.20", 40001), 10)
    assert of_type(actions, Send)[0].addr == ("198.51.100.20", 5070)


# ---- what is not ours ------------------------------------------------------------------------


def test_garbage_and_responses_matching_nothing_are_ignored_without_state() -> None:
    uac = make_uac()
    call_id, invite = dialed(uac)
    before = (uac.next_deadline_ms(), uac.calls[call_id].state, len(uac.calls))
    wrong_branch = response(invite, 200).replace(
        (invite.vias[0].branch or "").encode(), b"z9hG4bKother"
    )
    for data in [
        b"",
        b"\r\n\r\n",
        b"\x00\xff garbage",
        b"SIP/2.0 200 OK\r\n\r\n",
        response(invite, 180)[:60],
        wrong_branch,
        response(invite, 200).replace(b"CSeq: 1 INVITE", b"CSeq: 1 BYE"),
        response(invite, 200).replace(b"CSeq: 1 INVITE", b"CSeq: x"),
        response(invite, 200).replace(CALL_ID.encode(), b"someone-else"),
        response(invite, 200).replace(b"SIP/2.0 200 OK", b"SIP/2.0 999 Odd"),
        callee_request("BYE", invite).replace(b"Via:", b"X-Via:"),
    ]:
        assert uac.datagram(data, TRUNK, 100) == [], data
        assert (uac.next_deadline_ms(), uac.calls[call_id].state, len(uac.calls)) == before


def test_a_request_with_an_unreadable_header_gets_400() -> None:
    uac = make_uac()
    _, invite, _ = answered(uac)
    data = callee_request("INFO", invite, cseq=2).replace(b"CSeq: 2 INFO", b"CSeq: 2 BYE")
    assert one_sent(uac.datagram(data, CALLEE, 10)).status == 400


# ---- random orders -------------------------------------------------------------------------


def _script() -> list[bytes]:
    """The datagrams a trunk and callee might send for a call dialled with credentials: to
    the INVITE and to its authenticated retry, and in the dialog."""
    probe = make_uac()
    _, invite = dialed(probe, credentials=Credentials("u", "p"))
    authenticator = DigestAuthenticator(REALM, {"u": "p"}, key=b"k" * 32)
    challenge = challenge_response(invite, authenticator, 0)
    retry = sent(probe.datagram(challenge, TRUNK, 1))[1]
    messages = [challenge]
    for target in (invite, retry):
        messages += [
            response(target, 100),
            response(target, 180),
            response(target, 183, body=answer_sdp()),
            ok(target),
            ok(target, to_tag="fork2"),
            ok(target, body=answer_sdp("18", ("18 G729/8000",))),
            response(target, 486),
            response(target, 487),
            challenge_response(target, authenticator, 0, 401),
        ]
    messages += [
        callee_request("BYE", invite, cseq=5),
        callee_request(
            "INFO", invite, cseq=3, branch="z9hG4bKi", body=b"1", content_type="application/dtmf"
        ),
        callee_request("INVITE", invite, cseq=4, branch="z9hG4bKre", body=answer_sdp()),
        callee_request("ACK", invite, cseq=4, branch="z9hG4bKack"),
        callee_request("OPTIONS", invite, cseq=2, branch="z9hG4bKo"),
    ]
    return messages


SCRIPT = _script()
_OPERATIONS = ("tick", "cancel", "hang_up", "dial")
_step = st.one_of(
    st.sampled_from(SCRIPT),
    st.sampled_from(_OPERATIONS),
    st.sampled_from(SCRIPT).map(lambda data: data[: len(data) // 2]),
    st.binary(max_size=80),
)
_advance = st.sampled_from([0.0, 10.0, T1_MS, T2_MS, 20_000.0, TIMEOUT_MS + 1])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_step, _advance), max_size=30))
def test_no_order_of_responses_and_requests_breaks_the_client(
    steps: list[tuple[bytes | str, float]],
) -> None:
    """Whatever arrives in whatever order, as the clock runs and the agent cancels or hangs
    up: no exception, every datagram sent parses, no deadline in the past, the calls kept
    bounded, and once every timer has run only answered calls remain."""
    uac = make_uac(max_calls=3)
    uac.dial(CALL_ID, TARGET, FROM, MEDIA_HOST, MEDIA_PORT, 0, credentials=Credentials("u", "p"))
    now = 0.0
    for step, advance in steps:
        now += advance
        if isinstance(step, bytes):
            actions = uac.datagram(step, TRUNK, now)
        elif step == "tick":
            actions = uac.tick(now)
        elif step == "dial":
            actions = uac.dial(CALL_ID, TARGET, FROM, MEDIA_HOST, MEDIA_PORT, now)
        else:
            actions = []
            for call_id in list(uac.calls):
                actions += getattr(uac, step)(call_id, now)
        sent(actions)
        deadline = uac.next_deadline_ms()
        assert deadline is None or deadline > now - 1e-9 or step != "tick"
        assert len(uac.calls) <= 12
        for call in uac.calls.values():
            assert len(call.invites) <= 3 and len(call.outgoing) <= 2 + 4
    drive(uac, now + 10 * TIMEOUT_MS)
    assert all(call.state == "established" for call in uac.calls.values())
    assert uac.next_deadline_ms() is None

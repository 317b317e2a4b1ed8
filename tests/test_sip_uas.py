"""The SIP user agent server (voice_agent/sip/uas.py), sans-I/O: datagrams from a caller and a
virtual clock in, every datagram it sends parsed back and checked against RFC 3261 (and RFC
3581, 3264), the call events it reports checked against what the caller did. Nothing sleeps:
time is the `now_ms` each test passes in.

The caller is 127.0.0.1:5061 unless a test says otherwise; the server is 127.0.0.1:5060 and
answers with media at 127.0.0.1:20000."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voice_agent.sip.auth import (
    NONCE_LIFETIME_MS,
    OFFERED,
    Credentials,
    DigestAuthenticator,
    digest_authorization,
    parse_digest,
)
from voice_agent.sip.guard import WINDOW_MS, parse_networks
from voice_agent.sip.message import SipMessage, build_response, parse_message
from voice_agent.sip.sdp import SessionDescription, parse_sdp
from voice_agent.sip.transaction import T1_MS, T2_MS, TIMEOUT_MS
from voice_agent.sip.uas import (
    Action,
    CallConfirmed,
    CallEnded,
    DtmfReceived,
    IncomingCall,
    MediaChanged,
    Refused,
    Send,
    TransferAccepted,
    TransferFailed,
    TransferProgress,
    UasSettings,
    UserAgentServer,
)

CALLER: tuple[str, int] = ("127.0.0.1", 5061)
CALLER_VIA = "127.0.0.1:5061"
CALLER_CONTACT = "<sip:+14155550100@127.0.0.1:5061>"
CALL_ID = "a84b4c76e66710@carrier.example"
FROM_TAG = "1928301774"
MEDIA_HOST = "127.0.0.1"
MEDIA_PORT = 20000
ALLOWED_METHODS = {"INVITE", "ACK", "CANCEL", "BYE", "OPTIONS", "INFO", "NOTIFY", "UPDATE"}

A = TypeVar("A")


# ---- the caller's side: requests, an SDP offer like a carrier's -----------------------------


def offer(
    formats: str = "0 8 101",
    *,
    direction: str = "sendrecv",
    version: int = 1,
    address: str = "127.0.0.1",
    port: int = 30000,
    rtpmaps: Sequence[str] = (
        "0 PCMU/8000",
        "8 PCMA/8000",
        "101 telephone-event/8000",
    ),
) -> bytes:
    """An SBC's offer: G.711 mu-law and A-law, RFC 4733 events, 20 ms."""
    lines = [
        "v=0",
        f"o=- 1693234762 {version} IN IP4 {address}",
        "s=SBC",
        f"c=IN IP4 {address}",
        "t=0 0",
        f"m=audio {port} RTP/AVP {formats}",
        *(f"a=rtpmap:{rtpmap}" for rtpmap in rtpmaps),
        "a=fmtp:101 0-16",
        "a=ptime:20",
        f"a={direction}",
    ]
    return ("\r\n".join(lines) + "\r\n").encode()


G729_OPUS = offer("18 111", rtpmaps=("18 G729/8000", "111 opus/48000/2"))


def request(
    method: str,
    *,
    call_id: str | None = CALL_ID,
    branch: str = "z9hG4bKinvite1",
    cseq: int | None = 1,
    cseq_method: str | None = None,
    from_tag: str = FROM_TAG,
    to_tag: str | None = None,
    sent_by: str = CALLER_VIA,
    rport: bool = False,
    uri: str = "sip:agent@127.0.0.1:5060",
    contact: str | None = CALLER_CONTACT,
    body: bytes = b"",
    content_type: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    transport: str = "UDP",
) -> bytes:
    """A request as a carrier's SBC would send it (section 8.1.1): Via with an RFC 3261 branch,
    Max-Forwards, From with a tag, To (with our tag inside a dialog), Call-ID, CSeq, Contact,
    then `headers`, Content-Type and Content-Length."""
    via = f"SIP/2.0/{transport} {sent_by};branch={branch}" + (";rport" if rport else "")
    to = "<sip:agent@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
    lines = [
        f"{method} {uri} SIP/2.0",
        f"Via: {via}",
        "Max-Forwards: 70",
        f'From: "Alice" <sip:+14155550100@carrier.example>;tag={from_tag}',
        f"To: {to}",
    ]
    if call_id is not None:
        lines.append(f"Call-ID: {call_id}")
    if cseq is not None:
        lines.append(f"CSeq: {cseq} {cseq_method or method}")
    if contact is not None and method in ("INVITE", "OPTIONS", "REGISTER"):
        lines.append(f"Contact: {contact}")
    lines.extend(f"{name}: {value}" for name, value in headers)
    if body:
        lines.append(f"Content-Type: {content_type or 'application/sdp'}")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def invite(**kwargs: Any) -> bytes:
    kwargs.setdefault("body", offer())
    return request("INVITE", **kwargs)


def ack(to_tag: str, *, cseq: int = 1, branch: str = "z9hG4bKack1", body: bytes = b"") -> bytes:
    """The ACK of a 2xx: a transaction of its own, a new branch (section 13.2.2.4)."""
    return request("ACK", to_tag=to_tag, cseq=cseq, branch=branch, body=body)


def bye(to_tag: str, *, cseq: int = 2, branch: str = "z9hG4bKbye1", **kwargs: Any) -> bytes:
    return request("BYE", to_tag=to_tag, cseq=cseq, branch=branch, **kwargs)


def reinvite(
    to_tag: str, body: bytes, *, cseq: int = 2, branch: str = "z9hG4bKreinv2", **kwargs: Any
) -> bytes:
    return request("INVITE", to_tag=to_tag, cseq=cseq, branch=branch, body=body, **kwargs)


def response_to(data: bytes, status: int) -> bytes:
    """The caller's answer to a request the server sent (a BYE)."""
    return build_response(parse_message(data), status, to_tag=FROM_TAG)


# ---- the server's side and reading what it did ----------------------------------------------


def make_uas(**overrides: Any) -> UserAgentServer:
    """A server whose tags and branches count up (id1, id2, ...), so tests can name them."""
    counter = itertools.count(1)
    settings_ = UasSettings(host="127.0.0.1", port=5060, **overrides)
    return UserAgentServer(settings_, make_id=lambda: f"id{next(counter)}")


def of_type(actions: Iterable[Action], kind: type[A]) -> list[A]:
    return [action for action in actions if isinstance(action, kind)]


def sent(actions: Iterable[Action]) -> list[SipMessage]:
    """Every datagram the server sent, parsed (each must parse)."""
    return [parse_message(send.data) for send in of_type(actions, Send)]


def one_sent(actions: Iterable[Action]) -> SipMessage:
    messages = sent(actions)
    assert len(messages) == 1, [m.status or m.method for m in messages]
    return messages[0]


def statuses(actions: Iterable[Action]) -> list[int | None]:
    return [message.status for message in sent(actions)]


def body_of(message: SipMessage) -> SessionDescription:
    assert message.get("content-type") == "application/sdp"
    return parse_sdp(message.body)


def drive(uas: UserAgentServer, until_ms: float) -> list[tuple[float, Action]]:
    """Tick at every deadline the server names up to `until_ms`: what it did, and when."""
    done: list[tuple[float, Action]] = []
    while (deadline := uas.next_deadline_ms()) is not None and deadline <= until_ms:
        done.extend((deadline, action) for action in uas.tick(deadline))
    done.extend((until_ms, action) for action in uas.tick(until_ms))
    return done


def offered(
    uas: UserAgentServer,
    data: bytes | None = None,
    now_ms: float = 0.0,
    source: tuple[str, int] = CALLER,
) -> IncomingCall:
    actions = uas.datagram(data or invite(), source, now_ms)
    assert statuses(actions) == [100]
    (incoming,) = of_type(actions, IncomingCall)
    return incoming


def answered(
    uas: UserAgentServer, data: bytes | None = None, now_ms: float = 0.0
) -> tuple[IncomingCall, SipMessage]:
    incoming = offered(uas, data, now_ms)
    ok = one_sent(uas.accept(incoming.call_id, MEDIA_HOST, MEDIA_PORT, now_ms))
    assert ok.status == 200
    return incoming, ok


def confirmed(uas: UserAgentServer, data: bytes | None = None, now_ms: float = 0.0) -> str:
    """A call answered and acknowledged; its To tag (ours)."""
    _, ok = answered(uas, data, now_ms)
    tag = ok.to_tag
    assert tag is not None
    assert of_type(uas.datagram(ack(tag, cseq=ok.cseq[0]), CALLER, now_ms + 10), CallConfirmed)
    return tag


# ---- INVITE, 100, accept, 200 ---------------------------------------------------------------


def test_an_invite_gets_100_trying_at_once_and_the_server_is_told_of_the_call() -> None:
    """Section 8.2.6.1 and 17.2.1: a 100 Trying at once, copying Via, From, To (no tag
    needed), Call-ID and CSeq; the offer negotiated to PCMU with telephone-event 101."""
    uas = make_uas()
    actions = uas.datagram(invite(), CALLER, 0)
    trying = one_sent(actions)
    assert trying.status == 100
    assert of_type(actions, Send)[0].addr == CALLER
    assert trying.call_id == CALL_ID and trying.cseq == (1, "INVITE")
    assert trying.from_tag == FROM_TAG
    assert trying.vias[0].branch == "z9hG4bKinvite1"
    (incoming,) = of_type(actions, IncomingCall)
    assert incoming.call_id == CALL_ID and incoming.source == CALLER
    assert incoming.username is None
    assert incoming.negotiated is not None
    assert incoming.negotiated.codec.name == "PCMU"
    assert incoming.negotiated.telephone_event is not None
    assert incoming.negotiated.telephone_event.payload_type == 101
    assert (incoming.negotiated.remote_address, incoming.negotiated.remote_port) == (
        "127.0.0.1",
        30000,
    )


def test_accepting_sends_200_with_a_to_tag_contact_and_the_sdp_answer() -> None:
    """Section 13.3.1.4 and 8.2.6.2: the 200 carries our To tag, a Contact (12.1.1), Allow;
    RFC 3264 section 6: the answer picks PCMU, keeps telephone-event 101, at our port."""
    uas = make_uas()
    incoming = offered(uas)
    actions = uas.accept(incoming.call_id, MEDIA_HOST, MEDIA_PORT, 5)
    ok = one_sent(actions)
    assert of_type(actions, Send)[0].addr == CALLER
    assert ok.status == 200 and ok.cseq == (1, "INVITE")
    assert ok.to_tag == "id1"
    assert ok.from_tag == FROM_TAG
    assert ok.get("contact") == "<sip:127.0.0.1:5060>"
    assert {m.strip() for m in (ok.get("allow") or "").split(",")} == ALLOWED_METHODS
    answer = body_of(ok)
    (audio,) = answer.streams
    assert audio.port == MEDIA_PORT and audio.connection == MEDIA_HOST
    assert [(c.payload_type, c.name) for c in audio.codecs] == [
        (0, "PCMU"),
        (101, "TELEPHONE-EVENT"),
    ]
    assert audio.direction == "sendrecv"


def test_a_retransmitted_invite_gets_the_same_200_and_no_second_call() -> None:
    """Section 13.3.1.4 / 17.2.1: a retransmission of the INVITE is absorbed by its
    transaction and answered with the last response, not offered as a new call."""
    uas = make_uas()
    assert statuses(uas.datagram(invite(), CALLER, 0)) == [100]
    again = uas.datagram(invite(), CALLER, 100)
    assert statuses(again) == [100] and not of_type(again, IncomingCall)
    first = of_type(uas.accept(CALL_ID, MEDIA_HOST, MEDIA_PORT, 200), Send)[0]
    retransmitted = uas.datagram(invite(), CALLER, 300)
    assert of_type(retransmitted, Send) == [first]
    assert not of_type(retransmitted, IncomingCall)
    assert len(uas.calls) == 1


def test_accept_twice_sends_nothing_the_second_time() -> None:
    uas = make_uas()
    answered(uas)
    assert uas.accept(CALL_ID, MEDIA_HOST, MEDIA_PORT, 10) == []
    assert uas.accept("no-such-call", MEDIA_HOST, MEDIA_PORT, 10) == []


# ---- the 2xx until its ACK (section 13.3.1.4) -----------------------------------------------


def test_the_200_is_retransmitted_doubling_from_t1_to_t2_until_the_ack() -> None:
    """Section 13.3.1.4: the 2xx is sent again at T1, 2*T1, 4*T1 ... capped at T2 (500, 1000,
    2000, 4000, 4000 ms apart); the ACK stops it and confirms the call."""
    uas = make_uas()
    _, ok = answered(uas)
    done = drive(uas, 16_000)
    times = [t for t, action in done if isinstance(action, Send)]
    assert times == [500, 1500, 3500, 7500, 11500, 15500]
    assert [b - a for a, b in itertools.pairwise([0.0, *times])] == [
        T1_MS,
        2 * T1_MS,
        4 * T1_MS,
        T2_MS,
        T2_MS,
        T2_MS,
    ]
    for _, action in done:
        assert isinstance(action, Send) and parse_message(action.data).status == 200
        assert action.addr == CALLER
    assert ok.to_tag is not None
    actions = uas.datagram(ack(ok.to_tag), CALLER, 16_000)
    (event,) = actions
    assert isinstance(event, CallConfirmed) and event.call_id == CALL_ID
    assert event.negotiated.codec.name == "PCMU"
    assert uas.next_deadline_ms() is None
    assert drive(uas, 40_000) == []


def test_a_retransmitted_ack_gives_nothing() -> None:
    """Sections 13.3.1.4 and 17.2.1: ACK is never answered; a second one confirms nothing."""
    uas = make_uas()
    tag = confirmed(uas)
    assert uas.datagram(ack(tag), CALLER, 100) == []
    assert uas.datagram(ack(tag, branch="z9hG4bKack-other"), CALLER, 200) == []


def test_no_ack_in_32_seconds_ends_the_call_with_a_bye() -> None:
    """Section 13.3.1.4: after 64*T1 with no ACK the session is ended with a BYE."""
    uas = make_uas()
    _, ok = answered(uas)
    done = drive(uas, TIMEOUT_MS)
    resent = [t for t, a in done if isinstance(a, Send) and parse_message(a.data).status == 200]
    assert resent == [500, 1500, 3500, 7500, 11500, 15500, 19500, 23500, 27500, 31500]
    at_timeout = [a for t, a in done if t == TIMEOUT_MS]
    byes = [m for m in sent(at_timeout) if m.method == "BYE"]
    assert len(byes) == 1
    assert byes[0].from_tag == ok.to_tag and byes[0].to_tag == FROM_TAG
    assert of_type(at_timeout, CallEnded) == [CallEnded(CALL_ID, "no ACK from the caller")]


# ---- CANCEL (section 9.2) -------------------------------------------------------------------


def test_cancel_before_the_answer_gets_200_and_the_invite_487() -> None:
    """Section 9.2: 200 to the CANCEL with the To tag the INVITE's response carries, then 487
    to the INVITE; the call ends and a later accept() answers nothing."""
    uas = make_uas()
    offered(uas)
    actions = uas.datagram(request("CANCEL"), CALLER, 1000)
    ok, terminated = sent(actions)
    assert ok.status == 200 and ok.cseq == (1, "CANCEL")
    assert terminated.status == 487 and terminated.cseq == (1, "INVITE")
    assert ok.to_tag == terminated.to_tag == "id1"
    assert of_type(actions, CallEnded) == [CallEnded(CALL_ID, "caller cancelled before the answer")]
    assert uas.accept(CALL_ID, MEDIA_HOST, MEDIA_PORT, 1100) == []
    assert uas.reject(CALL_ID, 486, 1100) == []


def test_the_487_is_retransmitted_until_its_ack_with_the_invites_branch() -> None:
    """Section 17.2.1: a non-2xx final response is retransmitted (timer G, T1 doubling to T2)
    until the ACK, which for a non-2xx carries the INVITE's branch (17.1.1.3)."""
    uas = make_uas()
    offered(uas)
    uas.datagram(request("CANCEL"), CALLER, 0)
    done = drive(uas, 4000)
    assert [t for t, _ in done] == [500, 1500, 3500]
    assert {parse_message(a.data).status for _, a in done if isinstance(a, Send)} == {487}
    assert uas.datagram(request("ACK", branch="z9hG4bKinvite1", to_tag="id1"), CALLER, 4000) == []
    assert drive(uas, 20_000) == []


def test_the_retransmitted_invite_after_cancel_gets_the_487_again() -> None:
    """The INVITE a call was refused after is kept to absorb retransmissions (module doc)."""
    uas = make_uas()
    offered(uas)
    uas.datagram(request("CANCEL"), CALLER, 0)
    again = uas.datagram(invite(), CALLER, 100)
    assert statuses(again) == [487] and not of_type(again, IncomingCall)
    assert statuses(uas.datagram(request("CANCEL"), CALLER, 200)) == [200]


def test_cancel_with_no_matching_invite_gets_481() -> None:
    """Section 9.2: a CANCEL that matches no transaction gets 481."""
    uas = make_uas()
    assert statuses(uas.datagram(request("CANCEL"), CALLER, 0)) == [481]
    offered(uas)
    other_branch = request("CANCEL", branch="z9hG4bKsomething-else")
    assert statuses(uas.datagram(other_branch, CALLER, 10)) == [481]
    assert uas.calls[CALL_ID].state == "offered"


def test_cancel_after_the_200_gets_200_only_and_the_call_goes_on() -> None:
    """Section 9.2: a CANCEL after the final response has no effect on the INVITE."""
    uas = make_uas()
    _, ok = answered(uas)
    actions = uas.datagram(request("CANCEL"), CALLER, 100)
    assert statuses(actions) == [200]
    assert not of_type(actions, CallEnded)
    assert ok.to_tag is not None
    assert of_type(uas.datagram(ack(ok.to_tag), CALLER, 200), CallConfirmed)


def test_ringing_sends_180_with_the_to_tag_the_200_will_carry() -> None:
    """Sections 13.3.1.1 and 12.1.1: a 180 with a To tag sets up an early dialog, so its tag is
    the one of the 2xx; a retransmitted INVITE gets the 180 again."""
    uas = make_uas()
    offered(uas)
    ringing = one_sent(uas.ringing(CALL_ID))
    assert ringing.status == 180 and ringing.to_tag == "id1"
    assert ringing.get("contact") == "<sip:127.0.0.1:5060>"
    assert statuses(uas.datagram(invite(), CALLER, 10)) == [180]
    ok = one_sent(uas.accept(CALL_ID, MEDIA_HOST, MEDIA_PORT, 20))
    assert ok.to_tag == ringing.to_tag
    assert uas.ringing(CALL_ID) == []


def test_bye_on_the_early_dialog_of_a_180_ends_the_call() -> None:
    uas = make_uas()
    offered(uas)
    uas.ringing(CALL_ID)
    actions = uas.datagram(bye("id1"), CALLER, 20)
    assert set(statuses(actions)) == {200, 487}
    assert of_type(actions, CallEnded)


# ---- BYE from the caller (section 15.1.2) ---------------------------------------------------


def test_bye_from_the_caller_gets_200_and_ends_the_call() -> None:
    """Section 15.1.2: a BYE for the dialog is answered 200 and the session ends."""
    uas = make_uas()
    tag = confirmed(uas)
    actions = uas.datagram(bye(tag), CALLER, 5000)
    ok = one_sent(actions)
    assert ok.status == 200 and ok.cseq == (2, "BYE") and ok.to_tag == tag
    assert of_type(actions, CallEnded) == [CallEnded(CALL_ID, "caller hung up")]


def test_a_retransmitted_bye_gets_the_same_200_not_481() -> None:
    """Section 17.2.2: the non-INVITE server transaction answers retransmissions with its
    final response, for timer J (64*T1 over UDP)."""
    uas = make_uas()
    tag = confirmed(uas)
    first = of_type(uas.datagram(bye(tag), CALLER, 5000), Send)
    again = uas.datagram(bye(tag), CALLER, 5500)
    assert of_type(again, Send) == first
    assert not of_type(again, CallEnded)


def test_bye_with_a_wrong_to_tag_or_an_unknown_call_id_gets_481() -> None:
    """Section 12.2.2: a request naming no dialog we have gets 481, and the call goes on."""
    uas = make_uas()
    tag = confirmed(uas)
    wrong_tag = uas.datagram(bye("not-ours"), CALLER, 100)
    assert statuses(wrong_tag) == [481] and not of_type(wrong_tag, CallEnded)
    unknown = uas.datagram(bye(tag, call_id="nobody@here", branch="z9hG4bKbye9"), CALLER, 100)
    assert statuses(unknown) == [481] and not of_type(unknown, CallEnded)
    wrong_from = uas.datagram(bye(tag, from_tag="other", branch="z9hG4bKbye8"), CALLER, 100)
    assert statuses(wrong_from) == [481]
    assert uas.calls[CALL_ID].state == "confirmed"


def test_bye_before_the_call_is_answered_gets_481() -> None:
    """Section 15: there is no dialog before our 2xx (no early dialog: the 100 has no tag)."""
    uas = make_uas()
    offered(uas)
    assert statuses(uas.datagram(bye("id1"), CALLER, 10)) == [481]


# ---- hang_up: our BYE (sections 12.2.1.1, 15.1.1) -------------------------------------------

RECORD_ROUTES = (("Record-Route", "<sip:10.0.0.5:5070;lr>"), ("Record-Route", "<sip:10.0.0.6;lr>"))


def test_hang_up_sends_a_bye_in_the_dialog_through_the_recorded_route() -> None:
    """Section 12.2.1.1: Request-URI the caller's Contact (loose routing, 16.12), Route headers
    from Record-Route in order (12.1.1), From with our tag, To with the caller's, the next
    local CSeq, a new RFC 3261 branch; sent to the first route (8.1.2)."""
    uas = make_uas()
    tag = confirmed(uas, invite(headers=RECORD_ROUTES))
    actions = uas.hang_up(CALL_ID, 10_000)
    (send,) = of_type(actions, Send)
    assert send.addr == ("10.0.0.5", 5070)
    request_ = parse_message(send.data)
    assert request_.method == "BYE"
    assert request_.uri == "sip:+14155550100@127.0.0.1:5061"
    assert request_.get_all("route") == ["<sip:10.0.0.5:5070;lr>", "<sip:10.0.0.6;lr>"]
    assert request_.from_tag == tag and request_.to_tag == FROM_TAG
    assert request_.call_id == CALL_ID
    number, method = request_.cseq
    assert method == "BYE" and 0 < number < 2**31
    (via,) = request_.vias
    assert via.sent_by == "127.0.0.1:5060" and (via.branch or "").startswith("z9hG4bK")
    assert request_.get("max-forwards") == "70"
    assert of_type(actions, CallEnded) == [CallEnded(CALL_ID, "agent ended the call")]


def test_the_200_carries_the_record_route_of_the_invite() -> None:
    """Section 12.1.1: the UAS copies Record-Route into its 2xx, in order."""
    uas = make_uas()
    _, ok = answered(uas, invite(headers=RECORD_ROUTES))
    assert ok.get_all("record-route") == [value for _, value in RECORD_ROUTES]


def test_without_routes_the_bye_goes_to_the_contact() -> None:
    """Section 12.2.1.1 / 8.1.2: with an empty route set the request goes to the remote target."""
    uas = make_uas()
    confirmed(uas, invite(contact="<sip:alice@127.0.0.1:5099>"))
    (send,) = of_type(uas.hang_up(CALL_ID, 100), Send)
    assert send.addr == ("127.0.0.1", 5099)
    message = parse_message(send.data)
    assert message.uri == "sip:alice@127.0.0.1:5099" and message.get("route") is None


def test_our_bye_is_retransmitted_until_its_200_matched_by_branch() -> None:
    """Section 17.1.2.2: timer E from T1 doubling to T2 until a final response, matched to the
    transaction by the branch of its top Via (17.1.3)."""
    uas = make_uas()
    confirmed(uas)
    (first,) = of_type(uas.hang_up(CALL_ID, 0), Send)
    done = drive(uas, 4000)
    assert [t for t, _ in done] == [500, 1500, 3500]
    assert all(isinstance(a, Send) and a.data == first.data for _, a in done)
    other = parse_message(first.data)
    stray = build_response(other, 200).replace(
        (other.vias[0].branch or "").encode(), b"z9hG4bKnot-ours"
    )
    refused = uas.datagram(stray, CALLER, 4000)
    assert [type(a) for a in refused] == [Refused]
    assert [t for t, _ in drive(uas, 8000)] == [7500]
    assert uas.datagram(response_to(first.data, 200), CALLER, 8000) == []
    assert drive(uas, 31_000) == []


def test_a_provisional_response_does_not_stop_our_bye() -> None:
    """Section 17.1.2.2: a 1xx moves the transaction to Proceeding; it still retransmits."""
    uas = make_uas()
    confirmed(uas)
    (first,) = of_type(uas.hang_up(CALL_ID, 0), Send)
    assert uas.datagram(response_to(first.data, 100), CALLER, 100) == []
    assert [t for t, _ in drive(uas, 600)] == [500]


def test_hang_up_before_the_ack_waits_for_it_then_sends_the_bye() -> None:
    """Section 15: the callee MUST NOT send a BYE on a confirmed dialog until it has received
    the ACK for its 2xx (or the server transaction timed out)."""
    uas = make_uas()
    _, ok = answered(uas)
    assert uas.hang_up(CALL_ID, 100) == []
    assert statuses(a for _, a in drive(uas, 2000)) == [200, 200]  # at 500 and 1500 ms
    assert ok.to_tag is not None
    actions = uas.datagram(ack(ok.to_tag), CALLER, 2000)
    assert [type(a) for a in actions] == [CallConfirmed, Send, CallEnded]
    assert one_sent(actions).method == "BYE"


def test_hang_up_before_the_answer_refuses_the_call_with_480() -> None:
    uas = make_uas()
    offered(uas)
    actions = uas.hang_up(CALL_ID, 10)
    response = one_sent(actions)
    assert response.status == 480 and response.to_tag == "id1"
    assert of_type(actions, CallEnded)
    assert uas.hang_up(CALL_ID, 20) == []


def test_reject_sends_the_status_with_a_reason() -> None:
    """Section 13.3.1.3: a final non-2xx refusing the call, retransmitted until its ACK."""
    uas = make_uas()
    offered(uas)
    actions = uas.reject(CALL_ID, 486, 0, "agent is busy")
    busy = one_sent(actions)
    assert busy.status == 486 and busy.to_tag == "id1"
    assert 'text="agent is busy"' in (busy.get("reason") or "")
    assert of_type(actions, CallEnded) == [CallEnded(CALL_ID, "agent is busy")]
    assert [t for t, _ in drive(uas, 1000)] == [500]


# ---- the delayed offer (RFC 3264 section 5, RFC 3261 section 13.3.1.1) ----------------------


def test_an_invite_without_sdp_gets_our_offer_in_the_200_and_the_answer_in_the_ack() -> None:
    """Section 13.3.1.4: without an offer in the INVITE the 2xx carries ours; the ACK carries
    the answer, and the call's codec is the answer's."""
    uas = make_uas()
    incoming = offered(uas, invite(body=b""))
    assert incoming.negotiated is None
    ok = one_sent(uas.accept(CALL_ID, MEDIA_HOST, MEDIA_PORT, 0))
    our_offer = body_of(ok)
    (audio,) = our_offer.streams
    assert audio.port == MEDIA_PORT and audio.connection == MEDIA_HOST
    assert [(c.payload_type, c.name) for c in audio.codecs] == [
        (0, "PCMU"),
        (8, "PCMA"),
        (101, "TELEPHONE-EVENT"),
    ]
    assert ok.to_tag is not None
    answer = offer("8 101", rtpmaps=("8 PCMA/8000", "101 telephone-event/8000"))
    (event,) = uas.datagram(ack(ok.to_tag, body=answer), CALLER, 50)
    assert isinstance(event, CallConfirmed)
    assert event.negotiated.codec.name == "PCMA"
    assert event.negotiated.remote_port == 30000


def test_an_ack_without_the_answer_to_our_offer_ends_the_call_with_a_bye() -> None:
    """RFC 3264 section 5 / RFC 3261 13.2.2.4: the ACK must carry the answer; without one the
    session cannot start, so it is ended with a BYE."""
    uas = make_uas()
    offered(uas, invite(body=b""))
    ok = one_sent(uas.accept(CALL_ID, MEDIA_HOST, MEDIA_PORT, 0))
    assert ok.to_tag is not None
    actions = uas.datagram(ack(ok.to_tag), CALLER, 50)
    assert [m.method for m in sent(actions)] == ["BYE"]
    (ended,) = of_type(actions, CallEnded)
    assert ended.call_id == CALL_ID and "answer" in ended.reason
    assert not of_type(actions, CallConfirmed)


# ---- INVITEs refused ------------------------------------------------------------------------


def test_an_offer_of_only_g729_and_opus_gets_488_with_a_warning() -> None:
    """Section 21.4.26 / RFC 3264 section 6: no codec in common, 488 with a Warning (305)."""
    uas = make_uas()
    actions = uas.datagram(invite(body=G729_OPUS), CALLER, 0)
    response = one_sent(actions)
    assert response.status == 488 and response.to_tag is not None
    warnings = response.get_all("warning")
    assert any(w.startswith("305 ") for w in warnings)
    assert of_type(actions, Refused)[0].status == 488
    assert not of_type(actions, IncomingCall) and not uas.calls


def test_a_body_that_is_not_sdp_gets_415_with_accept() -> None:
    """Section 21.4.13 / 8.2.3: an unsupported body type gets 415 with an Accept header."""
    uas = make_uas()
    response = one_sent(uas.datagram(invite(body=b"hello", content_type="text/plain"), CALLER, 0))
    assert response.status == 415
    assert response.get("accept") == "application/sdp"
    assert not uas.calls


def test_an_unreadable_sdp_gets_400() -> None:
    """Section 21.4.1: a malformed request (its SDP) gets 400."""
    uas = make_uas()
    response = one_sent(uas.datagram(invite(body=b"this is not an SDP\r\n"), CALLER, 0))
    assert response.status == 400
    assert not uas.calls


def test_require_precondition_gets_420_with_unsupported() -> None:
    """Section 8.2.2.3: an option tag in Require we do not support gets 420 listing it in
    Unsupported."""
    uas = make_uas()
    actions = uas.datagram(invite(headers=[("Require", "precondition, timer")]), CALLER, 0)
    response = one_sent(actions)
    assert response.status == 420
    assert response.get("unsupported") == "precondition"
    assert not of_type(actions, IncomingCall)


def test_require_100rel_is_taken_and_no_180_is_sent() -> None:
    """RFC 3262: a caller that requires 100rel must get every provisional response but 100
    reliably; the server sends none (no 180 while ringing), so the call goes through."""
    uas = make_uas()
    actions = uas.datagram(invite(headers=[("Require", "100rel")]), CALLER, 0)
    assert statuses(actions) == [100]
    (call,) = of_type(actions, IncomingCall)
    assert uas.ringing(call.call_id) == []
    ok = one_sent(uas.accept(call.call_id, MEDIA_HOST, MEDIA_PORT, 10))
    assert ok.status == 200


def test_a_second_invite_of_a_call_id_on_another_branch_gets_482() -> None:
    """Section 8.2.2.2: a merged request (the same From tag, Call-ID and CSeq on another
    transaction, as a forking proxy's looped copy) gets 482 and no second call."""
    uas = make_uas()
    offered(uas)
    actions = uas.datagram(invite(branch="z9hG4bKlooped"), CALLER, 10)
    assert statuses(actions) == [482]
    assert not of_type(actions, IncomingCall)
    assert len(uas.calls) == 1


def test_past_max_calls_an_invite_gets_503() -> None:
    """Section 21.5.4: 503 with Retry-After when the server is at its limit of calls."""
    uas = make_uas(max_calls=1)
    offered(uas)
    actions = uas.datagram(invite(call_id="second@x", branch="z9hG4bK2"), CALLER, 10)
    response = one_sent(actions)
    assert response.status == 503 and response.get("retry-after") is not None
    assert not of_type(actions, IncomingCall)
    uas.datagram(request("CANCEL"), CALLER, 20)  # the first ends: there is room again
    assert of_type(
        uas.datagram(invite(call_id="third@x", branch="z9hG4bK3"), CALLER, 30), IncomingCall
    )


# ---- re-INVITE (sections 12.2.2, 14.2; RFC 3264 section 8) ----------------------------------


def test_a_re_invite_with_sendonly_puts_the_call_on_hold_and_sendrecv_resumes_it() -> None:
    """RFC 3264 section 8.4: a sendonly offer is hold, answered recvonly; sendrecv resumes.
    Section 14.2: the re-INVITE gets a 200 with our tag and the answer."""
    uas = make_uas()
    tag = confirmed(uas)
    actions = uas.datagram(reinvite(tag, offer(direction="sendonly", version=2)), CALLER, 1000)
    ok = one_sent(actions)
    assert ok.status == 200 and ok.cseq == (2, "INVITE") and ok.to_tag == tag
    assert body_of(ok).streams[0].direction == "recvonly"
    (changed,) = of_type(actions, MediaChanged)
    assert changed.call_id == CALL_ID and changed.negotiated.on_hold
    assert uas.datagram(ack(tag, cseq=2, branch="z9hG4bKack2"), CALLER, 1010) == []
    resumed = uas.datagram(
        reinvite(tag, offer(version=3), cseq=3, branch="z9hG4bKreinv3"), CALLER, 2000
    )
    assert body_of(one_sent(resumed)).streams[0].direction == "sendrecv"
    (changed,) = of_type(resumed, MediaChanged)
    assert not changed.negotiated.on_hold


def test_a_re_invite_keeps_the_law_in_use_if_offered_and_moves_to_the_other_if_not() -> None:
    """The call is in PCMU (the first of the caller's "0 8 101"). A re-offer of "8 0" (a hold,
    an SBC's new address) keeps PCMU: no switch mid-call for nothing; one of A-law only moves
    the call to PCMA, said in the answer and to the server (MediaChanged)."""
    uas = make_uas()
    tag = confirmed(uas)
    both = reinvite(tag, offer("8 0 101", version=2), cseq=2, branch="z9hG4bKre2")
    actions = uas.datagram(both, CALLER, 1000)
    assert body_of(one_sent(actions)).streams[0].codecs[0].name == "PCMU"
    (changed,) = of_type(actions, MediaChanged)
    assert changed.negotiated.codec.name == "PCMU"
    uas.datagram(ack(tag, cseq=2, branch="z9hG4bKack2"), CALLER, 1010)
    a_law = reinvite(tag, offer("8 101", version=3), cseq=3, branch="z9hG4bKre3")
    actions = uas.datagram(a_law, CALLER, 2000)
    assert body_of(one_sent(actions)).streams[0].codecs[0].name == "PCMA"
    (changed,) = of_type(actions, MediaChanged)
    assert changed.negotiated.codec.payload_type == 8


def test_a_retransmitted_re_invite_gets_the_same_200() -> None:
    uas = make_uas()
    tag = confirmed(uas)
    data = reinvite(tag, offer(direction="sendonly", version=2))
    first = of_type(uas.datagram(data, CALLER, 1000), Send)
    again = uas.datagram(data, CALLER, 1100)
    assert of_type(again, Send) == first and not of_type(again, MediaChanged)


def test_the_200_to_a_re_invite_is_retransmitted_until_its_ack() -> None:
    """Section 14.2 / 13.3.1.4: the 2xx to a re-INVITE is retransmitted like the first one."""
    uas = make_uas()
    tag = confirmed(uas)
    uas.datagram(reinvite(tag, offer(version=2)), CALLER, 1000)
    assert [t for t, _ in drive(uas, 2600)] == [1500, 2500]
    assert uas.datagram(ack(tag, cseq=2, branch="z9hG4bKack2"), CALLER, 2600) == []
    assert drive(uas, 10_000) == []


def test_a_re_invite_with_a_lower_cseq_gets_500() -> None:
    """Section 12.2.2: a request with a CSeq lower than the remote sequence number is out of
    order and MUST be rejected with 500."""
    uas = make_uas()
    tag = confirmed(uas, invite(cseq=5))
    actions = uas.datagram(reinvite(tag, offer(version=2), cseq=4), CALLER, 1000)
    response = one_sent(actions)
    assert response.status == 500 and response.to_tag == tag
    assert not of_type(actions, MediaChanged)


def test_a_re_invite_with_no_common_codec_gets_488_and_leaves_the_session() -> None:
    """Section 14.2: a re-INVITE the UAS refuses leaves the session as it was."""
    uas = make_uas()
    tag = confirmed(uas)
    before = uas.calls[CALL_ID].negotiated
    actions = uas.datagram(reinvite(tag, G729_OPUS), CALLER, 1000)
    response = one_sent(actions)
    assert response.status == 488 and response.to_tag == tag
    assert not of_type(actions, MediaChanged)
    assert uas.calls[CALL_ID].negotiated == before
    assert uas.calls[CALL_ID].state == "confirmed"
    again = uas.datagram(reinvite(tag, offer(version=2), cseq=3, branch="z9hG4bKr3"), CALLER, 2000)
    assert statuses(again) == [200]


def test_a_re_invite_for_an_unknown_dialog_gets_481() -> None:
    """Section 12.2.2 / 14.2: a request with a To tag matching no dialog gets 481."""
    uas = make_uas()
    confirmed(uas)
    assert statuses(uas.datagram(reinvite("bogus", offer(version=2)), CALLER, 100)) == [481]
    elsewhere = reinvite("id1", offer(version=2), call_id="other@x")
    assert statuses(uas.datagram(elsewhere, CALLER, 100)) == [481]


def test_a_re_invite_without_sdp_gets_our_offer_and_the_ack_changes_the_media() -> None:
    """RFC 3264 section 8 with RFC 3261 13.3.1.4: an offerless re-INVITE gets our offer in the
    200, and the answer in the ACK changes the media."""
    uas = make_uas()
    tag = confirmed(uas)
    ok = one_sent(uas.datagram(reinvite(tag, b""), CALLER, 1000))
    assert ok.status == 200 and len(body_of(ok).streams[0].codecs) == 3
    answer = offer("8 101", rtpmaps=("8 PCMA/8000", "101 telephone-event/8000"), version=2)
    (changed,) = uas.datagram(ack(tag, cseq=2, branch="z9hG4bKack2", body=answer), CALLER, 1010)
    assert isinstance(changed, MediaChanged) and changed.negotiated.codec.name == "PCMA"


# ---- INFO, OPTIONS and methods we do not take -----------------------------------------------


def test_info_with_dtmf_relay_gets_200_and_the_digit() -> None:
    """RFC 6086 INFO in the dialog; the application/dtmf-relay body as PBXes write it."""
    uas = make_uas()
    tag = confirmed(uas)
    data = request(
        "INFO",
        to_tag=tag,
        cseq=2,
        branch="z9hG4bKinfo2",
        body=b"Signal=5\r\nDuration=160\r\n",
        content_type="application/dtmf-relay",
    )
    actions = uas.datagram(data, CALLER, 1000)
    assert statuses(actions) == [200]
    assert of_type(actions, DtmfReceived) == [DtmfReceived(CALL_ID, "5")]
    again = uas.datagram(data, CALLER, 1200)  # a retransmission: the same 200, no second digit
    assert statuses(again) == [200] and not of_type(again, DtmfReceived)


def test_options_out_of_a_dialog_gets_200_with_allow() -> None:
    """Section 11.2: OPTIONS is answered as an INVITE would be, with Allow (and Accept)."""
    uas = make_uas()
    response = one_sent(uas.datagram(request("OPTIONS", branch="z9hG4bKopt"), CALLER, 0))
    assert response.status == 200 and response.to_tag is not None
    assert {m.strip() for m in (response.get("allow") or "").split(",")} == ALLOWED_METHODS
    assert response.get("accept") == "application/sdp"
    assert not uas.calls


def test_a_draining_server_answers_options_and_new_invites_with_503_and_keeps_its_calls() -> None:
    """A proxy's OPTIONS probe (Kamailio's dispatcher) reads 503 as "stop sending calls here";
    the call already confirmed goes on (its BYE still gets 200)."""
    uas = make_uas()
    to_tag = confirmed(uas)
    uas.draining = True
    probe = one_sent(
        uas.datagram(request("OPTIONS", call_id="probe-1", branch="z9hG4bKp1"), CALLER, 10)
    )
    assert probe.status == 503 and probe.get("retry-after") == "60"
    refused = uas.datagram(invite(call_id="second-call", branch="z9hG4bKinv2"), CALLER, 20)
    assert statuses(refused) == [503] and not of_type(refused, IncomingCall)
    assert "draining" in (one_sent(refused).get("warning") or "")
    assert statuses(uas.datagram(bye(to_tag), CALLER, 30)) == [200]
    uas.draining = False  # as a new run of the server would be
    assert (
        one_sent(
            uas.datagram(request("OPTIONS", call_id="probe-2", branch="z9hG4bKp2"), CALLER, 40)
        ).status
        == 200
    )


def test_register_gets_405_with_allow() -> None:
    """Section 8.2.1: a method the UAS knows but does not take gets 405 with Allow."""
    uas = make_uas()
    response = one_sent(uas.datagram(request("REGISTER", branch="z9hG4bKreg"), CALLER, 0))
    assert response.status == 405
    assert {m.strip() for m in (response.get("allow") or "").split(",")} == ALLOWED_METHODS


def test_an_unknown_method_gets_501() -> None:
    """Section 8.2.1 / 21.5.2: an unrecognised method gets 501."""
    uas = make_uas()
    assert statuses(uas.datagram(request("FOO", branch="z9hG4bKfoo"), CALLER, 0)) == [501]


@pytest.mark.parametrize("missing", ["call_id", "cseq"])
def test_a_request_missing_call_id_or_cseq_gets_400(missing: str) -> None:
    """Section 8.2 / 21.4.1: a request without a mandatory header (8.1.1) is malformed: 400,
    as the Via still says where the response goes."""
    uas = make_uas()
    actions = uas.datagram(invite(**{missing: None}), CALLER, 0)
    assert statuses(actions) == [400]
    assert of_type(actions, Refused)[0].status == 400
    assert not uas.calls


def test_a_cseq_whose_method_is_not_the_requests_gets_400() -> None:
    """Section 8.1.1.5: the CSeq method MUST match the request's."""
    uas = make_uas()
    assert statuses(uas.datagram(invite(cseq_method="BYE"), CALLER, 0)) == [400]


def test_a_request_without_a_via_is_dropped() -> None:
    """Section 18.2.2: with no Via there is nowhere to send a response."""
    uas = make_uas()
    data = invite().replace(b"Via: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bKinvite1\r\n", b"")
    actions = uas.datagram(data, CALLER, 0)
    assert of_type(actions, Send) == []
    assert [a.status for a in of_type(actions, Refused)] == [None]


def test_garbage_is_refused_without_an_answer() -> None:
    uas = make_uas()
    for data in (b"\x00\xff\xfe garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"SIP/2.0"):
        actions = uas.datagram(data, CALLER, 0)
        assert not of_type(actions, Send)
        assert [a.status for a in of_type(actions, Refused)] == [None]


def test_a_crlf_keep_alive_gets_nothing() -> None:
    """RFC 5626 section 3.5.1: CRLF keep-alives are read past without a word."""
    uas = make_uas()
    assert uas.datagram(b"\r\n\r\n", CALLER, 0) == []
    assert uas.datagram(b"\r\n", CALLER, 0) == []


def test_a_response_that_matches_nothing_is_dropped() -> None:
    """Sections 17.1.3 and 18.1.2: a response matching no client transaction is dropped."""
    uas = make_uas()
    stray = response_to(request("BYE", to_tag="x", branch="z9hG4bKnothing"), 200)
    actions = uas.datagram(stray, CALLER, 0)
    assert not of_type(actions, Send)
    assert [a.status for a in of_type(actions, Refused)] == [None]


def test_an_ack_for_nothing_is_absorbed() -> None:
    """Section 17.2.3 / 12.2.2: an ACK matching nothing is discarded, never answered."""
    uas = make_uas()
    assert not of_type(uas.datagram(ack("id1"), CALLER, 0), Send)


# ---- Via (section 18.2.1, 18.2.2; RFC 3581) -------------------------------------------------


def test_a_request_from_another_address_than_its_via_gets_received() -> None:
    """Section 18.2.1: received= with the source address when it differs from sent-by;
    18.2.2: without rport the response goes to that address at the Via's port."""
    uas = make_uas()
    actions = uas.datagram(invite(sent_by="10.0.0.1:5061"), ("192.0.2.10", 5099), 0)
    (send,) = of_type(actions, Send)
    via = parse_message(send.data).vias[0]
    assert via.params.get("received") == "192.0.2.10"
    assert "rport" not in via.params
    assert send.addr == ("192.0.2.10", 5061)


def test_a_via_without_a_port_gets_its_response_at_5060() -> None:
    """Section 18.2.2: the port of sent-by, 5060 by default for UDP."""
    uas = make_uas()
    (send,) = of_type(uas.datagram(invite(sent_by="10.0.0.1"), ("192.0.2.10", 5099), 0), Send)
    assert send.addr == ("192.0.2.10", 5060)


def test_rport_gets_the_source_port_and_the_response_goes_there() -> None:
    """RFC 3581 section 4: rport is filled with the source port and the response is sent to
    the source address and port (a caller behind NAT)."""
    uas = make_uas()
    actions = uas.datagram(invite(sent_by="10.0.0.1:5061", rport=True), ("192.0.2.10", 5099), 0)
    (send,) = of_type(actions, Send)
    via = parse_message(send.data).vias[0]
    assert via.params.get("rport") == "5099"
    assert via.params.get("received") == "192.0.2.10"
    assert send.addr == ("192.0.2.10", 5099)
    ok = of_type(uas.accept(CALL_ID, MEDIA_HOST, MEDIA_PORT, 10), Send)[0]
    assert ok.addr == ("192.0.2.10", 5099)
    assert parse_message(ok.data).vias[0].params.get("rport") == "5099"


def test_a_via_sent_by_hostname_gets_received() -> None:
    """Section 18.2.1: a domain name in sent-by always gets received=."""
    uas = make_uas()
    data = invite(sent_by="sbc.carrier.example:5061")
    (send,) = of_type(uas.datagram(data, ("203.0.113.7", 5061), 0), Send)
    assert parse_message(send.data).vias[0].params.get("received") == "203.0.113.7"
    assert send.addr == ("203.0.113.7", 5061)


def test_responses_copy_every_via_in_order() -> None:
    """Section 8.2.6.2: the Via values of the request, in order, in the response."""
    uas = make_uas()
    data = invite(headers=[("Via", "SIP/2.0/UDP proxy.example:5060;branch=z9hG4bKproxy")])
    response = one_sent(uas.datagram(data, CALLER, 0))
    assert [v.branch for v in response.vias] == ["z9hG4bKinvite1", "z9hG4bKproxy"]


# ---- stateless refusals (section 8.2.7) -----------------------------------------------------


def test_the_same_refused_request_twice_gets_the_same_to_tag() -> None:
    """Section 8.2.7: a stateless UAS MUST give a retransmitted request the same To tag."""
    uas = make_uas()
    first = one_sent(uas.datagram(invite(body=G729_OPUS), CALLER, 0))
    second = one_sent(uas.datagram(invite(body=G729_OPUS), CALLER, 500))
    assert first.status == second.status == 488
    assert first.to_tag is not None and first.to_tag == second.to_tag
    other = one_sent(uas.datagram(invite(body=G729_OPUS, call_id="other@x"), CALLER, 600))
    assert other.to_tag != first.to_tag


def test_a_flood_of_refused_invites_leaves_no_state() -> None:
    """Section 8.2.7: refusals are stateless, so 10,000 refused INVITEs keep no calls and a
    bounded cache of responses."""
    uas = make_uas(allowed_sources=parse_networks(["10.0.0.0/8"]))
    for n in range(10_000):
        data = invite(call_id=f"flood-{n}@scanner", branch=f"z9hG4bKflood{n}", body=G729_OPUS)
        source = ("10.1.2.3", 5061) if n % 2 else ("198.51.100.9", 5061)
        assert statuses(uas.datagram(data, source, n)) == [488 if n % 2 else 403]
    assert uas.calls == {}
    assert len(uas.responder.responses) <= uas.responder.responses.max_entries
    assert len(uas.responder.responses) == 0
    assert uas.next_deadline_ms() is None


def test_a_flood_of_options_keeps_the_cache_bounded() -> None:
    """Section 17.2.2: the non-INVITE transactions' responses are kept, within a bound."""
    uas = make_uas()
    for n in range(uas.responder.responses.max_entries + 500):
        uas.datagram(request("OPTIONS", call_id=f"o{n}", branch=f"z9hG4bKo{n}"), CALLER, 0)
    assert len(uas.responder.responses) == uas.responder.responses.max_entries
    uas.tick(TIMEOUT_MS)
    assert len(uas.responder.responses) == 0


# ---- allowed sources ------------------------------------------------------------------------


def test_an_invite_from_a_network_not_allowed_gets_403() -> None:
    """Section 21.4.4: 403 for a caller the server will not serve; no call is offered."""
    uas = make_uas(allowed_sources=parse_networks(["10.0.0.0/8", "127.0.0.1"]))
    actions = uas.datagram(invite(), ("198.51.100.9", 5061), 0)
    assert statuses(actions) == [403]
    assert not of_type(actions, IncomingCall) and not uas.calls
    assert of_type(uas.datagram(invite(call_id="ok@x"), CALLER, 0), IncomingCall)


# ---- digest authentication (section 22.4, RFC 8760) -----------------------------------------

REALM = "voice-agent"


def auth_uas(**overrides: Any) -> UserAgentServer:
    return make_uas(authenticator=DigestAuthenticator(REALM, {"alice": "secret"}), **overrides)


def challenges(response: SipMessage) -> list[dict[str, str]]:
    values = response.get_all("www-authenticate")
    parsed = [parse_digest(value) for value in values]
    assert all(p is not None for p in parsed), values
    return [p for p in parsed if p is not None]


def authorized_invite(
    nonce: str,
    *,
    algorithm: str,
    password: str = "secret",
    cseq: int = 2,
    branch: str = "z9hG4bKauth2",
    header: str = "Authorization",
    call_id: str = CALL_ID,
) -> bytes:
    uri = "sip:agent@127.0.0.1:5060"
    challenge = f'Digest realm="{REALM}", nonce="{nonce}", algorithm={algorithm}, qop="auth"'
    credentials = digest_authorization(
        challenge,
        method="INVITE",
        uri=uri,
        credentials=Credentials("alice", password),
        cnonce="0a4f113b",
    )
    assert credentials is not None
    return invite(
        cseq=cseq, branch=branch, uri=uri, headers=[(header, credentials)], call_id=call_id
    )


def test_an_invite_without_credentials_gets_401_with_a_challenge_per_algorithm() -> None:
    """Section 22.4 / 8.2.6: 401 with WWW-Authenticate; RFC 8760 section 2.4: one challenge
    per algorithm, in the server's order of preference (auth.OFFERED by default)."""
    uas = auth_uas()
    actions = uas.datagram(invite(), CALLER, 0)
    response = one_sent(actions)
    assert response.status == 401 and response.to_tag is not None
    offered_ = challenges(response)
    assert [c["algorithm"] for c in offered_] == list(OFFERED)
    assert set(OFFERED) == {"SHA-256", "MD5"}
    assert all(c["realm"] == REALM and c["qop"] == "auth" and c["nonce"] for c in offered_)
    assert not of_type(actions, IncomingCall) and not uas.calls


def test_a_server_preferring_sha256_challenges_with_it_first() -> None:
    """RFC 8760 section 2.4: the most preferred algorithm's challenge comes first."""
    authenticator = DigestAuthenticator(REALM, {"alice": "secret"}, algorithms=("SHA-256", "MD5"))
    uas = make_uas(authenticator=authenticator)
    response = one_sent(uas.datagram(invite(), CALLER, 0))
    assert response.status == 401
    assert [c["algorithm"] for c in challenges(response)] == ["SHA-256", "MD5"]


@pytest.mark.parametrize("algorithm", ["SHA-256", "MD5"])
def test_the_retry_with_the_right_password_is_offered_as_a_call(algorithm: str) -> None:
    """Section 22.2: the client retries with credentials for the challenge (a new CSeq, a new
    branch); the server checks them and the call proceeds: 100 and IncomingCall."""
    uas = auth_uas()
    nonce = challenges(one_sent(uas.datagram(invite(), CALLER, 0)))[0]["nonce"]
    actions = uas.datagram(authorized_invite(nonce, algorithm=algorithm), CALLER, 200)
    assert statuses(actions) == [100]
    (incoming,) = of_type(actions, IncomingCall)
    assert incoming.username == "alice"


def test_a_wrong_password_gets_401_again() -> None:
    uas = auth_uas()
    nonce = challenges(one_sent(uas.datagram(invite(), CALLER, 0)))[0]["nonce"]
    actions = uas.datagram(authorized_invite(nonce, algorithm="MD5", password="guess"), CALLER, 1)
    assert statuses(actions) == [401]
    assert not of_type(actions, IncomingCall)
    assert "stale" not in challenges(one_sent(actions))[0]


def test_too_many_wrong_passwords_from_one_address_are_dropped_for_a_minute() -> None:
    """The failure limiter (voice_agent.sip.guard): past max_auth_failures_per_minute wrong
    tries, the address's INVITEs are dropped unanswered until its minute is over."""
    uas = auth_uas(max_auth_failures_per_minute=3)
    nonce = challenges(one_sent(uas.datagram(invite(), CALLER, 0)))[0]["nonce"]
    for n in range(3):
        wrong = authorized_invite(
            nonce, algorithm="MD5", password=f"guess{n}", cseq=2 + n, branch=f"z9hG4bKg{n}"
        )
        assert statuses(uas.datagram(wrong, CALLER, 100 + n)) == [401]
    right = authorized_invite(nonce, algorithm="SHA-256", cseq=9, branch="z9hG4bKright")
    dropped = uas.datagram(right, CALLER, 1000)
    assert not of_type(dropped, Send)
    assert [a.status for a in of_type(dropped, Refused)] == [None]
    other_host = ("127.0.0.2", 5061)
    assert statuses(uas.datagram(invite(call_id="x@y"), other_host, 1000)) == [401]
    assert not of_type(uas.datagram(right, CALLER, 100 + WINDOW_MS - 1), Send)
    later = uas.datagram(right, CALLER, 100 + WINDOW_MS)
    assert statuses(later) == [100] and of_type(later, IncomingCall)


def test_a_nonce_older_than_five_minutes_gets_401_with_stale() -> None:
    """RFC 7616 section 3.3 / RFC 2617 3.2.1: the right password with an expired nonce gets a
    fresh challenge with stale=true, and it does not count as a failure."""
    uas = auth_uas(max_auth_failures_per_minute=1)
    nonce = challenges(one_sent(uas.datagram(invite(), CALLER, 0)))[0]["nonce"]
    late = NONCE_LIFETIME_MS + 1000
    response = one_sent(uas.datagram(authorized_invite(nonce, algorithm="SHA-256"), CALLER, late))
    assert response.status == 401
    fresh = challenges(response)
    assert all(c.get("stale") == "true" for c in fresh)
    assert fresh[0]["nonce"] != nonce
    retry = authorized_invite(fresh[0]["nonce"], algorithm="SHA-256", cseq=3, branch="z9hG4bK3")
    assert of_type(uas.datagram(retry, CALLER, late + 10), IncomingCall)


# ---- ended calls are forgotten --------------------------------------------------------------


def test_an_ended_call_is_forgotten_32_seconds_after_its_bye() -> None:
    """Section 17.2.2 (timer J) and 17.2.1 (timer H): an ended call is kept 64*T1 to absorb
    retransmissions, then nothing remains and nothing is scheduled."""
    uas = make_uas()
    tag = confirmed(uas)
    uas.datagram(bye(tag), CALLER, 1000)
    assert uas.next_deadline_ms() == 1000 + TIMEOUT_MS
    assert drive(uas, 1000 + TIMEOUT_MS) == []
    assert uas.calls == {}
    assert uas.next_deadline_ms() is None
    assert len(uas.responder.responses) == 0


def test_a_call_we_hung_up_is_forgotten_after_its_bye_is_answered() -> None:
    uas = make_uas()
    confirmed(uas)
    (send,) = of_type(uas.hang_up(CALL_ID, 1000), Send)
    uas.datagram(response_to(send.data, 200), CALLER, 1100)
    drive(uas, 1000 + TIMEOUT_MS)
    assert uas.calls == {} and uas.next_deadline_ms() is None


def test_a_bye_that_is_never_answered_gives_up_after_32_seconds() -> None:
    """Section 17.1.2.2: timer F, 64*T1, ends the BYE's transaction."""
    uas = make_uas()
    confirmed(uas)
    uas.hang_up(CALL_ID, 0)
    done = drive(uas, TIMEOUT_MS)
    assert [t for t, _ in done] == [500, 1500, 3500, 7500, 11500, 15500, 19500, 23500, 27500, 31500]
    assert uas.calls == {} and uas.next_deadline_ms() is None


def test_a_cancelled_call_is_forgotten_after_32_seconds() -> None:
    uas = make_uas()
    offered(uas)
    uas.datagram(request("CANCEL"), CALLER, 0)
    drive(uas, TIMEOUT_MS)
    assert uas.calls == {} and uas.next_deadline_ms() is None


# ---- what reads as a bug: each cites what it contradicts ------------------------------------


def test_rport_always_gets_received_too() -> None:
    uas = make_uas()
    (send,) = of_type(uas.datagram(invite(rport=True), CALLER, 0), Send)
    via = parse_message(send.data).vias[0]
    assert via.params.get("rport") == "5061"
    assert via.params.get("received") == "127.0.0.1"


def test_an_info_with_a_lower_cseq_gets_500() -> None:
    uas = make_uas()
    tag = confirmed(uas, invite(cseq=10))
    data = request(
        "INFO",
        to_tag=tag,
        cseq=3,
        branch="z9hG4bKinfo3",
        body=b"Signal=5\r\nDuration=160\r\n",
        content_type="application/dtmf-relay",
    )
    actions = uas.datagram(data, CALLER, 1000)
    assert statuses(actions) == [500]
    assert not of_type(actions, DtmfReceived)


def test_a_re_invite_older_than_an_info_gets_500() -> None:
    uas = make_uas()
    tag = confirmed(uas)
    info = request(
        "INFO",
        to_tag=tag,
        cseq=20,
        branch="z9hG4bKinfo20",
        body=b"5",
        content_type="application/dtmf",
    )
    assert statuses(uas.datagram(info, CALLER, 1000)) == [200]
    assert statuses(uas.datagram(reinvite(tag, offer(version=2), cseq=15), CALLER, 2000)) == [500]


@pytest.mark.parametrize("method", ["OPTIONS", "re-INVITE", "INFO"])
def test_require_we_lack_gets_420_on_every_request(method: str) -> None:
    uas = make_uas()
    tag = confirmed(uas)
    require = [("Require", "precondition")]
    if method == "OPTIONS":
        data = request("OPTIONS", branch="z9hG4bKopt", call_id="o@x", headers=require)
    elif method == "INFO":
        data = request("INFO", to_tag=tag, cseq=2, branch="z9hG4bKi", headers=require)
    else:
        data = reinvite(tag, offer(version=2), headers=require)
    assert statuses(uas.datagram(data, CALLER, 1000)) == [420]


def test_an_empty_call_id_gets_400() -> None:
    uas = make_uas()
    actions = uas.datagram(invite(call_id=""), CALLER, 0)
    assert statuses(actions) == [400]
    assert not uas.calls


def test_wrong_passwords_in_proxy_authorization_are_limited_too() -> None:
    uas = auth_uas(max_auth_failures_per_minute=3)
    nonce = challenges(one_sent(uas.datagram(invite(), CALLER, 0)))[0]["nonce"]
    for n in range(3):
        wrong = authorized_invite(
            nonce,
            algorithm="MD5",
            password=f"guess{n}",
            cseq=2 + n,
            branch=f"z9hG4bKp{n}",
            header="Proxy-Authorization",
        )
        assert statuses(uas.datagram(wrong, CALLER, 100 + n)) == [401]
    again = authorized_invite(
        nonce,
        algorithm="MD5",
        password="guess9",
        cseq=9,
        branch="z9hG4bKp9",
        header="Proxy-Authorization",
    )
    assert not of_type(uas.datagram(again, CALLER, 200), Send)


def test_an_ack_with_another_to_tag_does_not_confirm_the_call() -> None:
    uas = make_uas()
    answered(uas)
    assert uas.datagram(ack("somebody-else"), CALLER, 100) == []
    assert uas.calls[CALL_ID].state == "answered"


def test_the_488_to_a_re_invite_is_retransmitted_until_its_ack() -> None:
    uas = make_uas()
    tag = confirmed(uas)
    uas.datagram(reinvite(tag, G729_OPUS), CALLER, 1000)
    assert [t for t, _ in drive(uas, 1500)] == [1500]


# ---- no datagram breaks the server (property) -----------------------------------------------


def _bye_response(status: str) -> bytes:
    """The caller's answer to the BYE the server sends first (its branch is id2 when the
    first call's To tag is id1)."""
    return (
        f"SIP/2.0 {status}\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKid2;rport\r\n"
        f"From: <sip:agent@127.0.0.1>;tag=id1\r\nTo: <sip:a@x>;tag={FROM_TAG}\r\n"
        f"Call-ID: {CALL_ID}\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n"
    ).encode()


# A call from start to end as the caller and the server would take it (the first call's To
# tag is id1 with make_uas), and a second call that is cancelled. Each example keeps some of
# its steps, mutates some, and puts noise between them.
SCRIPT: list[bytes | str] = [
    invite(),
    invite(),  # a retransmission
    "ringing",
    "accept",
    ack("id1"),
    reinvite("id1", offer(direction="sendonly", version=2)),
    ack("id1", cseq=2, branch="z9hG4bKack2"),
    reinvite("id1", offer(version=3), cseq=3, branch="z9hG4bKre3"),
    "tick",
    ack("id1", cseq=3, branch="z9hG4bKack3"),
    reinvite("id1", b"", cseq=4, branch="z9hG4bKre4"),
    ack("id1", cseq=4, branch="z9hG4bKack4", body=offer("8", rtpmaps=("8 PCMA/8000",))),
    request(
        "INFO",
        to_tag="id1",
        cseq=5,
        branch="z9hG4bKinfo",
        body=b"Signal=#\r\n",
        content_type="application/dtmf-relay",
    ),
    reinvite("id1", G729_OPUS, cseq=6, branch="z9hG4bKre6"),
    invite(call_id="second@x", branch="z9hG4bKsecond", body=b""),
    request("CANCEL", call_id="second@x", branch="z9hG4bKsecond"),
    request("ACK", call_id="second@x", branch="z9hG4bKsecond", to_tag="id3"),
    "hang_up",
    _bye_response("100 Trying"),
    _bye_response("200 OK"),
    bye("id1", cseq=7),
]
# Everything else a server meets: each method in and out of the dialog, refusals, responses.
OTHERS: list[bytes] = [
    invite(body=b""),
    invite(body=G729_OPUS, call_id="third@x", branch="z9hG4bKthird"),
    invite(body=b"hello", content_type="text/plain", call_id="t@x", branch="z9hG4bKt"),
    invite(headers=[("Require", "100rel")], call_id="r@x", branch="z9hG4bKr"),
    invite(branch="z9hG4bKlooped"),
    invite(call_id="rp@x", branch="z9hG4bKrp", rport=True, sent_by="10.0.0.1"),
    request("ACK", branch="z9hG4bKinvite1", to_tag="id1"),
    request("CANCEL"),
    bye("id1"),
    bye("nobody", branch="z9hG4bKb2"),
    bye("id1", call_id="second@x"),
    reinvite("id1", offer(version=9), cseq=1, branch="z9hG4bKold"),
    request("OPTIONS", branch="z9hG4bKopt"),
    request("OPTIONS", branch="z9hG4bKopt2", to_tag="id1"),
    request("REGISTER", branch="z9hG4bKreg"),
    request("SUBSCRIBE", branch="z9hG4bKsub"),
    request("FOO", branch="z9hG4bKfoo"),
    request(
        "INFO", to_tag="id1", cseq=8, branch="z9hG4bKi8", body=b"7", content_type="application/dtmf"
    ),
    _bye_response("481 Call/Transaction Does Not Exist"),
    b"\r\n\r\n",
]
OPERATIONS = ("ringing", "accept", "reject", "hang_up", "tick")
Step = tuple[bytes | str, float, tuple[str, int]]


@st.composite
def _mutated(draw: st.DrawFn, base: bytes) -> bytes:
    how = draw(st.sampled_from(["as is"] * 4 + ["truncate", "flip", "drop line", "splice"]))
    if how == "as is" or not base:
        return base
    if how == "truncate":
        return base[: draw(st.integers(0, len(base)))]
    if how == "flip":
        data = bytearray(base)
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if how == "drop line":
        lines = base.split(b"\r\n")
        del lines[draw(st.integers(0, len(lines) - 1))]
        return b"\r\n".join(lines)
    at = draw(st.integers(0, len(base)))
    return base[:at] + draw(st.binary(max_size=40)) + base[at:]


_noise: st.SearchStrategy[bytes | str] = st.one_of(
    st.sampled_from(OTHERS).flatmap(_mutated),
    st.sampled_from(SCRIPT),
    st.sampled_from(OPERATIONS),
    st.binary(max_size=300),
)
_advance = st.one_of(
    st.sampled_from([0.0, 10.0, T1_MS, 1000.0, T2_MS, TIMEOUT_MS + 1]),
    st.floats(min_value=0, max_value=40_000, allow_nan=False),
)
_source = st.sampled_from([CALLER, CALLER, ("198.51.100.9", 40000)])


@st.composite
def _steps(draw: st.DrawFn) -> list[Step]:
    steps: list[Step] = []
    for scripted in SCRIPT:
        for extra in draw(st.lists(_noise, max_size=2)):
            steps.append((extra, draw(_advance), draw(_source)))
        if draw(st.integers(0, 9)) == 0:
            continue  # this step is lost
        step = draw(_mutated(scripted)) if isinstance(scripted, bytes) else scripted
        steps.append((step, draw(st.sampled_from([0.0, 10.0, 100.0])), CALLER))
    return steps


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_steps())
def test_no_sequence_of_datagrams_breaks_the_server(steps: list[Step]) -> None:
    """Whatever arrives (a call's requests, mutated, lost or out of place, among requests of
    every method, responses and random bytes), whatever the server decides meanwhile, as the
    clock runs: no exception, every datagram sent parses, no deadline in the past, never more
    calls than INVITEs taken, and once every timer has run only live calls remain."""
    uas = make_uas(max_calls=2)
    now = 0.0
    incoming: list[str] = []
    for step, advance, source in steps:
        now += advance
        if isinstance(step, bytes):
            actions = uas.datagram(step, source, now)
        elif step == "tick":
            actions = uas.tick(now)
        else:
            actions = []
            for call_id in incoming:
                if step == "ringing":
                    actions += uas.ringing(call_id)
                elif step == "accept":
                    actions += uas.accept(call_id, MEDIA_HOST, MEDIA_PORT, now)
                elif step == "reject":
                    actions += uas.reject(call_id, 486, now)
                else:
                    actions += uas.hang_up(call_id, now)
        actions += uas.tick(now)
        incoming += [a.call_id for a in of_type(actions, IncomingCall)]
        sent(actions)
        assert len(uas.calls) <= len(incoming)
        assert uas.live_calls <= uas.settings.max_calls
        deadline = uas.next_deadline_ms()
        assert deadline is None or deadline > now
    # A 2xx never ACKed ends at 32 s, its BYE is given up 32 s later: 64 s, and a hair more
    # for the float sums of the clock (hypothesis found one that landed just past it).
    drive(uas, now + 2 * TIMEOUT_MS + 1)
    assert all(c.state in ("offered", "confirmed") for c in uas.calls.values())


# ---- transfer: REFER and its NOTIFYs (RFC 3515) ---------------------------------------------


def notify(
    to_tag: str, frag: bytes, *, cseq: int, state: str = "active;expires=60", event: str = "refer"
) -> bytes:
    return request(
        "NOTIFY",
        to_tag=to_tag,
        cseq=cseq,
        branch=f"z9hG4bKnotify{cseq}",
        body=frag,
        content_type="message/sipfrag;version=2.0",
        headers=[("Event", event), ("Subscription-State", state)],
    )


def test_transfer_sends_a_refer_in_the_dialog_and_reports_its_notifies() -> None:
    uas = make_uas()
    tag = confirmed(uas)
    refer = one_sent(uas.transfer(CALL_ID, "sip:desk@192.0.2.10", 100))
    assert refer.method == "REFER" and refer.uri == "sip:+14155550100@127.0.0.1:5061"
    assert refer.get("refer-to") == "<sip:desk@192.0.2.10>"
    assert refer.to_tag == FROM_TAG and refer.from_tag == tag and refer.cseq == (2, "REFER")
    assert refer.get("referred-by") == "<sip:agent@127.0.0.1>"
    # Retransmitted like any request of ours until answered; a 202 ends that.
    resent = [a for _, a in drive(uas, 700) if isinstance(a, Send)]
    assert [parse_message(s.data).method for s in resent] == ["REFER"]
    assert of_type(uas.datagram(response_to(resent[0].data, 202), CALLER, 800), TransferAccepted)
    assert not [a for _, a in drive(uas, 5000) if isinstance(a, Send)]
    trying = uas.datagram(notify(tag, b"SIP/2.0 100 Trying\r\n", cseq=2), CALLER, 900)
    assert statuses(trying) == [200]
    assert of_type(trying, TransferProgress) == [TransferProgress(CALL_ID, 100, "Trying", False)]
    done = uas.datagram(
        notify(tag, b"SIP/2.0 200 OK\r\n", cseq=3, state="terminated;reason=noresource"),
        CALLER,
        5000,
    )
    assert statuses(done) == [200]
    assert of_type(done, TransferProgress) == [TransferProgress(CALL_ID, 200, "OK", True)]


def test_a_refused_or_unanswered_refer_is_a_failed_transfer_and_the_call_goes_on() -> None:
    uas = make_uas()
    confirmed(uas)
    refer = uas.transfer(CALL_ID, "sip:desk@192.0.2.10", 100)
    (data,) = [s.data for s in of_type(refer, Send)]
    failed = uas.datagram(response_to(data, 603), CALLER, 200)
    assert of_type(failed, TransferFailed) == [TransferFailed(CALL_ID, 603, "Decline")]
    assert uas.calls[CALL_ID].state == "confirmed"
    uas.transfer(CALL_ID, "sip:desk@192.0.2.10", 300)
    timed_out = [a for _, a in drive(uas, 100_000) if isinstance(a, TransferFailed)]
    assert timed_out == [TransferFailed(CALL_ID, 408, "no answer to the REFER")]
    assert uas.calls[CALL_ID].state == "confirmed"


def test_a_notify_without_a_refer_or_of_another_event_gets_481() -> None:
    uas = make_uas()
    tag = confirmed(uas)
    assert statuses(uas.datagram(notify(tag, b"SIP/2.0 200 OK", cseq=2), CALLER, 100)) == [481]
    uas.transfer(CALL_ID, "sip:desk@192.0.2.10", 200)
    other = notify(tag, b"SIP/2.0 200 OK", cseq=3, event="dialog")
    assert statuses(uas.datagram(other, CALLER, 300)) == [481]


def test_a_transfer_before_the_call_is_up_fails_at_once() -> None:
    uas = make_uas()
    offered(uas)
    assert uas.transfer(CALL_ID, "sip:desk@192.0.2.10", 0) == [
        TransferFailed(CALL_ID, 481, "the call is not established")
    ]


# ---- over a connection (TCP, TLS) ------------------------------------------------------------

# A caller on a connection: its requests say so in Via, and the I/O layer knows the connection
# by the peer's address, an ephemeral port unlike the one in Via.
CONNECTION: tuple[str, int] = ("127.0.0.1", 47001)


def test_over_tcp_responses_go_back_on_the_connection_and_contact_names_the_transport() -> None:
    uas = make_uas(stream_ports={"TCP": 5062, "TLS": 5063})
    actions = uas.datagram(invite(transport="TCP"), CONNECTION, 0.0)
    (trying,) = of_type(actions, Send)
    assert trying.addr == CONNECTION  # not Via's 127.0.0.1:5061, which nobody listens on
    (incoming,) = of_type(actions, IncomingCall)
    (ok,) = of_type(uas.accept(incoming.call_id, MEDIA_HOST, MEDIA_PORT, 0.0), Send)
    assert ok.addr == CONNECTION
    assert parse_message(ok.data).get("contact") == "<sip:127.0.0.1:5062;transport=tcp>"


def test_a_sips_request_uri_over_tls_gets_a_sips_contact() -> None:
    """Section 12.1.1: a dialog made by a SIPS Request-URI has a SIPS Contact."""
    uas = make_uas(stream_ports={"TLS": 5063})
    data = invite(transport="TLS", uri="sips:agent@127.0.0.1:5063")
    incoming = offered(uas, data, source=CONNECTION)
    ok = one_sent(uas.accept(incoming.call_id, MEDIA_HOST, MEDIA_PORT, 0.0))
    assert ok.get("contact") == "<sips:127.0.0.1:5063>"
    plain = make_uas(stream_ports={"TLS": 5063})
    incoming = offered(plain, invite(transport="TLS"), source=CONNECTION)
    ok = one_sent(plain.accept(incoming.call_id, MEDIA_HOST, MEDIA_PORT, 0.0))
    assert ok.get("contact") == "<sip:127.0.0.1:5063;transport=tls>"


def test_the_agents_bye_over_tcp_goes_on_the_connection_once_and_times_out_unanswered() -> None:
    """Our BYE in a dialog made over TCP: Via says TCP with our TCP port, it goes to the
    connection (not to the Contact's address), and it is not sent again (17.1.2.2: no timer E
    on a reliable transport); unanswered, the call is still over at timer F."""
    uas = make_uas(stream_ports={"TCP": 5062})
    incoming = offered(uas, invite(transport="TCP"), source=CONNECTION)
    (ok,) = of_type(uas.accept(incoming.call_id, MEDIA_HOST, MEDIA_PORT, 0.0), Send)
    tag = parse_message(ok.data).to_tag
    assert tag is not None
    confirm = request("ACK", to_tag=tag, branch="z9hG4bKack1", transport="TCP")
    assert of_type(uas.datagram(confirm, CONNECTION, 10.0), CallConfirmed)
    actions = uas.hang_up(incoming.call_id, 1000.0)
    (bye_sent,) = of_type(actions, Send)
    assert bye_sent.addr == CONNECTION
    via = parse_message(bye_sent.data).vias[0]
    assert (via.transport, via.sent_by) == ("TCP", "127.0.0.1:5062")
    later = drive(uas, 1000.0 + TIMEOUT_MS + 1)
    assert not [a for _, a in later if isinstance(a, Send)]


def test_a_refusal_over_tcp_is_not_sent_again_while_its_ack_is_awaited() -> None:
    """Timer G is not set on a reliable transport (17.2.1): one 486, then only its ACK."""
    uas = make_uas()
    incoming = offered(uas, invite(transport="TCP"), 0.0, source=CONNECTION)
    (busy,) = of_type(uas.reject(incoming.call_id, 486, 0.0), Send)
    assert busy.addr == CONNECTION
    assert not [a for _, a in drive(uas, TIMEOUT_MS + 1) if isinstance(a, Send)]
    over_udp = make_uas()
    incoming = offered(over_udp, invite(), 0.0)
    over_udp.reject(incoming.call_id, 486, 0.0)
    assert [a for _, a in drive(over_udp, 2 * T1_MS) if isinstance(a, Send)]  # UDP: again


def test_an_invite_whose_contact_no_request_can_be_sent_to_is_refused() -> None:
    """Our BYE and REFER go to the Contact (section 12.1.1): one with a blank or a control
    byte in it, or not a SIP URI, would make a request line nobody can read. Found by the
    property test above."""
    for contact in ("<\tip:+14155550100@127.0.0.1:5061>", "<tel:+14155550100>", "<sip:a b@c>"):
        uas = make_uas()
        actions = uas.datagram(invite(contact=contact), CALLER, 0.0)
        assert statuses(actions) == [400] and not of_type(actions, IncomingCall), contact
        (refused,) = of_type(actions, Refused)
        assert "is not a sip: or sips: URI" in refused.reason

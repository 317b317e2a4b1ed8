"""Session timers (RFC 4028) and UPDATE (RFC 3311) at the SIP user agent server, sans-I/O on a
virtual clock: what interval and refresher the 2xx sets, the BYE when the caller's refresh
never comes (and not before), the caller's refreshes by UPDATE and re-INVITE, and the server's
own refresh when it is the refresher, with each answer it can get. The caller's side and the
readers come from tests/test_sip_uas.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests.test_sip_uas import (
    CALLER,
    FROM_TAG,
    MEDIA_HOST,
    MEDIA_PORT,
    ack,
    drive,
    invite,
    make_uas,
    of_type,
    offer,
    one_sent,
    reinvite,
    request,
    sent,
    statuses,
)
from voice_agent.sip.message import SipMessage, build_response, parse_message
from voice_agent.sip.sdp import parse_sdp
from voice_agent.sip.session_timer import TimerSettings
from voice_agent.sip.uas import (
    CallConfirmed,
    CallEnded,
    IncomingCall,
    MediaChanged,
    Send,
    UserAgentServer,
)

TIMER = ("Supported", "timer")
S = 1000  # ms


def call_with(
    uas: UserAgentServer, headers: list[tuple[str, str]], now_ms: float = 0.0
) -> tuple[str, SipMessage]:
    """A call set up with these INVITE headers, answered and acknowledged: our tag, our 200."""
    actions = uas.datagram(invite(headers=headers), CALLER, now_ms)
    (incoming,) = of_type(actions, IncomingCall)
    ok = one_sent(uas.accept(incoming.call_id, MEDIA_HOST, MEDIA_PORT, now_ms))
    assert ok.status == 200
    tag = ok.to_tag
    assert tag is not None
    assert of_type(uas.datagram(ack(tag), CALLER, now_ms + 10), CallConfirmed)
    return tag, ok


def update(to_tag: str, *, cseq: int, body: bytes = b"", **kwargs: Any) -> bytes:
    return request(
        "UPDATE", to_tag=to_tag, cseq=cseq, branch=f"z9hG4bKupd{cseq}", body=body, **kwargs
    )


def ended(done: Sequence[tuple[float, object]]) -> list[tuple[float, str]]:
    return [(at, action.reason) for at, action in done if isinstance(action, CallEnded)]


def byes(done: Sequence[tuple[float, object]]) -> list[float]:
    """When each BYE was first sent (its retransmissions left out)."""
    return [at for at, _ in requests_sent(done, "BYE")]


def requests_sent(
    done: Sequence[tuple[float, object]], method: str
) -> list[tuple[float, SipMessage]]:
    """The requests of `method` the server sent, when each was first sent (not again)."""
    found: dict[int, tuple[float, SipMessage]] = {}
    for at, action in done:
        if isinstance(action, Send):
            message = parse_message(action.data)
            if message.method == method:
                found.setdefault(message.cseq[0], (at, message))
    return list(found.values())


def answer(
    data: bytes, status: int, headers: Sequence[tuple[str, str]] = (), body: bytes = b""
) -> bytes:
    """The caller's response to a request the server sent."""
    extra = list(headers)
    if body:
        extra.append(("Content-Type", "application/sdp"))
    return build_response(parse_message(data), status, to_tag=FROM_TAG, headers=extra, body=body)


# ---- the interval and the refresher our 2xx sets (section 9) --------------------------------


def test_a_caller_that_supports_timers_refreshes_at_the_interval_it_asked() -> None:
    uas = make_uas()
    _, ok = call_with(uas, [TIMER, ("Session-Expires", "600")])
    assert ok.get("session-expires") == "600;refresher=uac"
    assert ok.get("require") == "timer"  # a uac refresher must be told (section 9)
    assert "timer" in (ok.get("supported") or "")


def test_a_caller_naming_itself_or_us_as_refresher_is_taken_at_its_word() -> None:
    uas = make_uas()
    _, ok = call_with(uas, [TIMER, ("Session-Expires", "600;refresher=uas")])
    assert ok.get("session-expires") == "600;refresher=uas"
    assert ok.get("require") is None


def test_a_caller_that_supports_timers_but_asks_none_gets_the_default_interval() -> None:
    uas = make_uas()
    _, ok = call_with(uas, [TIMER])
    assert ok.get("session-expires") == "1800;refresher=uac"


def test_a_caller_without_timers_gets_none_and_its_call_has_no_deadline() -> None:
    uas = make_uas()
    _, ok = call_with(uas, [])
    assert ok.get("session-expires") is None
    assert ok.get("require") is None
    assert uas.next_deadline_ms() is None


def test_an_interval_below_min_se_gets_422_naming_ours() -> None:
    uas = make_uas()
    actions = uas.datagram(invite(headers=[TIMER, ("Session-Expires", "60")]), CALLER, 0)
    response = one_sent(actions)
    assert response.status == 422
    assert response.get("min-se") == "90"
    assert not of_type(actions, IncomingCall)
    assert not uas.calls


def test_a_short_interval_a_proxy_added_is_raised_and_we_refresh() -> None:
    """Errata 1687: a caller that does not support timers cannot understand a 422; the
    interval is raised to our minimum, and the refresher must be us (section 9)."""
    uas = make_uas(timers=TimerSettings(min_se_s=120))
    _, ok = call_with(uas, [("Session-Expires", "60;refresher=uac")])
    assert ok.get("session-expires") == "120;refresher=uas"
    assert ok.get("require") is None


@pytest.mark.parametrize(
    "value", ["soon", "0", "-5", "1800;refresher=both", "99999999999999999999"]
)
def test_a_session_expires_that_does_not_read_gets_400(value: str) -> None:
    uas = make_uas()
    response = one_sent(uas.datagram(invite(headers=[("Session-Expires", value)]), CALLER, 0))
    assert response.status == 400
    assert "Session-Expires" in (response.get("warning") or "")


def test_options_says_timers_are_supported() -> None:
    uas = make_uas()
    ok = one_sent(uas.datagram(request("OPTIONS", call_id="o@x"), CALLER, 0))
    assert "timer" in (ok.get("supported") or "")
    assert "UPDATE" in (ok.get("allow") or "")


# ---- the caller refreshes; we watch (section 10) ------------------------------------------


def test_no_refresh_from_the_caller_ends_the_call_with_a_bye_before_the_interval() -> None:
    """The BYE goes at the interval less min(32 s, a third): 600 - 32 = 568 s after the 200."""
    uas = make_uas()
    call_with(uas, [TIMER, ("Session-Expires", "600")], now_ms=0)
    assert ended(drive(uas, 567 * S)) == []
    done = drive(uas, 569 * S)
    assert ended(done) == [(568 * S, "session expired: no refresh from the caller")]
    assert byes(done) == [568 * S]


def test_a_short_interval_ends_a_third_early() -> None:
    uas = make_uas()
    call_with(uas, [TIMER, ("Session-Expires", "90")], now_ms=0)
    assert ended(drive(uas, 59 * S)) == []
    assert [at for at, _ in ended(drive(uas, 61 * S))] == [60 * S]


def test_an_update_refresh_answered_200_starts_a_new_interval() -> None:
    uas = make_uas()
    tag, _ = call_with(uas, [TIMER, ("Session-Expires", "600")], now_ms=0)
    assert ended(drive(uas, 300 * S)) == []
    data = update(tag, cseq=2, headers=[TIMER, ("Session-Expires", "600;refresher=uac")])
    ok = one_sent(uas.datagram(data, CALLER, 300 * S))
    assert ok.status == 200
    assert ok.get("session-expires") == "600;refresher=uac"
    assert ok.get("require") == "timer"
    assert ok.body == b""  # no offer, no answer
    assert ended(drive(uas, 867 * S)) == []  # the first interval's end passed
    assert [at for at, _ in ended(drive(uas, 869 * S))] == [868 * S]


def test_a_retransmitted_update_gets_the_same_200_and_no_second_refresh() -> None:
    uas = make_uas()
    tag, _ = call_with(uas, [TIMER, ("Session-Expires", "600")], now_ms=0)
    data = update(tag, cseq=2, headers=[TIMER, ("Session-Expires", "600")])
    first = uas.datagram(data, CALLER, 300 * S)
    again = uas.datagram(data, CALLER, 300.5 * S)
    assert [a.data for a in of_type(again, Send)] == [a.data for a in of_type(first, Send)]


def test_a_reinvite_refresh_starts_a_new_interval_too() -> None:
    uas = make_uas()
    tag, _ = call_with(uas, [TIMER, ("Session-Expires", "600")], now_ms=0)
    data = reinvite(tag, offer(version=1), headers=[TIMER, ("Session-Expires", "600")])
    ok = one_sent(uas.datagram(data, CALLER, 400 * S))
    assert ok.get("session-expires") == "600;refresher=uac"
    uas.datagram(ack(tag, cseq=2, branch="z9hG4bKack2"), CALLER, 400 * S + 10)
    assert ended(drive(uas, 967 * S)) == []
    assert [at for at, _ in ended(drive(uas, 969 * S))] == [968 * S]


def test_a_refresh_may_not_shorten_below_min_se_and_leaves_the_session_running() -> None:
    uas = make_uas()
    tag, _ = call_with(uas, [TIMER, ("Session-Expires", "600")], now_ms=0)
    data = update(tag, cseq=2, headers=[TIMER, ("Session-Expires", "30")])
    refused = one_sent(uas.datagram(data, CALLER, 100 * S))
    assert refused.status == 422
    assert refused.get("min-se") == "90"
    assert [at for at, _ in ended(drive(uas, 569 * S))] == [568 * S]  # the old interval holds


def test_an_update_with_an_offer_is_answered_in_its_200_and_changes_the_media() -> None:
    uas = make_uas()
    tag, _ = call_with(uas, [TIMER])
    body = offer(version=2, direction="sendonly", port=30010)
    actions = uas.datagram(update(tag, cseq=2, body=body), CALLER, 1000)
    ok = one_sent(actions)
    assert ok.status == 200
    answer_sdp = parse_sdp(ok.body)
    assert answer_sdp.streams[0].port == MEDIA_PORT
    (changed,) = of_type(actions, MediaChanged)
    assert changed.negotiated.remote_port == 30010
    assert changed.negotiated.on_hold


def test_an_update_with_an_offer_we_cannot_take_gets_488_and_the_session_stands() -> None:
    uas = make_uas()
    tag, _ = call_with(uas, [])
    g729 = offer("18", rtpmaps=("18 G729/8000",), version=2)
    actions = uas.datagram(update(tag, cseq=2, body=g729), CALLER, 1000)
    assert statuses(actions) == [488]
    assert not of_type(actions, MediaChanged)
    assert not of_type(actions, CallEnded)


def test_an_update_outside_a_dialog_gets_481() -> None:
    uas = make_uas()
    assert statuses(uas.datagram(update("nosuchtag", cseq=2), CALLER, 0)) == [481]


# ---- we refresh (the caller does not support timers; a proxy asked for them) ---------------

PROXY_TIMER = [("Session-Expires", "120"), ("Allow", "INVITE, ACK, BYE, CANCEL, UPDATE")]


def test_we_refresh_by_update_at_half_the_interval_and_again_after_its_200() -> None:
    uas = make_uas()
    _, ok = call_with(uas, PROXY_TIMER, now_ms=0)
    assert ok.get("session-expires") == "120;refresher=uas"
    done = drive(uas, 60 * S)
    ((at, sent_update),) = requests_sent(done, "UPDATE")
    assert at == 60 * S
    assert sent_update.get("session-expires") == "120;refresher=uac"  # we are its uac
    assert sent_update.body == b""
    data = next(a.data for _, a in done if isinstance(a, Send))
    reply = answer(data, 200, [("Session-Expires", "120;refresher=uac"), ("Require", "timer")])
    assert uas.datagram(reply, CALLER, 60.1 * S) == []
    later = drive(uas, 121 * S)
    assert [at for at, _ in requests_sent(later, "UPDATE")] == [120.1 * S]
    assert ended(later) == []


def test_our_update_unanswered_ends_the_call_before_the_interval() -> None:
    """Over UDP our UPDATE is sent again (timer E); with no answer at all the session ends
    when its interval does (120 - 32 = 88 s), with a BYE."""
    uas = make_uas()
    call_with(uas, PROXY_TIMER, now_ms=0)
    done = drive(uas, 100 * S)
    updates = [a for _, a in done if isinstance(a, Send) and a.data.startswith(b"UPDATE")]
    assert len(updates) > 1 and len({u.data for u in updates}) == 1  # the same, sent again
    assert ended(done) == [(88 * S, "session expired: our refresh was not taken")]
    assert byes(done) == [88 * S]


def test_a_481_to_our_refresh_ends_the_call_at_once() -> None:
    uas = make_uas()
    call_with(uas, PROXY_TIMER, now_ms=0)
    data = next(a.data for _, a in drive(uas, 60 * S) if isinstance(a, Send))
    actions = uas.datagram(answer(data, 481), CALLER, 60.1 * S)
    assert [a.reason for a in of_type(actions, CallEnded)] == [
        "session expired: our refresh got 481"
    ]
    assert [m.method for m in sent(actions)] == ["BYE"]


def test_a_422_to_our_refresh_asks_again_with_the_longer_interval() -> None:
    uas = make_uas()
    call_with(uas, PROXY_TIMER, now_ms=0)
    data = next(a.data for _, a in drive(uas, 60 * S) if isinstance(a, Send))
    again = one_sent(uas.datagram(answer(data, 422, [("Min-SE", "300")]), CALLER, 60.1 * S))
    assert again.method == "UPDATE"
    assert again.get("session-expires") == "300;refresher=uac"
    assert again.cseq[0] == parse_message(data).cseq[0] + 1


def test_a_caller_refusing_update_is_refreshed_by_reinvite() -> None:
    uas = make_uas()
    call_with(uas, PROXY_TIMER, now_ms=0)
    data = next(a.data for _, a in drive(uas, 60 * S) if isinstance(a, Send))
    again = one_sent(uas.datagram(answer(data, 405), CALLER, 60.1 * S))
    assert again.method == "INVITE"


def test_without_update_we_refresh_by_reinvite_offering_the_same_session() -> None:
    """A caller whose Allow lacks UPDATE gets a re-INVITE with our last SDP, its version
    unchanged (RFC 3264 section 8: no change); its 200 is ACKed with the INVITE's CSeq and a
    retransmitted 200 gets the ACK again."""
    uas = make_uas()
    _, ok = call_with(uas, [("Session-Expires", "120")], now_ms=0)
    done = drive(uas, 60 * S)
    ((_, reinv),) = requests_sent(done, "INVITE")
    assert reinv.get("session-expires") == "120;refresher=uac"
    ours, before = parse_sdp(reinv.body), parse_sdp(ok.body)
    assert (ours.origin_version, ours.streams[0].port) == (
        before.origin_version,
        before.streams[0].port,
    )
    data = next(a.data for _, a in done if isinstance(a, Send))
    reply = answer(data, 200, [("Session-Expires", "120;refresher=uac")], body=offer(version=1))
    acks = sent(uas.datagram(reply, CALLER, 60.1 * S))
    assert [(m.method, m.cseq) for m in acks] == [("ACK", (reinv.cseq[0], "ACK"))]
    assert [m.method for m in sent(uas.datagram(reply, CALLER, 60.6 * S))] == ["ACK"]
    assert ended(drive(uas, 119 * S)) == []


def test_the_callers_reinvite_crossing_ours_gets_491() -> None:
    uas = make_uas()
    tag, _ = call_with(uas, [("Session-Expires", "120")], now_ms=0)
    drive(uas, 60 * S)
    theirs = reinvite(tag, offer(version=2), cseq=2)
    assert statuses(uas.datagram(theirs, CALLER, 60.1 * S)) == [491]

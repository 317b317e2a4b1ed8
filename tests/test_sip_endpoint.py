"""The SIP endpoint (voice_agent/sip/endpoint.py), sans-I/O on a virtual clock: with a trunk
to place calls through, each datagram goes to the user agent whose call its Call-ID names, the
calls that come in are answered as without one, and one clock serves both."""

from __future__ import annotations

from tests import test_sip_uac as placed
from tests import test_sip_uas as incoming
from voice_agent.sip import uac as client
from voice_agent.sip import uas as server
from voice_agent.sip.endpoint import SipEndpoint
from voice_agent.sip.transaction import T1_MS

CALLER = ("203.0.113.5", 5062)


def endpoint() -> tuple[SipEndpoint, client.UserAgentClient]:
    uac = placed.make_uac()
    return SipEndpoint(incoming.make_uas(), uac), uac


def test_each_datagram_goes_to_the_agent_whose_call_it_names() -> None:
    sip, uac = endpoint()
    call_id, invite = placed.dialed(uac)
    answer = sip.datagram(placed.ok(invite), placed.TRUNK, 100)
    assert [type(a) for a in answer if not isinstance(a, server.Send)] == [client.Answered]
    assert [m.method for m in placed.sent(answer)] == ["ACK"]
    # A call from a caller, meanwhile, is the server's: offered, not taken for the placed one.
    offered = sip.datagram(incoming.invite(), CALLER, 150)
    assert [a.call_id for a in offered if isinstance(a, server.IncomingCall)] == [incoming.CALL_ID]
    assert incoming.CALL_ID in sip.uas.calls and call_id not in sip.uas.calls
    # The callee's BYE of the placed call ends it there, answered 200 by the client.
    bye = placed.callee_request("BYE", invite, cseq=2, branch="z9hG4bKbye9")
    ended = sip.datagram(bye, placed.CALLEE, 200)
    assert [a.call_id for a in ended if isinstance(a, server.CallEnded)] == [call_id]
    assert [m.status for m in placed.sent(ended)] == [200]


def test_a_response_naming_another_call_is_not_taken_for_the_placed_one() -> None:
    sip, uac = endpoint()
    call_id, invite = placed.dialed(uac)
    before = (uac.next_deadline_ms(), uac.calls[call_id].state)
    stranger = placed.response(invite, 200).replace(call_id.encode(), b"someone-else")
    (dropped,) = sip.datagram(stranger, placed.TRUNK, 100)  # the server's: it matches nothing
    assert isinstance(dropped, server.Refused) and "matches nothing" in dropped.reason
    assert (uac.next_deadline_ms(), uac.calls[call_id].state) == before
    assert [type(a) for a in sip.datagram(placed.response(invite, 180), placed.TRUNK, 110)] == [
        client.Ringing
    ]


def test_what_is_not_sip_is_refused_once_and_a_keep_alive_is_nothing() -> None:
    sip, _ = endpoint()
    (refused,) = sip.datagram(b"\x16\x03\x01 not sip at all", CALLER, 0)
    assert isinstance(refused, server.Refused) and refused.addr == CALLER
    assert "not a SIP message" in refused.reason
    assert sip.datagram(b"\r\n\r\n", CALLER, 0) == []


def test_hang_up_ends_a_call_either_way_it_began() -> None:
    sip, uac = endpoint()
    call_id, invite = placed.dialed(uac)
    sip.datagram(placed.ok(invite), placed.TRUNK, 100)
    (bye,) = placed.sent(sip.hang_up(call_id, 200, "agent ended the call"))
    assert bye.method == "BYE" and bye.call_id == call_id
    sip.datagram(incoming.invite(), CALLER, 300)
    refused = placed.sent(sip.hang_up(incoming.CALL_ID, 400, "agent ended the call"))
    assert [(m.status, m.call_id) for m in refused] == [(480, incoming.CALL_ID)]
    assert sip.hang_up("no-such-call", 500, "gone") == []


def test_one_clock_serves_both_agents() -> None:
    sip, uac = endpoint()
    assert sip.next_deadline_ms() is None
    placed.dialed(uac, now_ms=0)
    assert sip.next_deadline_ms() == T1_MS  # timer A of the placed call's INVITE
    again = placed.sent(sip.tick(T1_MS))
    assert [m.method for m in again] == ["INVITE"]
    # The placed INVITE's next retransmission is at 3 T1; a call that came in meanwhile and was
    # answered at T1 + 20 has its 200 retransmitted sooner (timer G): that is the next wake-up.
    sip.datagram(incoming.invite(), CALLER, T1_MS + 10)
    sip.uas.accept(incoming.CALL_ID, "127.0.0.1", 20000, T1_MS + 20)
    assert sip.next_deadline_ms() == T1_MS + 20 + T1_MS

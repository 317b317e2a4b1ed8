"""One call as the user agent server keeps it (voice_agent.sip.uas): its INVITE and the
transaction that answers it, the dialog once it is made, what is being sent again until it is
acknowledged (our 2xx or refusal, our BYE, our REFER, our session refresh), its session timer
(RFC 4028) and when the call may be forgotten. The server's counterpart of
voice_agent.sip.placed_call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from voice_agent.sip import sdp
from voice_agent.sip.dialog import Dialog
from voice_agent.sip.message import SipMessage
from voice_agent.sip.session_refresh import OurRefresh
from voice_agent.sip.session_timer import SessionTimer
from voice_agent.sip.transaction import Addr, Retransmission, TransactionKey

CallState = Literal["offered", "answered", "confirmed", "ended"]


@dataclass(eq=False)
class ServerCall:
    call_id: str
    invite: SipMessage
    invite_key: TransactionKey
    source: Addr
    response_addr: Addr
    local_tag: str
    negotiated: sdp.Negotiated | None
    state: CallState = "offered"
    dialog: Dialog | None = None
    last_response: bytes = b""  # the latest response to the call's INVITE
    reinvite_response: bytes = b""  # the latest response to a re-INVITE
    retransmit: Retransmission | None = None  # our 2xx or non-2xx until its ACK
    retransmit_2xx: bool = False  # its timing out without an ACK ends the call
    waiting_ack_cseq: int | None = None
    our_offer: sdp.SessionDescription | None = None  # while the answer is due in an ACK
    reinvite_key: TransactionKey | None = None
    media_addr: Addr | None = None
    sdp_version: int = 0
    bye: Retransmission | None = None
    bye_branch: str | None = None
    bye_after_ack: bool = False
    refer: Retransmission | None = None  # our REFER, until its final response
    refer_branch: str | None = None
    referred: bool = False  # a REFER was sent: its NOTIFYs are expected
    expires_ms: float | None = None  # an ended call is kept this long for retransmissions
    timer: SessionTimer | None = None  # RFC 4028, once negotiated
    refresh: OurRefresh | None = None  # our latest session refresh, while it matters
    session_body: bytes = b""  # the SDP of our latest 2xx: what a re-INVITE refresh offers

    @property
    def over_stream(self) -> bool:
        return self.invite.vias[0].over_stream

    @property
    def deadline_ms(self) -> float | None:
        times = [t.deadline_ms for t in (self.retransmit, self.bye, self.refer) if t is not None]
        if self.refresh is not None and self.refresh.retransmit is not None:
            times.append(self.refresh.retransmit.deadline_ms)
        if self.timer is not None and self.state == "confirmed":
            times.append(self.timer.deadline_ms)
        if self.expires_ms is not None:
            times.append(self.expires_ms)
        return min(times, default=None)

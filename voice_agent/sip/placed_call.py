"""One call the SIP client placed (voice_agent.sip.uac), as it stands: its INVITE client
transactions (RFC 3261 section 17.1.1), the CANCEL and BYE it sent (17.1.2), its dialog once
answered, and the deadline of whichever of its timers comes first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from voice_agent.sip import sdp
from voice_agent.sip.auth import Credentials
from voice_agent.sip.dialog import Dialog
from voice_agent.sip.events import Outcome
from voice_agent.sip.message import SipMessage
from voice_agent.sip.transaction import Addr, Retransmission, TransactionKey

CallState = Literal["calling", "proceeding", "established", "ended"]


@dataclass(eq=False)
class InviteTransaction:
    """One INVITE client transaction (section 17.1.1): the request sent and its ACK, once a
    non-2xx final response came (17.1.1.3), to send again for its retransmissions."""

    data: bytes
    message: SipMessage
    branch: str
    cseq: int
    ack: bytes | None = None


@dataclass(eq=False)
class OutgoingRequest:
    """A non-INVITE client transaction of ours (CANCEL or BYE, section 17.1.2)."""

    method: str
    branch: str
    retransmit: Retransmission
    dialog: Dialog | None = None
    authorized: bool = False


@dataclass(eq=False)
class PlacedCall:
    call_id: str
    target_uri: str
    from_value: str  # our From, with our tag
    local_tag: str
    trunk: Addr
    media: Addr
    offer: sdp.SessionDescription
    offer_body: bytes
    session_id: str
    credentials: Credentials | None
    extra_headers: tuple[tuple[str, str], ...]
    dialed_ms: float
    ring_deadline_ms: float
    state: CallState = "calling"
    invites: list[InviteTransaction] = field(default_factory=list)  # the last is the current one
    invite_retransmit: Retransmission | None = None  # timers A and B
    auth_tries: int = 0
    stale_retried: bool = False
    ringing: bool = False
    early_media: bool = False
    cancel_reason: str | None = None
    cancel_outcome: Outcome = "cancelled"
    cancel_deadline_ms: float | None = None
    dialog: Dialog | None = None
    ack_2xx: bytes | None = None
    auth_header: tuple[str, str] | None = None  # the INVITE's credentials, for its 2xx's ACK
    forks: dict[str, tuple[bytes, Addr]] = field(default_factory=dict)  # To tag: ACK, where
    outgoing: dict[str, OutgoingRequest] = field(default_factory=dict)  # branch: transaction
    negotiated: sdp.Negotiated | None = None
    sdp_version: int = 1
    reinvite_key: TransactionKey | None = None
    reinvite_response: bytes = b""
    reinvite_addr: Addr | None = None
    reinvite_cseq: int | None = None  # the re-INVITE whose 2xx waits for its ACK
    reinvite_retransmit: Retransmission | None = None
    expires_ms: float | None = None  # an ended call is kept this long

    @property
    def invite(self) -> InviteTransaction:
        return self.invites[-1]

    @property
    def busy(self) -> bool:
        """Timers other than the expiry still run."""
        return bool(self.outgoing) or self.reinvite_retransmit is not None

    @property
    def deadline_ms(self) -> float | None:
        times = [out.retransmit.deadline_ms for out in self.outgoing.values()]
        for timer in (self.invite_retransmit, self.reinvite_retransmit):
            if timer is not None:
                times.append(timer.deadline_ms)
        if self.state in ("calling", "proceeding") and self.cancel_reason is None:
            times.append(self.ring_deadline_ms)
        if self.cancel_deadline_ms is not None:
            times.append(self.cancel_deadline_ms)
        if self.expires_ms is not None and not self.busy:
            times.append(self.expires_ms)
        return min(times, default=None)

"""What the SIP user agents tell the gateway (voice_agent.gateways.sip), as plain values: the
datagrams to send, and what happened to a call, for calls that come in (voice_agent.sip.uas)
and calls placed through a trunk (voice_agent.sip.uac). voice_agent.sip.endpoint puts both
behind one datagram and one clock; each agent's `Action` union says which of these it emits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from voice_agent.sip import sdp
from voice_agent.sip.message import SipMessage
from voice_agent.sip.transaction import Addr

Outcome = Literal["busy", "no answer", "bad number", "refused", "failed", "cancelled"]


# ---- calls that come in (the server); Send, MediaChanged, DtmfReceived, CallEnded the client's too


@dataclass(frozen=True, slots=True)
class Send:
    data: bytes
    addr: Addr


@dataclass(frozen=True)
class IncomingCall:
    call_id: str  # the SIP Call-ID, this server's key for the call
    invite: SipMessage
    source: Addr
    negotiated: sdp.Negotiated | None  # None: no offer, ours goes in the 200 (delayed offer)
    username: str | None = None  # who authenticated, if credentials are configured


@dataclass(frozen=True)
class CallConfirmed:
    call_id: str
    negotiated: sdp.Negotiated


@dataclass(frozen=True)
class MediaChanged:
    call_id: str
    negotiated: sdp.Negotiated


@dataclass(frozen=True)
class DtmfReceived:
    call_id: str
    digit: str


@dataclass(frozen=True)
class CallEnded:
    call_id: str
    reason: str


@dataclass(frozen=True)
class Refused:
    """A datagram turned away: what it was, who sent it, and why (for the log and metrics)."""

    addr: Addr
    status: int | None  # None: dropped without an answer
    reason: str


@dataclass(frozen=True, slots=True)
class TransferAccepted:
    """The far end took our REFER (202): it now calls the target and NOTIFYs how that goes."""

    call_id: str


@dataclass(frozen=True, slots=True)
class TransferProgress:
    """A NOTIFY of the REFER's subscription: the status line its sipfrag body carries (100,
    180, 200, 486, ...); `final` once the subscription is terminated or the status is final."""

    call_id: str
    status: int
    reason: str
    final: bool


@dataclass(frozen=True, slots=True)
class TransferFailed:
    """The REFER was refused (its final status) or never answered (408)."""

    call_id: str
    status: int
    reason: str


# ---- calls placed through a trunk (the client) ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dialing:
    """First of dial's actions: the Call-ID the call goes by in every later action."""

    call_id: str
    target_uri: str


@dataclass(frozen=True, slots=True)
class Ringing:
    """A 180 or 183: the callee is alerted. `early_media` when the 183 carried an answer."""

    call_id: str
    status: int
    early_media: sdp.Negotiated | None = None


@dataclass(frozen=True, slots=True)
class Answered:
    """The 2xx came and was ACKed: media flows to `negotiated`."""

    call_id: str
    negotiated: sdp.Negotiated


@dataclass(frozen=True, slots=True)
class Failed:
    """The call never got answered: the final status (408 for timeouts), a reason for the log
    and what it means for the caller of dial."""

    call_id: str
    status: int
    reason: str
    outcome: Outcome


# What the user agent server (voice_agent.sip.uas) hands its I/O layer.
ServerAction = (
    Send
    | IncomingCall
    | CallConfirmed
    | MediaChanged
    | DtmfReceived
    | CallEnded
    | Refused
    | TransferAccepted
    | TransferProgress
    | TransferFailed
)

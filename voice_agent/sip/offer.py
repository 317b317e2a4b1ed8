"""A SIP request's SDP offer (RFC 3264 carried as RFC 3261 section 13 says): read and
negotiated, or the status that refuses it. The server reads the offers of INVITEs and
re-INVITEs that come in with it (voice_agent.sip.uas), the client the re-INVITEs of the calls
it placed (voice_agent.sip.uac): one reading, the same statuses for both.

With SRTP allowed (`MediaSecurity`), an offer's keys are taken here too: an RTP/SAVP stream,
or a plain one carrying `a=crypto` lines (what phones set to "SRTP optional" send), gets keys
of ours in the answer (voice_agent.sip.sdes). SDES keys travel in the SDP itself, so they are
taken only from a request that came over TLS, unless the operator says the signalling path is
private; `required` refuses plain RTP. Each refusal's reason says which rule refused it (the
server logs it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from voice_agent.sip import sdes, sdp
from voice_agent.sip.message import SipMessage

NO_COMMON_CODEC_WARNING = ("Warning", '305 voice-agent "no common codec"')
SrtpPolicy = Literal["off", "optional", "required"]


@dataclass(frozen=True)
class MediaSecurity:
    srtp: SrtpPolicy = "optional"
    keys_over_plain_signalling: bool = False  # SDES keys taken from requests not over TLS


class BadOffer(Exception):
    """The response an offer gets instead of an answer: its status, why, its extra headers."""

    def __init__(self, status: int, reason: str, headers: list[tuple[str, str]]) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers


def read_offer(
    request: SipMessage,
    security: MediaSecurity = MediaSecurity(srtp="off"),
    *,
    keep: str | None = None,
) -> tuple[sdp.SessionDescription, sdp.Negotiated] | None:
    """The request's SDP offer and what it negotiates to (`keep`: the codec of a call it
    re-offers, kept if offered); None without a body. Raises BadOffer
    with the response to give: 415 for a body that is not SDP, 400 for SDP that does not read,
    488 for no codec in common or media security the policy does not allow."""
    if not request.body:
        return None
    content_type = (request.get("content-type") or "").split(";", 1)[0].strip().lower()
    if content_type != "application/sdp":
        raise BadOffer(
            415,
            f"body of type {content_type or 'none'!r} is not SDP",
            [("Accept", "application/sdp")],
        )
    over_tls = request.vias[0].transport == "TLS"
    may_key = security.srtp != "off" and (over_tls or security.keys_over_plain_signalling)
    try:
        offer = sdp.parse_sdp(request.body)
    except sdp.SdpError as error:
        raise BadOffer(400, f"SDP: {error}", []) from None
    protocols = sdp.PLAIN_RTP + sdp.SECURE_RTP if may_key else sdp.PLAIN_RTP
    try:
        negotiated = sdp.negotiate(offer, protocols=protocols, keep=keep)
    except sdp.NoCommonCodec as error:
        reason = str(error)
        secure = [s for s in offer.streams if s.protocol.upper() in sdp.SECURE_RTP]
        if secure and not may_key:
            reason = _no_keys_reason(security) + f" ({reason})"
        raise BadOffer(488, reason, [NO_COMMON_CODEC_WARNING]) from None
    except sdp.SdpError as error:
        raise BadOffer(400, f"SDP: {error}", []) from None
    stream = offer.streams[negotiated.stream_index]
    keys = sdes.choose(stream.crypto) if may_key and stream.crypto else None
    if keys is None and stream.protocol.upper() in sdp.SECURE_RTP:
        suites = ", ".join(sdes.SUITES)
        raise BadOffer(488, f"SRTP offered with no a=crypto line this server takes ({suites})", [])
    if keys is None and security.srtp == "required":
        why = "plain RTP offered" if may_key else _no_keys_reason(security)
        raise BadOffer(488, f"sip.srtp is required: {why}", [])
    return offer, replace(negotiated, srtp=keys)


def _no_keys_reason(security: MediaSecurity) -> str:
    if security.srtp == "off":
        return "SRTP offered and sip.srtp is off"
    return (
        "SRTP keys (SDES) are taken over TLS only, as anyone on the path reads them otherwise "
        "(sip.srtp_keys_over_plain_signalling allows it)"
    )


def negotiated_offer(
    request: SipMessage,
    security: MediaSecurity = MediaSecurity(srtp="off"),
    *,
    keep: str | None = None,
) -> sdp.Negotiated | None:
    """What the request's offer negotiates to (None without one); BadOffer as read_offer, and
    for a request without an offer when SRTP is required (ours would be plain RTP)."""
    read = read_offer(request, security, keep=keep)
    if read is None and security.srtp == "required":
        raise BadOffer(488, "sip.srtp is required: send the SDP offer in the request", [])
    return None if read is None else read[1]

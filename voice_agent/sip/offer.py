"""A SIP request's SDP offer (RFC 3264 carried as RFC 3261 section 13 says): read and
negotiated, or the status that refuses it. The server reads the offers of INVITEs and
re-INVITEs that come in with it (voice_agent.sip.uas), the client the re-INVITEs of the calls
it placed (voice_agent.sip.uac): one reading, the same statuses for both."""

from __future__ import annotations

from voice_agent.sip import sdp
from voice_agent.sip.message import SipMessage

NO_COMMON_CODEC_WARNING = ("Warning", '305 voice-agent "no common codec"')


class BadOffer(Exception):
    """The response an offer gets instead of an answer: its status, why, its extra headers."""

    def __init__(self, status: int, reason: str, headers: list[tuple[str, str]]) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers


def read_offer(request: SipMessage) -> tuple[sdp.SessionDescription, sdp.Negotiated] | None:
    """The request's SDP offer and what it negotiates to; None without a body. Raises BadOffer
    with the response to give: 415 for a body that is not SDP, 400 for SDP that does not read,
    488 for no codec in common."""
    if not request.body:
        return None
    content_type = (request.get("content-type") or "").split(";", 1)[0].strip().lower()
    if content_type != "application/sdp":
        raise BadOffer(
            415,
            f"body of type {content_type or 'none'!r} is not SDP",
            [("Accept", "application/sdp")],
        )
    try:
        offer = sdp.parse_sdp(request.body)
        return offer, sdp.negotiate(offer)
    except sdp.NoCommonCodec as error:
        raise BadOffer(488, str(error), [NO_COMMON_CODEC_WARNING]) from None
    except sdp.SdpError as error:
        raise BadOffer(400, f"SDP: {error}", []) from None


def negotiated_offer(request: SipMessage) -> sdp.Negotiated | None:
    """What the request's offer negotiates to (None without one); BadOffer as read_offer."""
    read = read_offer(request)
    return None if read is None else read[1]

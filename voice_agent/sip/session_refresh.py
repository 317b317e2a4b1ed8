"""The session refresh the user agent server sends when it is the refresher (RFC 4028 section
10), sans-I/O: an UPDATE without a body (RFC 3311) when the caller allows UPDATE, else a
re-INVITE offering the session as it is (our last SDP, its version unchanged: RFC 3264
section 8 reads that as no change). Its retransmission over UDP (timer A for the INVITE, E for
the UPDATE), the ACK of the re-INVITE's final response (13.2.2.4 for a 2xx, a new branch; in
the transaction for a failure, 17.1.1.3), and what its final response means:

- 2xx: the session lives on, with the timer the response sets (voice_agent.sip.session_timer).
- 422: asked again at once with the interval the response's Min-SE names.
- 405 or 501 to an UPDATE: asked again as a re-INVITE (the caller's Allow misled us).
- 408, 481, or no answer at all: the dialog is gone on the other side; the call ends with a BYE
  (section 10).
- anything else (491 of a re-INVITE that crossed one of the caller's, 500, ...): the session is
  left to expire; a refresh of the caller's before then saves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from voice_agent.sip.dialog import Dialog
from voice_agent.sip.message import SipMessage, SipParseError, parse_via
from voice_agent.sip.session_timer import SessionTimer, answered, read_min_se
from voice_agent.sip.transaction import Retransmission

Verdict = Literal["refreshed", "ask again", "as re-INVITE", "gone", "left to expire", "pending"]


@dataclass
class OurRefresh:
    method: str  # "UPDATE" or "INVITE"
    branch: str
    cseq: int
    retransmit: Retransmission | None
    data: bytes = b""
    ack: bytes = b""  # sent for the final response (again for a retransmitted 2xx)
    final: int | None = None  # the final response's status, once it came


def allows_update(invite: SipMessage) -> bool:
    """Whether the caller's INVITE listed UPDATE in its Allow (RFC 3311 section 5.1)."""
    return any(
        method.strip().upper() == "UPDATE"
        for value in invite.get_all("allow")
        for method in value.split(",")
    )


def start_refresh(
    dialog: Dialog,
    timer: SessionTimer,
    *,
    method: str,
    via_host: str,
    branch: str,
    headers: list[tuple[str, str]],
    session_body: bytes,
    now_ms: float,
) -> OurRefresh:
    """The refresh request, ready to send (`.data`) and to retransmit."""
    extra = [*headers, *timer.request_headers()]
    body = b""
    if method == "INVITE":
        extra.append(("Content-Type", "application/sdp"))
        body = session_body
    data = dialog.request(method, via_host=via_host, branch=branch, headers=extra, body=body)
    over_stream = dialog.over_stream
    if method == "INVITE" and not over_stream:
        retransmit = Retransmission(data, dialog.destination(), now_ms, cap_ms=float("inf"))
    else:
        retransmit = Retransmission.of_request(
            data, dialog.destination(), now_ms, over_stream=over_stream
        )
    via_branch = parse_via(data.split(b"\r\n")[1].decode()[5:]).branch or branch
    return OurRefresh(method, via_branch, dialog.local_cseq, retransmit, data)


def refresh_response(
    refresh: OurRefresh,
    response: SipMessage,
    dialog: Dialog,
    timer: SessionTimer,
    *,
    via_host: str,
    ack_branch: str,
    now_ms: float,
) -> tuple[Verdict, SessionTimer | None]:
    """What a response to our refresh means, and the timer after it (for "refreshed": None
    when the response turned timers off). Sets `refresh.ack` when one is to be sent."""
    status = response.status or 0
    if status < 200:
        return "pending", timer
    if refresh.final is not None:
        return "pending", timer  # a retransmitted final response: the ACK again, if any
    refresh.final = status
    refresh.retransmit = None
    if refresh.method == "INVITE":
        if 200 <= status < 300:
            refresh.ack = _ack_2xx(dialog, refresh, via_host, ack_branch)
        else:
            refresh.ack = _ack_failure(refresh, response)
    if 200 <= status < 300:
        try:
            after = answered(response, timer)
        except SipParseError:
            after = timer  # a Session-Expires we cannot read: keep the interval we asked
        if after is not None:
            after.restart(now_ms)
        return "refreshed", after
    if status == 422:
        try:
            floor = read_min_se(response)
        except SipParseError:
            floor = None
        if floor is not None and floor > timer.interval_s:
            timer.interval_s = floor
            return "ask again", timer
        return "left to expire", timer
    if status in (405, 501) and refresh.method == "UPDATE":
        return "as re-INVITE", timer
    if status in (408, 481):
        return "gone", timer
    return "left to expire", timer


def _ack_2xx(dialog: Dialog, refresh: OurRefresh, via_host: str, branch: str) -> bytes:
    """Section 13.2.2.4: a request of the dialog with the INVITE's CSeq number, a new branch."""
    saved = dialog.local_cseq
    dialog.local_cseq = refresh.cseq - 1  # Dialog.request counts it up to the INVITE's
    data = dialog.request("ACK", via_host=via_host, branch=branch)
    dialog.local_cseq = saved
    return data


def _ack_failure(refresh: OurRefresh, response: SipMessage) -> bytes:
    """Section 17.1.1.3: in the INVITE's transaction: its Request-URI, top Via, From, Call-ID,
    CSeq number and Route; the response's To (with the tag it set)."""
    lines = refresh.data.split(b"\r\n\r\n", 1)[0].decode("utf-8").split("\r\n")
    method_line = lines[0].replace("INVITE ", "ACK ", 1)
    kept: list[str] = [method_line]
    seen_via = False
    for line in lines[1:]:
        name = line.split(":", 1)[0].strip().lower()
        if name == "via" and not seen_via:
            kept.append(line)
            seen_via = True
        elif name in ("route", "max-forwards", "from", "call-id"):
            kept.append(line)
        elif name == "to":
            kept.append(f"To: {response.get('to') or line.split(':', 1)[1].strip()}")
        elif name == "cseq":
            kept.append(f"CSeq: {refresh.cseq} ACK")
    kept.append("Content-Length: 0")
    return ("\r\n".join(kept) + "\r\n\r\n").encode("utf-8")

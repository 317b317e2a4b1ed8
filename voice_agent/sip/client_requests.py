"""What the SIP client (voice_agent.sip.uac) builds and reads beside its state machine: its
requests as RFC 3261 builds them (the INVITE of section 8.1.1, the CANCEL of 9.1, the ACK of a
non-2xx of 17.1.1.3), the dialog a 2xx makes (12.1.2), what a final status means for the caller
of dial, and the checks of what dial is given."""

from __future__ import annotations

import re
from collections.abc import Sequence

from voice_agent.sip.dialog import MAX_FORWARDS, Dialog
from voice_agent.sip.events import Outcome
from voice_agent.sip.message import SIP_VERSION, SipMessage, name_addr_uri, quoted, split_commas
from voice_agent.sip.transaction import Addr

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO"
_URI = re.compile(r"(?i)(sips?|tel):[^\s<>\"]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HEADER_NAME = re.compile(r"[A-Za-z0-9.!%*_+`'~-]+")


def check_target(uri: str) -> None:
    """A ValueError unless `uri` is a sip:, sips: or tel: URI."""
    if not _URI.fullmatch(uri):
        raise ValueError(f"target {uri[:80]!r} is not a sip:, sips: or tel: URI")


def checked_headers(headers: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Extra INVITE headers, stripped; a ValueError for one that would not make a header."""
    extra = tuple((name.strip(), value.strip()) for name, value in headers)
    for name, value in extra:
        if not _HEADER_NAME.fullmatch(name) or _CONTROL.search(value):
            raise ValueError(f"header {name[:40]!r} is not a header name and one-line value")
    return extra


def out_of_dialog_request(
    method: str,
    uri: str,
    *,
    via: str,
    from_value: str,
    to_value: str,
    call_id: str,
    cseq: int,
    headers: Sequence[tuple[str, str]] = (),
) -> bytes:
    """A request outside any dialog and without a body (section 8.1.1): a REGISTER, an
    OPTIONS probe. `via` is the Via value after the protocol: "HOST:PORT;branch=...;rport"."""
    lines = [
        f"{method} {uri} {SIP_VERSION}",
        f"Via: {SIP_VERSION}/UDP {via}",
        f"Max-Forwards: {MAX_FORWARDS}",
        f"From: {from_value}",
        f"To: {to_value}",
        f"Call-ID: {call_id}",
        f"CSeq: {cseq} {method}",
        *(f"{name}: {value}" for name, value in headers),
        "Content-Length: 0",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")


def invite_request(
    *,
    target_uri: str,
    from_value: str,
    call_id: str,
    cseq: int,
    via: str,
    contact: str,
    user_agent: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
) -> bytes:
    """An INVITE as section 8.1.1 builds it: Request-URI and To the target, our From (with our
    tag), the Call-ID and CSeq, Max-Forwards, our Via and Contact, the SDP offer."""
    lines = [
        f"INVITE {target_uri} {SIP_VERSION}",
        f"Via: {via}",
        f"Max-Forwards: {MAX_FORWARDS}",
        f"From: {from_value}",
        f"To: <{target_uri}>",
        f"Call-ID: {call_id}",
        f"CSeq: {cseq} INVITE",
        f"Contact: {contact}",
        f"Allow: {ALLOW}",
        f"User-Agent: {user_agent}",
        *(f"{name}: {value}" for name, value in headers),
        "Content-Type: application/sdp",
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


def cancel_request(invite: SipMessage, cseq: int, reason: str, user_agent: str) -> bytes:
    """Section 9.1: the INVITE's Request-URI, Call-ID, From, To, CSeq number and top Via (its
    branch), and CSeq method CANCEL."""
    lines = [
        f"CANCEL {invite.uri} {SIP_VERSION}",
        f"Via: {invite.get_all('via')[0]}",
        f"Max-Forwards: {MAX_FORWARDS}",
        f"From: {invite.get('from')}",
        f"To: {invite.get('to')}",
        f"Call-ID: {invite.call_id}",
        f"CSeq: {cseq} CANCEL",
        f"User-Agent: {user_agent}",
        f'Reason: SIP;cause=487;text="{quoted(reason)}"',
        "Content-Length: 0",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")


def dialog_from_response(
    response: SipMessage,
    *,
    local_uri: str,
    local_tag: str,
    target_uri: str,
    local_cseq: int,
    source: Addr,
) -> Dialog:
    """The dialog a 2xx to our INVITE makes, as its UAC sees it (section 12.1.2): the remote
    target from the 2xx's Contact (the Request-URI if it has none), the route set from its
    Record-Route in reverse order, the remote tag and URI from its To, ours from our From, no
    remote CSeq yet (0), our CSeq the INVITE's. Dialog.request then builds BYE with From ours
    and To theirs; Dialog.matches takes the callee's requests (our tag in To)."""
    contact = response.get("contact")
    routes = [
        part.strip()
        for value in response.get_all("record-route")
        for part in split_commas(value)
        if part.strip()
    ]
    return Dialog(
        call_id=response.call_id,
        local_tag=local_tag,
        remote_tag=response.to_tag or "",
        local_uri=local_uri,
        remote_uri=response.get("to") or "",
        remote_target=name_addr_uri(contact) if contact else target_uri,
        route_set=list(reversed(routes)),
        remote_cseq=0,
        source=source,
        local_cseq=local_cseq,
    )


def outcome_of(status: int) -> Outcome:
    """What a final status means for the caller of dial (section 21's classes, coarsely)."""
    if status in (486, 600):
        return "busy"
    if status in (480, 408, 487):
        return "no answer"
    if status in (404, 484, 604):
        return "bad number"
    if status in (401, 403, 407):
        return "refused"
    return "failed"


def challenge_header(status: int) -> str:
    return "www-authenticate" if status == 401 else "proxy-authenticate"


def ack_for_non_2xx(invite: SipMessage, response: SipMessage) -> bytes:
    """Section 17.1.1.3: the INVITE's Request-URI, top Via (its branch), From, Call-ID, CSeq
    number and Route, the response's To (with its tag), CSeq method ACK."""
    number, _ = invite.cseq
    lines = [
        f"ACK {invite.uri} {SIP_VERSION}",
        f"Via: {invite.get_all('via')[0]}",
        *(f"Route: {route}" for route in invite.get_all("route")),
        f"Max-Forwards: {MAX_FORWARDS}",
        f"From: {invite.get('from')}",
        f"To: {response.get('to') or invite.get('to')}",
        f"Call-ID: {invite.call_id}",
        f"CSeq: {number} ACK",
        "Content-Length: 0",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")


def request_uri(dialog: Dialog) -> str:
    """The Request-URI Dialog.request gives its requests (a strict router's, or the target)."""
    if dialog.route_set:
        first = name_addr_uri(dialog.route_set[0])
        params = {p.split("=", 1)[0].strip().lower() for p in first.split("?", 1)[0].split(";")[1:]}
        if "lr" not in params:
            return first
    return dialog.remote_target


def from_name_addr(uri: str) -> str:
    value = uri.strip()
    if _CONTROL.search(value):
        raise ValueError(f"From {value[:80]!r} holds a control character")
    if "<" not in value:
        if not _URI.fullmatch(value):
            raise ValueError(f"From {value[:80]!r} is not a sip:, sips: or tel: URI")
        return f"<{value}>"
    if not _URI.fullmatch(name_addr_uri(value)) or "tag=" in value.rpartition(">")[2]:
        raise ValueError(f"From {value[:80]!r} is not a name-addr without a tag")
    return value

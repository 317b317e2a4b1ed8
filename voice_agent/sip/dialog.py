"""A SIP dialog as its user agent server sees it (RFC 3261 section 12): made from the INVITE
the server answers (12.1.1), matching the requests that belong to it (12.2.2), and building the
requests the server sends in it, a BYE above all (12.2.1.1, with the route set of 12.1.1 and
loose routing of 16.12). Sans-I/O.

Where an in-dialog request goes: a dialog that came over a connection (TCP, TLS) sends on that
connection, the address the INVITE came from (connection reuse, as RFC 5923 and RFC 5626 have
it: a caller behind NAT or a firewall cannot take a connection opened towards it). Over UDP:
to the first route if the caller's proxies recorded one, else to the caller's Contact, when
either names an IP address and port; otherwise to the address the INVITE came from. The last
is what a caller behind NAT needs and what symmetric signalling (RFC 3581) gives; DNS lookups
of RFC 3263 are not done, since every peer that reaches this server has just sent from the
address that works.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from voice_agent.sip.message import (
    SIP_VERSION,
    SipMessage,
    SipParseError,
    header_params,
    name_addr_uri,
)
from voice_agent.sip.transaction import MAGIC_COOKIE, Addr

MAX_FORWARDS = 70
# What a request line can carry as the target: a sip: or sips: URI, no blank or control byte.
_TARGET = re.compile(r"(?i)sips?:[^\s<>\"\x00-\x1f\x7f]+")


def unusable_target(invite: SipMessage) -> str | None:
    """Why the INVITE's Contact (else its From) cannot be the dialog's remote target (12.1.1),
    which our BYE and REFER are sent to; None if it can."""
    value = invite.get("contact") or invite.get("from") or ""
    try:
        uri = name_addr_uri(value)
    except SipParseError as error:
        return f"Contact: {error}"
    if not _TARGET.fullmatch(uri):
        return f"Contact {uri[:60]!r} is not a sip: or sips: URI a request can be sent to"
    return None


@dataclass
class Dialog:
    call_id: str
    local_tag: str
    remote_tag: str
    local_uri: str  # the To of the INVITE, whose tag is ours
    remote_uri: str  # the From of the INVITE
    remote_target: str  # the caller's Contact URI
    route_set: list[str]  # Record-Route values, in the order of the INVITE (12.1.1)
    remote_cseq: int
    source: Addr  # where the INVITE came from
    local_cseq: int = 1
    transport: str = "UDP"  # the INVITE's (its top Via's): our requests go the same way

    @classmethod
    def from_invite(cls, invite: SipMessage, local_tag: str, source: Addr) -> Dialog:
        contact = invite.get("contact")
        number, _ = invite.cseq
        return cls(
            call_id=invite.call_id,
            local_tag=local_tag,
            remote_tag=invite.from_tag or "",
            local_uri=invite.get("to") or "",
            remote_uri=invite.get("from") or "",
            remote_target=name_addr_uri(contact)
            if contact
            else name_addr_uri(invite.get("from") or ""),
            route_set=invite.get_all("record-route"),
            remote_cseq=number,
            source=source,
            transport=invite.vias[0].transport,
        )

    def matches(self, request: SipMessage) -> bool:
        """Section 12.2.2: the same Call-ID, our tag in To, the caller's in From."""
        return (
            request.call_id == self.call_id
            and request.to_tag == self.local_tag
            and (request.from_tag or "") == self.remote_tag
        )

    @property
    def over_stream(self) -> bool:
        return self.transport != "UDP"

    def destination(self) -> Addr:
        if self.over_stream:
            return self.source
        uri = name_addr_uri(self.route_set[0]) if self.route_set else self.remote_target
        return _ip_address_of(uri) or self.source

    def request(
        self,
        method: str,
        *,
        via_host: str,
        branch: str,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> bytes:
        """A request in this dialog (section 12.2.1.1), its CSeq the next of ours."""
        self.local_cseq += 1
        request_uri = self.remote_target
        routes = list(self.route_set)
        if routes and "lr" not in _uri_params(name_addr_uri(routes[0])):
            # A strict router (RFC 2543) takes the Request-URI's place; the target goes last.
            request_uri = name_addr_uri(routes.pop(0))
            routes.append(f"<{self.remote_target}>")
        to_value = self.remote_uri
        from_value = self.local_uri
        if "tag" not in header_params(from_value):
            from_value = f"{from_value};tag={self.local_tag}"
        if not branch.startswith(MAGIC_COOKIE):
            branch = MAGIC_COOKIE + branch
        lines = [
            f"{method} {request_uri} {SIP_VERSION}",
            f"Via: {SIP_VERSION}/{self.transport} {via_host};branch={branch};rport",
            *(f"Route: {route}" for route in routes),
            f"Max-Forwards: {MAX_FORWARDS}",
            f"From: {from_value}",
            f"To: {to_value}",
            f"Call-ID: {self.call_id}",
            f"CSeq: {self.local_cseq} {method}",
            *(f"{name}: {value}" for name, value in headers or []),
            f"Content-Length: {len(body)}",
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


def _uri_params(uri: str) -> set[str]:
    host_part = uri.split("?", 1)[0]
    return {part.split("=", 1)[0].strip().lower() for part in host_part.split(";")[1:]}


def _ip_address_of(uri: str) -> Addr | None:
    """The host and port of a sip: URI when the host is an IP address (port 5060 by default)."""
    scheme, colon, rest = uri.partition(":")
    if not colon or scheme.lower() not in ("sip", "sips"):
        return None
    host_port = rest.split(";", 1)[0].split("?", 1)[0].rpartition("@")[2]
    if host_port.startswith("["):
        host, _, tail = host_port[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_text = host_port.partition(":")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    if port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536):
        return None
    return host, int(port_text) if port_text else 5060

"""How the user agent server (voice_agent.sip.uas) answers requests and names itself: responses
with its Server header, stateless refusals with a To tag derived from the request (RFC 3261
section 8.2.7: a retransmission gets the same one), the non-INVITE responses it caches for
retransmissions (voice_agent.sip.transaction), and its own address in Via and Contact for the
transport a request came over. Sans-I/O; kept apart from the call logic, which only decides
what to answer.
"""

from __future__ import annotations

import hashlib
import secrets

from voice_agent.sip.events import Refused, Send, ServerAction
from voice_agent.sip.message import (
    SipMessage,
    SipParseError,
    build_response,
    host_in_uri,
    quoted,
)
from voice_agent.sip.transaction import Addr, ResponseCache, TransactionKey, response_addr

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY, UPDATE"
SUPPORTED = ("Supported", "timer")  # RFC 4028


def warning(reason: str) -> tuple[str, str]:
    """The Warning header that says why a request was refused (RFC 3261 section 20.43)."""
    return ("Warning", f'399 voice-agent "{quoted(reason)}"')


class Responder:
    def __init__(self, host: str, port: int, stream_ports: dict[str, int], user_agent: str) -> None:
        self.host = host
        self.port = port
        self.stream_ports = stream_ports
        self.user_agent = user_agent
        self.responses = ResponseCache()
        self._tag_key = secrets.token_bytes(16)

    def common(self) -> list[tuple[str, str]]:
        return [("Server", self.user_agent)]

    def local(self, transport: str) -> str:
        """Our host:port as peers reach it over `transport`, for Via and Contact."""
        port = self.stream_ports.get(transport, self.port)
        return f"{host_in_uri(self.host)}:{port}"

    def contact(self, request: SipMessage) -> str:
        """Our Contact for the dialog `request` makes: the transport it came over, and a SIPS
        URI if its Request-URI was one (section 12.1.1)."""
        transport = request.vias[0].transport
        local = self.local(transport)
        if (request.uri or "").lower().startswith("sips:"):
            return f"<sips:{local}>"
        if transport == "UDP":
            return f"<sip:{local}>"
        return f"<sip:{local};transport={transport.lower()}>"

    def stateless_tag(self, request: SipMessage) -> str:
        # Section 8.2.7: the same request must get the same To tag.
        top = request.get("via") or ""
        seed = f"{request.get('call-id')}|{request.get('from')}|{top}".encode()
        return hashlib.blake2s(seed, key=self._tag_key, digest_size=8).hexdigest()

    def reply(
        self,
        request: SipMessage,
        source: Addr,
        status: int,
        *,
        key: TransactionKey | None = None,
        now_ms: float = 0.0,
        to_tag: str | None = None,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> list[ServerAction]:
        """A response to `request`; cached under `key` (for its retransmissions) if given."""
        tag = to_tag or request.to_tag or self.stateless_tag(request)
        response = build_response(
            request, status, to_tag=tag, headers=[*self.common(), *(headers or [])], body=body
        )
        if key is not None:
            self.responses.put(key, response, now_ms)
        return [Send(response, response_addr(request, source))]

    def refuse(
        self,
        request: SipMessage,
        source: Addr,
        status: int,
        reason: str,
        *,
        headers: list[tuple[str, str]] | None = None,
        key: TransactionKey | None = None,
        now_ms: float = 0.0,
        to_tag: str | None = None,
    ) -> list[ServerAction]:
        """A failure response with the reason in a Warning, and the Refused event that logs it."""
        extra = [*(headers or []), warning(reason)]
        actions = self.reply(
            request, source, status, headers=extra, key=key, now_ms=now_ms, to_tag=to_tag
        )
        return [*actions, Refused(source, status, f"{request.method}: {reason}")]

    def bad_request(self, request: SipMessage, source: Addr, reason: str) -> list[ServerAction]:
        """400 when the response can be routed (a Via that reads); otherwise dropped."""
        if request.method == "ACK":
            return [Refused(source, None, f"ACK: {reason}")]
        try:
            if not request.get("via"):
                raise SipParseError("no Via")
            request.vias  # noqa: B018 - the response needs them readable
            return self.refuse(request, source, 400, reason)
        except SipParseError:
            return [Refused(source, None, f"{request.method}: {reason}; no Via to answer to")]

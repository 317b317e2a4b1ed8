"""The SIP user agent server, sans-I/O: datagrams and a clock in, datagrams to send and call
events out (RFC 3261 sections 8.2, 9.2, 12, 13.3, 14.2, 15, 17.2 and 18.2, RFC 3581, RFC 6026's
accepted state; offer/answer through voice_agent.sip.sdp).

    uas = UserAgentServer(settings)
    actions = uas.datagram(data, source, now_ms)   # and uas.tick(now_ms) at uas.next_deadline_ms()
    # IncomingCall -> uas.accept(call_id, media_host, media_port, now_ms) or uas.reject(...)
    # CallConfirmed (the ACK came: media may flow), MediaChanged (re-INVITE), DtmfReceived,
    # CallEnded; Send is a datagram for the I/O layer; Refused says what was turned away, why.

What is answered how:
- INVITE: 100 at once, 200 with the SDP answer once the server accepts (retransmitted at T1,
  doubling to T2, until the ACK; no ACK in 32 s ends the call with a BYE, section 13.3.1.4).
  Without an SDP offer the 200 carries the offer and the ACK the answer (delayed offer).
  488 when no codec matches, 415 for a body that is not SDP, 420 for a Require we lack, 482 for
  a second INVITE of a Call-ID, 503 past `max_calls` or while draining. Retransmitted INVITEs
  get the last response again.
- Refusals before a call exists (400, 401, 403, 415, 420, 481, 482, 488, 503, 405, 501) are
  stateless (section 8.2.7), with a To tag derived from the request so a retransmission gets
  the same one. The INVITE a call was refused after is kept for 32 s to absorb retransmissions.
- ACK: for our 2xx it confirms the call (with the answer if the offer was ours); for a
  non-2xx it stops that response's retransmission. ACK is never answered.
- CANCEL before the answer: 200 to the CANCEL, 487 to the INVITE, the call ends.
- BYE: 200, the call ends. `hang_up` sends a BYE (after the ACK, if it has not come yet:
  section 15), retransmitted until answered or 32 s.
- re-INVITE: the new offer answered (hold: sendonly or inactive, or c=0.0.0.0; resume), or
  488 with the session unchanged; an older CSeq gets 500 (section 12.2.2). UPDATE (RFC 3311)
  and session timers (RFC 4028): voice_agent.sip.session_keeper. A Require: 100rel call gets
  no 180, so no reliable provisional (RFC 3262) is owed.
- INFO with application/dtmf-relay or application/dtmf: a digit. OPTIONS: 200 with Allow,
  503 while draining (a proxy's probe then stops sending calls here).
- `transfer` sends a REFER in the dialog (RFC 3515; the transferor's side of RFC 5589's basic
  transfer): its 2xx is `TransferAccepted`, a failure or no answer in 32 s `TransferFailed`.
  The NOTIFYs of the implied subscription get 200 and report the sipfrag's status
  (`TransferProgress`: 1xx while the target rings, then the final one); a NOTIFY with no REFER
  sent gets 481 (RFC 6665 section 4.1.3).
- Requests naming an unknown dialog: 481. Known methods this server does not take (REGISTER,
  SUBSCRIBE, ...): 405. Unknown methods: 501. Responses that match nothing are dropped.
- Non-INVITE retransmissions get the cached response (voice_agent.sip.transaction).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from voice_agent.sip import sdp
from voice_agent.sip.auth import DigestAuthenticator
from voice_agent.sip.dialog import Dialog, unusable_target
from voice_agent.sip.dtmf import parse_dtmf_body
from voice_agent.sip.events import (
    CallConfirmed,
    CallEnded,
    DtmfReceived,
    IncomingCall,
    MediaChanged,
    Refused,
    Send,
    TransferAccepted,
    TransferFailed,
    TransferProgress,
)
from voice_agent.sip.events import (
    ServerAction as Action,
)
from voice_agent.sip.guard import FailureLimiter, Network, source_allowed
from voice_agent.sip.message import (
    SipMessage,
    SipParseError,
    build_response,
    name_addr_uri,
    parse_message,
    parse_via,
    quoted,
    required_extensions,
    sipfrag_status,
)
from voice_agent.sip.offer import BadOffer, MediaSecurity, negotiated_offer
from voice_agent.sip.responder import ALLOW, SUPPORTED, Responder, warning
from voice_agent.sip.server_call import ServerCall
from voice_agent.sip.session_keeper import SessionKeeper
from voice_agent.sip.session_timer import TimerSettings, TooSmall, negotiate
from voice_agent.sip.transaction import (
    TIMEOUT_MS,
    Addr,
    Retransmission,
    TransactionKey,
    response_addr,
    transaction_key,
    with_received,
)

# Long enough that a client does not come straight back to a server that is emptying.
DRAIN_RETRY_AFTER_S = 60
# Methods of SIP's extensions a server may be sent and does not take here (405, with Allow).
KNOWN_METHODS = {
    "REGISTER",
    "SUBSCRIBE",
    "REFER",
    "MESSAGE",
    "PUBLISH",
    "PRACK",
}
# "100rel" (RFC 3262) is taken as required by never sending a provisional response but 100,
# which needs no PRACK: a call that requires it gets no 180 (see `ringing`).
SUPPORTED_EXTENSIONS: frozenset[str] = frozenset({"timer", "100rel"})
_REQUIRED = ("via", "from", "to", "call-id", "cseq")


@dataclass(frozen=True)
class UasSettings:
    host: str  # the address in Via, Contact and SDP (the public one, behind NAT)
    port: int  # UDP's
    # The port of each connection transport listened on ("TCP", "TLS"): for Via and Contact
    # of a call that came over it.
    stream_ports: dict[str, int] = field(default_factory=dict)
    allowed_sources: tuple[Network, ...] | None = None  # None: any
    authenticator: DigestAuthenticator | None = None
    max_calls: int = 1000
    max_auth_failures_per_minute: int = 10
    media_security: MediaSecurity = field(default_factory=MediaSecurity)
    timers: TimerSettings = field(default_factory=TimerSettings)  # RFC 4028
    user_agent: str = "voice-agent"


def read_datagram(data: bytes, source: Addr) -> SipMessage | Refused | None:
    """A datagram as a SIP message; None for a keep-alive (RFC 5626 section 3.5.1 sends CRLFs),
    Refused for one that is not SIP."""
    if not data.strip(b"\r\n \t\x00"):
        return None
    try:
        return parse_message(data)
    except SipParseError as error:
        return Refused(source, None, f"not a SIP message: {error}")


@dataclass
class UserAgentServer:
    settings: UasSettings
    make_id: Callable[[], str] = field(default=lambda: secrets.token_hex(8))
    calls: dict[str, ServerCall] = field(default_factory=dict)
    # A draining server (voice_agent.server.drain) answers new INVITEs and OPTIONS with 503:
    # a proxy's OPTIONS probe (Kamailio's dispatcher) then takes this host out of rotation,
    # while the calls in progress go on.
    draining: bool = False

    def __post_init__(self) -> None:
        self.responder = Responder(
            self.settings.host,
            self.settings.port,
            self.settings.stream_ports,
            self.settings.user_agent,
        )
        self.failures = FailureLimiter(self.settings.max_auth_failures_per_minute)
        # Our requests' branches (BYE, REFER, session refresh): their call.
        self._branches: dict[str, str] = {}
        self.sessions = SessionKeeper(
            timers=self.settings.timers,
            media_security=self.settings.media_security,
            user_agent=self.settings.user_agent,
            responder=self.responder,
            make_id=self.make_id,
            branches=self._branches,
            end=lambda call, now_ms, reason: self._end(call, now_ms, reason, bye=True),
            session_body=self._session_body,
        )

    @property
    def live_calls(self) -> int:
        return sum(1 for call in self.calls.values() if call.state != "ended")

    # ---- the clock -----------------------------------------------------------------------

    def next_deadline_ms(self) -> float | None:
        times = [t for call in self.calls.values() if (t := call.deadline_ms) is not None]
        return min(times, default=None)

    def tick(self, now_ms: float) -> list[Action]:
        actions: list[Action] = []
        self.responder.responses.prune(now_ms)
        for call in list(self.calls.values()):
            if call.retransmit is not None:
                if call.retransmit.due(now_ms):
                    actions.append(Send(call.retransmit.data, call.retransmit.addr))
                elif call.retransmit.timed_out(now_ms):
                    call.retransmit = None
                    if call.retransmit_2xx and call.state in ("answered", "confirmed"):
                        # Section 13.3.1.4: the 2xx was never acknowledged.
                        call.waiting_ack_cseq = None
                        actions += self._end(call, now_ms, "no ACK from the caller", bye=True)
            if call.bye is not None:
                if call.bye.due(now_ms):
                    actions.append(Send(call.bye.data, call.bye.addr))
                elif call.bye.timed_out(now_ms):
                    self._forget_bye(call)
            if call.refer is not None:
                if call.refer.due(now_ms):
                    actions.append(Send(call.refer.data, call.refer.addr))
                elif call.refer.timed_out(now_ms):
                    self._forget_refer(call)
                    actions.append(TransferFailed(call.call_id, 408, "no answer to the REFER"))
            actions += self.sessions.tick(call, now_ms)
            if call.expires_ms is not None and now_ms >= call.expires_ms:
                if call.retransmit is None and call.bye is None:
                    self._forget_bye(call)
                    self.sessions.forget(call)
                    del self.calls[call.call_id]
        return actions

    # ---- datagrams in --------------------------------------------------------------------

    def datagram(self, data: bytes, source: Addr, now_ms: float) -> list[Action]:
        read = read_datagram(data, source)
        if not isinstance(read, SipMessage):
            return [read] if read is not None else []
        return self.message(read, source, now_ms)

    def message(self, message: SipMessage, source: Addr, now_ms: float) -> list[Action]:
        """A datagram already parsed (voice_agent.sip.endpoint parses each one once)."""
        if not message.is_request:
            return self._response(message, source, now_ms)
        missing = [name for name in _REQUIRED if message.get(name) is None]
        try:
            if missing:
                raise SipParseError(f"no {', '.join(missing)} header")
            key = transaction_key(message)
            number, cseq_method = message.cseq
            if cseq_method != message.method:
                raise SipParseError(f"CSeq method {cseq_method} is not {message.method}")
            if not message.call_id.strip():
                raise SipParseError("an empty Call-ID")
            for name in ("from", "to", "contact"):
                # Read now: a dialog is made of them later, where a bad one must not surface.
                value = message.get(name)
                if value is not None:
                    name_addr_uri(value)
        except SipParseError as error:
            return self.responder.bad_request(message, source, str(error))
        message = with_received(message, source)
        if message.method == "ACK":
            return self._ack(message, number, now_ms)
        cached = self.responder.responses.get(key, now_ms)
        if cached is not None:
            return [Send(cached, response_addr(message, source))]
        method = message.method
        unsupported = (
            ", ".join(sorted(required_extensions(message) - SUPPORTED_EXTENSIONS))
            if method != "CANCEL"
            else ""
        )
        if unsupported:
            # Section 8.2.2.3: every request but ACK and CANCEL.
            return self.responder.refuse(
                message,
                source,
                420,
                f"Require: {unsupported}",
                headers=[("Unsupported", unsupported)],
            )
        if method == "INVITE":
            return self._invite(message, key, source, now_ms)
        if method == "CANCEL":
            return self._cancel(message, key, source, now_ms)
        if method in ("BYE", "INFO", "NOTIFY", "UPDATE"):
            return self._in_dialog(message, key, source, now_ms)
        if method == "OPTIONS" and self.draining:
            return self.responder.reply(
                message,
                source,
                503,
                key=key,
                now_ms=now_ms,
                headers=[("Retry-After", str(DRAIN_RETRY_AFTER_S)), ("Allow", ALLOW)],
            )
        if method == "OPTIONS":
            return self.responder.reply(
                message,
                source,
                200,
                key=key,
                now_ms=now_ms,
                headers=[("Allow", ALLOW), ("Accept", "application/sdp"), SUPPORTED],
            )
        if method in KNOWN_METHODS:
            return self.responder.refuse(
                message, source, 405, f"{method} is not taken here", headers=[("Allow", ALLOW)]
            )
        return self.responder.refuse(
            message, source, 501, f"unknown method {method}", headers=[("Allow", ALLOW)]
        )

    # ---- the server's decisions ----------------------------------------------------------

    def accept(self, call_id: str, media_host: str, media_port: int, now_ms: float) -> list[Action]:
        """Answer an offered call with media at `media_host:media_port` (200 with the SDP)."""
        call = self.calls.get(call_id)
        if call is None or call.state != "offered":
            return []  # cancelled meanwhile: nothing to answer
        call.media_addr = (media_host, media_port)
        call.dialog = Dialog.from_invite(call.invite, call.local_tag, call.source)
        number, _ = call.invite.cseq
        body = self._session_body(call, call.invite)
        if body is None:  # the offer was checked as the INVITE came in
            return self.reject(call_id, 488, now_ms)
        call.state = "answered"
        return self._send_2xx(call, call.invite, number, body, now_ms)

    def ringing(self, call_id: str) -> list[Action]:
        """180 Ringing for an offered call: the caller hears ringback until the answer."""
        call = self.calls.get(call_id)
        if call is None or call.state != "offered":
            return []
        if "100rel" in required_extensions(call.invite):
            return []  # a 180 would have to be sent reliably (RFC 3262): the caller waits
        # The 180's To tag makes an early dialog (section 12.1.1): the caller may BYE in it.
        call.dialog = Dialog.from_invite(call.invite, call.local_tag, call.source)
        call.last_response = build_response(
            call.invite,
            180,
            to_tag=call.local_tag,
            headers=[*self.responder.common(), ("Contact", self.responder.contact(call.invite))],
        )
        return [Send(call.last_response, call.response_addr)]

    def reject(self, call_id: str, status: int, now_ms: float, reason: str = "") -> list[Action]:
        """Refuse an offered call (486 busy, 503 unavailable, 404 no such agent, ...)."""
        call = self.calls.get(call_id)
        if call is None or call.state != "offered":
            return []
        response = self._final(call, status, reason)
        actions: list[Action] = [Send(response, call.response_addr)]
        call.retransmit = Retransmission.of_request(
            response, call.response_addr, now_ms, over_stream=call.over_stream
        )
        call.retransmit_2xx = False
        call.waiting_ack_cseq = call.invite.cseq[0]
        actions += self._end(call, now_ms, reason or f"refused with {status}")
        return actions

    def hang_up(
        self, call_id: str, now_ms: float, reason: str = "agent ended the call"
    ) -> list[Action]:
        call = self.calls.get(call_id)
        if call is None or call.state == "ended":
            return []
        if call.state == "offered":
            return self.reject(call_id, 480, now_ms, reason)
        if call.state == "answered":
            # Section 15: no BYE before the ACK of our 2xx (or its timeout).
            call.bye_after_ack = True
            return []
        return self._end(call, now_ms, reason, bye=True)

    def transfer(self, call_id: str, target: str, now_ms: float) -> list[Action]:
        """REFER the caller to `target` (a SIP URI), in the confirmed dialog."""
        call = self.calls.get(call_id)
        if call is None or call.state != "confirmed" or call.dialog is None:
            return [TransferFailed(call_id, 481, "the call is not established")]
        if call.refer is not None:
            return [TransferFailed(call_id, 491, "a transfer is already under way")]
        branch = self.make_id()
        local = name_addr_uri(call.dialog.local_uri)
        data = call.dialog.request(
            "REFER",
            via_host=self.responder.local(call.dialog.transport),
            branch=branch,
            headers=[
                ("Refer-To", f"<{target}>"),
                ("Referred-By", f"<{local}>"),
                ("Contact", self.responder.contact(call.invite)),
                ("User-Agent", self.settings.user_agent),
            ],
        )
        destination = call.dialog.destination()
        call.refer = Retransmission.of_request(
            data, destination, now_ms, over_stream=call.dialog.over_stream
        )
        call.refer_branch = parse_via(data.split(b"\r\n")[1].decode()[5:]).branch
        call.referred = True
        self._branches[call.refer_branch or ""] = call.call_id
        return [Send(data, destination)]

    # ---- methods -------------------------------------------------------------------------

    def _invite(
        self, invite: SipMessage, key: TransactionKey, source: Addr, now_ms: float
    ) -> list[Action]:
        call = self.calls.get(invite.call_id)
        if invite.to_tag is not None:
            if call is None or call.dialog is None or not call.dialog.matches(invite):
                return self.responder.refuse(invite, source, 481, "re-INVITE for an unknown dialog")
            return self._reinvite(call, invite, key, source, now_ms)
        if call is not None:
            if key == call.invite_key:
                return [Send(call.last_response, call.response_addr)] if call.last_response else []
            return self.responder.refuse(
                invite, source, 482, "a second INVITE for a Call-ID in use"
            )
        host = source[0]
        if not source_allowed(host, self.settings.allowed_sources):
            return self.responder.refuse(invite, source, 403, f"source {host} is not allowed")
        if self.failures.blocked(host, now_ms):
            return [Refused(source, None, f"{host} failed authentication too often")]
        if self.draining:
            return self.responder.refuse(
                invite,
                source,
                503,
                "draining: call another server",
                headers=[("Retry-After", str(DRAIN_RETRY_AFTER_S))],
            )
        username = None
        authenticator = self.settings.authenticator
        if authenticator is not None:
            verdict = authenticator.verify(
                "INVITE", invite.get("authorization") or invite.get("proxy-authorization"), now_ms
            )
            if not verdict.ok:
                presented = invite.get("authorization") or invite.get("proxy-authorization")
                if presented is not None and not verdict.stale:
                    self.failures.failed(host, now_ms)
                return self.responder.refuse(
                    invite,
                    source,
                    401,
                    f"authentication: {verdict.reason}",
                    headers=authenticator.challenges(now_ms, stale=verdict.stale),
                )
            username = verdict.username
        # Ended calls linger 32 s for retransmissions: bounded too, against INVITE+CANCEL floods.
        if (
            self.live_calls >= self.settings.max_calls
            or len(self.calls) >= 4 * self.settings.max_calls
        ):
            return self.responder.refuse(
                invite, source, 503, "at max_calls", headers=[("Retry-After", "5")]
            )
        unusable = unusable_target(invite)
        if unusable is not None:
            return self.responder.refuse(invite, source, 400, unusable)
        try:
            negotiated = negotiated_offer(invite, self.settings.media_security)
        except BadOffer as bad:
            return self.responder.refuse(
                invite, source, bad.status, bad.reason, headers=bad.headers
            )
        try:
            timer = negotiate(invite, self.settings.timers)
        except SipParseError as error:
            return self.responder.refuse(invite, source, 400, str(error))
        if isinstance(timer, TooSmall):
            return self.responder.refuse(
                invite,
                source,
                422,
                "session interval too small",
                headers=[("Min-SE", str(timer.min_se_s))],
            )
        call = ServerCall(
            call_id=invite.call_id,
            invite=invite,
            invite_key=key,
            source=source,
            response_addr=response_addr(invite, source),
            local_tag=self.make_id(),
            negotiated=negotiated,
            timer=timer,
        )
        self.calls[call.call_id] = call
        call.last_response = build_response(invite, 100, headers=self.responder.common())
        return [
            Send(call.last_response, call.response_addr),
            IncomingCall(call.call_id, invite, source, negotiated, username),
        ]

    def _reinvite(
        self, call: ServerCall, invite: SipMessage, key: TransactionKey, source: Addr, now_ms: float
    ) -> list[Action]:
        assert call.dialog is not None
        if key == call.reinvite_key and call.reinvite_response:
            return [Send(call.reinvite_response, call.response_addr)]
        number, _ = invite.cseq
        if call.state == "ended":
            return self.responder.refuse(invite, source, 481, "re-INVITE for an ended call")
        if call.state != "confirmed" or (call.retransmit is not None and call.retransmit_2xx):
            # Section 14.2: a second INVITE before the first has its final response (500 with
            # Retry-After); taken here too until the last 2xx's ACK, one offer at a time.
            return self.responder.refuse(
                invite, source, 500, "an INVITE is still under way", headers=[("Retry-After", "1")]
            )
        if number <= call.dialog.remote_cseq:
            return self.responder.refuse(
                invite, source, 500, "CSeq lower than the dialog's", headers=[("Retry-After", "1")]
            )
        call.dialog.remote_cseq = number
        call.reinvite_key = key
        refresh = call.refresh
        if refresh is not None and refresh.method == "INVITE" and refresh.final is None:
            # Section 14.2: our own re-INVITE (a session refresh) crossed this one.
            return self._refuse_reinvite(call, invite, 491, "our re-INVITE is under way", now_ms)
        try:
            timer = negotiate(invite, self.settings.timers, current=call.timer)
            negotiated = negotiated_offer(
                invite, self.settings.media_security, keep=sdp.codec_in_use(call.negotiated)
            )
        except SipParseError as error:
            return self._refuse_reinvite(call, invite, 400, str(error), now_ms)
        except BadOffer as bad:
            return self._refuse_reinvite(call, invite, bad.status, bad.reason, now_ms, bad.headers)
        if isinstance(timer, TooSmall):
            return self._refuse_reinvite(
                call,
                invite,
                422,
                "session interval too small",
                now_ms,
                [("Min-SE", str(timer.min_se_s))],
            )
        actions: list[Action] = []
        if negotiated is not None:
            call.negotiated = negotiated
            actions.append(MediaChanged(call.call_id, negotiated))
        body = self._session_body(call, invite)
        if body is None:
            return self.responder.refuse(invite, source, 488, "re-INVITE offer not acceptable")
        call.timer = timer
        return self._send_2xx(call, invite, number, body, now_ms) + actions

    def _refuse_reinvite(
        self,
        call: ServerCall,
        invite: SipMessage,
        status: int,
        reason: str,
        now_ms: float,
        headers: list[tuple[str, str]] | None = None,
    ) -> list[Action]:
        """Section 14.2: a refused re-INVITE leaves the session as it was. The refusal is
        retransmitted until its ACK (section 17.2.1), without ending the call if none comes."""
        extra = [*(headers or []), warning(reason)]
        response = build_response(
            invite, status, to_tag=call.local_tag, headers=[*self.responder.common(), *extra]
        )
        call.reinvite_response = response
        call.retransmit = Retransmission.of_request(
            response, call.response_addr, now_ms, over_stream=call.over_stream
        )
        call.retransmit_2xx = False
        call.waiting_ack_cseq = invite.cseq[0]
        return [
            Send(response, call.response_addr),
            Refused(call.source, status, f"re-INVITE: {reason}"),
        ]

    def _ack(self, ack: SipMessage, number: int, now_ms: float) -> list[Action]:
        call = self.calls.get(ack.call_id)
        if (
            call is None
            or call.waiting_ack_cseq != number
            or ack.to_tag != call.local_tag
            or (ack.from_tag or "") != (call.invite.from_tag or "")
        ):
            return []  # a retransmitted or stray ACK, or another dialog's: absorbed
        call.retransmit = None
        call.waiting_ack_cseq = None
        if call.state == "ended":
            return []
        actions: list[Action] = []
        if call.our_offer is not None:
            offer, call.our_offer = call.our_offer, None
            try:
                answer = sdp.parse_sdp(ack.body) if ack.body else None
                if answer is None:
                    raise sdp.SdpError("the ACK has no SDP answer to the offer in our 200")
                call.negotiated = sdp.negotiate_answer(offer, answer)
            except sdp.SdpError as error:
                return self._end(call, now_ms, f"bad answer in the ACK: {error}", bye=True)
            if call.state == "confirmed":
                actions.append(MediaChanged(call.call_id, call.negotiated))
        if call.state == "answered":
            call.state = "confirmed"
            assert call.negotiated is not None
            actions.append(CallConfirmed(call.call_id, call.negotiated))
            if call.bye_after_ack:
                actions += self._end(call, now_ms, "agent ended the call", bye=True)
        return actions

    def _cancel(
        self, cancel: SipMessage, key: TransactionKey, source: Addr, now_ms: float
    ) -> list[Action]:
        call = self.calls.get(cancel.call_id)
        invite_key = (*key[:-1], "INVITE")
        if call is not None and call.reinvite_key == invite_key:
            # A re-INVITE is answered at once: nothing left to cancel (section 9.2).
            return self.responder.reply(
                cancel, source, 200, key=key, now_ms=now_ms, to_tag=call.local_tag
            )
        if call is None or call.invite_key != invite_key:
            return self.responder.refuse(cancel, source, 481, "CANCEL matches no INVITE")
        # Section 9.2: the CANCEL's response carries the To tag the INVITE's would.
        actions = self.responder.reply(
            cancel, source, 200, key=key, now_ms=now_ms, to_tag=call.local_tag
        )
        if call.state == "offered":
            actions += self.reject(call.call_id, 487, now_ms, "caller cancelled before the answer")
        return actions

    def _in_dialog(
        self, request: SipMessage, key: TransactionKey, source: Addr, now_ms: float
    ) -> list[Action]:
        call = self.calls.get(request.call_id)
        if call is None or call.dialog is None or not call.dialog.matches(request):
            return self.responder.refuse(
                request,
                source,
                481,
                f"{request.method} for an unknown dialog",
                key=key,
                now_ms=now_ms,
            )
        number, _ = request.cseq
        if number < call.dialog.remote_cseq:
            # Section 12.2.2: out of order.
            return self.responder.refuse(
                request, source, 500, "CSeq lower than the dialog's", key=key, now_ms=now_ms
            )
        call.dialog.remote_cseq = number
        if request.method == "NOTIFY":
            return self._notify(call, request, key, source, now_ms)
        if request.method == "UPDATE":
            return self.sessions.update(call, request, key, source, now_ms)
        actions = self.responder.reply(request, source, 200, key=key, now_ms=now_ms)
        if request.method == "BYE":
            if call.state == "offered":
                # A BYE in the early dialog (section 15): the INVITE ends with 487.
                actions += self.reject(
                    call.call_id, 487, now_ms, "caller hung up before the answer"
                )
            elif call.state != "ended":
                actions += self._end(call, now_ms, "caller hung up")
        elif call.state != "ended":
            digit = parse_dtmf_body(request.get("content-type") or "", request.body)
            if digit is not None:
                actions.append(DtmfReceived(call.call_id, digit))
        return actions

    def _notify(
        self,
        call: ServerCall,
        request: SipMessage,
        key: TransactionKey,
        source: Addr,
        now_ms: float,
    ) -> list[Action]:
        event = (request.get("event") or "").split(";", 1)[0].strip().lower()
        if not call.referred or event != "refer":
            return self.responder.refuse(
                request, source, 481, "no such subscription", key=key, now_ms=now_ms
            )
        actions = self.responder.reply(request, source, 200, key=key, now_ms=now_ms)
        status, reason = sipfrag_status(request.body)
        state = (request.get("subscription-state") or "").split(";", 1)[0].strip().lower()
        if status is not None and call.state != "ended":
            final = status >= 200 or state == "terminated"
            actions.append(TransferProgress(call.call_id, status, reason, final))
        return actions

    def _response(self, response: SipMessage, source: Addr, now_ms: float) -> list[Action]:
        try:
            branch = response.vias[0].branch if response.get("via") else None
        except SipParseError:
            branch = None
        call_id = self._branches.get(branch or "")
        call = self.calls.get(call_id or "")
        status = response.status or 0
        if call is not None and call.refresh is not None and branch == call.refresh.branch:
            return self.sessions.answered(call, response, now_ms)
        if call is not None and call.refer is not None and branch == call.refer_branch:
            if status < 200:
                return []
            self._forget_refer(call)
            if status < 300:
                return [TransferAccepted(call.call_id)]
            call.referred = False
            return [TransferFailed(call.call_id, status, response.reason or "")]
        if call is None or call.bye is None:
            return [Refused(source, None, f"a response ({response.status}) that matches nothing")]
        if status >= 200:
            self._forget_bye(call)
        return []

    # ---- building and sending ------------------------------------------------------------

    def _session_body(self, call: ServerCall, request: SipMessage) -> bytes | None:
        """The SDP of our 2xx: the answer to the request's offer, or our offer if it had none."""
        assert call.media_addr is not None
        host, port = call.media_addr
        call.sdp_version += 1
        session_id = str(abs(hash(call.call_id)) % 10**10)
        if request.body and call.negotiated is not None:  # the request's, read as it came
            return sdp.build_answer(
                sdp.parse_sdp(request.body),
                call.negotiated,
                address=host,
                port=port,
                session_id=session_id,
                version=call.sdp_version,
            )
        body = sdp.build_offer(
            address=host, port=port, session_id=session_id, version=call.sdp_version
        )
        call.our_offer = sdp.parse_sdp(body)
        return body

    def _send_2xx(
        self, call: ServerCall, request: SipMessage, number: int, body: bytes, now_ms: float
    ) -> list[Action]:
        headers = [
            *self.responder.common(),
            *(("Record-Route", route) for route in request.get_all("record-route")),
            ("Contact", self.responder.contact(request)),
            ("Allow", ALLOW),
            SUPPORTED,
            *self.sessions.timer_headers(call, now_ms),
            ("Content-Type", "application/sdp"),
        ]
        call.session_body = body
        response = build_response(request, 200, to_tag=call.local_tag, headers=headers, body=body)
        if request is call.invite:
            call.last_response = response
        else:
            call.reinvite_response = response
        call.retransmit = Retransmission(response, call.response_addr, now_ms)
        call.retransmit_2xx = True
        call.waiting_ack_cseq = number
        return [Send(response, call.response_addr)]

    def _final(self, call: ServerCall, status: int, reason: str) -> bytes:
        headers = self.responder.common()
        if reason:
            headers = [*headers, ("Reason", f'SIP;cause={status};text="{quoted(reason)}"')]
        response = build_response(call.invite, status, to_tag=call.local_tag, headers=headers)
        call.last_response = response
        return response

    def _end(
        self, call: ServerCall, now_ms: float, reason: str, *, bye: bool = False
    ) -> list[Action]:
        actions: list[Action] = []
        if bye and call.dialog is not None and call.bye is None:
            branch = self.make_id()
            data = call.dialog.request(
                "BYE",
                via_host=self.responder.local(call.dialog.transport),
                branch=branch,
                headers=[("User-Agent", self.settings.user_agent)],
            )
            destination = call.dialog.destination()
            call.bye = Retransmission.of_request(
                data, destination, now_ms, over_stream=call.dialog.over_stream
            )
            call.bye_branch = parse_via(data.split(b"\r\n")[1].decode()[5:]).branch
            self._branches[call.bye_branch or ""] = call.call_id
            actions.append(Send(data, destination))
        self._forget_refer(call)  # a transfer under way ends with the call
        if call.refresh is not None:
            call.refresh.retransmit = None  # its final response still gets its ACK
        if call.state != "ended":
            call.state = "ended"
            actions.append(CallEnded(call.call_id, reason))
        call.expires_ms = now_ms + TIMEOUT_MS
        return actions

    def _forget_refer(self, call: ServerCall) -> None:
        call.refer = None
        if call.refer_branch is not None:
            self._branches.pop(call.refer_branch, None)
            call.refer_branch = None

    def _forget_bye(self, call: ServerCall) -> None:
        call.bye = None
        if call.bye_branch is not None:
            self._branches.pop(call.bye_branch, None)
            call.bye_branch = None

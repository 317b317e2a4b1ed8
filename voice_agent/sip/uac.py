"""The SIP user agent client, sans-I/O: outbound calls placed through a trunk (RFC 3261 sections
8.1, 9.1, 12.1.2, 13.2, 15, 17.1 and 22.2, RFC 3581's rport, RFC 6026's accepted state, RFC
8760's digest algorithms; offer/answer through voice_agent.sip.sdp). Datagrams and a clock in,
datagrams to send and call events out, as voice_agent.sip.uas does for calls that come in.

    uac = UserAgentClient(UacSettings(host, port, trunk=("198.51.100.7", 5060)))
    actions = uac.dial("call-1", "sip:+14155550123@trunk.example", "sip:+14155550100@us",
                       media_host, media_port, now_ms, credentials=Credentials("user", "pw"))
    # Dialing names the Call-ID; then Ringing, and Answered(negotiated) or Failed(status, ...)
    actions = uac.datagram(data, source, now_ms)   # or message(): voice_agent.sip.endpoint
    actions = uac.tick(now_ms)                     # at uac.next_deadline_ms()
    uac.hang_up(call_id, now_ms)                   # BYE once answered, CANCEL before

What is done how:
- dial: an INVITE with our SDP offer (PCMU, PCMA, telephone-event 101) to the trunk, built as
  section 8.1.1 says: Request-URI and To the target, From with our tag, a Call-ID, CSeq 1,
  Max-Forwards 70, a Via with an RFC 3261 branch and rport (RFC 3581), a Contact. Retransmitted
  at T1 doubling (timer A, no cap) until a response; none in 64*T1 (timer B) fails the call
  with 408, "no answer from the trunk" (section 17.1.1.2).
- 1xx: retransmissions stop (the Proceeding state). 180 and 183 report Ringing, with the early
  media a 183's SDP describes. Nothing times the Proceeding state out but the ring timeout
  (dial's ring_timeout_ms, else UacSettings.ring_timeout_ms: 60 s), counted from dial.
- 2xx: the dialog is made from it (section 12.1.2: remote target from its Contact, route set
  from its Record-Route reversed, remote tag from its To) and ACKed as a request of that dialog
  with the INVITE's CSeq and a new branch (13.2.2.4); retransmitted 2xx get that ACK again
  (RFC 6026's accepted state lasts as long as the call here). Its SDP answer negotiated against
  our offer (RFC 3264): Answered; an unusable answer is ACKed, then BYEd, and fails with 488.
  A 2xx of a second fork (another To tag) is ACKed and BYEd at once (13.2.2.4).
- 3xx-6xx: ACKed in the INVITE's own transaction, with its branch (17.1.1.3), again for each
  retransmission of it; the call fails with the status and an outcome: 486/600 busy, 480/408/487
  no answer, 404/484/604 bad number, 401/403/407 refused, others failed. Redirects (3xx) are not
  followed (section 8.1.3.4 is not covered).
- 401/407 with a digest challenge (WWW-Authenticate / Proxy-Authenticate, section 22.2): one
  new INVITE (CSeq + 1, a new branch) with Authorization / Proxy-Authorization answering the
  topmost challenge we can (MD5 or SHA-256, qop=auth with a cnonce and nc, or RFC 2069's form
  without qop; opaque echoed). A second challenge fails the call (refused), unless it says
  stale=true: a fresh nonce for the same password earns one more try (RFC 7616 section 3.3).
  A challenged BYE is resent once with credentials the same way.
- cancel (or hang_up before the answer, or the ring timeout): a CANCEL of the INVITE (section
  9.1), sent once a provisional response has come (not before, as 9.1 says), retransmitted
  until its final response; the INVITE's 487 is ACKed and the call fails as asked (cancelled,
  or no answer for the ring timeout). A 2xx that crosses the CANCEL is ACKed and BYEd. No final
  response within 64*T1 of the CANCEL ends the call with 408 (9.1).
- In the dialog, from the callee: BYE gets 200 and ends the call ("callee hung up"); INFO with
  application/dtmf-relay or application/dtmf gets 200 and a digit; OPTIONS 200 with Allow; a
  re-INVITE with an offer gets 200 with our answer (retransmitted until its ACK, 13.3.1.4) and
  MediaChanged, 488 when no codec matches or it has no offer (no delayed offer here); other
  methods SIP knows 405, unknown ones 501; requests of no dialog of ours 481; a CSeq below the
  dialog's 500 (12.2.2). Retransmitted requests get the cached response (17.2.2).
- hang_up once answered: our BYE (section 15), retransmitted until answered or 64*T1.
- Datagrams that do not parse, or responses matching no transaction, are dropped: no state.

A call ended or failed is kept 32 s (timer D, and for retransmissions of the final responses),
then forgotten. `max_calls` bounds the live calls, and four times it the calls kept.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from voice_agent.sip import sdp
from voice_agent.sip.auth import Credentials, digest_authorization, parse_digest
from voice_agent.sip.client_requests import (
    ALLOW,
    ack_for_non_2xx,
    cancel_request,
    challenge_header,
    check_target,
    checked_headers,
    dialog_from_response,
    from_name_addr,
    invite_request,
    outcome_of,
    request_uri,
)
from voice_agent.sip.dialog import Dialog
from voice_agent.sip.dtmf import parse_dtmf_body
from voice_agent.sip.events import (
    Answered,
    CallEnded,
    Dialing,
    DtmfReceived,
    Failed,
    MediaChanged,
    Outcome,
    Ringing,
    Send,
)
from voice_agent.sip.message import (
    SIP_VERSION,
    SipMessage,
    SipParseError,
    build_response,
    host_in_uri,
    parse_message,
    required_extensions,
)
from voice_agent.sip.offer import BadOffer, read_offer
from voice_agent.sip.placed_call import InviteTransaction, OutgoingRequest, PlacedCall
from voice_agent.sip.transaction import (
    MAGIC_COOKIE,
    TIMEOUT_MS,
    Addr,
    ResponseCache,
    Retransmission,
    TransactionKey,
    response_addr,
    transaction_key,
    with_received,
)

DEFAULT_RING_TIMEOUT_MS = 60_000.0
MAX_FORKS = 4  # 2xx of other forks ACKed and BYEd per call; past it they are only ACKed
_KNOWN_METHODS = {
    "REGISTER",
    "SUBSCRIBE",
    "NOTIFY",
    "REFER",
    "MESSAGE",
    "PUBLISH",
    "PRACK",
    "UPDATE",
}
_REQUIRED = ("via", "from", "to", "call-id", "cseq")
_CALL_ID_CHARS = re.compile(r"[^A-Za-z0-9.!%*_+`'~@-]")

Ended = CallEnded  # the call ended after its answer: callee hung up, or we did


@dataclass(frozen=True)
class UacSettings:
    host: str  # the address in Via, Contact and SDP origin (the public one, behind NAT)
    port: int
    trunk: Addr | None = None  # where INVITEs go unless dial names another
    max_calls: int = 1000
    ring_timeout_ms: float = DEFAULT_RING_TIMEOUT_MS
    user_agent: str = "voice-agent"


Action = Send | Dialing | Ringing | Answered | Failed | CallEnded | DtmfReceived | MediaChanged


@dataclass
class UserAgentClient:
    settings: UacSettings
    make_id: Callable[[], str] = field(default=lambda: secrets.token_hex(8))
    calls: dict[str, PlacedCall] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.responses = ResponseCache()

    @property
    def live_calls(self) -> int:
        return sum(1 for call in self.calls.values() if call.state != "ended")

    # ---- placing and ending calls --------------------------------------------------------

    def dial(
        self,
        call_id_hint: str,
        target_uri: str,
        from_uri: str,
        media_host: str,
        media_port: int,
        now_ms: float,
        credentials: Credentials | None = None,
        *,
        trunk: Addr | None = None,
        ring_timeout_ms: float | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> list[Action]:
        """Place a call to `target_uri` (sip:, sips: or tel:) from `from_uri` (a URI or a
        name-addr) with media at `media_host:media_port`. The Call-ID is `call_id_hint` if it
        is free and usable as one, else made from it: Dialing says which. `headers` are added to
        the INVITE (P-Asserted-Identity, X-...). Raises ValueError for values that would not
        make a valid request, or with no trunk to send it to."""
        destination = trunk or self.settings.trunk
        if destination is None:
            raise ValueError("no trunk to send the INVITE to: in UacSettings or dial's trunk")
        check_target(target_uri)
        from_value = from_name_addr(from_uri)
        extra = checked_headers(headers)
        call_id = self._call_id(call_id_hint)
        if self.live_calls >= self.settings.max_calls or len(self.calls) >= 4 * max(
            1, self.settings.max_calls
        ):
            return [
                Dialing(call_id, target_uri),
                Failed(call_id, 503, "at max_calls for outbound calls", "failed"),
            ]
        session_id = str(int.from_bytes(hashlib.blake2s(call_id.encode()).digest()[:6], "big"))
        body = sdp.build_offer(
            address=media_host, port=media_port, session_id=session_id, version=1
        )
        local_tag = self.make_id()
        timeout = self.settings.ring_timeout_ms if ring_timeout_ms is None else ring_timeout_ms
        call = PlacedCall(
            call_id=call_id,
            target_uri=target_uri,
            from_value=f"{from_value};tag={local_tag}",
            local_tag=local_tag,
            trunk=destination,
            media=(media_host, media_port),
            offer=sdp.parse_sdp(body),
            offer_body=body,
            session_id=session_id,
            credentials=credentials,
            extra_headers=extra,
            dialed_ms=now_ms,
            ring_deadline_ms=now_ms + timeout,
        )
        self.calls[call_id] = call
        return [Dialing(call_id, target_uri), *self._send_invite(call, 1, now_ms)]

    def cancel(
        self, call_id: str, now_ms: float, reason: str = "cancelled by the agent"
    ) -> list[Action]:
        """Give up on a call not yet answered (section 9.1); Failed follows its 487."""
        call = self.calls.get(call_id)
        if call is None:
            return []
        return self._cancel(call, now_ms, reason, "cancelled")

    def hang_up(
        self, call_id: str, now_ms: float, reason: str = "agent ended the call"
    ) -> list[Action]:
        """End a call: BYE once answered (section 15), CANCEL before."""
        call = self.calls.get(call_id)
        if call is None or call.state == "ended":
            return []
        if call.state != "established":
            return self._cancel(call, now_ms, reason, "cancelled")
        assert call.dialog is not None
        call.state = "ended"
        call.expires_ms = now_ms + TIMEOUT_MS
        return [*self._bye(call, call.dialog, now_ms), CallEnded(call.call_id, reason)]

    # ---- the clock -----------------------------------------------------------------------

    def next_deadline_ms(self) -> float | None:
        times = [t for call in self.calls.values() if (t := call.deadline_ms) is not None]
        return min(times, default=None)

    def tick(self, now_ms: float) -> list[Action]:
        actions: list[Action] = []
        self.responses.prune(now_ms)
        for call in list(self.calls.values()):
            timer = call.invite_retransmit
            if timer is not None:
                if timer.due(now_ms):
                    actions.append(Send(timer.data, timer.addr))
                elif timer.timed_out(now_ms):
                    # Timer B (section 17.1.1.2): not a word from the trunk.
                    call.invite_retransmit = None
                    if call.state == "calling":
                        outcome = call.cancel_outcome if call.cancel_reason else "no answer"
                        actions += self._fail(
                            call, 408, "no answer from the trunk", outcome, now_ms
                        )
            if (
                call.state in ("calling", "proceeding")
                and call.cancel_reason is None
                and now_ms >= call.ring_deadline_ms
            ):
                seconds = (call.ring_deadline_ms - call.dialed_ms) / 1000
                actions += self._cancel(call, now_ms, f"no answer in {seconds:g} s", "no answer")
            if call.cancel_deadline_ms is not None and now_ms >= call.cancel_deadline_ms:
                # Section 9.1: no final response 64*T1 after the CANCEL.
                call.cancel_deadline_ms = None
                if call.state in ("calling", "proceeding"):
                    actions += self._fail(
                        call,
                        408,
                        f"{call.cancel_reason}; no final response to the CANCELled INVITE",
                        call.cancel_outcome,
                        now_ms,
                    )
            for branch, out in list(call.outgoing.items()):
                if out.retransmit.due(now_ms):
                    actions.append(Send(out.retransmit.data, out.retransmit.addr))
                elif out.retransmit.timed_out(now_ms):
                    del call.outgoing[branch]  # timer F: given up on
            timer = call.reinvite_retransmit
            if timer is not None:
                if timer.due(now_ms):
                    actions.append(Send(timer.data, timer.addr))
                elif timer.timed_out(now_ms):
                    # Section 13.3.1.4: our 2xx to the re-INVITE was never ACKed.
                    call.reinvite_retransmit = None
                    call.reinvite_cseq = None
                    if call.state == "established" and call.dialog is not None:
                        call.state = "ended"
                        call.expires_ms = now_ms + TIMEOUT_MS
                        actions += self._bye(call, call.dialog, now_ms)
                        actions.append(CallEnded(call.call_id, "no ACK to our 200 (re-INVITE)"))
            if call.expires_ms is not None and now_ms >= call.expires_ms and not call.busy:
                del self.calls[call.call_id]
        return actions

    # ---- datagrams in --------------------------------------------------------------------

    def datagram(self, data: bytes, source: Addr, now_ms: float) -> list[Action]:
        """A datagram for one of our calls; anything else is dropped."""
        if not data.strip(b"\r\n \t\x00"):
            return []
        try:
            message = parse_message(data)
        except SipParseError:
            return []
        return self.message(message, source, now_ms)

    def message(self, message: SipMessage, source: Addr, now_ms: float) -> list[Action]:
        """A datagram already parsed (voice_agent.sip.endpoint parses each one once); one
        that is not for one of our calls is dropped."""
        try:
            call = self.calls.get(message.call_id)
        except SipParseError:
            return []
        if call is None:
            return []
        if message.is_request:
            return self._request(call, message, source, now_ms)
        try:
            return self._response(call, message, now_ms)
        except SipParseError:
            return []  # a response whose headers do not read matches nothing

    # ---- responses -----------------------------------------------------------------------

    def _response(self, call: PlacedCall, response: SipMessage, now_ms: float) -> list[Action]:
        """Section 17.1.3: a response belongs to the client transaction of its top Via's
        branch and its CSeq method."""
        if not response.get("via"):
            return []
        branch = response.vias[0].branch or ""
        number, method = response.cseq
        status = response.status or 0
        if not 100 <= status <= 699:
            return []
        if method == "INVITE":
            for invite in call.invites:
                if invite.branch == branch and invite.cseq == number:
                    if invite is call.invite:
                        return self._invite_response(call, response, status, now_ms)
                    if invite.ack is not None and status >= 300:
                        # A retransmission of an earlier INVITE's final response (17.1.1.3).
                        return [Send(invite.ack, call.trunk)]
            return []
        out = call.outgoing.get(branch)
        if out is None or out.method != method or status < 200:
            return []
        del call.outgoing[branch]
        if (
            method == "BYE"
            and status in (401, 407)
            and not out.authorized
            and call.credentials is not None
            and out.dialog is not None
        ):
            authorization = self._authorize(call, response, status, "BYE", out.dialog)
            if authorization is not None:
                return self._bye(call, out.dialog, now_ms, authorization)
        return []

    def _invite_response(
        self, call: PlacedCall, response: SipMessage, status: int, now_ms: float
    ) -> list[Action]:
        invite = call.invite
        if status < 200:
            return self._provisional(call, response, status, now_ms)
        if status < 300:
            return self._success(call, response, now_ms)
        if call.state == "established":
            return []  # another fork's failure after the answer
        if invite.ack is not None:
            return [Send(invite.ack, call.trunk)]  # a retransmission: the ACK again
        call.invite_retransmit = None
        invite.ack = ack_for_non_2xx(invite.message, response)
        actions: list[Action] = [Send(invite.ack, call.trunk)]
        if call.state == "ended":
            return actions
        if call.cancel_reason is not None:
            call.cancel_deadline_ms = None
            return actions + self._fail(
                call, status, call.cancel_reason, call.cancel_outcome, now_ms
            )
        if status in (401, 407):
            return actions + self._challenged(call, response, status, now_ms)
        reason = response.reason.strip()[:100] or f"refused with {status}"
        return actions + self._fail(call, status, reason, outcome_of(status), now_ms)

    def _provisional(
        self, call: PlacedCall, response: SipMessage, status: int, now_ms: float
    ) -> list[Action]:
        actions: list[Action] = []
        if call.state == "calling":
            # Section 17.1.1.2: the Proceeding state; timers A and B stop.
            call.state = "proceeding"
            call.invite_retransmit = None
            if call.cancel_reason is not None:
                actions += self._send_cancel(call, now_ms)  # held until now (section 9.1)
        if call.state != "proceeding" or status not in (180, 183) or call.cancel_reason:
            return actions  # no ringing to report while a CANCEL is under way
        early: sdp.Negotiated | None = None
        if response.body:
            try:
                early = sdp.negotiate_answer(call.offer, sdp.parse_sdp(response.body))
            except sdp.SdpError:
                early = None
        if not call.ringing or (early is not None and not call.early_media):
            call.ringing = True
            call.early_media = early is not None
            actions.append(Ringing(call.call_id, status, early))
        return actions

    def _success(self, call: PlacedCall, response: SipMessage, now_ms: float) -> list[Action]:
        to_tag = response.to_tag or ""
        if call.dialog is not None:
            if to_tag == call.dialog.remote_tag:
                # A retransmitted 2xx: the same ACK again (section 13.2.2.4).
                assert call.ack_2xx is not None
                return [Send(call.ack_2xx, call.dialog.destination())]
            return self._fork(call, response, to_tag, now_ms)
        dialog = dialog_from_response(
            response,
            local_uri=call.from_value,
            local_tag=call.local_tag,
            target_uri=call.target_uri,
            local_cseq=call.invite.cseq,
            source=call.trunk,
        )
        call.dialog = dialog
        call.ack_2xx = self._ack_2xx(call, dialog)
        call.invite_retransmit = None
        call.cancel_deadline_ms = None
        actions: list[Action] = [Send(call.ack_2xx, dialog.destination())]
        if call.state == "ended" or call.cancel_reason is not None:
            # Answered after we gave up, or as the CANCEL crossed it: section 15's BYE.
            actions += self._bye(call, dialog, now_ms)
            if call.state != "ended":
                reason = f"{call.cancel_reason}; answered meanwhile, hung up"
                actions += self._fail(call, 487, reason, call.cancel_outcome, now_ms)
            return actions
        try:
            content_type = (response.get("content-type") or "").split(";", 1)[0].strip().lower()
            if not response.body or content_type != "application/sdp":
                raise sdp.SdpError("the 2xx has no SDP answer to our offer")
            negotiated = sdp.negotiate_answer(call.offer, sdp.parse_sdp(response.body))
        except sdp.SdpError as error:
            actions += self._bye(call, dialog, now_ms)
            return actions + self._fail(call, 488, f"unusable answer: {error}", "failed", now_ms)
        call.state = "established"
        call.negotiated = negotiated
        return [*actions, Answered(call.call_id, negotiated)]

    def _fork(
        self, call: PlacedCall, response: SipMessage, to_tag: str, now_ms: float
    ) -> list[Action]:
        """A 2xx from a second fork (section 13.2.2.4): ACK it, and BYE the dialog it made."""
        if to_tag in call.forks:
            ack, where = call.forks[to_tag]
            return [Send(ack, where)]
        dialog = dialog_from_response(
            response,
            local_uri=call.from_value,
            local_tag=call.local_tag,
            target_uri=call.target_uri,
            local_cseq=call.invite.cseq,
            source=call.trunk,
        )
        ack = self._ack_2xx(call, dialog)
        actions: list[Action] = [Send(ack, dialog.destination())]
        if len(call.forks) < MAX_FORKS:
            call.forks[to_tag] = (ack, dialog.destination())
            actions += self._bye(call, dialog, now_ms)
        return actions

    def _challenged(
        self, call: PlacedCall, response: SipMessage, status: int, now_ms: float
    ) -> list[Action]:
        """Section 22.2: answer the challenge once with the INVITE again (CSeq + 1)."""
        if call.credentials is None:
            return self._fail(
                call, status, "the trunk asks for credentials and none are set", "refused", now_ms
            )
        stale = any(
            (parse_digest(value) or {}).get("stale", "").lower() == "true"
            for value in response.get_all(challenge_header(status))
        )
        if call.auth_tries >= 1 and not (stale and not call.stale_retried):
            return self._fail(call, status, "the trunk refused our credentials", "refused", now_ms)
        authorization = self._authorize(call, response, status, "INVITE", None)
        if authorization is None:
            return self._fail(
                call, status, "no digest challenge we can answer (MD5, SHA-256)", "refused", now_ms
            )
        if call.auth_tries >= 1:
            call.stale_retried = True
        call.auth_tries += 1
        call.auth_header = authorization
        call.state = "calling"
        return self._send_invite(call, call.invite.cseq + 1, now_ms)

    def _authorize(
        self,
        call: PlacedCall,
        response: SipMessage,
        status: int,
        method: str,
        dialog: Dialog | None,
    ) -> tuple[str, str] | None:
        assert call.credentials is not None
        uri = call.target_uri if dialog is None else request_uri(dialog)
        for challenge in response.get_all(challenge_header(status)):
            value = digest_authorization(
                challenge,
                method=method,
                uri=uri,
                credentials=call.credentials,
                cnonce=self.make_id(),
            )
            if value is not None:
                name = "Authorization" if status == 401 else "Proxy-Authorization"
                return name, value
        return None

    # ---- requests from the callee --------------------------------------------------------

    def _request(
        self, call: PlacedCall, request: SipMessage, source: Addr, now_ms: float
    ) -> list[Action]:
        try:
            missing = [name for name in _REQUIRED if request.get(name) is None]
            if missing:
                raise SipParseError(f"no {', '.join(missing)} header")
            key = transaction_key(request)
            number, cseq_method = request.cseq
            if cseq_method != request.method:
                raise SipParseError(f"CSeq method {cseq_method} is not {request.method}")
            request.from_tag  # noqa: B018 - read now, so a bad one is a 400 here
            to_tag = request.to_tag
            request = with_received(request, source)
            addr = response_addr(request, source)
        except SipParseError:
            if request.method == "ACK":
                return []
            return self._bad_request(request, source)
        method = request.method
        if method == "ACK":
            if call.reinvite_cseq == number and to_tag == call.local_tag:
                call.reinvite_retransmit = None
                call.reinvite_cseq = None
            return []  # ACKs are never answered
        cached = self.responses.get(key, now_ms)
        if cached is not None:
            return [Send(cached, addr)]
        if method == "INVITE" and key == call.reinvite_key and call.reinvite_response:
            return [Send(call.reinvite_response, addr)]
        dialog = call.dialog
        if dialog is None or not dialog.matches(request):
            return self._reply(request, addr, 481, key, now_ms, tag=call.local_tag)
        if method == "CANCEL":
            # A re-INVITE is answered at once: nothing is left to cancel (section 9.2).
            return self._reply(request, addr, 200, key, now_ms)
        unsupported = ", ".join(sorted(required_extensions(request)))
        if unsupported:
            # Section 8.2.2.3.
            return self._reply(request, addr, 420, key, now_ms, [("Unsupported", unsupported)])
        if number < dialog.remote_cseq or (method == "INVITE" and number == dialog.remote_cseq):
            # Section 12.2.2: out of order.
            return self._reply(request, addr, 500, key, now_ms)
        dialog.remote_cseq = number
        if method == "BYE":
            actions = self._reply(request, addr, 200, key, now_ms)
            if call.state == "established":
                call.state = "ended"
                call.expires_ms = now_ms + TIMEOUT_MS
                actions.append(CallEnded(call.call_id, "callee hung up"))
            return actions
        if method == "INFO":
            actions = self._reply(request, addr, 200, key, now_ms)
            digit = parse_dtmf_body(request.get("content-type") or "", request.body)
            if digit is not None and call.state == "established":
                actions.append(DtmfReceived(call.call_id, digit))
            return actions
        if method == "OPTIONS":
            headers = [("Allow", ALLOW), ("Accept", "application/sdp")]
            return self._reply(request, addr, 200, key, now_ms, headers)
        if method == "INVITE":
            return self._reinvite(call, request, key, addr, now_ms)
        status = 405 if method in _KNOWN_METHODS else 501
        return self._reply(request, addr, status, key, now_ms, [("Allow", ALLOW)])

    def _reinvite(
        self, call: PlacedCall, request: SipMessage, key: TransactionKey, addr: Addr, now_ms: float
    ) -> list[Action]:
        """A re-INVITE from the callee (section 14.2): its offer answered at once."""
        number, _ = request.cseq
        if call.state != "established":
            return self._reply(request, addr, 481, None, now_ms)
        if call.reinvite_retransmit is not None:
            # Section 14.2: one INVITE at a time; our last 2xx still waits for its ACK.
            return self._reply(request, addr, 500, None, now_ms, [("Retry-After", "1")])
        call.reinvite_key = key
        call.reinvite_addr = addr
        status, headers, body = 488, [("Warning", '305 voice-agent "no offer"')], b""
        negotiated: sdp.Negotiated | None = None
        try:
            read = read_offer(request, keep=sdp.codec_in_use(call.negotiated))
        except BadOffer as bad:
            read, status, headers = None, bad.status, bad.headers
        if read is not None:
            offer, negotiated = read
            call.sdp_version += 1
            body = sdp.build_answer(
                offer,
                negotiated,
                address=call.media[0],
                port=call.media[1],
                session_id=call.session_id,
                version=call.sdp_version,
            )
            status = 200
            headers = [
                ("Contact", self._contact()),
                ("Allow", ALLOW),
                ("Content-Type", "application/sdp"),
            ]
        response = build_response(
            request, status, headers=[("Server", self.settings.user_agent), *headers], body=body
        )
        call.reinvite_response = response
        actions: list[Action] = [Send(response, addr)]
        if status == 200 and negotiated is not None:
            call.reinvite_cseq = number
            call.reinvite_retransmit = Retransmission(response, addr, now_ms)
            call.negotiated = negotiated
            actions.append(MediaChanged(call.call_id, negotiated))
        return actions

    # ---- building and sending ------------------------------------------------------------

    @property
    def _via_host(self) -> str:
        return f"{host_in_uri(self.settings.host)}:{self.settings.port}"

    def _contact(self) -> str:
        return f"<sip:{self._via_host}>"

    def _call_id(self, hint: str) -> str:
        base = _CALL_ID_CHARS.sub("-", hint.strip())[:96].strip("-")
        if base and base not in self.calls:
            return base
        while True:
            candidate = f"{base or 'call'}-{self.make_id()}"
            if candidate not in self.calls:
                return candidate

    def _send_invite(self, call: PlacedCall, cseq: int, now_ms: float) -> list[Action]:
        """An INVITE as section 8.1.1 builds it; sent, and retransmitted by timer A."""
        branch = MAGIC_COOKIE + self.make_id()
        data = invite_request(
            target_uri=call.target_uri,
            from_value=call.from_value,
            call_id=call.call_id,
            cseq=cseq,
            via=f"{SIP_VERSION}/UDP {self._via_host};branch={branch};rport",
            contact=self._contact(),
            user_agent=self.settings.user_agent,
            headers=[*call.extra_headers, *([call.auth_header] if call.auth_header else [])],
            body=call.offer_body,
        )
        call.invites.append(InviteTransaction(data, parse_message(data), branch, cseq))
        # Timer A doubles with no cap for INVITEs (17.1.1.2); timer B is its 64*T1 end.
        call.invite_retransmit = Retransmission(data, call.trunk, now_ms, cap_ms=math.inf)
        return [Send(data, call.trunk)]

    def _cancel(
        self, call: PlacedCall, now_ms: float, reason: str, outcome: Outcome
    ) -> list[Action]:
        if call.state not in ("calling", "proceeding") or call.cancel_reason is not None:
            return []
        call.cancel_reason = reason
        call.cancel_outcome = outcome
        if call.state == "calling":
            return []  # section 9.1: the CANCEL waits for a provisional response
        return self._send_cancel(call, now_ms)

    def _send_cancel(self, call: PlacedCall, now_ms: float) -> list[Action]:
        """The CANCEL of the call's INVITE (section 9.1), retransmitted until its final response;
        the INVITE's own final response is due within 64*T1."""
        data = cancel_request(
            call.invite.message,
            call.invite.cseq,
            call.cancel_reason or "",
            self.settings.user_agent,
        )
        branch = call.invite.branch
        call.outgoing[branch] = OutgoingRequest(
            "CANCEL", branch, Retransmission(data, call.trunk, now_ms)
        )
        call.cancel_deadline_ms = now_ms + TIMEOUT_MS
        return [Send(data, call.trunk)]

    def _ack_2xx(self, call: PlacedCall, dialog: Dialog) -> bytes:
        """Section 13.2.2.4: the ACK of a 2xx is a request of its dialog with the INVITE's
        CSeq number (and its credentials), in a transaction of its own (a new branch)."""
        dialog.local_cseq = call.invite.cseq - 1  # Dialog.request counts it up to the INVITE's
        headers = [("User-Agent", self.settings.user_agent)]
        if call.auth_header is not None:
            headers.append(call.auth_header)
        return dialog.request(
            "ACK", via_host=self._via_host, branch=MAGIC_COOKIE + self.make_id(), headers=headers
        )

    def _bye(
        self,
        call: PlacedCall,
        dialog: Dialog,
        now_ms: float,
        authorization: tuple[str, str] | None = None,
    ) -> list[Action]:
        branch = MAGIC_COOKIE + self.make_id()
        headers = [("User-Agent", self.settings.user_agent)]
        if authorization is not None:
            headers.append(authorization)
        data = dialog.request("BYE", via_host=self._via_host, branch=branch, headers=headers)
        destination = dialog.destination()
        call.outgoing[branch] = OutgoingRequest(
            "BYE",
            branch,
            Retransmission(data, destination, now_ms),
            dialog,
            authorized=authorization is not None,
        )
        return [Send(data, destination)]

    def _fail(
        self, call: PlacedCall, status: int, reason: str, outcome: Outcome, now_ms: float
    ) -> list[Action]:
        call.state = "ended"
        call.invite_retransmit = None
        call.cancel_deadline_ms = None
        call.expires_ms = now_ms + TIMEOUT_MS  # timer D, and late 2xx to ACK and BYE
        return [Failed(call.call_id, status, reason, outcome)]

    def _reply(
        self,
        request: SipMessage,
        addr: Addr,
        status: int,
        key: TransactionKey | None,
        now_ms: float,
        headers: list[tuple[str, str]] | None = None,
        *,
        tag: str | None = None,
    ) -> list[Action]:
        response = build_response(
            request,
            status,
            to_tag=None if request.to_tag else tag,
            headers=[("Server", self.settings.user_agent), *(headers or [])],
        )
        if key is not None:
            self.responses.put(key, response, now_ms)
        return [Send(response, addr)]

    def _bad_request(self, request: SipMessage, source: Addr) -> list[Action]:
        """400 when the response can be routed (a Via that reads); otherwise dropped."""
        try:
            if not request.get("via"):
                return []
            response = build_response(request, 400, headers=[("Server", self.settings.user_agent)])
            return [Send(response, response_addr(request, source))]
        except SipParseError:
            return []

"""The part of the user agent server (voice_agent.sip.uas) that keeps an established session
alive and changes it in place, sans-I/O: the caller's UPDATE (RFC 3311, with or without a new
offer), session timers (RFC 4028: the interval our 2xx sets, the BYE when the caller's refresh
never comes) and, when the server is the refresher, its own refresh and what the answer to it
means (voice_agent.sip.session_refresh). The timer's arithmetic and negotiation are in
voice_agent.sip.session_timer.
"""

from __future__ import annotations

from collections.abc import Callable

from voice_agent.sip import sdp
from voice_agent.sip.events import MediaChanged, Send, ServerAction
from voice_agent.sip.message import SipMessage, SipParseError
from voice_agent.sip.offer import BadOffer, MediaSecurity, negotiated_offer
from voice_agent.sip.responder import ALLOW, SUPPORTED, Responder
from voice_agent.sip.server_call import ServerCall
from voice_agent.sip.session_refresh import allows_update, refresh_response, start_refresh
from voice_agent.sip.session_timer import SessionTimer, TimerSettings, TooSmall, negotiate
from voice_agent.sip.transaction import Addr, TransactionKey

Action = ServerAction


class SessionKeeper:
    def __init__(
        self,
        *,
        timers: TimerSettings,
        media_security: MediaSecurity,
        user_agent: str,
        responder: Responder,
        make_id: Callable[[], str],
        branches: dict[str, str],
        end: Callable[[ServerCall, float, str], list[Action]],
        session_body: Callable[[ServerCall, SipMessage], bytes | None],
    ) -> None:
        self.timers = timers
        self.media_security = media_security
        self.user_agent = user_agent
        self.responder = responder
        self.make_id = make_id
        self._branches = branches  # the server's: a response's branch -> its call
        self._end = end  # ends the call with a BYE
        self._session_body = session_body  # our SDP answering a request's offer

    def update(
        self,
        call: ServerCall,
        request: SipMessage,
        key: TransactionKey,
        source: Addr,
        now_ms: float,
    ) -> list[Action]:
        """RFC 3311: a session refresh (RFC 4028) with or without a new offer, answered at once
        (no ACK); a refused one leaves the session as it was."""

        def refuse(status: int, reason: str, headers: list[tuple[str, str]]) -> list[Action]:
            return self.responder.refuse(
                request, source, status, reason, headers=headers, key=key, now_ms=now_ms
            )

        if call.state == "ended":
            return refuse(481, "UPDATE for an ended call", [])
        if request.body and call.our_offer is not None:
            return refuse(491, "our offer is still unanswered", [])  # RFC 3311 section 5.2
        if request.body and (call.state != "confirmed" or call.retransmit is not None):
            return refuse(500, "an offer is still under way", [("Retry-After", "1")])
        try:
            timer = negotiate(request, self.timers, current=call.timer)
            keep = sdp.codec_in_use(call.negotiated)
            negotiated = (
                negotiated_offer(request, self.media_security, keep=keep) if request.body else None
            )
        except SipParseError as error:
            return refuse(400, str(error), [])
        except BadOffer as bad:
            return refuse(bad.status, bad.reason, bad.headers)
        if isinstance(timer, TooSmall):
            return refuse(422, "session interval too small", [("Min-SE", str(timer.min_se_s))])
        actions: list[Action] = []
        body = b""
        if negotiated is not None:
            call.negotiated = negotiated
            body = self._session_body(call, request) or b""
            call.session_body = body
            actions.append(MediaChanged(call.call_id, negotiated))
        call.timer = timer
        headers = [
            ("Contact", self.responder.contact(call.invite)),
            ("Allow", ALLOW),
            SUPPORTED,
            *self.timer_headers(call, now_ms),
        ]
        if body:
            headers.append(("Content-Type", "application/sdp"))
        reply = self.responder.reply(
            request, source, 200, key=key, now_ms=now_ms, headers=headers, body=body
        )
        return reply + actions

    def timer_headers(self, call: ServerCall, now_ms: float) -> list[tuple[str, str]]:
        """The timer headers of a 2xx to the caller's INVITE or UPDATE, whose sending starts a
        new interval (section 10)."""
        if call.timer is None:
            return []
        call.timer.restart(now_ms)
        return call.timer.response_headers()

    def tick(self, call: ServerCall, now_ms: float) -> list[Action]:
        actions: list[Action] = []
        refresh = call.refresh
        if refresh is not None and refresh.retransmit is not None:
            if refresh.retransmit.due(now_ms):
                actions.append(Send(refresh.retransmit.data, refresh.retransmit.addr))
            elif refresh.retransmit.timed_out(now_ms):
                refresh.retransmit = None
                reason = "session expired: no answer to our refresh"
                return actions + self._end(call, now_ms, reason)
        timer = call.timer
        if timer is None or call.state != "confirmed" or now_ms < timer.deadline_ms:
            return actions
        if now_ms >= timer.expiry_ms:
            who = "our refresh was not taken" if timer.we_refresh else "no refresh from the caller"
            return actions + self._end(call, now_ms, f"session expired: {who}")
        return actions + self._send_refresh(call, now_ms)

    def _send_refresh(self, call: ServerCall, now_ms: float, method: str = "") -> list[Action]:
        """Our refresh, as the refresher: an UPDATE if the caller takes them, else a
        re-INVITE offering the session unchanged (voice_agent.sip.session_refresh)."""
        assert call.dialog is not None and call.timer is not None
        call.timer.refreshing = True
        method = method or ("UPDATE" if allows_update(call.invite) else "INVITE")
        if method == "INVITE" and (call.retransmit is not None or call.our_offer is not None):
            return []  # the caller's re-INVITE is under way: its 2xx is the refresh
        self.forget(call)
        dialog = call.dialog
        call.refresh = start_refresh(
            dialog,
            call.timer,
            method=method,
            via_host=self.responder.local(dialog.transport),
            branch=self.make_id(),
            headers=[
                ("Contact", self.responder.contact(call.invite)),
                ("Allow", ALLOW),
                ("User-Agent", self.user_agent),
            ],
            session_body=call.session_body,
            now_ms=now_ms,
        )
        self._branches[call.refresh.branch] = call.call_id
        return [Send(call.refresh.data, dialog.destination())]

    def answered(self, call: ServerCall, response: SipMessage, now_ms: float) -> list[Action]:
        refresh, dialog, timer = call.refresh, call.dialog, call.timer
        assert refresh is not None and dialog is not None
        if timer is None:  # timers were turned off meanwhile: only the ACK is owed
            timer = SessionTimer(self.timers.min_se_s, we_refresh=False)
        first = refresh.final is None
        verdict, after = refresh_response(
            refresh,
            response,
            dialog,
            timer,
            via_host=self.responder.local(dialog.transport),
            ack_branch=self.make_id(),
            now_ms=now_ms,
        )
        actions: list[Action] = []
        if (response.status or 0) >= 200 and refresh.ack:
            actions.append(Send(refresh.ack, dialog.destination()))  # again for a retransmission
        if not first or call.state == "ended" or verdict == "pending":
            return actions
        if verdict == "refreshed":
            # The answer to a re-INVITE refresh is not read for media: we offered the session
            # unchanged, and a caller that moved its RTP is followed by latching (media.py).
            call.timer = after
        elif verdict == "ask again":
            actions += self._send_refresh(call, now_ms, refresh.method)
        elif verdict == "as re-INVITE":
            actions += self._send_refresh(call, now_ms, "INVITE")
        elif verdict == "gone":
            reason = f"session expired: our refresh got {response.status}"
            actions += self._end(call, now_ms, reason)
        return actions

    def forget(self, call: ServerCall) -> None:
        if call.refresh is not None:
            self._branches.pop(call.refresh.branch, None)
            call.refresh = None

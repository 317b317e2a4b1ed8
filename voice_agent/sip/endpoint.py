"""One SIP endpoint, sans-I/O: the calls that come in (voice_agent.sip.uas), the calls the
server places (voice_agent.sip.uac) and its registrations (voice_agent.sip.registration) behind
one `datagram / tick / next_deadline_ms -> actions`.

    endpoint = SipEndpoint(uas, uac)               # uac None: no trunk to place calls through
    actions = endpoint.datagram(data, source, now_ms)
    actions = endpoint.tick(now_ms)                # at endpoint.next_deadline_ms()
    actions = endpoint.hang_up(call_id, now_ms, reason)

Each datagram is parsed once and goes to the user agent whose call its Call-ID names: a call
this server placed (the trunk's responses, the callee's BYE or re-INVITE) to the client,
anything else to the server, which answers or refuses it. The I/O layer only sends the Send
actions and acts on the call events.
"""

from __future__ import annotations

from collections.abc import Sequence

from voice_agent.sip import events
from voice_agent.sip import uac as client
from voice_agent.sip import uas as server
from voice_agent.sip.message import SipMessage, SipParseError
from voice_agent.sip.registration import Registration, RegistrationChanged
from voice_agent.sip.transaction import Addr
from voice_agent.sip.trunk_probe import TrunkProbe, TrunkReachability

Action = server.Action | client.Action | RegistrationChanged | TrunkReachability
# The actions about one live call (all of voice_agent.sip.events but Send, Refused, IncomingCall,
# Ringing and Dialing), whichever user agent holds it.
CallEvent = (
    events.CallConfirmed
    | events.Answered
    | events.MediaChanged
    | events.DtmfReceived
    | events.CallEnded
    | events.Failed
    | events.TransferAccepted
    | events.TransferProgress
    | events.TransferFailed
)


class SipEndpoint:
    def __init__(
        self,
        uas: server.UserAgentServer,
        uac: client.UserAgentClient | None = None,
        registrations: Sequence[Registration] = (),
        probe: TrunkProbe | None = None,
    ) -> None:
        self.uas = uas
        self.uac = uac
        self.probe = probe  # OPTIONS to the trunk (voice_agent.sip.trunk_probe)
        # Bindings with registrars (voice_agent.sip.registration), by their REGISTERs' Call-ID.
        self.registrations = {registration.call_id: registration for registration in registrations}

    def datagram(self, data: bytes, source: Addr, now_ms: float) -> Sequence[Action]:
        read = server.read_datagram(data, source)
        if not isinstance(read, SipMessage):
            return [read] if read is not None else []
        call_id = read.get("call-id")
        if self.uac is not None and self._placed(call_id):
            return self.uac.message(read, source, now_ms)
        registration = self.registrations.get(call_id or "")
        if registration is not None and read.status is not None and _of_register(read):
            return registration.response(read, now_ms)
        if self.probe is not None and call_id == self.probe.call_id and read.status is not None:
            return self.probe.response(read, now_ms)
        return self.uas.message(read, source, now_ms)

    def register(self, now_ms: float) -> list[Action]:
        """Every registration's first REGISTER, and the trunk's first probe."""
        actions: list[Action] = [a for r in self.registrations.values() for a in r.start(now_ms)]
        if self.probe is not None:
            actions += self.probe.start(now_ms)
        return actions

    def unregister(self, now_ms: float) -> list[Action]:
        """Every binding removed (the server drains)."""
        return [a for r in self.registrations.values() for a in r.stop(now_ms)]

    def tick(self, now_ms: float) -> list[Action]:
        actions: list[Action] = list(self.uas.tick(now_ms))
        if self.uac is not None:
            actions += self.uac.tick(now_ms)
        for registration in self.registrations.values():
            actions += registration.tick(now_ms)
        if self.probe is not None:
            actions += self.probe.tick(now_ms)
        return actions

    def next_deadline_ms(self) -> float | None:
        deadlines = [self.uas.next_deadline_ms()]
        if self.uac is not None:
            deadlines.append(self.uac.next_deadline_ms())
        deadlines += [r.next_deadline_ms() for r in self.registrations.values()]
        if self.probe is not None:
            deadlines.append(self.probe.next_deadline_ms())
        return min((d for d in deadlines if d is not None), default=None)

    def hang_up(self, call_id: str, now_ms: float, reason: str) -> Sequence[Action]:
        """End a call either way it began; one already ended (the caller's own BYE came
        first) gives nothing."""
        if self.uac is not None and self._placed(call_id):
            return self.uac.hang_up(call_id, now_ms, reason)
        return self.uas.hang_up(call_id, now_ms, reason)

    def _placed(self, call_id: str | None) -> bool:
        return self.uac is not None and call_id is not None and call_id in self.uac.calls


def _of_register(response: SipMessage) -> bool:
    try:
        return response.cseq[1] == "REGISTER"
    except SipParseError:
        return False  # the user agent server answers what does not read

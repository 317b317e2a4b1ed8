"""Whether the SIP trunk answers, sans-I/O: an OPTIONS to it every `interval_ms` (RFC 3261
section 11, the way trunks and proxies probe each other), retransmitted as any non-INVITE
request (17.1.2, timers E and F). Any response is an answer: a trunk that replies 404 or 405 to
OPTIONS is there all the same; 32 s of silence is "unreachable". The gateway turns the changes
into a log line, `/healthz` and `voice_agent_sip_trunk_reachable`.

    probe = TrunkProbe(settings)
    actions = probe.start(now_ms)        # the first OPTIONS at once
    actions = probe.response(message, now_ms)   # a response in the probe's Call-ID
    actions = probe.tick(now_ms)         # at next_deadline_ms()
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from voice_agent.sip.client_requests import out_of_dialog_request
from voice_agent.sip.events import Send
from voice_agent.sip.message import SipMessage, SipParseError
from voice_agent.sip.transaction import MAGIC_COOKIE, Addr, Retransmission

DEFAULT_INTERVAL_MS = 30_000.0


@dataclass(frozen=True)
class ProbeSettings:
    trunk: Addr
    trunk_uri: str  # "sip:HOST:PORT"
    from_uri: str  # ours: "sip:voice-agent@OUR_HOST"
    via_host: str  # our host:port for Via
    interval_ms: float = DEFAULT_INTERVAL_MS
    user_agent: str = "voice-agent"


@dataclass(frozen=True)
class TrunkReachability:
    reachable: bool
    detail: str  # the trunk's answer, or that none came


Action = Send | TrunkReachability


class TrunkProbe:
    def __init__(
        self, settings: ProbeSettings, make_id: Callable[[], str] = lambda: secrets.token_hex(8)
    ) -> None:
        self.settings = settings
        self._make_id = make_id
        self.call_id = f"{make_id()}@voice-agent"
        self._from_tag = make_id()
        self._cseq = 0
        self._pending: Retransmission | None = None
        self._next_ms: float | None = None
        self.reachable: bool | None = None  # None: not probed yet

    def start(self, now_ms: float) -> list[Action]:
        return self._send(now_ms)

    def next_deadline_ms(self) -> float | None:
        pending = self._pending.deadline_ms if self._pending is not None else None
        return min((t for t in (pending, self._next_ms) if t is not None), default=None)

    def tick(self, now_ms: float) -> list[Action]:
        pending = self._pending
        if pending is not None:
            if pending.timed_out(now_ms):
                self._pending = None
                self._next_ms = pending.started_ms + self.settings.interval_ms
                return self._changed(False, "no answer to OPTIONS in 32 s")
            return [Send(pending.data, pending.addr)] if pending.due(now_ms) else []
        if self._next_ms is not None and now_ms >= self._next_ms:
            return self._send(now_ms)
        return []

    def response(self, response: SipMessage, now_ms: float) -> list[Action]:
        try:
            number, method = response.cseq
        except SipParseError:
            return []
        pending = self._pending
        if pending is None or method != "OPTIONS" or number != self._cseq:
            return []
        if (response.status or 0) < 200:
            return []
        self._pending = None
        self._next_ms = max(now_ms, pending.started_ms + self.settings.interval_ms)
        return self._changed(True, f"{response.status} {response.reason or ''}".strip())

    def _changed(self, reachable: bool, detail: str) -> list[Action]:
        if reachable == self.reachable:
            return []
        self.reachable = reachable
        return [TrunkReachability(reachable, detail)]

    def _send(self, now_ms: float) -> list[Action]:
        settings = self.settings
        self._cseq += 1
        self._next_ms = None
        data = out_of_dialog_request(
            "OPTIONS",
            settings.trunk_uri,
            via=f"{settings.via_host};branch={MAGIC_COOKIE}{self._make_id()};rport",
            from_value=f"<{settings.from_uri}>;tag={self._from_tag}",
            to_value=f"<{settings.trunk_uri}>",
            call_id=self.call_id,
            cseq=self._cseq,
            headers=[("Accept", "application/sdp"), ("User-Agent", settings.user_agent)],
        )
        self._pending = Retransmission(data, settings.trunk, now_ms)
        return [Send(data, settings.trunk)]

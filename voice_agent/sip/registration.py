"""Registering this server with a registrar (RFC 3261 section 10), sans-I/O: the REGISTER and
its retransmissions (17.1.2, timers E and F), the digest challenge answered (22.2, 22.4; MD5 or
SHA-256), a refresh before the binding expires, a back-off after a failure, and the binding
removed (Expires: 0) when the server drains. Many PBXs and hosted trunks deliver calls only to
a registered contact; the calls then come in like any other, to the user agent server.

    registration = Registration(settings)
    actions = registration.start(now_ms)            # Send and RegistrationChanged
    actions = registration.response(message, now_ms) # a response whose Call-ID is ours
    actions = registration.tick(now_ms)             # at next_deadline_ms()
    actions = registration.stop(now_ms)             # unregister

The binding is refreshed when REFRESH_SHARE of what the registrar granted has gone (a fifth
left, as most user agents do, and never less than a transaction's 32 s before it runs out).
After a failure the next try waits BACKOFF_BASE_MS, doubling to BACKOFF_MAX_MS (RFC 5626
section 4.5's base and ceiling, without its random part: the clock here is the caller's and
several registrations already start at different times).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from voice_agent.sip.auth import Credentials, digest_authorization, parse_digest
from voice_agent.sip.client_requests import challenge_header, out_of_dialog_request
from voice_agent.sip.events import Send
from voice_agent.sip.message import (
    SipMessage,
    SipParseError,
    header_params,
    name_addr_uri,
)
from voice_agent.sip.transaction import MAGIC_COOKIE, TIMEOUT_MS, Addr, Retransmission

REFRESH_SHARE = 0.8
BACKOFF_BASE_MS = 30_000.0
BACKOFF_MAX_MS = 1_800_000.0

State = Literal["registering", "registered", "failed", "unregistering", "unregistered"]


@dataclass(frozen=True)
class RegistrationSettings:
    name: str  # how logs, metrics and /healthz call it
    registrar: Addr
    registrar_uri: str  # the Request-URI: "sip:HOST:PORT"
    aor: str  # the address of record: "sip:USER@DOMAIN"
    contact: str  # where calls for it are to come: "sip:USER@OUR_HOST:PORT"
    via_host: str  # our host:port for Via
    expires_s: int = 600
    credentials: Credentials | None = None
    user_agent: str = "voice-agent"


@dataclass(frozen=True)
class RegistrationChanged:
    name: str
    state: State
    detail: str  # what the registrar said, or why it failed
    expires_s: int | None = None  # granted, once registered


Action = Send | RegistrationChanged


class Registration:
    def __init__(
        self,
        settings: RegistrationSettings,
        make_id: Callable[[], str] = lambda: secrets.token_hex(8),
    ) -> None:
        self.settings = settings
        self._make_id = make_id
        self.call_id = f"{make_id()}@voice-agent"  # one Call-ID for every REGISTER (10.2)
        self._from_tag = make_id()
        self._cseq = 0
        self.state: State = "unregistered"
        self._expires_s = settings.expires_s
        self._pending: Retransmission | None = None  # the REGISTER of CSeq _cseq, unanswered
        self._authorization: tuple[str, str] | None = None
        self._auth_tries = 0
        self._failures = 0
        self._next_ms: float | None = None  # the refresh, or the next try after a failure

    # ---- the caller's side -------------------------------------------------------------------

    def start(self, now_ms: float) -> list[Action]:
        self._auth_tries = 0
        return self._send(self._expires_s, now_ms, "registering")

    def stop(self, now_ms: float) -> list[Action]:
        """Remove the binding (Expires: 0), if there is one or one is under way."""
        self._next_ms = None
        if self.state in ("registered", "registering"):
            self._auth_tries = 0
            return self._send(0, now_ms, "unregistering")
        self._pending = None
        return []

    def next_deadline_ms(self) -> float | None:
        times = [t for t in (self._next_ms, self._deadline_of_pending()) if t is not None]
        return min(times, default=None)

    def tick(self, now_ms: float) -> list[Action]:
        pending = self._pending
        if pending is not None:
            if pending.timed_out(now_ms):
                return self._failed("no answer from the registrar in 32 s", now_ms)
            if pending.due(now_ms):
                return [Send(pending.data, pending.addr)]
            return []
        if self._next_ms is not None and now_ms >= self._next_ms:
            self._next_ms = None
            return self.start(now_ms)
        return []

    def response(self, response: SipMessage, now_ms: float) -> list[Action]:
        status = response.status or 0
        try:
            number, method = response.cseq
        except SipParseError:
            return []  # not the answer to anything we sent
        if self._pending is None or method != "REGISTER" or number != self._cseq:
            return []  # a retransmission, or the answer to a REGISTER given up on
        if status < 200:
            return []
        self._pending = None
        if 200 <= status < 300:
            return self._accepted(response, now_ms)
        if status in (401, 407):
            return self._challenged(response, status, now_ms)
        if status == 423:
            minimum = (response.get("min-expires") or "").strip()
            if minimum.isdigit() and int(minimum) > self._expires_s and self._auth_tries < 3:
                self._expires_s = int(minimum)  # 10.2.8: ask again for at least that much
                self._auth_tries += 1
                return self._send(self._expires_s, now_ms, self.state)
        return self._failed(f"{status} {response.reason or ''}".strip(), now_ms)

    # ---- what happened -----------------------------------------------------------------------

    def _accepted(self, response: SipMessage, now_ms: float) -> list[Action]:
        if self.state == "unregistering":
            self.state = "unregistered"
            return [RegistrationChanged(self.settings.name, "unregistered", "binding removed")]
        granted = self._granted(response)
        self._failures = 0
        self.state = "registered"
        # A fifth of the binding left, and at least a transaction's time before it lapses.
        refresh_ms = min(granted * 1000 * REFRESH_SHARE, granted * 1000 - TIMEOUT_MS)
        self._next_ms = now_ms + max(refresh_ms, 1000.0)
        detail = f"{response.status} {response.reason or ''}".strip()
        return [RegistrationChanged(self.settings.name, "registered", detail, granted)]

    def _granted(self, response: SipMessage) -> int:
        """Section 10.2.4: the expires of our binding in the 200's Contacts, else its Expires,
        else what we asked for."""
        ours = name_addr_uri(f"<{self.settings.contact}>").lower()
        for value in response.get_all("contact"):
            for contact in value.split(","):
                if name_addr_uri(contact).lower() == ours:
                    expires = header_params(contact).get("expires")
                    if expires is not None and expires.strip().isdigit():
                        return int(expires)
        header = (response.get("expires") or "").strip()
        return int(header) if header.isdigit() else self._expires_s

    def _challenged(self, response: SipMessage, status: int, now_ms: float) -> list[Action]:
        credentials = self.settings.credentials
        if credentials is None:
            return self._failed(f"{status}: the registrar asks for credentials", now_ms)
        challenges = response.get_all(challenge_header(status))
        stale = any(
            (parse_digest(value) or {}).get("stale", "").lower() == "true" for value in challenges
        )
        if self._auth_tries >= 1 and not stale:
            return self._failed(f"{status}: the registrar refused the credentials", now_ms)
        for challenge in challenges:
            value = digest_authorization(
                challenge,
                method="REGISTER",
                uri=self.settings.registrar_uri,
                credentials=credentials,
                cnonce=self._make_id(),
            )
            if value is not None:
                header = "Authorization" if status == 401 else "Proxy-Authorization"
                self._authorization = (header, value)
                self._auth_tries += 1
                expires = 0 if self.state == "unregistering" else self._expires_s
                return self._send(expires, now_ms, self.state)
        return self._failed(f"{status}: no digest challenge to answer (MD5, SHA-256)", now_ms)

    def _failed(self, why: str, now_ms: float) -> list[Action]:
        self._pending = None
        if self.state == "unregistering":
            self.state = "unregistered"
            return [RegistrationChanged(self.settings.name, "unregistered", why)]
        self._failures += 1
        delay = min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** (self._failures - 1))
        self._next_ms = now_ms + delay
        self.state = "failed"
        detail = f"{why}; trying again in {delay / 1000:g} s"
        return [RegistrationChanged(self.settings.name, "failed", detail)]

    # ---- the request -------------------------------------------------------------------------

    def _send(self, expires_s: int, now_ms: float, state: State) -> list[Action]:
        settings = self.settings
        self._cseq += 1
        headers = [
            ("Contact", f"<{settings.contact}>"),
            ("Expires", str(expires_s)),
            *([self._authorization] if self._authorization else []),
            ("User-Agent", settings.user_agent),
        ]
        data = out_of_dialog_request(
            "REGISTER",
            settings.registrar_uri,
            via=f"{settings.via_host};branch={MAGIC_COOKIE}{self._make_id()};rport",
            from_value=f"<{settings.aor}>;tag={self._from_tag}",
            to_value=f"<{settings.aor}>",
            call_id=self.call_id,
            cseq=self._cseq,
            headers=headers,
        )
        self._pending = Retransmission(data, settings.registrar, now_ms)
        changed = state != self.state
        self.state = state
        actions: list[Action] = [Send(data, settings.registrar)]
        if changed:
            actions.append(RegistrationChanged(settings.name, state, settings.registrar_uri))
        return actions

    def _deadline_of_pending(self) -> float | None:
        return self._pending.deadline_ms if self._pending is not None else None

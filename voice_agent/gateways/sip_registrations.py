"""What the SIP listener keeps up with beside calls: its registrations (`sip.registrations`),
each one's settings for the sans-I/O state machine (voice_agent.sip.registration) from the
config and the secrets, and the trunk's OPTIONS probe (voice_agent.sip.trunk_probe); and what
the registrars and the trunk said last, for /healthz and metrics."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from voice_agent.config import SipSettings, split_host_port
from voice_agent.config.telephony import SipTrunk
from voice_agent.errors import ConfigError
from voice_agent.sip.auth import Credentials
from voice_agent.sip.message import host_in_uri
from voice_agent.sip.registration import Registration, RegistrationChanged, RegistrationSettings
from voice_agent.sip.transaction import Addr
from voice_agent.sip.trunk_probe import ProbeSettings, TrunkProbe, TrunkReachability

log = logging.getLogger("voice_agent.sip")


def registrations_from(
    settings: SipSettings, secrets: Mapping[str, str], *, host: str, port: int
) -> list[Registration]:
    """One Registration for each of `sip.registrations`; ConfigError names a secret not set.
    `host:port` is where the registrar is to send calls: this server's UDP address."""
    registrations = []
    for index, entry in enumerate(settings.registrations):
        key = f"sip.registrations[{index}]"
        registrar = split_host_port(entry.registrar)
        registrar_host = host_in_uri(registrar[0])
        credentials = None
        if entry.password_secret is not None:
            if entry.password_secret not in secrets:
                raise ConfigError(
                    f"{key}.password_secret names secret {entry.password_secret!r}, which is not "
                    f"set: voice-agent secrets set {entry.password_secret}",
                    key=f"{key}.password_secret",
                )
            credentials = Credentials(entry.auth_user or entry.user, secrets[entry.password_secret])
        domain = entry.domain or registrar_host
        registrations.append(
            Registration(
                RegistrationSettings(
                    name=entry.name or f"{entry.user}@{entry.registrar}",
                    registrar=registrar,
                    registrar_uri=f"sip:{registrar_host}:{registrar[1]}",
                    aor=f"sip:{entry.user}@{domain}",
                    contact=f"sip:{entry.user}@{host_in_uri(host)}:{port}",
                    via_host=f"{host_in_uri(host)}:{port}",
                    expires_s=entry.expires,
                    credentials=credentials,
                )
            )
        )
    return registrations


def trunk_probe(trunk: SipTrunk, address: Addr, *, host: str, port: int) -> TrunkProbe:
    """The OPTIONS probe of `sip.trunk`, from this server's UDP address."""
    return TrunkProbe(
        ProbeSettings(
            trunk=address,
            trunk_uri=f"sip:{host_in_uri(address[0])}:{address[1]}",
            from_uri=f"sip:voice-agent@{host_in_uri(host)}",
            via_host=f"{host_in_uri(host)}:{port}",
            interval_ms=trunk.options_interval_s * 1000,
        )
    )


class RegistrationStates:
    """What each registrar said last (the state, why, the binding's lifetime), and whether
    the trunk answers its probe."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, Any]] = {}
        self.trunk_state: dict[str, Any] | None = None  # None: no probe (yet)

    def trunk(self, change: TrunkReachability) -> None:
        level = logging.INFO if change.reachable else logging.WARNING
        what = "answers" if change.reachable else "does not answer"
        log.log(level, "sip trunk %s (%s)", what, change.detail)
        self.trunk_state = {"reachable": change.reachable, "detail": change.detail}

    def changed(self, change: RegistrationChanged) -> None:
        level = logging.WARNING if change.state == "failed" else logging.INFO
        log.log(level, "sip registration %s: %s (%s)", change.name, change.state, change.detail)
        self.states[change.name] = {
            "state": change.state,
            "detail": change.detail,
            "expires_s": change.expires_s,
        }

"""Where a SIP call goes and how it went, decided from the messages alone: the agent and args an
INVITE names (`sip.numbers`, `sip.agent_header`, `sip.headers`), the Refer-To a transfer's
target becomes, and the end reason of a placed call that was never answered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from voice_agent.config import SipSettings
from voice_agent.sip import uac as outbound
from voice_agent.sip.message import SipMessage, name_addr_uri, uri_user


@dataclass(frozen=True)
class CallRoute:
    agent: str | None
    args: dict[str, str]


def route_call(
    invite: SipMessage, settings: SipSettings, agents: Mapping[str, Any]
) -> CallRoute | None:
    """Which agent takes the call and with which args; None if the call names no agent here.

    The agent: `agent_header`'s value, else `numbers[dialled user]`, else the agent named by
    the dialled user part, else the default agent. The args: `caller` (the user part of
    P-Asserted-Identity, else From), `called` (the Request-URI's user part), and each header
    `settings.headers` maps to an arg name.
    """
    dialled = uri_user(invite.uri or "")
    agent: str | None = None
    if settings.agent_header and invite.get(settings.agent_header):
        agent = (invite.get(settings.agent_header) or "").strip()
        if agent not in agents:
            return None
    elif dialled is not None and dialled in settings.numbers:
        agent = settings.numbers[dialled]
    elif dialled is not None and dialled in agents:
        agent = dialled
    identity = invite.get("p-asserted-identity") or invite.get("from") or ""
    args: dict[str, str] = {}
    caller = uri_user(name_addr_uri(identity)) if identity else None
    if caller:
        args["caller"] = caller
    if dialled:
        args["called"] = dialled
    for header, name in settings.headers.items():
        value = invite.get(header)
        if value is not None:
            args[name] = value[:256]
    return CallRoute(agent, args)


def failure_reason(failed: outbound.Failed) -> str:
    """A placed call's end reason when it was never answered: its outcome first (the store
    files it as busy, no_answer or failed), then what the far end said."""
    said = f"{failed.status} {failed.reason}".strip()
    if failed.outcome == "busy":
        return f"busy: {said}"
    if failed.outcome in ("no answer", "cancelled"):
        return f"no answer: {said}"
    return f"call failed: {said} ({failed.outcome})"


def refer_target(target: str, trunk_host: str) -> str:
    """What a REFER's Refer-To names: a SIP URI as configured; a phone number (or tel: URI)
    at the host the call came from, the trunk or PBX that can dial it."""
    if target.lower().startswith(("sip:", "sips:")):
        return target
    number = target[4:] if target.lower().startswith("tel:") else target
    host = f"[{trunk_host}]" if ":" in trunk_host else trunk_host
    return f"sip:{number}@{host}"

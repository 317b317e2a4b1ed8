"""Call control an agent can ask for: handing the call to a person (`transfer_call`) and sending
keypad digits (`send_dtmf`), as LLM tools and as flow route actions.

The runtime only decides and says so: each yields an agent event (`CallTransfer`, `SendDigits`)
that the pipeline passes to the call's transport, which does what its protocol can (a SIP REFER,
RFC 4733 packets, a carrier's REST call); what came of it goes to the audit and, for a transfer,
to the call's end reason ("transferred to <destination>") or back to the agent as the
`transfer_failed` event.

Destinations are named in the agent's config (`destinations: {front_desk: "sip:desk@pbx"}`):
the LLM and the flow choose a name, never an address, so a caller cannot talk the agent into
dialling anywhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from voice_agent.errors import ToolError

TRANSFER_CALL_TOOL = "transfer_call"
SEND_DTMF_TOOL = "send_dtmf"
TRANSFER_FAILED_EVENT = "transfer_failed"
VOICEMAIL_EVENT = "voicemail"  # an answering machine's message may start (answering_machine)
DTMF_KEYS = frozenset("0123456789*#ABCD")
MAX_DIGITS = 32  # an IVR menu path or an extension, not a data channel
MAX_REASON_CHARS = 200


@dataclass(frozen=True)
class CallTransfer:
    """Hand the call over to `target` (the destination `destination` names) once the agent's
    last words have played."""

    destination: str
    target: str
    reason: str


@dataclass(frozen=True)
class SendDigits:
    """Send `digits` to the far end as keypad presses, in order."""

    digits: str


def check_digits(value: object) -> str:
    """`value` as keypad digits, or a ToolError saying what is wrong with it."""
    if not isinstance(value, str) or not value:
        raise ToolError("digits must be a non-empty string of keypad keys")
    digits = value.replace(" ", "").upper()
    bad = sorted(set(digits) - DTMF_KEYS)
    if bad:
        raise ToolError(f"digits may hold only 0-9, *, # and A-D, not {''.join(bad)!r}")
    if len(digits) > MAX_DIGITS:
        raise ToolError(f"at most {MAX_DIGITS} digits at a time, not {len(digits)}")
    return digits


def check_transfer(destinations: Mapping[str, str], arguments: Mapping[str, Any]) -> CallTransfer:
    """The transfer the LLM asked for, or a ToolError naming the destinations it may choose."""
    name = arguments.get("destination")
    if not isinstance(name, str) or name not in destinations:
        raise ToolError(f"destination must be one of {sorted(destinations)}, not {name!r}")
    reason = arguments.get("reason") or ""
    if not isinstance(reason, str):
        raise ToolError("reason must be a string")
    return CallTransfer(name, destinations[name], reason[:MAX_REASON_CHARS])


def transfer_call_schema(destinations: Mapping[str, str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": TRANSFER_CALL_TOOL,
            "description": (
                "Hand the caller over to a person. Say a short line first (for example that"
                " you are putting them through); the call leaves you once it has played."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "destination": {"type": "string", "enum": sorted(destinations)},
                    "reason": {
                        "type": "string",
                        "description": "Why, in a few words, for the person taking the call.",
                    },
                },
                "required": ["destination"],
            },
        },
    }


def send_dtmf_schema() -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": SEND_DTMF_TOOL,
            "description": (
                "Press keys on the phone's keypad, to choose in an automated menu or enter an"
                " extension."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "digits": {
                        "type": "string",
                        "description": "The keys, in order: 0-9, * and #.",
                    }
                },
                "required": ["digits"],
            },
        },
    }

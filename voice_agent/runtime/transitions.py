"""Handing the conversation to another agent of the same call: the `transfer_to_agent` tool the
LLM is offered when the agent's config lists `transitions`, and the check of what it asked for.

The new agent takes over the same call, state and context (CallSession.transfer); a transfer of
the call itself to a person is runtime/call_control.py's `transfer_call`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from voice_agent.errors import ToolError

TRANSFER_TOOL = "transfer_to_agent"


def transfer_tool_schema(targets: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": TRANSFER_TOOL,
            "description": "Hand the conversation over to another agent.",
            "parameters": {
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "enum": list(targets)},
                    "args": {
                        "type": "object",
                        "description": "Values to pass to the new agent's state.",
                    },
                },
                "required": ["agent"],
            },
        },
    }


def check_agent_transfer(
    allowed: list[str], arguments: Mapping[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The agent to hand over to and the args for its state (`args` and any other argument the
    LLM added), or a ToolError the LLM reads."""
    target = arguments.get("agent")
    if target not in allowed:
        raise ToolError(f"agent must be one of {allowed}, not {target!r}")
    args = arguments.get("args") or {}
    if not isinstance(args, dict):
        raise ToolError("args must be an object")
    extra = {k: v for k, v in arguments.items() if k not in ("agent", "args")}
    return str(target), {**args, **extra}

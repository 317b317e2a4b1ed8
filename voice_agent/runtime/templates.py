"""`{{var}}` templates in prompts and replies, rendered from the call's state."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_$][\w.$-]*)\s*\}\}")


def template_variables(template: str) -> list[str]:
    return _PLACEHOLDER.findall(template)


def _lookup(state: Mapping[str, Any], name: str) -> Any:
    if name.startswith("$session.params."):
        name = name[len("$session.params.") :]
    if name in state:
        return state[name]
    value: Any = state
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def render(template: str, state: Mapping[str, Any]) -> str:
    """Unset variables render as empty text: a caller should never hear a brace."""
    return _PLACEHOLDER.sub(lambda m: _as_text(_lookup(state, m.group(1))), template)

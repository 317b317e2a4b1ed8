"""The update_state system tools: up to 50 variables set at once from expressions, atomically."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from voice_agent.errors import ConfigError, ExpressionError, ToolError
from voice_agent.runtime.expressions import Expression, parse_expression

_JSON_TYPES = {"boolean": "boolean", "string": "string", "number": "number"}


def compile_updates(
    updates: Mapping[str, Any], *, file: str, key: str, allow_llm: bool
) -> dict[str, Expression]:
    compiled: dict[str, Expression] = {}
    for variable, source in updates.items():
        where = f"{key}.{variable}"
        if not isinstance(source, str):
            # YAML turns `x: 3` into a number: accept constants written without quotes.
            source = _literal(source)
        try:
            expression = parse_expression(source, "update")
        except ExpressionError as exc:
            raise ConfigError(str(exc), file=file, key=where) from None
        if expression.extraction is not None and not allow_llm:
            raise ConfigError(
                "an LLM-extracted value needs the LLM: use it in an update_state tool, "
                "not in on_enter/on_turn or a flow",
                file=file,
                key=where,
            )
        compiled[variable] = expression
    return compiled


def _literal(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    raise ConfigError(f"an update must be an expression string, not {type(value).__name__}")


def evaluate_updates(
    updates: Mapping[str, Expression],
    state: Mapping[str, Any],
    *,
    extracted: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Every expression reads the state as it was before: all apply together or none do."""
    extracted = extracted or {}
    values: dict[str, Any] = {}
    for variable, expression in updates.items():
        try:
            values[variable] = expression.evaluate(
                state, extracted=extracted.get(variable), now=now
            )
        except ExpressionError as exc:
            raise ToolError(f"cannot set {variable!r}: {exc}") from None
    return values


@dataclass(frozen=True)
class UpdateStateTool:
    name: str
    description: str
    updates: dict[str, Expression]

    def parameters(self) -> dict[str, Any]:
        properties = {
            variable: {
                "type": _JSON_TYPES[expression.extraction.kind],
                "description": expression.extraction.description,
            }
            for variable, expression in self.updates.items()
            if expression.extraction is not None
        }
        return {
            "type": "object",
            "properties": properties,
            "required": list(properties),
            "additionalProperties": False,
        }

    def tool_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters(),
            },
        }

    def evaluate(
        self, state: Mapping[str, Any], arguments: Mapping[str, Any], now: datetime
    ) -> dict[str, Any]:
        unknown = set(arguments) - {v for v, e in self.updates.items() if e.extraction}
        if unknown:
            raise ToolError(f"{self.name} takes no argument(s) {sorted(unknown)}")
        return evaluate_updates(self.updates, state, extracted=arguments, now=now)

"""The expression language's values (voice_agent.runtime.expressions): their type names,
truthiness and equality, string and number literals, what an `llm:` extraction gives, and the
arithmetic and containment operators with their errors."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal, NoReturn

from lark import Token

from voice_agent.errors import ExpressionError

LlmKind = Literal["boolean", "string", "number"]  # what an `llm:` extraction gives


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def truthy(value: Any, source: str, pos: int | None) -> bool:
    try:
        return bool(value)
    except Exception:
        raise ExpressionError(
            f"cannot use a {type_name(value)} as true/false", source=source, position=pos
        ) from None


def equal(left: Any, right: Any) -> bool:
    kind = type_name(left)
    if kind != type_name(right):
        return False
    if kind == "null":
        return True
    return bool(left == right)


def _fold(value: Any) -> Any:
    return value.casefold() if isinstance(value, str) else value


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "0": "\0"}

_ESCAPE_RE = re.compile(r"\\(u[0-9A-Fa-f]{4}|.)", re.S)


def decode_string(token: Token, source: str) -> str:
    body = str(token)[1:-1]
    if "\\" not in body:
        return body

    def replace(match: re.Match[str]) -> str:
        text = match.group(1)
        if len(text) == 5:
            return chr(int(text[1:], 16))
        if text == "u":
            raise ExpressionError(
                "bad \\u escape: it needs four hex digits",
                source=source,
                position=(token.start_pos or 0) + 1 + match.start(),
            )
        return _ESCAPES.get(text, text)

    return _ESCAPE_RE.sub(replace, body)


def parse_number(text: str) -> int | float:
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(text)
    return number


def coerce_extracted(value: Any, kind: LlmKind, source: str) -> Any:
    if kind == "number":
        if is_number(value):
            return value
        if isinstance(value, str):
            try:
                return parse_number(value.strip())
            except ValueError:
                pass
    elif kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            word = value.strip().lower()
            if word in ("true", "yes"):
                return True
            if word in ("false", "no"):
                return False
    elif isinstance(value, str):
        return value
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    raise ExpressionError(f"the LLM-extracted value {shown} is not a valid {kind}", source=source)


def _type_error(symbol: str, a: Any, b: Any, source: str, pos: int | None) -> NoReturn:
    raise ExpressionError(
        f"cannot apply {symbol!r} to {type_name(a)} and {type_name(b)}",
        source=source,
        position=pos,
    )


def _numbers(symbol: str, a: Any, b: Any, source: str, pos: int | None) -> None:
    if not (is_number(a) and is_number(b)):
        _type_error(symbol, a, b, source, pos)


def _add(a: Any, b: Any, symbol: str, source: str, pos: int | None) -> Any:
    if isinstance(a, str) and isinstance(b, str):
        return a + b
    _numbers(symbol, a, b, source, pos)
    return _checked(lambda: a + b, source, pos)


def _sub(a: Any, b: Any, symbol: str, source: str, pos: int | None) -> Any:
    _numbers(symbol, a, b, source, pos)
    return _checked(lambda: a - b, source, pos)


def _mul(a: Any, b: Any, symbol: str, source: str, pos: int | None) -> Any:
    _numbers(symbol, a, b, source, pos)
    return _checked(lambda: a * b, source, pos)


def _div(a: Any, b: Any, symbol: str, source: str, pos: int | None) -> Any:
    _numbers(symbol, a, b, source, pos)
    if b == 0:
        raise ExpressionError("division by zero", source=source, position=pos)
    return _checked(lambda: a / b, source, pos)


def _mod(a: Any, b: Any, symbol: str, source: str, pos: int | None) -> Any:
    _numbers(symbol, a, b, source, pos)
    if b == 0:
        raise ExpressionError("division by zero (modulo)", source=source, position=pos)
    return _checked(lambda: a % b, source, pos)


def _checked(compute: Callable[[], Any], source: str, pos: int | None) -> Any:
    try:
        return compute()
    except OverflowError:
        # Huge integers from the state cannot always be mixed with floats.
        raise ExpressionError("number too large", source=source, position=pos) from None


ARITHMETIC: dict[str, Callable[[Any, Any, str, str, int | None], Any]] = {
    "PLUS": _add,
    "MINUS": _sub,
    "STAR": _mul,
    "SLASH": _div,
    "PERCENT": _mod,
}

ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {
    "LT": lambda a, b: bool(a < b),
    "LE": lambda a, b: bool(a <= b),
    "GT": lambda a, b: bool(a > b),
    "GE": lambda a, b: bool(a >= b),
}


def contains_item(container: Any, item: Any, source: str, pos: int | None) -> bool:
    if container is None:
        return False
    if isinstance(container, str):
        if not isinstance(item, str):
            _type_error(":", container, item, source, pos)
        return item.casefold() in container.casefold()
    if isinstance(container, list | tuple):
        wanted = _fold(item)
        return any(equal(_fold(element), wanted) for element in container)
    if isinstance(container, Mapping):
        return isinstance(item, str) and item in container
    _type_error(":", container, item, source, pos)

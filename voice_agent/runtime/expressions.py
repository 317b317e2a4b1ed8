"""The expression engine: parses `update_state` expressions and Dialogflow-style conditions
with lark and compiles them once into closures that evaluate cheaply on every turn."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any, Literal, NoReturn, cast

from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedInput

from voice_agent.errors import ExpressionError
from voice_agent.runtime.expression_grammar import (
    DIALECT_SLOTS,
    KEYWORDS,
    MAX_DEPTH,
    check_depth,
    dialect_parser,
    raise_parse_error,
)
from voice_agent.runtime.expression_values import (
    ARITHMETIC,
    ORDERINGS,
    LlmKind,
    coerce_extracted,
    contains_item,
    decode_string,
    equal,
    is_number,
    parse_number,
    truthy,
    type_name,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_LENGTH",
    "NOW_FIELDS",
    "Dialect",
    "Expression",
    "LlmExtraction",
    "LlmKind",
    "evaluate_condition",
    "parse_expression",
]

Dialect = Literal["update", "condition"]

#: Longest accepted source text, in characters.
MAX_LENGTH = 2000

#: Fields of `$sys.func.NOW()`; weekday follows ISO 8601 (Monday=1 ... Sunday=7).
NOW_FIELDS: dict[str, Callable[[datetime], int]] = {
    "hours": lambda d: d.hour,
    "minutes": lambda d: d.minute,
    "seconds": lambda d: d.second,
    "year": lambda d: d.year,
    "month": lambda d: d.month,
    "day": lambda d: d.day,
    "weekday": lambda d: d.isoweekday(),
}

_SESSION_PREFIX = "$session.params."


@dataclass(frozen=True)
class LlmExtraction:
    """An LLM-extracted value inside an update expression: its kind and what to ask for."""

    kind: LlmKind
    description: str


class _Env:
    """What one evaluation reads; closures receive it instead of many arguments."""

    __slots__ = ("_now", "extracted", "refs", "state")

    def __init__(
        self,
        state: Mapping[str, Any],
        refs: Mapping[str, Any] | None,
        extracted: Any,
        now: datetime | None,
    ) -> None:
        self.state = state
        self.refs = refs
        self.extracted = extracted
        self._now = now

    def now(self) -> datetime:
        # Read the clock at most once per evaluation so all NOW() fields agree.
        if self._now is None:
            self._now = datetime.now()
        return self._now


_Fn = Callable[[_Env], Any]


@dataclass(frozen=True)
class Expression:
    """A parsed, compiled expression (make one with parse_expression); immutable, so parse
    results can be cached and shared."""

    source: str
    dialect: Dialect
    extraction: LlmExtraction | None
    variables: frozenset[str]
    #: Non-session `$` references it reads, by full text (e.g. "$next-action.name").
    references: frozenset[str] = frozenset()
    _fn: _Fn = field(default=lambda env: None, repr=False, compare=False)

    def evaluate(
        self,
        state: Mapping[str, Any],
        *,
        refs: Mapping[str, Any] | None = None,
        extracted: Any = None,
        now: datetime | None = None,
    ) -> Any:
        """Evaluate against the call state; raises only ExpressionError."""
        if self.extraction is not None and extracted is None:
            raise ExpressionError(
                f"needs the LLM-extracted {self.extraction.kind} "
                f"({self.extraction.description!r}) but none was given",
                source=self.source,
            )
        try:
            return self._fn(_Env(state, refs, extracted, now))
        except ExpressionError:
            raise
        except RecursionError:
            raise ExpressionError("expression is nested too deeply", source=self.source) from None
        except Exception as exc:
            # A safety net: odd state values (custom objects) must not leak foreign exceptions.
            raise ExpressionError(
                f"evaluation failed: {type(exc).__name__}: {exc}", source=self.source
            ) from exc


def parse_expression(source: str, dialect: Dialect = "update") -> Expression:
    """Parse and compile `source` (cached); raises only ExpressionError."""
    if not isinstance(source, str):
        raise ExpressionError(f"expression must be a string, not {type(source).__name__}")
    if not isinstance(dialect, str) or dialect not in DIALECT_SLOTS:
        raise ExpressionError(f"unknown dialect {dialect!r}", source=source)
    return _parse_cached(source, dialect)


def evaluate_condition(
    source: str,
    state: Mapping[str, Any],
    *,
    refs: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> bool:
    """Parse `source` as a condition (cached), evaluate it and return its truthiness."""
    expression = parse_expression(source, "condition")
    value = expression.evaluate(state, refs=refs, now=now)
    return truthy(value, expression.source, None)


@lru_cache(maxsize=2048)
def _parse_cached(source: str, dialect: Dialect) -> Expression:
    try:
        return _parse(source, dialect)
    except ExpressionError:
        raise
    except RecursionError:
        raise ExpressionError("expression is nested too deeply", source=source) from None
    except Exception as exc:
        raise ExpressionError(f"cannot parse: {type(exc).__name__}: {exc}", source=source) from exc


def _parse(source: str, dialect: Dialect) -> Expression:
    if len(source) > MAX_LENGTH:
        # Report without echoing a huge source back into logs.
        raise ExpressionError(
            f"expression is too long ({len(source)} characters, the limit is {MAX_LENGTH})"
        )
    if not source.strip():
        raise ExpressionError("empty expression", source=source, position=0)
    parser = dialect_parser(dialect)
    try:
        tree = parser.parse(source)
    except UnexpectedInput as exc:
        raise_parse_error(exc, source, dialect, parser)
    except LarkError as exc:
        raise ExpressionError(f"cannot parse: {exc}", source=source) from None
    check_depth(tree, source)
    compiler = _Compiler(source, dialect)
    fn = compiler.compile(tree)
    return Expression(
        source=source,
        dialect=dialect,
        extraction=compiler.extraction,
        variables=frozenset(compiler.variables),
        references=frozenset(compiler.references),
        _fn=fn,
    )


# ----------------------------------------------------------------------------- compiler


_MISSING = object()


class _Compiler:
    """Turns a lark tree into nested closures, collecting variables and the extraction."""

    def __init__(self, source: str, dialect: Dialect) -> None:
        self.source = source
        self.dialect = dialect
        self.variables: set[str] = set()
        self.references: set[str] = set()
        self.extraction: LlmExtraction | None = None

    def fail(self, message: str, pos: int | None) -> NoReturn:
        raise ExpressionError(message, source=self.source, position=pos)

    def compile(self, node: Tree[Token] | Token) -> _Fn:
        if isinstance(node, Token):
            return self.token(node)
        handler = getattr(self, f"rule_{node.data}", None)
        if handler is None:  # pragma: no cover - the grammar and handlers are kept in step
            self.fail(f"internal error: no handler for {node.data}", None)
        return cast(_Fn, handler(node.children))

    # -- leaves

    def token(self, token: Token) -> _Fn:
        kind = token.type
        text = str(token)
        if kind == "NUMBER":
            try:
                number = parse_number(text)
            except ValueError:
                self.fail(f"number {text!r} is out of range", token.start_pos)
            return lambda env: number
        if kind == "STRING":
            value = decode_string(token, self.source)
            return lambda env: value
        if kind in ("TRUE", "FALSE"):
            flag = kind == "TRUE"
            return lambda env: flag
        if kind == "NULL":
            return lambda env: None
        if kind in ("WORD", "NAME") and text.lower() in KEYWORDS:
            # The contextual lexer only knows a keyword where the grammar accepts it, so `and`
            # in operand position arrives as a name; keep keywords reserved everywhere.
            self.fail(f"unexpected {text!r}: it is a keyword", token.start_pos)
        if kind == "WORD":
            # Dialogflow lets `$session.params.size = large` compare against the bare word.
            return lambda env: text
        if kind == "NAME":
            return self.variable(text, token.start_pos)
        if kind == "REF":
            if text.startswith(_SESSION_PREFIX):
                return self.variable(text[len(_SESSION_PREFIX) :], token.start_pos)
            return self.reference(text)
        if kind == "NOW_CALL":
            return self.now(text, token.start_pos)
        self.fail(f"unexpected {text!r}", token.start_pos)  # pragma: no cover

    def variable(self, path: str, pos: int | None) -> _Fn:
        parts = path.split(".")
        self.variables.add(parts[0])
        source = self.source
        strict = self.dialect == "update"

        def lookup(env: _Env) -> Any:
            value: Any = env.state
            for part in parts:
                if isinstance(value, Mapping) and part in value:
                    value = value[part]
                elif strict:
                    raise ExpressionError(f"unknown variable {path!r}", source=source, position=pos)
                else:
                    # Conditions read unset session parameters as null, like Dialogflow.
                    return None
            return value

        return lookup

    def reference(self, text: str) -> _Fn:
        self.references.add(text)
        parts = text.split(".")

        def lookup(env: _Env) -> Any:
            refs = env.refs
            if refs is None:
                return None
            value = refs.get(text, _MISSING)
            if value is not _MISSING:
                return value
            # Also accept nested mappings: {"$next-action": {"input": {"city": ...}}}.
            value = refs
            for part in parts:
                if not isinstance(value, Mapping) or part not in value:
                    return None
                value = value[part]
            return value

        return lookup

    def now(self, text: str, pos: int | None) -> _Fn:
        _, _, suffix = text.rpartition(")")
        if not suffix:
            return lambda env: env.now().isoformat(timespec="seconds")
        name = suffix[1:].lower()
        getter = NOW_FIELDS.get(name)
        if getter is None:
            self.fail(
                f"NOW() has no field {suffix[1:]!r}; use one of " + ", ".join(NOW_FIELDS),
                pos,
            )
        return lambda env: getter(env.now())

    # -- rules

    def rule_group(self, children: list[Any]) -> _Fn:
        return self.compile(children[0])

    def rule_llm(self, children: list[Any]) -> _Fn:
        llm_token = children[0]
        kind: LlmKind = "boolean"
        if len(children) == 4:
            kind = cast(LlmKind, children[1].type.removeprefix("KIND_").lower())
        if self.dialect != "update":
            self.fail("LLM extractions are allowed only in update expressions", llm_token.start_pos)
        if self.extraction is not None:
            self.fail(
                "only one LLM extraction is allowed per expression "
                "(each becomes one tool parameter named after the variable)",
                llm_token.start_pos,
            )
        description = decode_string(children[-1], self.source)
        self.extraction = LlmExtraction(kind, description)
        source = self.source
        return lambda env: coerce_extracted(env.extracted, kind, source)

    def rule_or_expr(self, children: list[Any]) -> _Fn:
        parts = [self.compile(child) for child in children]
        source = self.source

        def or_(env: _Env) -> bool:
            for part in parts:
                if truthy(part(env), source, None):
                    return True
            return False

        return or_

    def rule_and_expr(self, children: list[Any]) -> _Fn:
        parts = [self.compile(child) for child in children]
        source = self.source

        def and_(env: _Env) -> bool:
            for part in parts:
                if not truthy(part(env), source, None):
                    return False
            return True

        return and_

    def rule_not_op(self, children: list[Any]) -> _Fn:
        operand = self.compile(children[0])
        source = self.source
        return lambda env: not truthy(operand(env), source, None)

    def rule_cond_op(self, children: list[Any]) -> _Fn:
        return self._choice(children)

    def rule_if_call(self, children: list[Any]) -> _Fn:
        return self._choice(children)

    def _choice(self, children: list[Any]) -> _Fn:
        cond, then, otherwise = (self.compile(child) for child in children)
        source = self.source
        return lambda env: then(env) if truthy(cond(env), source, None) else otherwise(env)

    def rule_neg(self, children: list[Any]) -> _Fn:
        minus, operand_node = children
        operand = self.compile(operand_node)
        source, pos = self.source, minus.start_pos

        def neg(env: _Env) -> Any:
            value = operand(env)
            if not is_number(value):
                raise ExpressionError(
                    f"cannot negate a {type_name(value)}", source=source, position=pos
                )
            return -value

        return neg

    def rule_comparison(self, children: list[Any]) -> _Fn:
        left_node, op, right_node = children
        left, right = self.compile(left_node), self.compile(right_node)
        source, pos, symbol = self.source, op.start_pos, str(op)
        if op.type in ("EQ", "EQ2"):
            return lambda env: equal(left(env), right(env))
        if op.type == "NE":
            return lambda env: not equal(left(env), right(env))
        if op.type == "COLON":

            def contains(env: _Env) -> bool:
                return contains_item(left(env), right(env), source, pos)

            return contains
        check = ORDERINGS[op.type]

        def compare(env: _Env) -> bool:
            a, b = left(env), right(env)
            if a is None or b is None:
                # null is neither smaller nor larger than anything, so conditions on unset
                # parameters are simply false instead of failing the turn.
                return False
            if (is_number(a) and is_number(b)) or (isinstance(a, str) and isinstance(b, str)):
                return check(a, b)
            raise ExpressionError(
                f"cannot compare {type_name(a)} and {type_name(b)} with {symbol!r}",
                source=source,
                position=pos,
            )

        return compare

    def rule_sum(self, children: list[Any]) -> _Fn:
        return self._arithmetic(children)

    def rule_product(self, children: list[Any]) -> _Fn:
        return self._arithmetic(children)

    def _arithmetic(self, children: list[Any]) -> _Fn:
        first = self.compile(children[0])
        steps = [
            (
                ARITHMETIC[children[i].type],
                str(children[i]),
                children[i].start_pos,
                self.compile(children[i + 1]),
            )
            for i in range(1, len(children), 2)
        ]
        source = self.source

        def run(env: _Env) -> Any:
            value = first(env)
            for apply, symbol, pos, operand in steps:
                value = apply(value, operand(env), symbol, source, pos)
            return value

        return run

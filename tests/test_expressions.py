"""Tests for the expression engine: a table of expressions in both dialects, metadata, fuzzing."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voice_agent.errors import ExpressionError
from voice_agent.runtime.expressions import (
    MAX_DEPTH,
    MAX_LENGTH,
    Dialect,
    Expression,
    LlmExtraction,
    evaluate_condition,
    parse_expression,
)

# A Friday afternoon, so weekday is 5.
NOW = datetime(2024, 3, 15, 14, 30, 45)

STATE: dict[str, Any] = {
    "retry_count": 2,
    "name": "Alice",
    "size": "large",
    "price": 7,
    "ratio": 0.5,
    "zero": 0,
    "empty": "",
    "flag": True,
    "nothing": None,
    "tags": ["VIP", "new"],
    "user": {"address": {"city": "Paris"}, "age": 41},
    "count-1": 9,
}

REFS: dict[str, Any] = {
    "$next-action.name": "book_table",
    "$next-action.input.party_size": 4,
    "$next-action.input.city": "Lyon",
    "$last-action.name": "lookup",
    "$last-action.status": "error",
}


@dataclass(frozen=True)
class Err:
    """An expected ExpressionError: a fragment of its message and, optionally, its column."""

    fragment: str
    column: int | None = None


U: Dialect = "update"
C: Dialect = "condition"

# (dialect, source, expected value or Err, extracted value)
CASES: list[tuple[Any, ...]] = [
    # the seed examples
    (U, '(llm: "User sounds frustrated with the conversation") OR (retry_count > 3)', True, True),
    (U, '(llm: "User sounds frustrated with the conversation") OR (retry_count > 3)', False, "no"),
    (U, "retry_count + 1", 3, None),
    (U, 'llm string: "Department the caller chose"', "Sales", "Sales"),
    (C, "$session.params.size = large", True, None),
    # constants
    (U, "42", 42, None),
    (U, "3.25", 3.25, None),
    (U, "1e3", 1000.0, None),
    (U, "'single'", "single", None),
    (U, '"double"', "double", None),
    (U, r'"say \"hi\"\n"', 'say "hi"\n', None),
    (U, r"'it\'s'", "it's", None),
    (U, r'"\u00e9t\u00e9"', "été", None),
    (U, "TRUE", True, None),
    (U, "False", False, None),
    (C, "NuLl", None, None),
    # arithmetic and precedence
    (U, "1 + 2 * 3", 7, None),
    (U, "(1 + 2) * 3", 9, None),
    (U, "10 - 4 - 3", 3, None),
    (U, "7 / 2", 3.5, None),
    (U, "7 % 3", 1, None),
    (U, "-price + 10", 3, None),
    (U, "- -3", 3, None),
    (U, "2 * -3", -6, None),
    (U, "price * ratio", 3.5, None),
    (U, '"ab" + "cd"', "abcd", None),
    (U, 'name + " Smith"', "Alice Smith", None),
    (C, "$session.params.price * 2 - 4", 10, None),
    # comparison
    (U, "price = 7", True, None),
    (U, "price == 7.0", True, None),
    (U, "price != 7", False, None),
    (U, "price < 8", True, None),
    (U, "price <= 7", True, None),
    (U, "price > 7", False, None),
    (U, "price >= 7", True, None),
    (U, '"apple" < "banana"', True, None),
    (U, 'price = "7"', False, None),
    (U, "flag = 1", False, None),
    (U, 'name = "alice"', False, None),
    (U, "1 + 1 = 2", True, None),
    # logic
    (U, "flag AND price > 3", True, None),
    (U, "flag and zero", False, None),
    (U, "zero OR empty", False, None),
    (U, "zero or name", True, None),
    (U, "NOT flag", False, None),
    (U, "not empty", True, None),
    (U, "Not price = 8", True, None),
    (U, "flag OR missing_variable", True, None),
    (U, "zero AND missing_variable", False, None),
    (U, "zero OR flag AND empty", False, None),
    (U, "(zero OR flag) AND price", True, None),
    (C, "$session.params.flag AND NOT $session.params.zero", True, None),
    # ternaries
    (U, 'retry_count > 1 ? "many" : "few"', "many", None),
    (U, 'zero ? "a" : flag ? "b" : "c"', "b", None),
    (U, "flag ? 1 + 1 : 0", 2, None),
    (U, 'IF(price > 5, "pricey", "cheap")', "pricey", None),
    (C, 'if($session.params.zero, "yes", "no")', "no", None),
    (U, "IF(flag, 1, 1 / 0)", 1, None),
    (U, "IF(IF(zero, 1, 0), 1, IF(flag, 2, 3))", 2, None),
    # variables and nesting
    (U, "user.address.city", "Paris", None),
    (U, "$session.params.retry_count * 10", 20, None),
    (U, "user.age + 1", 42, None),
    (U, "((((((((((price))))))))))", 7, None),
    (U, "((1 + (2 * (3 + (4 - 1)))) * 2)", 26, None),
    # llm forms
    (U, '(llm number: "How many people")', 4, "4"),
    (U, 'llm number: "How many people" + 1', 3.5, 2.5),
    (U, 'llm boolean: "Wants a callback"', True, "Yes"),
    (U, 'llm: "Wants a callback"', False, False),
    (U, 'retry_count + llm number: "extra"', 5, " 3 "),
    (U, '(llm string: "City") + ", France"', "Nice, France", "Nice"),
    # condition references, NOW() and null handling
    (C, '$next-action.name = "book_table"', True, None),
    (C, "$next-action.input.party_size >= 4", True, None),
    (C, "$next-action.input.city = Lyon", True, None),
    (C, '$last-action.status = "error" AND $last-action.name = lookup', True, None),
    (C, "$next-action.input.unknown = null", True, None),
    (C, "$session.params.unset = null", True, None),
    (C, "$session.params.unset > 3", False, None),
    (C, "$session.params.unset", None, None),
    (C, "$session.params.user.address.city = Paris", True, None),
    (C, "$session.params.count-1", 9, None),
    (C, "$sys.func.NOW().hours", 14, None),
    (C, "$sys.func.NOW().minutes", 30, None),
    (C, "$sys.func.NOW().seconds", 45, None),
    (C, "$sys.func.NOW().year", 2024, None),
    (C, "$sys.func.NOW().month", 3, None),
    (C, "$sys.func.NOW().day", 15, None),
    (C, "$sys.func.NOW().weekday", 5, None),
    (C, "$sys.func.NOW().hours >= 9 AND $sys.func.NOW().hours < 17", True, None),
    (C, "$sys.func.NOW()", "2024-03-15T14:30:45", None),
    (U, "NOW().weekday = 5", True, None),
    (U, "nothing = null", True, None),
    (U, "nothing < 3", False, None),
    (U, "null != 0", True, None),
    # contains (condition only)
    (C, '$session.params.name : "lic"', True, None),
    (C, '$session.params.name : "LIC"', True, None),
    (C, '$session.params.name : "bob"', False, None),
    (C, "$session.params.tags : vip", True, None),
    (C, '$session.params.tags : "old"', False, None),
    (C, "$session.params.unset : x", False, None),
    (C, "$session.params.user : age", True, None),
    # type errors
    (U, '1 + "a"', Err("cannot apply '+' to number and string", 3)),
    (U, 'name - "x"', Err("cannot apply '-' to string and string", 6)),
    (U, "flag + 1", Err("boolean and number")),
    (U, 'price < "8"', Err("cannot compare number and string with '<'", 7)),
    (U, "-name", Err("cannot negate a string", 1)),
    (U, "nothing + 1", Err("null and number")),
    (C, "$session.params.price : 7", Err("cannot apply ':' to number and number")),
    # runtime errors
    (U, "retry_count / 0", Err("division by zero", 13)),
    (U, "price % zero", Err("division by zero")),
    (U, "unknown_var + 1", Err("unknown variable 'unknown_var'", 1)),
    (U, "user.phone", Err("unknown variable 'user.phone'")),
    (U, "$session.params.missing", Err("unknown variable 'missing'")),
    (U, '(llm: "x") OR flag', Err("needs the LLM-extracted boolean"), None),
    (U, 'llm number: "x"', Err("not a valid number"), "four"),
    (U, 'llm boolean: "x"', Err("not a valid boolean"), "maybe"),
    (U, 'llm string: "x"', Err("not a valid string"), 3),
    # parse errors
    (U, "", Err("empty expression")),
    (U, "1 +", Err("unexpected end of expression", 4)),
    (U, "(1 + 2", Err("expected ')'", 7)),
    (U, "1 + * 2", Err("unexpected '*'", 5)),
    (U, "price 3", Err("unexpected '3'", 7)),
    (U, "a < b < c", Err("comparisons do not chain", 7)),
    (C, "1 = 1 = 1", Err("comparisons do not chain", 7)),
    (U, '"unterminated', Err("unterminated string", 1)),
    (U, "price # 2", Err("unexpected character '#'", 7)),
    (U, "name : x", Err("':' (contains) exists only in conditions", 6)),
    (C, "flag ? 1 : 2", Err("exists only in update expressions", 6)),
    (C, 'llm: "x"', Err("only in update expressions", 1)),
    (U, '(llm: "a") AND llm string: "b"', Err("only one LLM extraction", 16)),
    (U, "NOW().fortnight", Err("NOW() has no field 'fortnight'", 1)),
    (U, "IF(flag, 1)", Err("unexpected ')'", 11)),
    (U, r'"\u12"', Err("bad \\u escape", 2)),
    (U, "1e999", Err("out of range", 1)),
    (U, "and", Err("unexpected 'and'", 1)),
    (U, "1 + NOT flag", Err("put NOT and its operand in parentheses", 5)),
    (U, "flag price", Err("expected an operator", 6)),
    (C, "$session.params.x = or", Err("it is a keyword", 21)),
    (U, "x" * (MAX_LENGTH + 1), Err("too long")),
    (U, "(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), Err("nested too deeply")),
    (U, "-" * 150 + "1", Err("nested too deeply")),
]


def _case_id(case: tuple[Any, ...]) -> str:
    dialect, source, *_ = case
    return f"{dialect[0]}:{source[:40]}"


@pytest.mark.parametrize(
    ("dialect", "source", "expected", "extracted"),
    [case if len(case) == 4 else (*case, None) for case in CASES],
    ids=[_case_id(case) for case in CASES],
)
def test_expression_table(dialect: Dialect, source: str, expected: Any, extracted: Any) -> None:
    if isinstance(expected, Err):
        with pytest.raises(ExpressionError, match=re.escape(expected.fragment)) as info:
            parse_expression(source, dialect).evaluate(
                STATE, refs=REFS, extracted=extracted, now=NOW
            )
        if expected.column is not None:
            assert info.value.position is not None
            assert info.value.position + 1 == expected.column
        return
    result = parse_expression(source, dialect).evaluate(
        STATE, refs=REFS, extracted=extracted, now=NOW
    )
    assert result == expected
    assert type(result) is type(expected)


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 80


@pytest.mark.parametrize(
    ("source", "dialect", "extraction", "variables"),
    [
        (
            '(llm: "User sounds frustrated with the conversation") OR (retry_count > 3)',
            "update",
            LlmExtraction("boolean", "User sounds frustrated with the conversation"),
            {"retry_count"},
        ),
        ("retry_count + 1", "update", None, {"retry_count"}),
        (
            'llm string: "Department the caller chose"',
            "update",
            LlmExtraction("string", "Department the caller chose"),
            set(),
        ),
        ('llm number: "Age" + offset', "update", LlmExtraction("number", "Age"), {"offset"}),
        ("user.address.city = $session.params.city", "update", None, {"user", "city"}),
        ("$session.params.size = large AND $next-action.name = x", "condition", None, {"size"}),
        ("$sys.func.NOW().hours > 9", "condition", None, set()),
        ("string + number", "update", None, {"string", "number"}),
    ],
)
def test_extraction_and_variables(
    source: str, dialect: Dialect, extraction: LlmExtraction | None, variables: set[str]
) -> None:
    expression = parse_expression(source, dialect)
    assert expression.extraction == extraction
    assert expression.variables == frozenset(variables)


def test_references_are_listed() -> None:
    expression = parse_expression(
        "$next-action.name = x OR $session.params.y = 1 OR $last-action.status = ok", "condition"
    )
    assert expression.references == {"$next-action.name", "$last-action.status"}


def test_parse_is_cached_and_immutable() -> None:
    first = parse_expression("retry_count + 1")
    assert parse_expression("retry_count + 1") is first
    assert parse_expression("retry_count + 1", "condition") is not first
    with pytest.raises(AttributeError):
        first.source = "other"  # type: ignore[misc]


def test_evaluate_condition() -> None:
    assert evaluate_condition("$session.params.size = large", {"size": "large"}) is True
    assert evaluate_condition("$session.params.size", {}) is False
    assert evaluate_condition("$session.params.tags", {"tags": ["a"]}) is True
    assert evaluate_condition('$next-action.name = "pay"', {}, refs=REFS) is False
    assert evaluate_condition("$sys.func.NOW().weekday = 5", {}, now=NOW) is True
    # Sunday is 7, Monday is 1.
    assert evaluate_condition("$sys.func.NOW().weekday = 7", {}, now=datetime(2024, 3, 17))
    assert evaluate_condition("$sys.func.NOW().weekday = 1", {}, now=datetime(2024, 3, 18))


def test_refs_may_be_nested_mappings() -> None:
    refs = {"$next-action": {"name": "pay", "input": {"amount": 12}}}
    assert evaluate_condition("$next-action.input.amount > 10", {}, refs=refs)
    assert evaluate_condition("$next-action.input.missing = null", {}, refs=refs)
    assert evaluate_condition("$next-action.name = null", {}, refs=None)


def test_now_defaults_to_the_clock() -> None:
    hours = parse_expression("$sys.func.NOW().hours", "condition").evaluate({})
    assert isinstance(hours, int)
    assert 0 <= hours <= 23


def test_keywords_are_case_insensitive_and_prefixes_are_names() -> None:
    state = {"android": 1, "ORDER": 2, "nothing": 3, "iffy": 4, "truex": 5, "llmx": 6}
    expression = parse_expression("android + ORDER + nothing + iffy + truex + llmx")
    assert expression.evaluate(state) == 21
    assert parse_expression("TRUE aNd NoT fAlSe Or NULL").evaluate({}) is True


def test_non_string_input_is_an_expression_error() -> None:
    with pytest.raises(ExpressionError, match="must be a string"):
        parse_expression(3)  # type: ignore[arg-type]
    with pytest.raises(ExpressionError, match="must be a string"):
        parse_expression(["a"])  # type: ignore[arg-type]
    with pytest.raises(ExpressionError, match="unknown dialect"):
        parse_expression("1", "sql")  # type: ignore[arg-type]
    with pytest.raises(ExpressionError, match="unknown dialect"):
        parse_expression("1", ["update"])  # type: ignore[arg-type]


def test_odd_state_values_raise_expression_error() -> None:
    class Weird:
        def __bool__(self) -> bool:
            raise ValueError("no truth here")

    with pytest.raises(ExpressionError, match="as true/false"):
        parse_expression("NOT w").evaluate({"w": Weird()})
    with pytest.raises(ExpressionError, match="number too large"):
        parse_expression("big / 3").evaluate({"big": 10**400})


def test_error_positions_are_zero_based_and_column_is_one_based() -> None:
    with pytest.raises(ExpressionError) as info:
        parse_expression("1 +   ")
    assert info.value.position == 3
    assert "at column 4" in str(info.value)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 1000, 5000])
def test_deep_parentheses_are_rejected_clearly(levels: int) -> None:
    source = "(" * levels + "1" + ")" * levels
    with pytest.raises(ExpressionError, match=r"nested too deeply|too long"):
        parse_expression(source)


def test_nesting_at_the_limit_is_fine() -> None:
    source = "(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH
    assert parse_expression(source).evaluate({}) == 1
    # Chains of the same operator are flat, so they do not count as nesting.
    chained = " + ".join(["p"] * 300)
    assert parse_expression(chained).evaluate({"p": 1}) == 300


# --------------------------------------------------------------------------- property-based

TOKENS = [
    "1", "0", "2.5", "1e3", "'a'", '"b"', r'"\n"', r'"\u0041"', "true", "FALSE", "null",
    "x", "y", "a.b", "string", "number", "llm", "boolean", "$session.params.x",
    "$session.params.a.b", "$next-action.name", "$next-action.input.x", "$sys.func.NOW()",
    "$sys.func.NOW().hours", "NOW().weekday", "IF", "(", ")", ",", "+", "-", "*", "/", "%",
    "=", "==", "!=", "<", "<=", ">", ">=", ":", "?", "AND", "or", "Not", "large",
]  # fmt: skip

token_text = st.lists(st.sampled_from(TOKENS), max_size=25).map(" ".join)

LEAVES = [
    "1", "0", "2.5", "-3", "'a'", '"B"', "true", "false", "null", "x", "y", "a.b", "string",
    "$session.params.x", "$session.params.a.b", "$next-action.name", "$next-action.input.x",
    "$sys.func.NOW()", "NOW().hours", "NOW().weekday",
]  # fmt: skip
BINARY = ["+", "-", "*", "/", "%", "=", "==", "!=", "<", "<=", ">", ">=", "AND", "or", ":"]


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from(BINARY), children).map(lambda t: " ".join(t)),
        st.tuples(children, children, children).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
        st.tuples(children, children, children).map(lambda t: "IF({}, {}, {})".format(*t)),
        children.map(lambda c: f"({c})"),
        children.map(lambda c: f"NOT {c}"),
        children.map(lambda c: f"-({c})"),
    )


# Mostly well-formed expressions, so evaluation is exercised and not just the parser.
grammar_text = st.recursive(
    st.sampled_from(LEAVES) | st.sampled_from(['(llm: "q")', 'llm number: "n"']),
    _combine,
    max_leaves=12,
)
dialects = st.sampled_from(["update", "condition"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "x"]), children, max_size=3)
    ),
    max_leaves=8,
)
states = st.dictionaries(st.sampled_from(["x", "y", "a", "string", "number"]), json_values)
refs_maps = st.dictionaries(
    st.sampled_from(["$next-action.name", "$next-action.input.x", "$next-action"]), json_values
)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _parse_or_none(source: str, dialect: Dialect) -> Expression | None:
    try:
        return parse_expression(source, dialect)
    except ExpressionError:
        return None


@FUZZ
@given(source=st.text(max_size=60), dialect=dialects)
def test_arbitrary_text_parses_or_raises_expression_error(source: str, dialect: Dialect) -> None:
    result = _parse_or_none(source, dialect)
    assert result is None or isinstance(result, Expression)


@FUZZ
@given(source=token_text | grammar_text, dialect=dialects)
def test_token_soup_parses_or_raises_expression_error(source: str, dialect: Dialect) -> None:
    result = _parse_or_none(source, dialect)
    assert result is None or isinstance(result, Expression)


@FUZZ
@given(
    source=grammar_text | token_text,
    dialect=dialects,
    state=states,
    refs=refs_maps,
    extracted=json_values,
)
def test_evaluation_returns_a_value_or_raises_expression_error(
    source: str, dialect: Dialect, state: dict[str, Any], refs: dict[str, Any], extracted: Any
) -> None:
    expression = _parse_or_none(source, dialect)
    if expression is None:
        return
    try:
        expression.evaluate(state, refs=refs, extracted=extracted, now=NOW)
    except ExpressionError:
        pass


@settings(FUZZ, max_examples=40)
@given(
    depth=st.integers(min_value=1, max_value=5000),
    opener=st.sampled_from(["(", "-", "NOT ", "IF(1,1,", "-(", "x ? 1 : "]),
)
def test_deep_nesting_of_any_kind_raises_expression_error(depth: int, opener: str) -> None:
    closer = {"(": ")", "IF(1,1,": ")", "-(": ")"}.get(opener, "")
    source = opener * depth + "1" + closer * depth
    expression = _parse_or_none(source, "update")
    if expression is not None:
        expression.evaluate({"x": 1})

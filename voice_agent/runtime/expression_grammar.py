"""The expression language's grammar (lark, LALR(1); one template for the update and the
condition dialects) and what a source that does not parse is told: the error at its position,
in words, and the nesting limit."""

from __future__ import annotations

from typing import NoReturn

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternStr

from voice_agent.errors import ExpressionError

#: Deepest accepted nesting: each parenthesis, NOT, unary minus, IF, ternary or change of
#: operator adds a level (a chain like `a + b + c` is one level).
MAX_DEPTH = 100

# One template for both dialects; the slots hold what differs between them. Keeping ':' (contains)
# out of the update dialect and '? :' out of the condition dialect keeps the grammar LALR(1) and
# unambiguous next to the `llm: "..."` form.
_GRAMMAR = r"""
?start: expr
?expr: {top}
{ternary}
?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: _NOT not_expr -> not_op
         | comparison
?comparison: sum (_comp_op sum)?
_comp_op: EQ | EQ2 | NE | LT | LE | GT | GE {contains}
?sum: product ((PLUS | MINUS) product)*
?product: unary ((STAR | SLASH | PERCENT) unary)*
?unary: MINUS unary -> neg
      | primary
?primary: NUMBER
        | STRING
        | TRUE
        | FALSE
        | NULL
        | {word}
        | REF
        | NOW_CALL
        | _IF "(" expr "," expr "," expr ")" -> if_call
        | "(" expr ")" -> group
        | LLM (KIND_BOOLEAN | KIND_STRING | KIND_NUMBER)? COLON STRING -> llm

EQ2: "=="
EQ: "="
NE: "!="
LE: "<="
GE: ">="
LT: "<"
GT: ">"
COLON: ":"
PLUS: "+"
MINUS: "-"
STAR: "*"
SLASH: "/"
PERCENT: "%"
_OR: "or"i
_AND: "and"i
_NOT: "not"i
_IF: "if"i
TRUE: "true"i
FALSE: "false"i
NULL: "null"i
LLM: "llm"i
KIND_BOOLEAN: "boolean"i
KIND_STRING: "string"i
KIND_NUMBER: "number"i
NUMBER: /\d+(\.\d+)?([eE][+-]?\d+)?/
STRING: /"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'/s
NAME: /[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*/i
WORD: /[A-Za-z_][A-Za-z0-9_]*/i
REF: /\$[A-Za-z_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?(?:\.[A-Za-z_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)*/
NOW_CALL.3: /(?:\$sys\.func\.)?now\s*\(\s*\)(?:\.[A-Za-z_][A-Za-z0-9_]*)?/i
%ignore /\s+/
"""

DIALECT_SLOTS: dict[str, dict[str, str]] = {
    "update": {
        "top": "ternary",
        "ternary": '?ternary: or_expr "?" ternary ":" ternary -> cond_op\n        | or_expr',
        "contains": "",
        "word": "NAME",
    },
    "condition": {"top": "or_expr", "ternary": "", "contains": "| COLON", "word": "WORD"},
}

_PARSERS: dict[str, Lark] = {}

# How parse errors name what was expected instead of lark's terminal names.
_FRIENDLY_TERMINALS = {
    "NUMBER": "a number",
    "STRING": "a string",
    "NAME": "a variable",
    "WORD": "a word",
    "REF": "a $reference",
    "NOW_CALL": "NOW()",
    "$END": "end of expression",
}

_OPERAND_TERMINALS = {"NUMBER", "STRING"}

_COMPARISON_TERMINALS = {"EQ", "EQ2", "NE", "LT", "LE", "GT", "GE"}


def dialect_parser(dialect: str) -> Lark:
    parser = _PARSERS.get(dialect)
    if parser is None:
        grammar = _GRAMMAR.format(**DIALECT_SLOTS[dialect])
        # Built once per dialect; the contextual lexer keeps 'string'/'number' usable as names
        # everywhere except right after 'llm'.
        parser = Lark(grammar, parser="lalr", lexer="contextual", propagate_positions=False)
        _PARSERS[dialect] = parser
    return parser


def raise_parse_error(exc: UnexpectedInput, source: str, dialect: str, parser: Lark) -> NoReturn:
    if isinstance(exc, UnexpectedCharacters):
        pos: int = exc.pos_in_stream or 0
        char = source[pos] if 0 <= pos < len(source) else ""
        if char in ("'", '"'):
            message = "unterminated string"
        elif char == "?" and dialect == "condition":
            message = "unexpected '?': 'cond ? a : b' exists only in update expressions; use IF()"
        elif char == "$":
            message = "unexpected '$': a reference looks like $session.params.name"
        else:
            message = f"unexpected character {char!r}"
        raise ExpressionError(message, source=source, position=pos) from None
    if isinstance(exc, UnexpectedToken):
        token = exc.token
        previous = exc.token_history[-1] if exc.token_history else None
        if (
            previous is not None
            and previous.type in ("NAME", "WORD")
            and str(previous).lower() in KEYWORDS
        ):
            # A keyword where the grammar does not accept one (`1 + NOT x`) was lexed as a
            # name; blame the keyword, not the token after it.
            hint = (
                "; put NOT and its operand in parentheses" if str(previous).lower() == "not" else ""
            )
            raise ExpressionError(
                f"unexpected {str(previous)!r}{hint}",
                source=source,
                position=previous.start_pos,
            ) from None
        expected = set(exc.expected)
        if token.type == "$END":
            message = "unexpected end of expression"
            pos = len(source.rstrip())
        else:
            message = f"unexpected {str(token.value)!r}"
            pos = token.start_pos if token.start_pos is not None else 0
        if token.type in _COMPARISON_TERMINALS and not expected & _OPERAND_TERMINALS:
            message += "; comparisons do not chain, combine them with AND"
        elif token.type == "COLON" and dialect == "update" and "COLON" not in expected:
            message += "; ':' (contains) exists only in conditions"
        else:
            message += f", expected {_describe_expected(expected, parser)}"
        raise ExpressionError(message, source=source, position=pos) from None
    raise ExpressionError(
        f"cannot parse: {exc}", source=source, position=getattr(exc, "pos_in_stream", None)
    ) from None


def _describe_expected(expected: set[str], parser: Lark) -> str:
    if expected & _OPERAND_TERMINALS:
        return "a value"
    names: list[str] = []
    for name in sorted(expected):
        if name in _FRIENDLY_TERMINALS:
            names.append(_FRIENDLY_TERMINALS[name])
            continue
        try:
            pattern = parser.get_terminal(name).pattern
        except KeyError:
            names.append(name)
            continue
        if isinstance(pattern, PatternStr):
            text = pattern.value
            names.append(repr(text.upper() if text.isalpha() else text))
        else:
            names.append(name)
    if len(names) > 8:
        # LALR merges lookaheads, so a long list would name tokens that cannot really follow.
        return "an operator"
    return " or ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " or " + names[-1]


def check_depth(tree: Tree[Token], source: str) -> None:
    # Iterative, so a pathological tree cannot exhaust the Python stack before it is rejected;
    # below the limit the recursive compiler and closures are safe.
    # Only operator nodes count: a lone value is depth 0, `(1)` is depth 1.
    stack: list[tuple[Tree[Token] | Token, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, Tree):
            continue
        if depth > MAX_DEPTH:
            raise ExpressionError(
                f"expression is nested too deeply (more than {MAX_DEPTH} levels)", source=source
            )
        stack.extend((child, depth + 1) for child in node.children)


KEYWORDS = frozenset({"and", "or", "not", "if", "true", "false", "null", "llm"})

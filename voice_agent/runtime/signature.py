"""Turn an operator's Python function into an LLM tool (JSON schema) and bind the LLM's arguments.

`describe_function` checks the signature at load time; `bind_arguments` validates each call.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
import sys
import types
import typing
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import docstring_parser
import typing_extensions
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from voice_agent.errors import ConfigError, ToolError

__all__ = ["FunctionSpec", "bind_arguments", "describe_function"]

# OpenAI rejects tool names outside this pattern, so catch them at load time rather than per call.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

# coerce_numbers_to_str: LLMs often send phone numbers or codes as JSON numbers for str parameters.
_MODEL_CONFIG = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

# JSON-schema keywords whose values are schemas; everything else ("default", "enum", "const",
# "examples", ...) is data and must not be rewritten, even if it contains a "title" key.
_SCHEMA_MAP_KEYS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
_SCHEMA_LIST_KEYS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMA_KEYS = frozenset(
    {
        "items",
        "additionalProperties",
        "additionalItems",
        "unevaluatedItems",
        "unevaluatedProperties",
        "not",
        "contains",
        "propertyNames",
        "if",
        "then",
        "else",
    }
)
_DEFS_PREFIX = "#/$defs/"

_MAX_PROBLEMS = 6
_MAX_INPUT_REPR = 60


@dataclass(frozen=True)
class FunctionSpec:
    """What the LLM is told about one tool: its name, purpose and argument schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    is_async: bool

    def tool_schema(self) -> dict[str, Any]:
        """The entry for the OpenAI chat-completions "tools" list."""
        # A copy, so a provider adapter that edits the schema cannot corrupt the shared spec.
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }


@dataclass(frozen=True)
class _Analysis:
    """Everything derived from one function, computed once and reused for every call."""

    model: type[BaseModel]
    fields: tuple[tuple[str, str], ...]  # (parameter name, field name in `model`)
    parameters: dict[str, Any]
    description: str
    is_async: bool


_cache: weakref.WeakKeyDictionary[Any, _Analysis] = weakref.WeakKeyDictionary()
# Bound methods are created afresh on each attribute access, so they are cached by their
# function; kept apart from _cache because the unbound function's signature includes `self`.
_method_cache: weakref.WeakKeyDictionary[Any, _Analysis] = weakref.WeakKeyDictionary()


def describe_function(
    fn: Callable[..., Any], *, name: str | None = None, file: str | None = None
) -> FunctionSpec:
    """Build the tool description of `fn`, or raise ConfigError saying what in it is unsupported.

    `name` overrides the tool name (default: the function's name); `file` locates errors
    (default: the file the function is defined in).
    """
    tool_name = name if name is not None else getattr(fn, "__name__", None)
    if file is None:
        file = _source_file(fn)
    if not tool_name:
        raise ConfigError("the callable has no __name__; pass name=", file=file)
    if not _TOOL_NAME.fullmatch(tool_name):
        raise ConfigError(
            f"tool name {tool_name!r} must be 1-64 ASCII letters, digits, '_' or '-'",
            file=file,
            key=tool_name,
        )
    analysis = _analyse(fn, tool_name, file)
    return FunctionSpec(
        name=tool_name,
        description=analysis.description,
        parameters=copy.deepcopy(analysis.parameters),
        is_async=analysis.is_async,
    )


def bind_arguments(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the LLM's decoded JSON arguments for `fn` and return keyword arguments to call it.

    Values are coerced to the declared types (pydantic lax mode) and defaults are filled in.
    Raises ToolError with a message meant for the LLM when arguments are missing, unknown or
    of the wrong type.
    """
    analysis = _analyse(fn, None, None)
    if not isinstance(arguments, Mapping):
        raise ToolError(
            f"Invalid arguments: expected a JSON object of named arguments, "
            f"got {_short_repr(arguments)}"
        )
    try:
        validated = analysis.model.model_validate(dict(arguments))
    except ValidationError as exc:
        raise ToolError(_describe_errors(exc, arguments, analysis)) from None
    return {param: getattr(validated, field) for param, field in analysis.fields}


# --- analysis -------------------------------------------------------------------------------


def _analyse(fn: Callable[..., Any], tool_name: str | None, file: str | None) -> _Analysis:
    cache, key = (_method_cache, fn.__func__) if inspect.ismethod(fn) else (_cache, fn)
    try:
        cached = cache.get(key)
    except TypeError:  # not weakly referenceable (some builtins): analyse on every call
        cached = None
    if cached is not None:
        return cached
    # Only worked out on a cache miss: they are needed for error messages alone.
    if tool_name is None:
        tool_name = getattr(fn, "__name__", None) or repr(fn)
    if file is None:
        file = _source_file(fn)
    analysis = _build_analysis(fn, tool_name, file)
    try:
        cache[key] = analysis
    except TypeError:
        pass
    return analysis


def _build_analysis(fn: Callable[..., Any], tool_name: str, file: str | None) -> _Analysis:
    def fail(message: str) -> ConfigError:
        return ConfigError(message, file=file, key=tool_name)

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise fail(f"cannot read the signature: {exc}") from exc

    summary, param_docs = _parse_docstring(fn)
    globalns = _globals_of(fn)

    params: list[tuple[str, Any, Any]] = []  # (name, resolved annotation, default or ...)
    for param in signature.parameters.values():
        pname = param.name
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            raise fail(
                f"*{pname} is not supported: the LLM passes named arguments, "
                "so declare each one as its own parameter"
            )
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            raise fail(
                f"**{pname} is not supported: declare each argument the LLM may pass "
                "as its own typed parameter"
            )
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise fail(
                f"parameter {pname!r} is positional-only (before '/'); "
                "the LLM passes arguments by name"
            )
        if pname.startswith("_"):
            raise fail(
                f"parameter {pname!r} starts with '_'; tool parameter names are shown to the "
                "LLM and must be public, so rename it"
            )
        if param.annotation is inspect.Parameter.empty:
            raise fail(
                f"parameter {pname!r} has no type hint; annotate it (e.g. '{pname}: str') "
                "so the LLM knows what to pass"
            )
        annotation = _resolve_annotation(pname, param.annotation, globalns, fail)
        default = ... if param.default is inspect.Parameter.empty else param.default
        params.append((pname, _compat_type(annotation), default))

    # Fields get neutral names and carry the parameter name as alias, so parameters called
    # "json", "copy" or "model_config" cannot clash with BaseModel's own attributes.
    fields = tuple((pname, f"p{index}") for index, (pname, _, _) in enumerate(params))
    definitions: dict[str, Any] = {
        field: (Annotated[annotation, Field(alias=pname)], default)
        for (pname, field), (_, annotation, default) in zip(fields, params, strict=True)
    }
    try:
        model = create_model(f"{tool_name}_arguments", __config__=_MODEL_CONFIG, **definitions)
        raw_schema = model.model_json_schema()
    except Exception as exc:
        # pydantic reports the failure for the model as a whole; find the parameter to blame.
        raise _unsupported_type(params, exc, fail) from exc

    parameters = _clean_schema(raw_schema)
    properties = parameters["properties"]
    for pname, field in fields:
        doc = param_docs.get(pname)
        prop = properties.get(pname)
        # An explicit Field(description=...) wins; the docstring beats the description a model
        # or TypedDict type brings from its class docstring, being specific to this parameter.
        if doc and isinstance(prop, dict) and model.model_fields[field].description is None:
            properties[pname] = {
                "description": doc,
                **{k: v for k, v in prop.items() if k != "description"},
            }

    return _Analysis(
        model=model,
        fields=fields,
        parameters=parameters,
        description=summary,
        is_async=_is_async(fn),
    )


def _resolve_annotation(
    pname: str, annotation: Any, globalns: dict[str, Any], fail: Callable[[str], ConfigError]
) -> Any:
    """Evaluate one parameter's hint, including string hints from `from __future__ import ...`."""
    # One parameter at a time, so the error names the hint at fault and an unresolvable
    # return annotation (which the schema never needs) does no harm.
    holder = types.SimpleNamespace(__annotations__={pname: annotation})
    try:
        return typing.get_type_hints(holder, globalns=globalns, include_extras=True)[pname]
    except Exception as exc:
        text = annotation if isinstance(annotation, str) else _type_name(annotation)
        hint = ""
        if isinstance(exc, NameError):
            hint = " (types used in hints must be importable from the module's top level)"
        raise fail(
            f"cannot resolve the type hint {text!r} of parameter {pname!r}: {exc}{hint}"
        ) from exc


def _unsupported_type(
    params: Sequence[tuple[str, Any, Any]], exc: Exception, fail: Callable[[str], ConfigError]
) -> ConfigError:
    for pname, annotation, _ in params:
        try:
            TypeAdapter(annotation).json_schema()
        except Exception as param_exc:
            return fail(
                f"parameter {pname!r} has type {_type_name(annotation)}, which cannot be "
                f"described to the LLM as JSON: {_first_line(param_exc)}"
            )
    # Each type is fine alone, so a default value or the combination is at fault.
    return fail(f"cannot build a JSON schema for the parameters: {_first_line(exc)}")


def _compat_type(tp: Any) -> Any:
    """Rewrite typing.TypedDict classes as typing_extensions ones, which pydantic needs on 3.11."""
    if sys.version_info >= (3, 12):
        return tp
    try:
        return _rewrite_typeddicts(tp, {})
    except Exception:
        # e.g. an unresolvable hint inside the TypedDict: pydantic's own error says it better.
        return tp


def _rewrite_typeddicts(tp: Any, seen: dict[Any, Any]) -> Any:
    if typing.is_typeddict(tp) and type(tp).__module__ == "typing":
        if tp in seen:
            # Recursive TypedDict: leave it, pydantic then explains the version limitation.
            return seen[tp]
        seen[tp] = tp
        hints = typing.get_type_hints(tp, include_extras=True)
        fields: dict[str, Any] = {}
        for key, hint in hints.items():
            inner = _rewrite_typeddicts(_strip_required(hint), seen)
            if _is_required_key(key, hint, tp):
                fields[key] = typing_extensions.Required[inner]
            else:
                fields[key] = typing_extensions.NotRequired[inner]
        make_typeddict: Any = typing_extensions.TypedDict
        rewritten = make_typeddict(tp.__name__, fields)
        rewritten.__doc__ = tp.__doc__
        rewritten.__module__ = tp.__module__
        seen[tp] = rewritten
        return rewritten

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is None or not args or origin is typing.Literal:
        return tp
    if origin is Annotated:
        inner = _rewrite_typeddicts(args[0], seen)
        return tp if inner is args[0] else Annotated[(inner, *tp.__metadata__)]
    new_args = tuple(_rewrite_typeddicts(arg, seen) for arg in args)
    if all(new is old for new, old in zip(new_args, args, strict=True)):
        return tp
    if origin in (typing.Union, types.UnionType):
        return typing.Union[new_args]  # noqa: UP007 - subscripting with a runtime tuple
    try:
        return tp.copy_with(new_args)
    except AttributeError:
        return origin[new_args]


def _is_required_key(key: str, hint: Any, typeddict: Any) -> bool:
    # With string annotations, 3.11 computes __required_keys__ without seeing Required[...]
    # or NotRequired[...], so the evaluated hint has the final say.
    origin = typing.get_origin(hint)
    if origin in (typing.Required, typing_extensions.Required):
        return True
    if origin in (typing.NotRequired, typing_extensions.NotRequired):
        return False
    return key in typeddict.__required_keys__


def _strip_required(hint: Any) -> Any:
    while typing.get_origin(hint) in (
        typing.Required,
        typing.NotRequired,
        typing_extensions.Required,
        typing_extensions.NotRequired,
    ):
        hint = typing.get_args(hint)[0]
    return hint


# --- docstrings -----------------------------------------------------------------------------


def _parse_docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (without Args/Returns/... sections) and each parameter's description."""
    doc = inspect.getdoc(fn)
    if not doc:
        return "", {}
    try:
        parsed = docstring_parser.parse(doc)
    except docstring_parser.ParseError:
        # A malformed section should not stop the tool from loading; show the text as written.
        return doc, {}
    parts = [part for part in (parsed.short_description, parsed.long_description) if part]
    param_docs = {
        p.arg_name: p.description.strip()
        for p in parsed.params
        if p.arg_name and p.description and p.description.strip()
    }
    return "\n\n".join(parts), param_docs


# --- JSON schema clean-up -------------------------------------------------------------------


def _clean_schema(raw: dict[str, Any]) -> dict[str, Any]:
    """Inline $defs and drop pydantic's titles; recursive types keep a top-level $defs entry."""
    inliner = _Inliner(raw.get("$defs", {}))
    properties = {
        pname: inliner.schema(prop, ()) for pname, prop in raw.get("properties", {}).items()
    }
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": list(raw.get("required", [])),
        "additionalProperties": False,
    }
    if inliner.kept:
        parameters["$defs"] = inliner.kept
    return parameters


class _Inliner:
    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs
        self.kept: dict[str, Any] = {}

    def schema(self, node: Any, expanding: tuple[str, ...]) -> Any:
        if not isinstance(node, dict):
            return node  # true/false are valid schemas
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_DEFS_PREFIX):
            key = ref[len(_DEFS_PREFIX) :]
            siblings = self._walk({k: v for k, v in node.items() if k != "$ref"}, expanding)
            if key not in self.defs:
                return {"$ref": ref, **siblings}
            if key in expanding:
                # A recursive type cannot be inlined; ship its definition once, referenced.
                self._keep(key)
                return {"$ref": ref, **siblings}
            return {**self.schema(self.defs[key], (*expanding, key)), **siblings}
        return self._walk(node, expanding)

    def _keep(self, key: str) -> None:
        if key in self.kept:
            return
        self.kept[key] = {}  # placeholder first, so the definition's own self-references stop
        self.kept[key] = self.schema(self.defs[key], (key,))

    def _walk(self, node: dict[str, Any], expanding: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "title":
                continue
            if key in _SCHEMA_MAP_KEYS and isinstance(value, dict):
                out[key] = {name: self.schema(sub, expanding) for name, sub in value.items()}
            elif key in _SCHEMA_LIST_KEYS and isinstance(value, list):
                out[key] = [self.schema(sub, expanding) for sub in value]
            elif key in _SCHEMA_KEYS:
                out[key] = self.schema(value, expanding)
            else:
                out[key] = value
        # Older pydantic wraps a $ref that has siblings as allOf: [{...}]; flatten it.
        all_of = out.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], dict):
            del out["allOf"]
            out = {**all_of[0], **out}
        return out


# --- validation errors ----------------------------------------------------------------------


def _describe_errors(
    exc: ValidationError, arguments: Mapping[str, Any], analysis: _Analysis
) -> str:
    missing: list[str] = []
    unknown: list[str] = []
    problems: dict[str, list[str]] = {}  # path -> messages, several when a union failed
    inputs: dict[str, Any] = {}
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        kind = error["type"]
        if len(loc) == 1 and kind == "missing":
            missing.append(str(loc[0]))
            continue
        if len(loc) == 1 and kind == "extra_forbidden":
            unknown.append(str(loc[0]))
            continue
        path = _error_path(loc, arguments, keep_last=kind == "missing")
        messages = problems.setdefault(path, [])
        if error["msg"] not in messages:
            messages.append(error["msg"])
        if kind != "missing":
            inputs.setdefault(path, error["input"])

    parts: list[str] = []
    if missing:
        parts.append(f"missing required {_plural('argument', missing)} {_quoted(missing)}")
    if unknown:
        expected = [pname for pname, _ in analysis.fields]
        accepted = f"expected only {_quoted(expected)}" if expected else "it takes no arguments"
        parts.append(f"unknown {_plural('argument', unknown)} {_quoted(unknown)} ({accepted})")
    for path, messages in problems.items():
        text = f"argument {path!r}: {' or '.join(messages)}"
        if path in inputs:
            text += f" (got {_short_repr(inputs[path])})"
        parts.append(text)
    if len(parts) > _MAX_PROBLEMS:
        parts = [*parts[:_MAX_PROBLEMS], f"and {len(parts) - _MAX_PROBLEMS} more"]
    return "Invalid arguments: " + "; ".join(parts)


def _error_path(loc: tuple[int | str, ...], arguments: Mapping[str, Any], keep_last: bool) -> str:
    """Render a pydantic error location as the LLM sees its JSON, e.g. "guests[0].name".

    pydantic also puts union member tags ("int", "list[int]") into locations; a segment is
    kept only if it is a key or index that exists in the arguments the LLM sent.
    """
    path = str(loc[0])
    current: Any = arguments.get(loc[0]) if isinstance(loc[0], str) else None
    for position, segment in enumerate(loc[1:], start=1):
        is_last = position == len(loc) - 1
        if isinstance(current, Mapping) and (segment in current or (is_last and keep_last)):
            path += f".{segment}"
            current = current.get(segment)
        elif (
            isinstance(segment, int)
            and isinstance(current, Sequence)
            and not isinstance(current, str)
            and -len(current) <= segment < len(current)
        ):
            path += f"[{segment}]"
            current = current[segment]
    return path


def _plural(word: str, items: Sequence[str]) -> str:
    return word if len(items) == 1 else f"{word}s"


def _quoted(items: Sequence[str]) -> str:
    return ", ".join(repr(item) for item in items)


def _short_repr(value: Any) -> str:
    text = repr(value)
    if len(text) > _MAX_INPUT_REPR:
        text = text[: _MAX_INPUT_REPR - 3] + "..."
    return text


# --- small helpers --------------------------------------------------------------------------


def _globals_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """The namespace the function's string annotations are written against."""
    target: Any = inspect.unwrap(fn)
    while isinstance(target, functools.partial):
        target = inspect.unwrap(target.func)
    namespace = getattr(target, "__globals__", None)
    if isinstance(namespace, dict):
        return namespace
    module = sys.modules.get(getattr(target, "__module__", None) or "")
    return vars(module) if module is not None else {}


def _source_file(fn: Callable[..., Any]) -> str | None:
    try:
        return inspect.getsourcefile(inspect.unwrap(fn))
    except (TypeError, OSError):
        return None


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(inspect.unwrap(fn)):
        return True
    if inspect.isroutine(fn):
        return False
    # A callable object with `async def __call__`.
    return inspect.iscoroutinefunction(type(fn).__call__)


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return (
            tp.__qualname__ if tp.__module__ == "builtins" else f"{tp.__module__}.{tp.__qualname__}"
        )
    return repr(tp).replace("typing.", "")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

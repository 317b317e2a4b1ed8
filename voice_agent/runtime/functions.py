"""Loading an agent's functions module: its tools (public functions, @Action) and its triggers."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from voice_agent.errors import ConfigError, ExpressionError, ToolError
from voice_agent.runtime import implicit
from voice_agent.runtime import triggers as trigger_decorators
from voice_agent.runtime.expressions import Expression, parse_expression
from voice_agent.runtime.signature import FunctionSpec, describe_function
from voice_agent.runtime.triggers import ACTION_ATTR, TRIGGER_ATTR, TriggerKind, TriggerMark

# What a functions module finds in its globals without importing anything.
IMPLICIT_NAMES: dict[str, Any] = {
    "state": implicit.state,
    "context": implicit.context,
    "secrets": implicit.secrets,
    "history": implicit.history,
    "tools": implicit.tools,
    "flows": implicit.flows,
    "respond": implicit.respond,
    "add_override": implicit.add_override,
    "raise_event": implicit.raise_event,
    "ToolError": ToolError,
    "Action": trigger_decorators.Action,
    "BeforeModelTrigger": trigger_decorators.BeforeModelTrigger,
    "BeforeActionTrigger": trigger_decorators.BeforeActionTrigger,
    "BeforePlaybookTrigger": trigger_decorators.BeforePlaybookTrigger,
    "PlaybookStartTrigger": trigger_decorators.PlaybookStartTrigger,
    "EventTrigger": trigger_decorators.EventTrigger,
}


@dataclass(frozen=True)
class LocalTool:
    fn: Callable[..., Any]
    spec: FunctionSpec

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Trigger:
    kind: TriggerKind
    fn: Callable[..., Any]
    name: str
    condition: Expression | None
    event: str | None
    parameters: frozenset[str]  # event data the function accepts as keyword arguments


@dataclass(frozen=True)
class FunctionModule:
    path: Path
    module: ModuleType
    tools: dict[str, LocalTool]
    triggers: tuple[Trigger, ...]

    def triggers_of(self, kind: TriggerKind, event: str | None = None) -> list[Trigger]:
        return [t for t in self.triggers if t.kind == kind and (event is None or t.event == event)]


def _import(path: Path, config_file: str) -> ModuleType:
    if not path.is_file():
        raise ConfigError(f"functions module {str(path)!r} not found", file=config_file)
    module_name = f"voice_agent_functions_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError("cannot load this file as a Python module", file=str(path))
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(IMPLICIT_NAMES)
    # Sibling modules (a shared database helper, say) import by plain name, as in a script.
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
        line = f" (line {frames[-1].lineno})" if frames else ""
        detail = f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"the module failed to import{line}: {detail}", file=str(path)) from exc
    return module


def _trigger(fn: Callable[..., Any], mark: TriggerMark, file: str) -> Trigger:
    condition: Expression | None = None
    if mark.condition:
        try:
            condition = parse_expression(mark.condition, "condition")
        except ExpressionError as exc:
            raise ConfigError(f"bad trigger condition: {exc}", file=file, key=fn.__name__) from None
    parameters = frozenset(inspect.signature(fn).parameters)
    if mark.kind != "event" and parameters:
        raise ConfigError(
            "a trigger function takes no arguments (only @EventTrigger functions receive "
            "event data)",
            file=file,
            key=fn.__name__,
        )
    return Trigger(mark.kind, fn, fn.__name__, condition, mark.event, parameters)


def load_functions(
    path: Path, *, config_file: str, cache: dict[Path, FunctionModule] | None = None
) -> FunctionModule:
    """Import once per path and cache: agents that share a module share its tools and triggers."""
    path = path.resolve()
    if cache is not None and path in cache:
        return cache[path]
    module = _import(path, config_file)
    tools: dict[str, LocalTool] = {}
    found_triggers: list[Trigger] = []
    for name, value in vars(module).items():
        if not inspect.isfunction(value) or value.__module__ != module.__name__:
            continue  # helpers imported from elsewhere are not this agent's tools
        mark = getattr(value, TRIGGER_ATTR, None)
        if isinstance(mark, TriggerMark):
            found_triggers.append(_trigger(value, mark, str(path)))
        elif getattr(value, ACTION_ATTR, False) or not name.startswith("_"):
            tools[name] = LocalTool(value, describe_function(value, name=name, file=str(path)))
    loaded = FunctionModule(path, module, tools, tuple(found_triggers))
    if cache is not None:
        cache[path] = loaded
    return loaded

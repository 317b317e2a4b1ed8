"""The names user functions use without importing them: state, context, secrets, respond, tools...

Each resolves, through a context variable, to the objects of the call whose function is running,
so hundreds of concurrent calls in one process never see each other's data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from voice_agent.errors import ToolError


@dataclass(frozen=True)
class Override:
    """An action queued by add_override: a function object or a `tools.x.y` handle."""

    action: Any
    inputs: dict[str, Any] | None = None


@dataclass
class Effects:
    """What a function asked the runtime to do besides changing state."""

    responses: list[str] = field(default_factory=list)
    overrides: list[Override] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.responses or self.overrides or self.events)


class CallServices(Protocol):
    """What the implicit names need from the call they run in (the session provides it)."""

    call_id: str

    def context_messages(self) -> list[dict[str, Any]]: ...
    def last_utterance(self, role: str) -> str | None: ...
    def remote_action(self, tool: str, action: str) -> Any: ...
    def remote_tool_names(self, tool: str) -> list[str]: ...
    def flow_matcher(self, flow: str) -> Any: ...


@dataclass
class FunctionScope:
    """One function invocation: a working copy of the state, kept only if the function succeeds."""

    services: CallServices
    state: dict[str, Any]
    secrets: Mapping[str, str]
    loop: asyncio.AbstractEventLoop
    effects: Effects = field(default_factory=Effects)


current_scope: ContextVar[FunctionScope] = ContextVar("voice_agent_function_scope")


def _scope(name: str) -> FunctionScope:
    try:
        return current_scope.get()
    except LookupError:
        raise RuntimeError(
            f"'{name}' is only available while a call runs one of its agent's functions"
        ) from None


_SESSION_PREFIX = "$session.params."
_READ_ONLY_PREFIX = "$"


class _State(MutableMapping[str, Any]):
    """The call's state; `$session.params.X` and `$request.session-id` read as in Dialogflow."""

    def __getitem__(self, key: str) -> Any:
        scope = _scope("state")
        if key.startswith(_SESSION_PREFIX):
            return scope.state[key[len(_SESSION_PREFIX) :]]
        if key == "$request.session-id":
            return scope.services.call_id
        return scope.state[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key.startswith(_READ_ONLY_PREFIX):
            raise KeyError(f"{key!r} is read-only; write state[{key.split('.')[-1]!r}] instead")
        _scope("state").state[key] = value

    def __delitem__(self, key: str) -> None:
        del _scope("state").state[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(_scope("state").state))

    def __len__(self) -> int:
        return len(_scope("state").state)

    def __repr__(self) -> str:
        return f"state({_scope('state').state!r})"


class _Context(Mapping[str, Any]):
    """Read-only: a fresh copy of what the LLM will be sent next, on every access."""

    def __getitem__(self, key: str) -> Any:
        if key != "messages":
            raise KeyError(key)
        return _scope("context").services.context_messages()

    def __iter__(self) -> Iterator[str]:
        return iter(("messages",))

    def __len__(self) -> int:
        return 1


class _Secrets(Mapping[str, str]):
    def __getitem__(self, key: str) -> str:
        return _scope("secrets").secrets[key]

    def __iter__(self) -> Iterator[str]:
        return iter(_scope("secrets").secrets)

    def __len__(self) -> int:
        return len(_scope("secrets").secrets)

    def __repr__(self) -> str:
        return f"secrets(names={sorted(self)})"


class _History:
    @property
    def last_user_utterance(self) -> str | None:
        return _scope("history").services.last_utterance("user")

    @property
    def last_agent_utterance(self) -> str | None:
        return _scope("history").services.last_utterance("assistant")


class ActionHandle:
    """`tools.<tool>.<action>`: call it (the LLM sees no result) or pass it to add_override."""

    def __init__(self, tool: str, action: str) -> None:
        self.tool = tool
        self.action = action

    @property
    def qualified_name(self) -> str:
        return f"{self.tool}.{self.action}"

    async def acall(self, inputs: Mapping[str, Any] | None = None) -> Any:
        scope = _scope("tools")
        remote = scope.services.remote_action(self.tool, self.action)
        return await remote.call(dict(inputs or {}))

    def __call__(self, inputs: Mapping[str, Any] | None = None) -> Any:
        scope = _scope("tools")
        if _on_loop(scope.loop):
            raise ToolError(
                f"tools.{self.qualified_name}() blocks; in an async function use "
                f"'await tools.{self.qualified_name}.acall(...)'"
            )
        remote = scope.services.remote_action(self.tool, self.action)
        future = asyncio.run_coroutine_threadsafe(remote.call(dict(inputs or {})), scope.loop)
        return future.result()

    def __repr__(self) -> str:
        return f"tools.{self.qualified_name}"


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class _Tool:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, action: str) -> ActionHandle:
        if action.startswith("_"):
            raise AttributeError(action)
        names = _scope("tools").services.remote_tool_names(self._name)
        if action not in names:
            raise AttributeError(f"tool {self._name!r} has no action {action!r}")
        return ActionHandle(self._name, action)


class _Tools:
    def __getattr__(self, name: str) -> _Tool:
        if name.startswith("_"):
            raise AttributeError(name)
        _scope("tools").services.remote_tool_names(name)  # raises for an unknown tool
        return _Tool(name)


class _Flows:
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _scope("flows").services.flow_matcher(name)


state: MutableMapping[str, Any] = _State()
context: Mapping[str, Any] = _Context()
secrets: Mapping[str, str] = _Secrets()
history = _History()
tools = _Tools()
flows = _Flows()


def respond(text: str) -> None:
    """Make the agent say exactly this text."""
    _scope("respond").effects.responses.append(str(text))


def add_override(action: Any, inputs: Mapping[str, Any] | None = None) -> None:
    """Queue an action to run before the LLM chooses again; its result is shown to the LLM."""
    _scope("add_override").effects.overrides.append(
        Override(action, dict(inputs) if inputs is not None else None)
    )


def raise_event(name: str, **data: Any) -> None:
    """Raise a custom event; @EventTrigger(name) functions run after this function returns."""
    _scope("raise_event").effects.events.append((str(name), data))

"""Code-block decorators with the Dialogflow playbook spelling: @Action and the trigger family."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

TriggerKind = Literal["before_model", "before_action", "before_playbook", "event"]
F = TypeVar("F", bound=Callable[..., Any])

TRIGGER_ATTR = "__voice_agent_trigger__"
ACTION_ATTR = "__voice_agent_action__"

# Events the runtime raises by itself; functions may raise any other name with raise_event().
BUILTIN_EVENTS = ("welcome", "no-input", "dtmf", "call-ended")


@dataclass(frozen=True)
class TriggerMark:
    kind: TriggerKind
    condition: str | None = None
    event: str | None = None


def Action(fn: F) -> F:
    """Marks a function as an inline action (a tool the LLM may call)."""
    setattr(fn, ACTION_ATTR, True)
    return fn


class _TriggerDecorator:
    """Usable bare (`@BeforeModelTrigger`) or with a condition (`@BeforeModelTrigger("...")`)."""

    def __init__(self, kind: TriggerKind) -> None:
        self._kind = kind

    @overload
    def __call__(self, fn: F, /) -> F: ...
    @overload
    def __call__(
        self, fn: str | None = None, /, condition: str | None = None
    ) -> Callable[[F], F]: ...
    def __call__(self, fn: Any = None, /, condition: str | None = None) -> Any:
        if callable(fn):
            setattr(fn, TRIGGER_ATTR, TriggerMark(self._kind))
            return fn
        # The condition may come positionally, as in Dialogflow's samples, or by keyword.
        mark = TriggerMark(self._kind, condition=condition if fn is None else fn)

        def decorate(target: F) -> F:
            setattr(target, TRIGGER_ATTR, mark)
            return target

        return decorate


BeforeModelTrigger = _TriggerDecorator("before_model")
BeforeActionTrigger = _TriggerDecorator("before_action")
BeforePlaybookTrigger = _TriggerDecorator("before_playbook")
PlaybookStartTrigger = BeforePlaybookTrigger


def EventTrigger(event: str, condition: str | None = None) -> Callable[[F], F]:
    """Runs the function when the named event happens (and the condition, if any, holds)."""
    if not isinstance(event, str) or not event:
        raise TypeError("EventTrigger needs an event name")

    def decorate(fn: F) -> F:
        setattr(fn, TRIGGER_ATTR, TriggerMark("event", condition=condition, event=event))
        return fn

    return decorate

"""Running one user function (an action, a trigger, an override) inside its call's scope: the
implicit names bound through a copied context, a timeout, and every failure turned into an
error the audit and the LLM can read rather than an exception that ends the call.

The caller (the session) makes the scope with a working copy of the state and adopts that copy
only when the invocation succeeds.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from voice_agent.errors import ToolError
from voice_agent.runtime.implicit import Effects, FunctionScope, current_scope


@dataclass
class Invocation:
    ok: bool
    value: Any = None
    error: str | None = None
    effects: Effects = field(default_factory=Effects)


async def run_in_scope(
    fn: Callable[..., Any],
    kwargs: Mapping[str, Any],
    scope: FunctionScope,
    *,
    executor: Executor | None,
    timeout_s: float,
    name: str,
) -> Invocation:
    """`fn(**kwargs)` with `scope` as the current one: a coroutine function on the loop, a plain
    one in `executor` (a timed-out thread may still be running: its scope is dropped)."""
    loop = scope.loop
    ctx = contextvars.copy_context()
    ctx.run(current_scope.set, scope)
    try:
        if inspect.iscoroutinefunction(fn):
            task = loop.create_task(fn(**kwargs), context=ctx)
            value = await asyncio.wait_for(task, timeout_s)
        else:
            call = functools.partial(ctx.run, fn, **kwargs)
            value = await asyncio.wait_for(loop.run_in_executor(executor, call), timeout_s)
    except TimeoutError:
        return Invocation(False, error=f"{name} timed out after {timeout_s:g} s")
    except ToolError as exc:
        return Invocation(False, error=exc.message)
    except Exception as exc:
        return Invocation(False, error=f"{type(exc).__name__}: {exc}")
    return Invocation(True, value, effects=scope.effects)

"""One call's agent runtime: state, committed context, audit, triggers, actions and transfers.

A session is plain code driven by its caller (the text simulator, a voice pipeline): each entry
point is an async generator of agent speech, so the first words can go to TTS at once and a
barge-in can stop a turn by closing the generator. Time comes from injected clocks.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from voice_agent.errors import ExpressionError, ToolError
from voice_agent.runtime.audit import AuditLog
from voice_agent.runtime.call_control import (
    SEND_DTMF_TOOL,
    TRANSFER_CALL_TOOL,
    CallTransfer,
    SendDigits,
    check_digits,
    check_transfer,
)
from voice_agent.runtime.conversation import (
    UNFINISHED_RESULT,
    CommitOutcome,
    Conversation,
    ToolCallRecord,
)
from voice_agent.runtime.implicit import ActionHandle, Effects, FunctionScope
from voice_agent.runtime.invocation import Invocation, run_in_scope
from voice_agent.runtime.secrets import Redactor, Secrets
from voice_agent.runtime.signature import bind_arguments
from voice_agent.runtime.templates import render
from voice_agent.runtime.transitions import TRANSFER_TOOL, check_agent_transfer
from voice_agent.runtime.triggers import TriggerKind
from voice_agent.runtime.turn_events import (
    ActionResult,
    AgentEvent,
    AgentSpeech,
    AgentSpeechEnd,
    CallerAudio,
    StepOutcome,
    result_json,
)
from voice_agent.runtime.update_state import evaluate_updates

if TYPE_CHECKING:
    from voice_agent.runtime.agent import Agents, CompiledAgent

MAX_EVENT_DEPTH = 4


@dataclass(frozen=True)
class _TurnStart:
    """The call as a caller's turn found it (see CallSession.user_turn)."""

    state: dict[str, Any]
    flow_page: dict[str, str]
    agent: CompiledAgent
    started_agents: set[str]
    last_action: dict[str, Any]
    actions_run: int


class CallSession:
    def __init__(
        self,
        registry: Agents,
        *,
        agent: str | None = None,
        args: Mapping[str, Any] | None = None,
        call_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = datetime.now,
        auto_commit: bool = True,
        executor: Executor | None = None,
    ) -> None:
        self.registry = registry
        self.call_id = call_id or uuid.uuid4().hex
        self.agent: CompiledAgent = registry.agent(agent or registry.default_agent)
        self.secrets: Secrets = registry.secrets
        self.redactor = Redactor(self.secrets)
        self.clock = clock
        self.wall_clock = wall_clock
        # Text callers hear everything; a voice pipeline commits what was played instead.
        self.auto_commit = auto_commit
        self.executor = executor or registry.executor
        self.audit = AuditLog(clock, self.redactor.value)
        self.conversation = Conversation()
        self.state: dict[str, Any] = {**self.agent.config.args, **(args or {})}
        self.started_agents: set[str] = set()
        self.ended = False
        self.last_action: dict[str, Any] = {}
        self.flow_page: dict[str, str] = {}  # current page per flow agent
        self._next_reply_id = 0
        self._reply_started: dict[int, float] = {}
        self._reply_texts: dict[int, str] = {}
        self._tool_call_counter = 0
        self._event_depth = 0
        # Actions (functions, tools) run so far, and the call as the caller's last turn found
        # it: a turn the caller continues is undone when nothing has run since (user_turn).
        self._actions_run = 0
        self._turn_start: _TurnStart | None = None
        # For an engine that hears and voices the call itself (brains/realtime.py): the voice
        # pipeline's audio format and the caller's turn as heard, and who is told of commits
        # and of the end (to edit and close its own copy of the conversation).
        self.voice_format: tuple[str, int] | None = None  # (encoding, rate); None: text only
        self.caller_audio: CallerAudio | None = None
        self.commit_listeners: list[Callable[[int, CommitOutcome, float | None], None]] = []
        self.end_listeners: list[Callable[[], Awaitable[None]]] = []

    # ---- views -------------------------------------------------------------------------

    def system_prompt(self) -> str:
        return render(self.agent.config.prompt, self.state)

    def llm_messages(self) -> list[dict[str, Any]]:
        """Exactly what the LLM is sent next: the prompt rendered now plus the committed history."""
        messages: list[dict[str, Any]] = []
        prompt = self.system_prompt()
        if prompt:
            messages.append({"role": "system", "content": prompt})
        messages.extend(self.conversation.snapshot())
        redacted: list[dict[str, Any]] = self.redactor.value(messages)
        return redacted

    def committed_history(self) -> list[dict[str, Any]]:
        """The committed history alone (no reply still playing), redacted, without the prompt."""
        committed: list[dict[str, Any]] = self.redactor.value(self.conversation.committed())
        return committed

    def context_messages(self) -> list[dict[str, Any]]:
        return self.llm_messages()

    def context_view(self) -> dict[str, Any]:
        return {"messages": self.llm_messages()}

    def public_state(self) -> dict[str, Any]:
        redacted: dict[str, Any] = self.redactor.value(copy.deepcopy(self.state))
        return redacted

    def expecting(self) -> str | None:
        """What the agent's last words asked the caller for (see Brain.expecting)."""
        return self.agent.brain.expecting(self)

    def last_utterance(self, role: str) -> str | None:
        return self.conversation.last_content(role)

    def remote_action(self, tool: str, action: str) -> Any:
        return self.agent.remote_tools[tool].actions[action]

    def remote_tool_names(self, tool: str) -> list[str]:
        if tool not in self.agent.remote_tools:
            raise AttributeError(f"agent {self.agent.name!r} has no tool {tool!r}")
        return list(self.agent.remote_tools[tool].actions)

    def flow_matcher(self, flow: str) -> Any:
        return self.registry.flow_handle(flow, self)

    def now(self) -> datetime:
        return self.wall_clock()

    # ---- entry points ------------------------------------------------------------------

    async def start(self, *, greet: bool = True) -> AsyncIterator[AgentEvent]:
        """Call start: the agent's entry steps, then the `welcome` event and the agent's
        opening (its flow's start page, its playbook's first words). Not those for a placed
        call an answering machine took: its agent speaks when the `voicemail` event comes."""
        self.audit.add(
            "call_started",
            call_id=self.call_id,
            agent=self.agent.name,
            state=copy.deepcopy(self.state),  # as it was then, not as it ends up
        )
        async for event in self._enter_agent(StepOutcome(), welcome=greet, enter=greet):
            yield event

    async def user_turn(self, text: str, *, continues: bool = False) -> AsyncIterator[AgentEvent]:
        """The caller's turn. `continues`: `text` is the whole of the caller's last turn, which
        they went on with after a pause (core/continuation.py): it replaces that turn's message,
        and the state goes back to where that turn found it unless an action ran meanwhile
        (whose effects happened, and stay)."""
        if self.ended:
            return
        text = text.strip()
        if not text:
            self.audit.add("user_utterance_dropped", text=text, reason="empty")
            return
        if continues and self.conversation.amend_last_user(text):
            restored = self._restore_turn_start()
            self.audit.add(
                "user_utterance",
                text=text,
                agent=self.agent.name,
                continues=True,
                state_restored=restored,
            )
            if restored:
                self._run_fixed_updates(self.agent.on_turn, "on_turn")
        else:
            self._turn_start = self._turn_snapshot()
            self.conversation.add_user(text)
            self.audit.add("user_utterance", text=text, agent=self.agent.name)
            self._run_fixed_updates(self.agent.on_turn, "on_turn")
        try:
            async for event in self.agent.brain.turn(self, text):
                yield event
        finally:
            self.conversation.close_unfinished()

    def _turn_snapshot(self) -> _TurnStart:
        return _TurnStart(
            copy.deepcopy(self.state),
            dict(self.flow_page),
            self.agent,
            set(self.started_agents),
            dict(self.last_action),
            self._actions_run,
        )

    def _restore_turn_start(self) -> bool:
        """The call as the last turn found it, if nothing has run since that cannot be undone."""
        start = self._turn_start
        if start is None or start.actions_run != self._actions_run or start.agent is not self.agent:
            return False
        self._replace_state(start.state, "continued turn")
        self.flow_page = dict(start.flow_page)
        self.started_agents = set(start.started_agents)
        self.last_action = dict(start.last_action)
        return True

    async def event(self, name: str, **data: Any) -> AsyncIterator[AgentEvent]:
        """A named event (dtmf, no-input, custom): its triggers, then the brain's handler."""
        if self.ended:
            return
        self.audit.add("event", name=name, data=data)
        outcome = StepOutcome()
        async for item in self.run_triggers("event", outcome, event=name, data=data):
            yield item
        if outcome.ends_turn or outcome.transferred:
            return
        async for item in self.agent.brain.event(self, name, data, outcome):
            yield item

    async def end(self, reason: str = "completed") -> None:
        """The call is over: `call-ended` triggers may still update state; nothing is spoken."""
        if self.ended:
            return
        self.ended = True
        for reply_id in self.conversation.pending_ids():
            self.commit_reply(reply_id, None)
        outcome = StepOutcome()
        async for _ in self.run_triggers("event", outcome, event="call-ended", data={}):
            pass
        self.audit.add("call_ended", reason=reason, state=copy.deepcopy(self.state))
        for listener in self.end_listeners:
            await listener()

    def commit_reply(
        self, reply_id: int, heard: str | None, heard_ms: float | None = None
    ) -> CommitOutcome:
        """Keep only what the caller heard of a reply (`heard_ms` into its audio, when the
        voice side knows it was cut there); the audit keeps what was generated."""
        outcome = self.conversation.commit(reply_id, heard)
        self.audit.add(
            "agent_utterance",
            reply_id=reply_id,
            generated=outcome.generated,
            committed=outcome.committed,
            interrupted=outcome.committed != outcome.generated,
            started_t=self._reply_started.pop(reply_id, None),
        )
        for listener in self.commit_listeners:
            listener(reply_id, outcome, heard_ms)
        return outcome

    # ---- speech ------------------------------------------------------------------------

    def begin_reply(self) -> int:
        self._next_reply_id += 1
        # Committed later (once heard or cut): the viewer places the reply where it began.
        self._reply_started[self._next_reply_id] = round(self.audit.elapsed(), 6)
        self.conversation.start_reply(self._next_reply_id)
        return self._next_reply_id

    def extend_reply(self, reply_id: int, text: str) -> AgentSpeech:
        # The driver may commit (cut) a reply while it is still being generated.
        if self.conversation.is_pending(reply_id):
            self.conversation.extend_reply(reply_id, text)
        self._reply_texts[reply_id] = self._reply_texts.get(reply_id, "") + text
        return AgentSpeech(reply_id, text)

    def finish_reply(self, reply_id: int) -> AgentSpeechEnd:
        text = self._reply_texts.pop(reply_id, "")
        if self.auto_commit and self.conversation.is_pending(reply_id):
            self.commit_reply(reply_id, text)
        return AgentSpeechEnd(reply_id, text)

    async def say(self, text: str) -> AsyncIterator[AgentEvent]:
        # Functions may build speech from a secret; it would reach the caller's events and
        # the TTS service, so speech is redacted like everything else that leaves a function.
        text = self.redactor.text(text).strip()
        if not text:
            return
        reply_id = self.begin_reply()
        yield self.extend_reply(reply_id, text)
        yield self.finish_reply(reply_id)

    # ---- agents and transfers ------------------------------------------------------------

    async def _enter_agent(
        self, outcome: StepOutcome, *, welcome: bool = False, enter: bool = True
    ) -> AsyncIterator[AgentEvent]:
        agent = self.agent
        self._run_fixed_updates(agent.on_enter, "on_enter")
        first_time = agent.name not in self.started_agents
        self.started_agents.add(agent.name)
        if first_time:
            async for item in self.run_triggers("before_playbook", outcome):
                yield item
        if welcome and not outcome.ends_turn:
            self.audit.add("event", name="welcome", data={})
            async for item in self.run_triggers("event", outcome, event="welcome", data={}):
                yield item
        if outcome.ends_turn or outcome.transferred or not enter:
            return
        async for item in agent.brain.enter(self, outcome):
            outcome.responded = True  # the new agent spoke first: the caller answers next
            yield item

    async def transfer(
        self, target: str, args: Mapping[str, Any], outcome: StepOutcome
    ) -> AsyncIterator[AgentEvent]:
        source = self.agent
        self.agent = self.registry.agent(target)
        added = {k: v for k, v in self.agent.config.args.items() if k not in self.state}
        self.state.update(added)
        self.state.update(args)
        policy = source.config.context_on_transfer
        if policy == "none":
            self.conversation.keep_last(0)
        elif isinstance(policy, int):
            self.conversation.keep_last(policy)
        outcome.transferred = True
        self.audit.add(
            "transition", source=source.name, target=target, args=dict(args), context=policy
        )
        async for item in self._enter_agent(outcome):
            yield item

    # ---- triggers and effects ------------------------------------------------------------

    async def run_triggers(
        self,
        kind: TriggerKind,
        outcome: StepOutcome,
        *,
        event: str | None = None,
        data: Mapping[str, Any] | None = None,
        refs: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[AgentEvent]:
        module = self.agent.functions
        if module is None:
            return
        all_refs: dict[str, Any] = {"$request.session-id": self.call_id}
        if self.last_action:
            all_refs["$last-action.name"] = self.last_action.get("name")
            all_refs["$last-action.status"] = self.last_action.get("status")
        all_refs.update(refs or {})
        all_refs.update({f"$event.{key}": value for key, value in (data or {}).items()})
        for trigger in module.triggers_of(kind, event):
            if trigger.condition is not None:
                try:
                    fires = bool(
                        trigger.condition.evaluate(self.state, refs=all_refs, now=self.now())
                    )
                except ExpressionError as exc:
                    self.audit.add("error", where=f"trigger {trigger.name}", message=str(exc))
                    continue
                if not fires:
                    continue
            kwargs = {k: v for k, v in (data or {}).items() if k in trigger.parameters}
            self.audit.add("trigger", kind=kind, function=trigger.name, event=event)
            invocation = await self.invoke(trigger.fn, kwargs, name=trigger.name)
            if not invocation.ok:
                self.audit.add("error", where=f"trigger {trigger.name}", message=invocation.error)
                continue
            async for item in self.apply_effects(invocation.effects, outcome):
                yield item

    async def apply_effects(
        self, effects: Effects, outcome: StepOutcome
    ) -> AsyncIterator[AgentEvent]:
        for text in effects.responses:
            outcome.responded = True
            self.audit.add("respond", text=text)
            async for item in self.say(text):
                yield item
        for override in effects.overrides:
            outcome.overridden = True
            async for item in self._run_override(override.action, override.inputs or {}, outcome):
                yield item
        for name, data in effects.events:
            if self._event_depth >= MAX_EVENT_DEPTH:
                self.audit.add(
                    "error", where="raise_event", message=f"{name!r}: events nest too deep"
                )
                continue
            self._event_depth += 1
            try:
                async for item in self.event(name, **data):
                    yield item
            finally:
                self._event_depth -= 1

    async def _run_override(
        self, action: Any, inputs: dict[str, Any], outcome: StepOutcome
    ) -> AsyncIterator[AgentEvent]:
        name = self._action_name(action)
        self.audit.add("override", action=name, inputs=inputs)
        call = ToolCallRecord(self.new_call_id("override"), name, inputs)
        self.conversation.open_tool_calls([call])
        result = ActionResult(False, UNFINISHED_RESULT)
        try:
            async for item in self.run_action(call, outcome):
                if isinstance(item, ActionResult):
                    result = item
                else:
                    yield item
        finally:
            self.conversation.set_tool_result(call.call_id, result.content)

    def _action_name(self, action: Any) -> str:
        if isinstance(action, ActionHandle):
            return self.agent.remote_llm_name(action.tool, action.action)
        if isinstance(action, str):
            return action
        name = getattr(action, "__name__", None)
        if name is None:
            raise ToolError(f"add_override() needs a function or tools.x.y, not {action!r}")
        return str(name)

    def new_call_id(self, prefix: str = "call") -> str:
        self._tool_call_counter += 1
        return f"{prefix}_{self._tool_call_counter}"

    # ---- actions -----------------------------------------------------------------------

    def _skip(self, call: ToolCallRecord, why: str) -> None:
        self.conversation.set_tool_result(call.call_id, json.dumps({"error": why}))
        self.audit.add("tool_call", name=call.name, arguments=call.arguments, error=why)

    async def run_llm_calls(
        self,
        calls: list[ToolCallRecord],
        reply_id: int | None,
        outcome: StepOutcome,
        *,
        invalid: Sequence[tuple[ToolCallRecord, str]] = (),
    ) -> AsyncIterator[AgentEvent]:
        """Run the actions the LLM chose, each after its BeforeActionTriggers."""
        problems = {call.call_id: why for call, why in invalid}
        self.conversation.open_tool_calls(calls, reply_id=reply_id)
        for call in calls:
            if call.call_id in problems:
                self._skip(call, problems[call.call_id])
                continue
            if outcome.ends_turn or outcome.transferred:
                self._skip(call, "not run: the turn ended before this action")
                continue
            refs = {"$next-action.name": call.name}
            for key, value in call.arguments.items():
                refs[f"$next-action.input.{key}"] = value
            async for item in self.run_triggers("before_action", outcome, refs=refs):
                yield item
            if outcome.ends_turn:
                self._skip(call, "not run: a BeforeActionTrigger responded instead")
                continue
            result = ActionResult(False, UNFINISHED_RESULT)
            try:
                async for step in self.run_action(call, outcome):
                    if isinstance(step, ActionResult):
                        result = step
                    else:
                        yield step
            finally:
                self.conversation.set_tool_result(call.call_id, result.content)

    async def run_action(
        self, call: ToolCallRecord, outcome: StepOutcome
    ) -> AsyncIterator[AgentEvent | ActionResult]:
        """One action by its LLM-facing name; yields speech, then exactly one ActionResult."""
        self._actions_run += 1
        started = self.clock()
        agent = self.agent
        effects = Effects()
        value: Any = None
        error: str | None = None
        transfer_to: tuple[str, dict[str, Any]] | None = None
        control: CallTransfer | SendDigits | None = None
        try:
            if call.name == TRANSFER_CALL_TOOL and agent.config.destinations:
                control = check_transfer(agent.config.destinations, call.arguments)
                value = {"transferring_to": control.destination}
            elif call.name == SEND_DTMF_TOOL and agent.config.send_dtmf:
                control = SendDigits(check_digits(call.arguments.get("digits")))
                value = {"sent": control.digits}
            elif call.name == TRANSFER_TOOL and agent.config.transitions:
                transfer_to = check_agent_transfer(agent.config.transitions, call.arguments)
                value = {"transferred_to": transfer_to[0]}
            elif call.name in agent.update_tools:
                value = self._apply_update_tool(call.name, call.arguments)
            elif call.name in agent.local_tools:
                tool = agent.local_tools[call.name]
                kwargs = bind_arguments(tool.fn, call.arguments)
                invocation = await self.invoke(tool.fn, kwargs, name=call.name)
                value, error, effects = invocation.value, invocation.error, invocation.effects
            elif call.name in agent.remote_actions:
                remote = agent.remote_actions[call.name]
                value = await asyncio.wait_for(
                    remote.call(call.arguments), agent.config.function_timeout_s
                )
            else:
                error = f"unknown action {call.name!r}"
        except ToolError as exc:
            error = exc.message
        except TimeoutError:
            error = f"{call.name} timed out after {agent.config.function_timeout_s:g} s"
        status = "error" if error is not None else "ok"
        self.last_action = {"name": call.name, "status": status}
        if error is not None:
            content = json.dumps({"error": self.redactor.text(error)}, ensure_ascii=False)
        else:
            content = self.redactor.text(result_json(value))
        self.audit.add(
            "tool_call",
            name=call.name,
            arguments=call.arguments,
            result=None if error else value,
            error=error,
            duration_s=round(self.clock() - started, 6),
        )
        yield ActionResult(
            error is None, content, value, self.redactor.text(error) if error else None
        )
        async for item in self.apply_effects(effects, outcome):
            yield item
        if isinstance(control, CallTransfer):
            outcome.call_ended = True  # the call leaves this agent once the line has played
        if control is not None:
            yield control
        if transfer_to is not None:
            async for item in self.transfer(*transfer_to, outcome):
                yield item

    def _apply_update_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        tool = self.agent.update_tools[name]
        values = tool.evaluate(self.state, arguments, self.now())
        self.set_state(values, source=name)
        return {"updated": values}

    def _run_fixed_updates(self, updates: Mapping[str, Any], where: str) -> None:
        if not updates:
            return
        try:
            values = evaluate_updates(updates, self.state, now=self.now())
        except ToolError as exc:
            self.audit.add("error", where=f"{self.agent.name}.{where}", message=exc.message)
            return
        self.set_state(values, source=where)

    def set_state(self, values: Mapping[str, Any], *, source: str) -> None:
        before = {key: self.state.get(key) for key in values}
        self.state.update(values)
        self.audit.state_change(before, values, source)

    def _replace_state(self, values: Mapping[str, Any], source: str) -> None:
        before = dict(self.state)
        self.state.clear()
        self.state.update(values)
        self.audit.state_change(before, self.state, source)

    # ---- running user code -------------------------------------------------------------

    async def invoke(
        self, fn: Callable[..., Any], kwargs: Mapping[str, Any], *, name: str
    ) -> Invocation:
        """Run a user function with this call's implicit names, a timeout, and state rollback.

        The function writes to a copy of the state, adopted only on success: a failure or a
        timeout (whose thread may still be running) leaves the call's state as it was.
        """
        self._actions_run += 1
        scope = FunctionScope(
            self, copy.deepcopy(self.state), self.secrets, asyncio.get_running_loop()
        )
        invocation = await run_in_scope(
            fn,
            kwargs,
            scope,
            executor=self.executor,
            timeout_s=self.agent.config.function_timeout_s,
            name=name,
        )
        if invocation.ok:
            self._replace_state(scope.state, name)
        return invocation

"""The LLM playbook brain: triggers, then the model streams speech and picks actions, in a loop."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from voice_agent.brains.llm import ChatLLM, LlmSettings, TextDelta
from voice_agent.config import LlmConfig
from voice_agent.engines.openai_http import load_sdk
from voice_agent.errors import LlmError
from voice_agent.runtime.conversation import ToolCallRecord
from voice_agent.runtime.templates import render
from voice_agent.runtime.turn_events import AgentEvent, StepOutcome

if TYPE_CHECKING:
    from voice_agent.runtime.session import CallSession


def decode_arguments(text: str) -> tuple[dict[str, Any], str | None]:
    """A model's tool-call arguments (its raw JSON text), or why they cannot be used."""
    try:
        arguments = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        return {}, f"arguments are not valid JSON ({exc.msg})"
    if not isinstance(arguments, dict):
        return {}, "arguments must be a JSON object"
    return arguments, None


async def first_message(session: CallSession, outcome: StepOutcome) -> AsyncIterator[AgentEvent]:
    """A playbook's opening: its first message, rendered, unless an entry step answered."""
    text = session.agent.config.first_message
    if text and not outcome.responded:
        async for item in session.say(render(text, session.state)):
            yield item


class PlaybookBrain:
    def __init__(self, config: LlmConfig) -> None:
        self.config = config
        self._llm: ChatLLM | None = None
        load_sdk()  # the client is made on first use; the SDK's slow import is paid now

    @property
    def llm(self) -> ChatLLM:
        # Built on first use: a config whose playbooks never run needs no endpoint or key.
        if self._llm is None:
            self._llm = ChatLLM(
                LlmSettings(
                    model=self.config.model,
                    base_url=self.config.base_url,
                    api_key=self.config.api_key,
                    temperature=self.config.temperature,
                    turn_deadline_s=self.config.turn_deadline_s,
                    request_timeout_s=self.config.request_timeout_s,
                    max_attempts=self.config.max_attempts,
                )
            )
        return self._llm

    async def aclose(self) -> None:
        """Close the LLM client's HTTP connections, if a turn ever made the client."""
        if self._llm is not None:
            await self._llm.aclose()
            self._llm = None

    async def enter(self, session: CallSession, outcome: StepOutcome) -> AsyncIterator[AgentEvent]:
        async for item in first_message(session, outcome):
            yield item

    async def event(
        self, session: CallSession, name: str, data: Mapping[str, Any], outcome: StepOutcome
    ) -> AsyncIterator[AgentEvent]:
        # A playbook reacts to events through @EventTrigger functions only.
        return
        yield  # pragma: no cover - makes this an async generator

    def expecting(self, session: CallSession) -> str | None:
        return None  # what an LLM asked is in its words, not in a form

    async def turn(self, session: CallSession, text: str) -> AsyncIterator[AgentEvent]:
        brain = self
        for _ in range(session.agent.config.max_steps_per_turn):
            agent = session.agent
            outcome = StepOutcome()
            async for item in session.run_triggers("before_model", outcome):
                yield item
            if outcome.ends_turn or outcome.transferred:
                return
            calls: list[ToolCallRecord] = []
            bad_calls: list[tuple[ToolCallRecord, str]] = []
            reply_id: int | None = None
            try:
                async for delta in brain.llm.stream(session.llm_messages(), agent.llm_tools()):
                    if isinstance(delta, TextDelta):
                        if not delta.text:
                            continue
                        if reply_id is None:
                            reply_id = session.begin_reply()
                        yield session.extend_reply(reply_id, delta.text)
                    else:
                        arguments, problem = decode_arguments(delta.arguments)
                        record = ToolCallRecord(delta.id, delta.name, arguments)
                        if problem:
                            bad_calls.append((record, problem))
                        calls.append(record)
            except LlmError as exc:
                session.audit.add("error", where="llm", message=str(exc))
                if reply_id is not None:
                    yield session.finish_reply(reply_id)
                async for item in session.say(agent.config.llm.fallback_line):
                    yield item
                return
            if reply_id is not None:
                yield session.finish_reply(reply_id)
            if not calls:
                return
            session.audit.add(
                "llm_actions", actions=[{"name": c.name, "arguments": c.arguments} for c in calls]
            )
            outcome = StepOutcome()
            async for item in session.run_llm_calls(calls, reply_id, outcome, invalid=bad_calls):
                yield item
            if outcome.ends_turn or session.ended:
                return
            if outcome.transferred:
                # The new agent greeted the caller already, or it is not a playbook: its turn.
                if not isinstance(session.agent.brain, PlaybookBrain):
                    return
                brain = session.agent.brain
        session.audit.add("error", where="llm", message="too many action steps in one turn")

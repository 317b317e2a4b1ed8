"""An agent as a call runs it: its config, tools and brain, compiled once for every call
(voice_agent/agents/registry.py compiles them), and what a call asks of the set of agents."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from voice_agent.config import AgentConfig
from voice_agent.runtime.call_control import send_dtmf_schema, transfer_call_schema
from voice_agent.runtime.functions import FunctionModule, LocalTool
from voice_agent.runtime.intent_match import MatchesIntents, MatchResult
from voice_agent.runtime.remote_tools import RemoteAction, RemoteTool
from voice_agent.runtime.secrets import Secrets
from voice_agent.runtime.transitions import transfer_tool_schema
from voice_agent.runtime.update_state import UpdateStateTool

if TYPE_CHECKING:
    from voice_agent.runtime.expressions import Expression
    from voice_agent.runtime.session import CallSession
    from voice_agent.runtime.turn_events import AgentEvent, StepOutcome


class Brain(Protocol):
    """Chooses what an agent does: an LLM playbook or a deterministic flow."""

    def enter(self, session: CallSession, outcome: StepOutcome) -> AsyncIterator[AgentEvent]: ...
    def turn(self, session: CallSession, text: str) -> AsyncIterator[AgentEvent]: ...
    def event(
        self, session: CallSession, name: str, data: Mapping[str, Any], outcome: StepOutcome
    ) -> AsyncIterator[AgentEvent]: ...
    def expecting(self, session: CallSession) -> str | None:
        """What the agent's last words asked the caller for ("phone", "number", "datetime",
        "name", "yes_no", ...), None if nothing in particular: it helps tell a finished
        answer from a pause (core/transcript_cues.py)."""
        ...


@dataclass
class CompiledAgent:
    name: str
    config: AgentConfig
    functions: FunctionModule | None
    update_tools: dict[str, UpdateStateTool]
    on_enter: dict[str, Expression]
    on_turn: dict[str, Expression]
    remote_tools: dict[str, RemoteTool]
    # The flow's intent matcher, for `flows.<name>.match_intent` in code blocks; None for
    # playbooks.
    matcher: MatchesIntents | None = None
    brain: Brain = field(init=False)
    remote_actions: dict[str, RemoteAction] = field(init=False)

    def __post_init__(self) -> None:
        self.remote_actions = {
            self.remote_llm_name(tool.name, action.name): action
            for tool in self.remote_tools.values()
            for action in tool.actions.values()
        }

    @property
    def local_tools(self) -> dict[str, LocalTool]:
        return self.functions.tools if self.functions else {}

    @staticmethod
    def remote_llm_name(tool: str, action: str) -> str:
        # OpenAI function names allow no dots, so `tools.weather.get` is `weather__get` to the LLM.
        return f"{tool}__{action}"

    def llm_tools(self) -> list[dict[str, Any]]:
        schemas = [tool.spec.tool_schema() for tool in self.local_tools.values()]
        schemas += [tool.tool_schema() for tool in self.update_tools.values()]
        schemas += [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": action.description,
                    "parameters": action.parameters,
                },
            }
            for name, action in self.remote_actions.items()
        ]
        if self.config.transitions:
            schemas.append(transfer_tool_schema(self.config.transitions))
        if self.config.destinations:
            schemas.append(transfer_call_schema(self.config.destinations))
        if self.config.send_dtmf:
            schemas.append(send_dtmf_schema())
        return schemas


class FlowHandle:
    """`flows.<name>` in code blocks: the named flow agent's intent matcher."""

    def __init__(self, matcher: MatchesIntents, session: CallSession) -> None:
        self._matcher = matcher
        self._session = session

    def match_intent(self, text: str) -> MatchResult:
        return self._matcher.match(text, now=self._session.now())


class Agents(Protocol):
    """What a call asks of the agents its config defines (AgentRegistry is the one)."""

    @property
    def default_agent(self) -> str: ...
    @property
    def secrets(self) -> Secrets: ...
    @property
    def executor(self) -> Executor:
        """Where the agent's own (synchronous) functions run, off the event loop."""
        ...

    def agent(self, name: str) -> CompiledAgent: ...
    def flow_handle(self, name: str, session: CallSession) -> FlowHandle: ...

"""Compiles a loaded config into ready agents: every problem shows here, before any call."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from voice_agent.brains.flows.flow import FlowBrain, load_intents
from voice_agent.brains.flows.intents import IntentMatcher, IntentSpec, Matcher
from voice_agent.brains.flows.parameters import EntitySpec
from voice_agent.brains.flows.semantic import THRESHOLD as MEANING_THRESHOLD
from voice_agent.brains.flows.semantic import SemanticMatcher
from voice_agent.brains.playbook import PlaybookBrain
from voice_agent.brains.realtime import RealtimeBrain
from voice_agent.config import AgentConfig, LoadedConfig, NluSettings, load_config, read_yaml
from voice_agent.engines.embedding import EmbeddingError, load_encoder
from voice_agent.errors import ConfigError
from voice_agent.runtime.agent import CompiledAgent, FlowHandle
from voice_agent.runtime.functions import FunctionModule, load_functions
from voice_agent.runtime.remote_tools import RemoteTool, load_remote_tool
from voice_agent.runtime.secrets import Secrets
from voice_agent.runtime.update_state import UpdateStateTool, compile_updates

if TYPE_CHECKING:
    from voice_agent.runtime.session import CallSession


_SECRET_PLACEHOLDER = re.compile(r"\{\{\s*secrets?[:.]")


def _spoken_texts(config: AgentConfig) -> list[tuple[str, str]]:
    """Every text that reaches the LLM or the caller, with its key."""
    texts = [("prompt", config.prompt), ("first_message", config.first_message or "")]
    if config.flow is not None:
        for name, page in config.flow.pages.items():
            texts.append((f"flow.pages.{name}.message", page.message or ""))
            for param, form_field in page.form.items():
                texts.append((f"flow.pages.{name}.form.{param}.prompt", form_field.prompt))
            for index, route in enumerate(page.routes):
                texts.append((f"flow.pages.{name}.routes[{index}].say", route.say or ""))
    return texts


class AgentRegistry:
    def __init__(
        self,
        loaded: LoadedConfig,
        secrets: Secrets | None = None,
        *,
        executor_threads: int = 32,
    ) -> None:
        self.loaded = loaded
        self.secrets = secrets if secrets is not None else Secrets({})
        self.default_agent = loaded.config.default_agent
        # User functions are sync by default; a pool of their own keeps them off the event loop
        # and away from the loop's default executor used by engines.
        self.executor = ThreadPoolExecutor(executor_threads, thread_name_prefix="agent-fn")
        self._modules: dict[Path, FunctionModule] = {}
        self.agents: dict[str, CompiledAgent] = {}
        try:
            for name, agent_config in loaded.config.agents.items():
                self.agents[name] = self._compile(name, agent_config)
        except BaseException:
            self.executor.shutdown(wait=False)
            raise

    @classmethod
    def from_file(cls, path: str | Path, secrets: Secrets | None = None) -> AgentRegistry:
        return cls(load_config(path), secrets)

    @property
    def file(self) -> str:
        return str(self.loaded.path)

    def agent(self, name: str) -> CompiledAgent:
        try:
            return self.agents[name]
        except KeyError:
            raise ConfigError(
                f"no agent named {name!r}; known agents: {sorted(self.agents)}", file=self.file
            ) from None

    def flow_handle(self, name: str, session: CallSession) -> FlowHandle:
        agent = self.agents.get(name)
        if agent is None or agent.matcher is None:
            flows = sorted(n for n, a in self.agents.items() if a.matcher is not None)
            raise AttributeError(f"no flow named {name!r}; flows: {flows}")
        return FlowHandle(agent.matcher, session)

    async def aclose(self) -> None:
        for agent in self.agents.values():
            for tool in agent.remote_tools.values():
                await tool.aclose()
            if isinstance(agent.brain, PlaybookBrain | RealtimeBrain):
                await agent.brain.aclose()  # its LLM client's connections, its calls' sockets
        self.executor.shutdown(wait=False, cancel_futures=True)

    # ---- compiling ---------------------------------------------------------------------

    def _matcher(
        self,
        config: AgentConfig,
        intents: list[IntentSpec],
        entities: dict[str, EntitySpec],
        key: str,
    ) -> Matcher:
        assert config.flow is not None
        nlu = config.nlu or NluSettings.model_construct()
        if nlu.matcher == "lexical":
            threshold = config.flow.match_threshold if nlu.threshold is None else nlu.threshold
            return IntentMatcher(intents, entities, threshold=threshold)
        lexical = IntentMatcher(intents, entities, threshold=0.0)
        try:
            encoder = load_encoder(nlu.model)
        except EmbeddingError as exc:
            raise ConfigError(str(exc), file=self.file, key=f"{key}.nlu.model") from None
        threshold = MEANING_THRESHOLD if nlu.threshold is None else nlu.threshold
        return SemanticMatcher(lexical, encoder, threshold=threshold)

    def _compile(self, name: str, config: AgentConfig) -> CompiledAgent:
        file = self.file
        key = f"agents.{name}"
        for where, text in _spoken_texts(config):
            if _SECRET_PLACEHOLDER.search(text):
                raise ConfigError(
                    "secrets may not appear in prompts or messages: they would reach the "
                    "LLM or the caller",
                    file=file,
                    key=f"{key}.{where}",
                )
        functions = None
        if config.functions:
            functions_path = self.loaded.resolve(config.functions)
            if not functions_path.is_file():
                raise ConfigError(
                    f"functions module {str(functions_path)!r} not found",
                    file=file,
                    key=f"{key}.functions",
                )
            functions = load_functions(functions_path, config_file=file, cache=self._modules)
        update_tools: dict[str, UpdateStateTool] = {}
        for index, tool in enumerate(config.update_state):
            where = f"{key}.update_state[{index}]"
            if tool.name in update_tools or (functions and tool.name in functions.tools):
                raise ConfigError(f"tool name {tool.name!r} is used twice", file=file, key=where)
            updates = compile_updates(
                tool.updates, file=file, key=f"{where}.updates", allow_llm=True
            )
            update_tools[tool.name] = UpdateStateTool(tool.name, tool.description, updates)
        remote_tools: dict[str, RemoteTool] = {}
        for tool_name, remote in config.tools.items():
            try:
                remote_tools[tool_name] = load_remote_tool(
                    tool_name,
                    self.loaded.resolve(remote.openapi),
                    base_url=remote.base_url,
                    headers=remote.headers,
                    timeout_s=remote.timeout_s,
                    resolve_secret=self.secrets.get,
                    config_file=file,
                )
            except ConfigError as exc:
                where = f"{key}.{exc.key}" if exc.key else f"{key}.tools.{tool_name}"
                raise ConfigError(exc.message, file=exc.file or file, key=where) from None
        agent = CompiledAgent(
            name=name,
            config=config,
            functions=functions,
            update_tools=update_tools,
            on_enter=compile_updates(
                config.on_enter, file=file, key=f"{key}.on_enter", allow_llm=False
            ),
            on_turn=compile_updates(
                config.on_turn, file=file, key=f"{key}.on_turn", allow_llm=False
            ),
            remote_tools=remote_tools,
        )
        if config.brain == "flow":
            assert config.flow is not None and config.intents is not None
            intents_path = self.loaded.resolve(config.intents)
            intents, entities = load_intents(read_yaml(intents_path, what="intents"), intents_path)
            matcher = self._matcher(config, intents, entities, key)
            agent.matcher = matcher
            agent.brain = FlowBrain.compile(
                agent, matcher, config.flow, file=file, key=f"{key}.flow"
            )
        elif config.llm.provider == "openai_realtime":
            agent.brain = RealtimeBrain(config.llm)
        else:
            agent.brain = PlaybookBrain(config.llm)
        return agent

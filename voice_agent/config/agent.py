"""An agent: its model, its tools (update_state, remote OpenAPI tools), its flows (pages, routes,
handlers, forms) and the agent itself with its voice, hold audio and answering-machine setting."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from voice_agent.config.base import MAX_UPDATES_PER_TOOL, Assignments, Strict
from voice_agent.config.voice import (
    ContextOnTransfer,
    HoldSettings,
    InterruptionSettings,
    NluSettings,
    SttSettings,
    TtsSettings,
    TurnSettings,
    VadSettings,
    VoiceSettings,
)
from voice_agent.destination import DESTINATION

REALTIME_MODEL = "gpt-realtime"
REALTIME_SESSION_MAX_S = 55 * 60.0  # five minutes inside OpenAI's limit of an hour
REALTIME_UNAVAILABLE_LINE = (
    "Sorry, I can't take your call right now. Please call back a little later. Goodbye."
)


class LlmConfig(Strict):
    # openai_realtime: a speech-to-speech model over the Realtime protocol hears the caller and
    # speaks the agent's replies itself (brains/realtime.py); the agent's TTS says fixed lines.
    provider: Literal["openai", "openai_realtime"] = "openai"
    model: str = "gpt-4o-mini"
    base_url: str | None = None
    api_key: str | None = None
    temperature: float | None = None
    turn_deadline_s: float = Field(default=12.0, gt=0)
    request_timeout_s: float = Field(default=8.0, gt=0)
    max_attempts: int = Field(default=4, ge=1)
    fallback_line: str = "Sorry, I'm having trouble answering right now. Could you say that again?"
    # openai_realtime only: the model's voice (none: its default), and a transcription model
    # for its own record of what the caller said (none: the server's STT text alone).
    voice: str | None = None
    input_transcription: str | None = None
    # openai_realtime only: a session older than this is replaced by a new one (the call's
    # history restored) at the caller's next turn, before the service ends it mid-reply
    # (OpenAI at 60 minutes, Azure at 30); and what the agent says before it ends a call its
    # model cannot be reached for (the key or model refused, or no session after a retry).
    session_max_s: float | None = Field(default=None, gt=0)
    unavailable_line: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _realtime_model(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("provider") == "openai_realtime":
            data.setdefault("model", REALTIME_MODEL)
            data.setdefault("session_max_s", REALTIME_SESSION_MAX_S)
            data.setdefault("unavailable_line", REALTIME_UNAVAILABLE_LINE)
        return data

    @model_validator(mode="after")
    def _realtime_keys(self) -> LlmConfig:
        if self.provider != "openai_realtime":
            for key in ("voice", "input_transcription", "session_max_s", "unavailable_line"):
                if getattr(self, key) is not None:
                    raise ValueError(f"`{key}` is for `provider: openai_realtime` only")
        return self


class UpdateStateTool(Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    description: str = ""
    updates: Assignments

    @field_validator("updates")
    @classmethod
    def _not_too_many(cls, updates: Assignments) -> Assignments:
        if not updates:
            raise ValueError("an update_state tool needs at least one update")
        if len(updates) > MAX_UPDATES_PER_TOOL:
            raise ValueError(
                f"{len(updates)} updates in one tool; at most {MAX_UPDATES_PER_TOOL} are allowed"
            )
        return updates


class RemoteToolConfig(Strict):
    openapi: str
    base_url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(default=5.0, gt=0)


class HandlerConfig(Strict):
    """What a flow does on no-match, no-input or another event."""

    say: str | None = None
    set: Assignments = Field(default_factory=dict)
    call: str | None = None
    goto: str | None = None
    transfer: str | None = None
    end_call: bool = False
    # Call control (voice_agent.runtime.call_control): keys to press, a destination to hand
    # the caller to (one of the agent's `destinations`).
    send_dtmf: str | None = None
    transfer_call: str | None = None


class RouteConfig(Strict):
    """One route of a flow page: fires on an intent and/or a condition."""

    intent: str | None = None
    condition: str | None = None
    set: Assignments = Field(default_factory=dict)
    call: str | None = None
    say: str | None = None
    goto: str | None = None
    transfer: str | None = None
    end_call: bool = False
    send_dtmf: str | None = None
    transfer_call: str | None = None
    # When `call` fails: what to do instead of the flow's on_error; `{{error}}` holds the message.
    on_error: HandlerConfig | None = None

    @model_validator(mode="after")
    def _fires_on_something(self) -> RouteConfig:
        if self.intent is None and self.condition is None:
            raise ValueError("a route needs an 'intent', a 'condition', or both")
        return self


class FormParameter(Strict):
    type: str
    prompt: str
    required: bool = True


class PageConfig(Strict):
    message: str | None = None
    form: dict[str, FormParameter] = Field(default_factory=dict)
    routes: list[RouteConfig] = Field(default_factory=list)


class FlowConfig(Strict):
    start_page: str
    pages: dict[str, PageConfig]
    # Routes that apply on every page (after the page's own), as Dialogflow's flow-level routes.
    routes: list[RouteConfig] = Field(default_factory=list)
    no_match: HandlerConfig = HandlerConfig(say="Sorry, I didn't get that. Could you say it again?")
    no_input: HandlerConfig = HandlerConfig(say="Are you still there?")
    on_error: HandlerConfig = HandlerConfig(say="Sorry, something went wrong on my side.")
    events: dict[str, HandlerConfig] = Field(default_factory=dict)
    match_threshold: float = Field(default=0.6, ge=0, le=1)
    # An intent the current page's routes expect beats a flow-wide one that scored at most
    # this much higher (voice_agent.brains.flows.flow, FlowBrain._answering).
    page_intent_margin: float = Field(default=0.05, ge=0, le=1)

    @model_validator(mode="after")
    def _pages_exist(self) -> FlowConfig:
        if self.start_page not in self.pages:
            raise ValueError(f"start_page {self.start_page!r} is not one of the pages")
        return self


class AgentConfig(Strict):
    brain: Literal["playbook", "flow"] = "playbook"
    description: str = ""
    prompt: str = ""
    first_message: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    functions: str | None = None
    function_timeout_s: float = Field(default=10.0, gt=0)
    llm: LlmConfig = LlmConfig()
    update_state: list[UpdateStateTool] = Field(default_factory=list)
    on_enter: Assignments = Field(default_factory=dict)
    on_turn: Assignments = Field(default_factory=dict)
    transitions: list[str] = Field(default_factory=list)
    context_on_transfer: ContextOnTransfer = "all"
    tools: dict[str, RemoteToolConfig] = Field(default_factory=dict)
    intents: str | None = None
    flow: FlowConfig | None = None
    nlu: NluSettings | None = None  # flow agents; None: the defaults, by meaning
    no_input_timeout_s: float = Field(default=8.0, gt=0)
    # Where `transfer_call` may hand a caller: name -> SIP URI or phone number. The LLM gets the
    # transfer_call tool when there are any; flows name one in a route's `transfer_call`.
    destinations: dict[str, str] = Field(default_factory=dict)
    send_dtmf: bool = False  # offer the LLM the send_dtmf tool (flows need no switch)
    # Listen for an answering machine from the answer on (meant for calls the agent places):
    # the `voicemail` event comes when the message can start (voice_agent.core.voicemail).
    answering_machine: bool = False
    hold: HoldSettings | None = None  # audio while a turn takes long (pipeline/hold.py)
    # What the agent says to a call still live when a draining server's deadline comes
    # (`server.drain_deadline_s`), before it hangs up; null hangs up without a word.
    drain_goodbye: str | None = "I'm sorry, I have to end our call now. Goodbye."
    max_steps_per_turn: int = Field(default=8, ge=1)
    # Each replaces the config-wide `voice:` section of the same name for this agent.
    vad: VadSettings | None = None
    stt: SttSettings | None = None
    tts: TtsSettings | None = None
    turn: TurnSettings | None = None
    interruption: InterruptionSettings | None = None

    def voice(self, defaults: VoiceSettings) -> VoiceSettings:
        return VoiceSettings(
            vad=self.vad or defaults.vad,
            stt=self.stt or defaults.stt,
            tts=self.tts or defaults.tts,
            turn=self.turn or defaults.turn,
            interruption=self.interruption or defaults.interruption,
        )

    @model_validator(mode="after")
    def _brain_needs(self) -> AgentConfig:
        if self.brain == "flow":
            if self.flow is None:
                raise ValueError("an agent with brain: flow needs a 'flow' section")
            if self.intents is None:
                raise ValueError("an agent with brain: flow needs 'intents' (a file of intents)")
        elif self.flow is not None:
            raise ValueError("'flow' is only for agents with brain: flow")
        elif self.nlu is not None:  # a playbook's LLM reads the caller itself: nothing to match
            raise ValueError("'nlu' is only for agents with brain: flow")
        for name, target in self.destinations.items():
            if not DESTINATION.fullmatch(target):
                raise ValueError(
                    f"destinations.{name}: {target!r} is neither a sip:/sips:/tel: URI nor a"
                    " phone number"
                )
        return self

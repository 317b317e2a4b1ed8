"""The YAML configuration schema (pydantic) and its loader, whose errors name the file and key."""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Callable, Container
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from voice_agent.destination import DESTINATION
from voice_agent.errors import ConfigError, VoiceAgentError
from voice_agent.public_url import validate_public_url

MAX_UPDATES_PER_TOOL = 50


# `set:` values are expressions; YAML scalars (3, true, null) are accepted as constants.
Assignments = dict[str, str | bool | int | float | None]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LlmConfig(_Strict):
    provider: Literal["openai"] = "openai"
    model: str = "gpt-4o-mini"
    base_url: str | None = None
    api_key: str | None = None
    temperature: float | None = None
    turn_deadline_s: float = Field(default=12.0, gt=0)
    request_timeout_s: float = Field(default=8.0, gt=0)
    max_attempts: int = Field(default=4, ge=1)
    fallback_line: str = "Sorry, I'm having trouble answering right now. Could you say that again?"


class UpdateStateTool(_Strict):
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


class RemoteToolConfig(_Strict):
    openapi: str
    base_url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(default=5.0, gt=0)


class HandlerConfig(_Strict):
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


class RouteConfig(_Strict):
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


class FormParameter(_Strict):
    type: str
    prompt: str
    required: bool = True


class PageConfig(_Strict):
    message: str | None = None
    form: dict[str, FormParameter] = Field(default_factory=dict)
    routes: list[RouteConfig] = Field(default_factory=list)


class FlowConfig(_Strict):
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


def _checked_model(
    model: str, bundled: Container[str], resolve: Callable[[str], object], info: ValidationInfo
) -> str:
    """A model setting checked at load, so a wrong path shows before a call starts, naming
    its key: a bundled name as it is, a folder relative to the config file."""
    base_dir = (info.context or {}).get("base_dir")
    if model not in bundled and base_dir is not None:
        model = str(Path(base_dir) / Path(model).expanduser())
    try:
        resolve(model)
    except VoiceAgentError as e:
        raise ValueError(str(e)) from None
    return model


class NluSettings(_Strict):
    """How a flow agent's intents are matched (voice_agent.brains.flows.semantic)."""

    # meaning: a sentence encoder's similarity blended with the wording; lexical: wording alone.
    matcher: Literal["meaning", "lexical"] = "meaning"
    # "all-MiniLM-L6-v2" (installed by scripts/_env.sh) or a sentence-transformers BERT folder.
    model: str = Field(default="all-MiniLM-L6-v2", validate_default=True)
    # Intents scoring below it match nothing; None: 0.5 by meaning, flow.match_threshold lexical.
    threshold: float | None = Field(default=None, ge=0, le=1)

    @field_validator("model")
    @classmethod
    def _model_exists(cls, model: str, info: ValidationInfo) -> str:
        if info.data.get("matcher") != "meaning":
            return model
        from voice_agent.engines.embedding.base import BUNDLED_NAME
        from voice_agent.engines.embedding.minilm import resolve_model

        return _checked_model(model, {BUNDLED_NAME}, resolve_model, info)


ContextOnTransfer = Literal["all", "none"] | Annotated[int, Field(ge=0)]


class VadSettings(_Strict):
    provider: Literal["webrtcvad", "silero"] = "webrtcvad"
    aggressiveness: int = Field(default=2, ge=0, le=3)  # webrtcvad
    threshold: float = Field(default=0.5, gt=0, lt=1)  # silero


class SttSettings(_Strict):
    provider: Literal["whisper", "pocketsphinx", "openai"] = "pocketsphinx"
    language_model: Literal["domain", "full"] = "domain"
    phrases: list[str] = Field(default_factory=list)
    # whisper: "tiny.en" (bundled) or the folder of a CTranslate2 conversion; openai: its name.
    model: str | None = Field(default=None, validate_default=True)
    base_url: str | None = None
    api_key: str | None = None
    # Recognition runs in this many worker processes (pocketsphinx's decoder holds the GIL, and
    # Whisper's fills a core, so in threads they would stall every call's audio); None: one per
    # CPU core; 0 (pocketsphinx only): in-process threads.
    processes: int | None = Field(default=None, ge=0)
    # whisper: CTranslate2's weights type, beam width, threads per process, initial prompt.
    compute_type: Literal["int8", "int8_float32", "float32", "default"] = "int8"
    beam_size: int = Field(default=1, ge=1, le=10)
    threads: int = Field(default=1, ge=1, le=64)
    prompt: str | None = None

    @field_validator("model")
    @classmethod
    def _whisper_model_exists(cls, model: str | None, info: ValidationInfo) -> str | None:
        # At load, so a wrong path shows before a call starts, naming this key.
        if info.data.get("provider") != "whisper":
            return model
        from voice_agent.engines.stt.whisper import BUNDLED_MODEL, resolve_model

        base_dir = (info.context or {}).get("base_dir")
        if model and model != BUNDLED_MODEL and base_dir is not None:
            model = str(Path(base_dir) / Path(model).expanduser())
        try:
            resolve_model(model)
        except VoiceAgentError as e:
            raise ValueError(str(e)) from None
        return model

    @model_validator(mode="after")
    def _whisper_needs_processes(self) -> SttSettings:
        if self.provider == "whisper" and self.processes == 0:
            raise ValueError("whisper decodes in worker processes: processes must be 1 or more")
        return self


class TtsSettings(_Strict):
    provider: Literal["espeak", "piper", "openai"] = "espeak"
    voice: str | None = None
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    speed: float = Field(default=1.0, gt=0.2, lt=4)


class TurnSettings(_Strict):
    min_speech_ms: int = Field(default=100, ge=20)
    end_of_turn_silence_ms: int = Field(default=600, ge=100)
    pre_roll_ms: int = Field(default=300, ge=0)
    # Speech frames this many dB below the utterance's loudest end the turn like silence;
    # null: the VAD alone decides.
    quiet_db: float | None = Field(default=35.0, gt=0)
    # Speech that begins this soon after the end of a turn, while the agent's answer has not
    # been heard to the end, is the rest of that turn: joined to it, and the answer cut.
    continuation_window_ms: int = Field(default=1500, ge=0, le=5000)
    # What ends a turn: "silence", end_of_turn_silence_ms of it every time; "smart", an
    # acoustic end-of-turn model (`model`) and the words so far, between min_silence_ms and
    # max_silence_ms (core/end_of_turn.py; docs/config.md).
    detector: Literal["silence", "smart"] = "silence"
    model: str = Field(default="smart-turn-v3.2", validate_default=True)
    min_silence_ms: int = Field(default=200, ge=60, le=2000)
    max_silence_ms: int = Field(default=2500, ge=300, le=10000)
    unsure_silence_ms: int = Field(default=1600, ge=60, le=10000)
    finished_threshold: float = Field(default=0.5, gt=0, lt=1)

    @field_validator("model")
    @classmethod
    def _turn_model_exists(cls, model: str, info: ValidationInfo) -> str:
        if info.data.get("detector") != "smart":
            return model
        from voice_agent.engines.turn.smart_turn import BUNDLED, resolve_model

        return _checked_model(model, BUNDLED, resolve_model, info)

    @model_validator(mode="after")
    def _silences_in_order(self) -> TurnSettings:
        if not self.min_silence_ms <= self.unsure_silence_ms <= self.max_silence_ms:
            raise ValueError(
                "min_silence_ms <= unsure_silence_ms <= max_silence_ms must hold, not "
                f"{self.min_silence_ms}, {self.unsure_silence_ms}, {self.max_silence_ms}"
            )
        return self


class InterruptionSettings(_Strict):
    min_interruption_ms: int = Field(default=400, ge=20)
    min_interruption_words: int = Field(default=0, ge=0)
    false_interruption_timeout_ms: int = Field(default=1500, ge=100)
    backchannels: list[str] = Field(
        default_factory=lambda: [
            "uh-huh",
            "uh huh",
            "mm-hmm",
            "mhm",
            "yeah",
            "yep",
            "okay",
            "ok",
            "right",
        ]
    )
    resume_after_false_interruption: bool = True
    backchannel_max_ms: int = Field(default=1000, ge=0)


class VoiceSettings(_Strict):
    """Engines and turn-taking for voice calls; an agent may replace any section."""

    vad: VadSettings = VadSettings()
    stt: SttSettings = SttSettings()
    tts: TtsSettings = TtsSettings()
    turn: TurnSettings = TurnSettings()
    interruption: InterruptionSettings = InterruptionSettings()


class HoldSettings(_Strict):
    """What the caller hears while the agent works on a turn longer than `after_s` (a slow
    function or tool) before its answer: `audio` (a mono 16-bit WAV, looped), or silence."""

    @field_validator("audio")
    @classmethod
    def _audio_readable(cls, audio: str | None, info: ValidationInfo) -> str | None:
        if audio is None:
            return None
        base_dir = (info.context or {}).get("base_dir")
        path = Path(base_dir) / Path(audio).expanduser() if base_dir is not None else Path(audio)
        from voice_agent.audio.wav import read_wav

        try:
            read_wav(path)  # at load: a wrong file shows before a call, naming this key
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        return str(path)

    audio: str | None = None
    after_s: float = Field(default=2.0, gt=0, le=30)


class AgentConfig(_Strict):
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


class IceServer(_Strict):
    """A STUN or TURN server for browsers behind NAT; localhost and LAN calls need none."""

    urls: list[str] = Field(min_length=1)
    username: str | None = None
    credential: str | None = None


class WebRtcSettings(_Strict):
    ice_servers: list[IceServer] = Field(default_factory=list)
    # Pages on these origins may call; the server's own origin always may.
    allowed_origins: list[str] = Field(default_factory=list)
    ice_timeout_s: float = Field(default=15.0, gt=0)


class ServerSettings(_Strict):
    """Where call records go, who may connect, and how long records are kept."""

    @field_validator("control_listen", "agent_check_listen")
    @classmethod
    def _control(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)  # ValueError says what is wrong
        return value

    # "HOST:PORT" of the control API (POST /calls: voice_agent/server/control_api.py); off when
    # unset. Keep it off the public balancer.
    control_listen: str | None = None
    # The base URL carriers reach the control API at, for their status callbacks on placed
    # calls (only /callbacks/ need be public), e.g. https://voice.example.com:8444.
    control_public_url: str | None = None

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        return validate_public_url(value) if value else value

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for item in value:
            ipaddress.ip_network(item, strict=False)  # ValueError names the bad one
        return value

    # "sqlite" (calls.db in the data directory), "sqlite:///path/to/calls.db", or a
    # "postgresql://user:password@host:5432/db" URL for deployments on several hosts.
    store: str = "sqlite"
    data_dir: str | None = None  # default: $VOICE_AGENT_DATA_DIR, else ./data
    retention_days: float | None = Field(default=30.0, gt=0)  # None keeps calls forever
    recording: bool = False  # both directions of each call to a compressed audio file
    # Names of secrets (`voice-agent secrets set NAME`) holding the accepted bearer tokens.
    api_tokens: list[str] = Field(default_factory=list)
    # Name of the secret holding Twilio's auth token: /twilio then checks X-Twilio-Signature.
    twilio_auth_token: str | None = None
    # Twilio's REST API, for transfers on /twilio: an API key's SID and the name of the secret
    # holding its secret; without them the auth token above
    # (voice_agent/callcontrol/twilio_rest.py).
    twilio_api_key: str | None = None
    twilio_api_secret: str | None = None
    twilio_api_url: str = "https://api.twilio.com"
    # Without a token the server binds to loopback only; this overrides that refusal.
    allow_public_without_token: bool = False
    # The base URL clients and Twilio use (through proxies and tunnels), e.g.
    # https://voice.example.com: the URL X-Twilio-Signature is checked against, and an origin
    # the browser pages may call from.
    public_url: str | None = None
    # Proxies whose X-Forwarded-For is believed (addresses or CIDRs), for per-client limits.
    trusted_proxies: list[str] = Field(default_factory=list)
    max_failed_auth_per_minute: int = Field(default=10, ge=1)
    # Admission control, per worker process: beyond any of these, new calls are refused.
    max_calls: int = Field(default=200, ge=1)
    max_loop_lag_ms: float | None = Field(default=150.0, gt=0)
    max_cpu_percent: float | None = Field(default=None, gt=0)
    # Draining (SIGTERM, or POST /admin/drain on the control API) lets live calls run on this
    # long before each hears its agent's `drain_goodbye` and is ended. Ten minutes covers all
    # but the longest calls, and is what rolling deploys elsewhere allow a host to empty.
    drain_deadline_s: float = Field(default=600.0, ge=0)
    # "HOST:PORT" where HAProxy's agent-check reads this host's weight (or "drain");
    # off when unset (voice_agent/server/agent_check.py).
    agent_check_listen: str | None = None


DigestAlgorithm = Literal["MD5", "SHA-256"]


class SipTrunk(_Strict):
    """Where calls the server places go (`POST /calls`): a SIP trunk or PBX taking INVITEs."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        split_host_port(value)  # ValueError says what is wrong
        return value

    address: str  # "HOST:PORT" of the trunk (an IP address: no DNS lookups)
    # Digest credentials, if the trunk challenges: the user name and the secret holding the
    # password.
    username: str | None = None
    password_secret: str | None = None
    caller_id: str = "voice-agent"  # the From user part: the number the callee sees
    ring_timeout_s: float = Field(default=45.0, gt=0, le=300)
    calls_per_minute: int = Field(default=10, ge=1)  # placed calls, a guard against abuse


class SipSettings(_Strict):
    """SIP calls straight from a trunk or a PBX (docs/telephony.md); off unless `listen` or
    `serve --sip` gives an address."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)  # ValueError says what is wrong
        return value

    @field_validator("allowed_sources")
    @classmethod
    def _sources(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            ipaddress.ip_network(item, strict=False)  # ValueError names the bad one
        return value

    @model_validator(mode="after")
    def _ports(self) -> SipSettings:
        if self.rtp_port_max < self.rtp_port_min:
            raise ValueError(
                f"rtp_port_max {self.rtp_port_max} is below rtp_port_min {self.rtp_port_min}"
            )
        return self

    listen: str | None = None  # "HOST:PORT", e.g. "0.0.0.0:5060"
    # The address callers reach this server at, for Contact and SDP: needed when `listen` is
    # 0.0.0.0 or behind NAT.
    public_address: str | None = None
    rtp_port_min: int = Field(default=20000, ge=1024, le=65535)
    rtp_port_max: int = Field(default=20999, ge=1024, le=65535)
    # Networks (CIDR or single addresses) whose INVITEs are taken; None takes any source.
    allowed_sources: list[str] | None = None
    # Digest credentials for INVITEs: user name -> name of the secret holding the password.
    credentials: dict[str, str] = Field(default_factory=dict)
    realm: str = "voice-agent"
    # Offered in this order (many clients take the first); ["SHA-256"] refuses MD5.
    digest_algorithms: list[DigestAlgorithm] = Field(
        default_factory=lambda: list(get_args(DigestAlgorithm)), min_length=1
    )
    # Which agent takes a call: this header's value if present, else `numbers` for the dialled
    # user part, else an agent of that name, else the default agent.
    agent_header: str | None = None
    numbers: dict[str, str] = Field(default_factory=dict)
    # SIP headers that become agent args: header name -> arg name (e.g. X-Customer: customer).
    headers: dict[str, str] = Field(default_factory=dict)
    # Audio sent is taken as heard this much later (network and the caller's jitter buffer).
    heard_delay_ms: float = Field(default=60.0, ge=0, le=1000)
    # Ring (180) this long before answering; 0 answers at once.
    answer_after_ms: float = Field(default=0.0, ge=0, le=60_000)
    trunk: SipTrunk | None = None  # for calls the server places; none: POST /calls is off


def split_host_port(value: str) -> tuple[str, int]:
    """ "127.0.0.1:5060", "[::1]:5060" -> host and port; ValueError says what is wrong."""
    host, colon, port = value.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:5060)")
    return host, int(port)


class AudioSocketRoute(_Strict):
    agent: str | None = None  # None: the default agent
    args: dict[str, Any] = Field(default_factory=dict)


class AudioSocketSettings(_Strict):
    """Asterisk AudioSocket calls (AudioSocket() / Dial(AudioSocket/...)); off unless `listen`."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)
        return value

    @field_validator("routes")
    @classmethod
    def _routes(cls, value: dict[str, AudioSocketRoute]) -> dict[str, AudioSocketRoute]:
        for key in value:
            uuid.UUID(key)  # ValueError names it
        return value

    listen: str | None = None  # "HOST:PORT", e.g. "10.0.0.5:9092"
    # The call's UUID (the dialplan's ${UUID} or a fixed one per agent) -> agent and args.
    routes: dict[str, AudioSocketRoute] = Field(default_factory=dict)


class TwilioApi(_Strict):
    """Calls placed through Twilio (`POST /calls` with `via: twilio`); the credentials are
    server.twilio_api_key / twilio_api_secret (or twilio_auth_token), as for transfers."""

    account_sid: str
    caller_id: str  # the From number: one of the account's Twilio numbers


class TelnyxApi(_Strict):
    """Telnyx's Call Control API v2: transfers and keys on /telnyx calls, and placed calls."""

    api_key_secret: str  # the name of the secret holding the API v2 key (Bearer)
    api_url: str = "https://api.telnyx.com"
    connection_id: str | None = None  # the Call Control application placed calls go out on
    caller_id: str | None = None  # the From number for placed calls
    # The portal's webhook public key (base64 Ed25519): callbacks are checked against it.
    webhook_public_key: str | None = None


class PlivoApi(_Strict):
    """Plivo's REST API: transfers on /plivo calls, and placed calls (keys go on the stream)."""

    auth_id: str
    auth_token_secret: str  # the name of the secret holding the auth token
    api_url: str = "https://api.plivo.com"
    caller_id: str | None = None  # the From number for placed calls


class VonageApi(_Strict):
    """Vonage's Voice API: transfers and keys on /vonage calls (JWT signed with the
    application's private key)."""

    application_id: str
    private_key_secret: str  # the name of the secret holding the application's PEM key
    api_url: str = "https://api.nexmo.com"


class CarrierApis(_Strict):
    """The carriers' REST APIs, for call control on their streams and for placed calls
    (docs/telephony.md); each is off until configured."""

    twilio: TwilioApi | None = None
    telnyx: TelnyxApi | None = None
    plivo: PlivoApi | None = None
    vonage: VonageApi | None = None
    # Ask the carrier for its answering-machine detection on placed calls whose agent has
    # `answering_machine: true`; its verdict raises `voicemail` like the server's own detector.
    carrier_amd: bool = False
    ring_timeout_s: float = Field(default=45.0, gt=0, le=300)  # placed calls ring this long
    calls_per_minute: int = Field(default=10, ge=1)  # calls placed through carriers, all told


class Config(_Strict):
    default_agent: str
    agents: dict[str, AgentConfig]
    voice: VoiceSettings = VoiceSettings()
    webrtc: WebRtcSettings = WebRtcSettings()
    server: ServerSettings = ServerSettings()
    sip: SipSettings = SipSettings()
    audiosocket: AudioSocketSettings = AudioSocketSettings()
    carriers: CarrierApis = CarrierApis()


def _check_references(config: Config, file: str) -> None:
    """Cross-references between agents, checked after the schema so errors can name the key."""
    if config.default_agent not in config.agents:
        raise ConfigError(
            f"default_agent {config.default_agent!r} is not one of the agents "
            f"{sorted(config.agents)}",
            file=file,
            key="default_agent",
        )
    for key, route in config.audiosocket.routes.items():
        if route.agent is not None and route.agent not in config.agents:
            raise ConfigError(
                f"audiosocket route {key} names agent {route.agent!r}, which is not an agent",
                file=file,
                key=f"audiosocket.routes.{key}.agent",
            )
    for number, agent_name in config.sip.numbers.items():
        if agent_name not in config.agents:
            raise ConfigError(
                f"sip number {number} names agent {agent_name!r}, which is not an agent",
                file=file,
                key=f"sip.numbers.{number}",
            )
    for name, agent in config.agents.items():
        for index, target in enumerate(agent.transitions):
            if target not in config.agents:
                raise ConfigError(
                    f"agent {name!r} lists transition {target!r}, which is not an agent",
                    file=file,
                    key=f"agents.{name}.transitions[{index}]",
                )


class LoadedConfig:
    """A validated config plus where it came from, so relative paths resolve against its file."""

    def __init__(self, config: Config, path: Path) -> None:
        self.config = config
        self.path = path
        self.base_dir = path.parent

    def resolve(self, relative: str) -> Path:
        return (self.base_dir / relative).resolve()


def _input_path(loc: tuple[int | str, ...], data: Any) -> tuple[int | str, ...]:
    """The part of pydantic's location that exists in the YAML (it adds union and type tags)."""
    path: list[int | str] = []
    node = data
    for item in loc:
        if isinstance(node, dict) and item in node:
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):
            node = node[item]
        elif isinstance(node, dict) and isinstance(item, str) and not path[-1:] == [item]:
            # A missing or unknown key: name it, then stop.
            if "[" not in item and "-" not in item and "'" not in item:
                path.append(item)
            break
        else:
            break
        path.append(item)
    return tuple(path)


def _location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif parts:
            parts.append(f".{item}")
        else:
            parts.append(str(item))
    return "".join(parts)


def _first_error(exc: ValidationError, file: str, data: Any) -> ConfigError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = _input_path(first["loc"], data)
    # Branches of a union each report an error at the same place: say them as one.
    same_place = [e for e in errors if _input_path(e["loc"], data) == loc]
    messages: list[str] = []
    for error in same_place:
        if error["type"] == "extra_forbidden":
            text = "unknown key"
        elif error["type"] == "missing":
            text = "required key is missing"
        elif error["type"] == "value_error" and "error" in error.get("ctx", {}):
            text = str(error["ctx"]["error"])
        else:
            text = str(error["msg"])
        if text not in messages:
            messages.append(text)
    message = " or ".join(messages)
    others = len(errors) - len(same_place)
    more = f" (and {others} more problem(s))" if others else ""
    return ConfigError(message + more, file=file, key=_location(loc) or None)


def parse_config(data: Any, file: str) -> Config:
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping with 'agents'", file=file)
    try:
        # Relative paths inside the config (a Whisper model folder) are the config file's.
        config = Config.model_validate(data, context={"base_dir": Path(file).parent})
    except ValidationError as exc:
        raise _first_error(exc, file, data) from None
    _check_references(config, file)
    return config


def read_yaml(path: Path, *, what: str = "config") -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} file not found", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} file: {exc.strerror}", file=str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid YAML{where}: {problem}", file=str(path)) from None


def load_config(path: str | Path) -> LoadedConfig:
    """Read and validate a config file; raises ConfigError naming the file and key."""
    path = Path(path).resolve()
    return LoadedConfig(parse_config(read_yaml(path), str(path)), path)

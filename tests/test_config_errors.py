"""Bad configs fail at load time with a ConfigError that names the file and the key at fault.

Each case writes a small config (and the functions module or intents file it needs) into
tmp_path and loads it through `AgentRegistry.from_file`, the same path the server and the
`voice-agent` command take.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from voice_agent.agents import registry as registry_module
from voice_agent.agents.registry import AgentRegistry
from voice_agent.cli import main
from voice_agent.errors import ConfigError

CONFIG = "agents.yaml"
FUNCTIONS = "functions.py"
INTENTS = "intents.yaml"

PLAYBOOK = """\
default_agent: a
agents:
  a:
    prompt: You book tables.
"""

GOOD_FUNCTIONS = '''\
def quote() -> dict:
    """Quote the booking."""
    return {}
'''

GOOD_INTENTS = """\
intents:
  confirm:
    phrases: ["yes", "yes please"]
  book:
    phrases: [i'd like to book a table]
    parameters:
      party_size: number
"""


def flow_config(route: str, *, intents: str | None = INTENTS) -> str:
    """A one-agent flow config whose `start` page has the given route (a YAML flow mapping)."""
    intents_line = f"    intents: {intents}\n" if intents else ""
    return (
        "default_agent: f\n"
        "agents:\n"
        "  f:\n"
        "    brain: flow\n"
        f"    functions: {FUNCTIONS}\n"
        f"{intents_line}"
        "    flow:\n"
        "      start_page: start\n"
        "      pages:\n"
        "        start:\n"
        "          message: Hello!\n"
        "          routes:\n"
        f"            - {route}\n"
        "        done:\n"
        "          message: Goodbye!\n"
    )


def flow_files(route: str, **overrides: str) -> dict[str, str]:
    files = {CONFIG: flow_config(route), FUNCTIONS: GOOD_FUNCTIONS, INTENTS: GOOD_INTENTS}
    files.update(overrides)
    return files


def with_functions(module: str) -> dict[str, str]:
    return {CONFIG: PLAYBOOK + f"    functions: {FUNCTIONS}\n", FUNCTIONS: module}


def updates(count: int) -> str:
    lines = "".join(f"          v{i}: '{i}'\n" for i in range(count))
    return PLAYBOOK + "    update_state:\n      - name: set_all\n        updates:\n" + lines


@dataclass(frozen=True)
class Case:
    files: dict[str, str]
    error_file: str  # relative to tmp_path
    key: str | None
    fragment: str
    marks: tuple[Any, ...] = field(default=())


def case(name: str, c: Case) -> Any:
    return pytest.param(c, id=name, marks=c.marks)


CASES = [
    # ---- the YAML itself -----------------------------------------------------------------
    case(
        "invalid-yaml",
        Case(
            {CONFIG: "default_agent: a\nagents:\n  a:\n    prompt: hi\n  - b\n"},
            CONFIG,
            None,
            "invalid YAML at line 5, column 3",
        ),
    ),
    case(
        "top-level-not-a-mapping",
        Case({CONFIG: "- a\n- b\n"}, CONFIG, None, "the top level must be a mapping"),
    ),
    case(
        "empty-file",
        Case({CONFIG: "# nothing yet\n"}, CONFIG, None, "the top level must be a mapping"),
    ),
    # ---- schema ------------------------------------------------------------------------------
    case(
        "unknown-top-level-key",
        Case({CONFIG: PLAYBOOK + "data_dri: data\n"}, CONFIG, "data_dri", "unknown key"),
    ),
    case(
        "unknown-agent-key",
        Case({CONFIG: PLAYBOOK + "    promt: hi\n"}, CONFIG, "agents.a.promt", "unknown key"),
    ),
    case(
        "unknown-flow-route-key",
        Case(
            flow_files("{intent: confirm, goto: done, gotoo: done}"),
            CONFIG,
            "agents.f.flow.pages.start.routes[0].gotoo",
            "unknown key",
        ),
    ),
    case(
        "missing-agents",
        Case({CONFIG: "default_agent: a\n"}, CONFIG, "agents", "required key is missing"),
    ),
    case(
        "default-agent-not-an-agent",
        Case(
            {CONFIG: PLAYBOOK.replace("default_agent: a", "default_agent: b")},
            CONFIG,
            "default_agent",
            "default_agent 'b' is not one of the agents",
        ),
    ),
    case(
        "transition-to-unknown-agent",
        Case(
            {CONFIG: PLAYBOOK + "    transitions: [billing]\n"},
            CONFIG,
            "agents.a.transitions[0]",
            "lists transition 'billing', which is not an agent",
        ),
    ),
    case(
        "context-on-transfer-not-all-none-or-count",
        Case(
            {CONFIG: PLAYBOOK + "    context_on_transfer: some\n"},
            CONFIG,
            "agents.a.context_on_transfer",
            "'all' or 'none'",
        ),
    ),
    case(
        "51-updates-in-one-tool",
        Case(
            {CONFIG: updates(51)},
            CONFIG,
            "agents.a.update_state[0].updates",
            "51 updates in one tool; at most 50 are allowed",
        ),
    ),
    case(
        "secret-placeholder-in-prompt",
        Case(
            {CONFIG: PLAYBOOK.replace("You book tables.", "'Use key {{secret:x}}.'")},
            CONFIG,
            "agents.a.prompt",
            "secrets may not appear in prompts",
        ),
    ),
    # ---- expressions -------------------------------------------------------------------------
    case(
        "bad-update-expression",
        Case(
            {
                CONFIG: (
                    "default_agent: X\n"
                    "agents:\n"
                    "  X:\n"
                    "    args: {retry_count: 0}\n"
                    "    update_state:\n"
                    "      - name: count_retry\n"
                    "        updates:\n"
                    "          retry_count: 'retry_count +'\n"
                )
            },
            CONFIG,
            "agents.X.update_state[0].updates.retry_count",
            "in expression 'retry_count +' at column 14",
        ),
    ),
    case(
        "a-voice-for-a-chat-model",
        Case(
            {CONFIG: PLAYBOOK + "    llm: {provider: openai, voice: marin}\n"},
            CONFIG,
            "agents.a.llm",
            "`voice` is for `provider: openai_realtime` only",
        ),
    ),
    case(
        "a-session-limit-for-a-chat-model",
        Case(
            {CONFIG: PLAYBOOK + "    llm: {provider: openai, session_max_s: 600}\n"},
            CONFIG,
            "agents.a.llm",
            "`session_max_s` is for `provider: openai_realtime` only",
        ),
    ),
    case(
        "a-realtime-session-limit-of-nothing",
        Case(
            {CONFIG: PLAYBOOK + "    llm: {provider: openai_realtime, session_max_s: 0}\n"},
            CONFIG,
            "agents.a.llm.session_max_s",
            "greater than 0",
        ),
    ),
    case(
        "an-unknown-llm-provider",
        Case(
            {CONFIG: PLAYBOOK + "    llm: {provider: openai_realtim}\n"},
            CONFIG,
            "agents.a.llm.provider",
            "openai_realtime",
        ),
    ),
    case(
        "llm-extraction-in-on-turn",
        Case(
            {CONFIG: PLAYBOOK + "    on_turn:\n      mood: 'llm string: \"The mood\"'\n"},
            CONFIG,
            "agents.a.on_turn.mood",
            "an LLM-extracted value needs the LLM",
        ),
    ),
    case(
        "duplicate-tool-name",
        Case(
            {
                CONFIG: PLAYBOOK
                + f"    functions: {FUNCTIONS}\n"
                + "    update_state: [{name: quote, updates: {x: '1'}}]\n",
                FUNCTIONS: GOOD_FUNCTIONS,
            },
            CONFIG,
            "agents.a.update_state[0]",
            "tool name 'quote' is used twice",
        ),
    ),
    # ---- the functions module ----------------------------------------------------------------
    case(
        "functions-file-missing",
        Case(
            {CONFIG: PLAYBOOK + "    functions: nope.py\n"},
            CONFIG,
            "agents.a.functions",
            "nope.py' not found",
        ),
    ),
    case(
        "functions-module-raises-at-import",
        Case(
            with_functions('"""Fails at import."""\n\nLIMIT = 3\nraise RuntimeError("CRM down")\n'),
            FUNCTIONS,
            None,
            "the module failed to import (line 4): RuntimeError: CRM down",
        ),
    ),
    case(
        "functions-module-imports-a-missing-module",
        Case(
            with_functions('"""Needs a package."""\n\nimport no_such_module_xyz\n'),
            FUNCTIONS,
            None,
            "(line 3): ModuleNotFoundError: No module named 'no_such_module_xyz'",
        ),
    ),
    case(
        "function-with-star-args",
        Case(
            with_functions('def lookup(*cities: str) -> str:\n    """Look up."""\n    return ""\n'),
            FUNCTIONS,
            "lookup",
            "*cities is not supported",
        ),
    ),
    case(
        "function-with-star-star-kwargs",
        Case(
            with_functions('def lookup(**extra: str) -> str:\n    """Look up."""\n    return ""\n'),
            FUNCTIONS,
            "lookup",
            "**extra is not supported",
        ),
    ),
    case(
        "function-without-type-hint",
        Case(
            with_functions('def lookup(city) -> str:\n    """Look up."""\n    return ""\n'),
            FUNCTIONS,
            "lookup",
            "parameter 'city' has no type hint",
        ),
    ),
    case(
        "bad-trigger-condition",
        Case(
            with_functions(
                "@BeforeModelTrigger('$session.params.retry_count >')\n"
                "def escalate():\n"
                "    respond('Let me help.')\n"
            ),
            FUNCTIONS,
            "escalate",
            "bad trigger condition",
        ),
    ),
    case(
        "trigger-with-parameters",
        Case(
            with_functions("@BeforeModelTrigger\ndef escalate(level: int):\n    pass\n"),
            FUNCTIONS,
            "escalate",
            "a trigger function takes no arguments",
        ),
    ),
    # ---- flows and intents -------------------------------------------------------------------
    case(
        "flow-route-to-unknown-page",
        Case(
            flow_files("{intent: confirm, goto: nowhere}"),
            CONFIG,
            "agents.f.flow.pages.start.routes[0].goto",
            "unknown page 'nowhere'",
        ),
    ),
    case(
        "flow-route-with-unknown-intent",
        Case(
            flow_files("{intent: cancel, goto: done}"),
            CONFIG,
            "agents.f.flow.pages.start.routes[0].intent",
            "unknown intent 'cancel'",
        ),
    ),
    case(
        "flow-route-calling-unknown-function",
        Case(
            flow_files("{intent: confirm, call: book_table}"),
            CONFIG,
            "agents.f.flow.pages.start.routes[0].call",
            "function 'book_table' is not in the agent's functions module",
        ),
    ),
    case(
        "flow-route-on-error-to-unknown-page",
        Case(
            flow_files("{intent: confirm, call: quote, on_error: {say: '{{error}}', goto: oops}}"),
            CONFIG,
            "agents.f.flow.pages.start.routes[0].on_error.goto",
            "unknown page 'oops'",
        ),
    ),
    case(
        "flow-route-bad-condition",
        Case(
            flow_files("{condition: '$page.params.status =', goto: done}"),
            CONFIG,
            "agents.f.flow.pages.start.routes[0].condition",
            "in expression '$page.params.status ='",
        ),
    ),
    case(
        "flow-agent-without-intents",
        Case(
            {
                CONFIG: flow_config("{intent: confirm, goto: done}", intents=None),
                FUNCTIONS: GOOD_FUNCTIONS,
            },
            CONFIG,
            "agents.f",
            "an agent with brain: flow needs 'intents'",
        ),
    ),
    case(
        "intents-file-missing",
        Case(
            {CONFIG: flow_config("{intent: confirm, goto: done}"), FUNCTIONS: GOOD_FUNCTIONS},
            INTENTS,
            None,
            "intents file not found",
        ),
    ),
    case(
        "unknown-parameter-type-in-intents-file",
        Case(
            flow_files(
                "{intent: confirm, goto: done}",
                **{INTENTS: GOOD_INTENTS.replace("party_size: number", "party_size: numbr")},
            ),
            INTENTS,
            "intents.book.parameters.party_size",
            "unknown parameter type 'numbr'",
        ),
    ),
    case(
        "unknown-top-level-key-in-intents-file",
        Case(
            flow_files(
                "{intent: confirm, goto: done}", **{INTENTS: "entites: {}\n" + GOOD_INTENTS}
            ),
            INTENTS,
            "entites",
            "unknown key",
        ),
    ),
    case(
        "entity-synonyms-not-a-list",
        Case(
            flow_files(
                "{intent: confirm, goto: done}",
                **{INTENTS: "entities:\n  seating:\n    indoor: inside\n" + GOOD_INTENTS},
            ),
            INTENTS,
            "entities.seating.indoor",
            "list",
        ),
    ),
    # ---- intents by meaning ------------------------------------------------------------------
    case(
        "nlu-model-missing",
        Case(
            flow_files("{intent: confirm, goto: done}")
            | {
                CONFIG: flow_config("{intent: confirm, goto: done}") + "    nlu: {model: nowhere}\n"
            },
            CONFIG,
            "agents.f.nlu.model",
            "nowhere' does not exist",
        ),
    ),
    case(
        "nlu-model-not-a-model",
        Case(
            flow_files("{intent: confirm, goto: done}")
            | {CONFIG: flow_config("{intent: confirm, goto: done}") + "    nlu: {model: .}\n"},
            CONFIG,
            "agents.f.nlu.model",
            "is not a model folder: no config.json, model.safetensors, tokenizer.json",
        ),
    ),
    case(
        "nlu-matcher-unknown",
        Case(
            flow_files("{intent: confirm, goto: done}")
            | {
                CONFIG: flow_config("{intent: confirm, goto: done}") + "    nlu: {matcher: fuzzy}\n"
            },
            CONFIG,
            "agents.f.nlu.matcher",
            "'meaning' or 'lexical'",
        ),
    ),
    case(
        "nlu-on-a-playbook",
        Case(
            {CONFIG: PLAYBOOK + "    nlu: {matcher: lexical}\n"},
            CONFIG,
            "agents.a",
            "'nlu' is only for agents with brain: flow",
        ),
    ),
    # ---- speech recognition ------------------------------------------------------------------
    case(
        "whisper-model-missing",
        Case(
            {
                CONFIG: PLAYBOOK
                + "voice:\n  stt:\n    provider: whisper\n    model: /no/such/model\n"
            },
            CONFIG,
            "voice.stt.model",
            "/no/such/model' does not exist",
        ),
    ),
    case(
        "whisper-model-not-a-model",
        Case(
            {CONFIG: PLAYBOOK + "voice:\n  stt:\n    provider: whisper\n    model: .\n"},
            CONFIG,
            "voice.stt.model",
            "is not a CTranslate2 Whisper model: no model.bin, config.json",
        ),
    ),
    case(
        "whisper-in-process",
        Case(
            {CONFIG: PLAYBOOK + "    stt:\n      provider: whisper\n      processes: 0\n"},
            CONFIG,
            "agents.a.stt",
            "whisper decodes in worker processes",
        ),
    ),
    # ---- turn-taking --------------------------------------------------------------------------
    case(
        "turn-model-missing",
        Case(
            {
                CONFIG: PLAYBOOK
                + "voice:\n  turn:\n    detector: smart\n    model: /no/such/turn.onnx\n"
            },
            CONFIG,
            "voice.turn.model",
            "/no/such/turn.onnx' does not exist",
        ),
    ),
    case(
        "turn-model-not-a-model",
        Case(
            {
                CONFIG: PLAYBOOK + "voice:\n  turn:\n    detector: smart\n    model: notes.txt\n",
                "notes.txt": "this is no model\n",
            },
            CONFIG,
            "voice.turn.model",
            "is not an ONNX model",
        ),
    ),
    case(
        "turn-silences-out-of-order",
        Case(
            {
                CONFIG: PLAYBOOK
                + "    turn:\n      min_silence_ms: 900\n      unsure_silence_ms: 600\n"
            },
            CONFIG,
            "agents.a.turn",
            "min_silence_ms <= unsure_silence_ms <= max_silence_ms",
        ),
    ),
    # ---- telephony ---------------------------------------------------------------------------
    case(
        "sip-listen-not-host-port",
        Case({CONFIG: PLAYBOOK + "sip:\n  listen: '5060'\n"}, CONFIG, "sip.listen", "HOST:PORT"),
    ),
    case(
        "sip-rtp-ports-upside-down",
        Case(
            {CONFIG: PLAYBOOK + "sip:\n  rtp_port_min: 30000\n  rtp_port_max: 20000\n"},
            CONFIG,
            "sip",
            "rtp_port_max 20000 is below rtp_port_min 30000",
        ),
    ),
    case(
        "sip-session-expires-below-its-minimum",
        Case(
            {CONFIG: PLAYBOOK + "sip:\n  session_expires_s: 120\n  min_session_expires_s: 300\n"},
            CONFIG,
            "sip",
            "session_expires_s 120 is below min_session_expires_s 300",
        ),
    ),
    case(
        "sip-min-session-expires-below-the-rfcs-floor",
        Case(
            {CONFIG: PLAYBOOK + "sip:\n  min_session_expires_s: 30\n"},
            CONFIG,
            "sip.min_session_expires_s",
            "90",
        ),
    ),
    case(
        "sip-allowed-source-not-a-network",
        Case(
            {CONFIG: PLAYBOOK + "sip:\n  allowed_sources: [10.0.0.0/33]\n"},
            CONFIG,
            "sip.allowed_sources",
            "10.0.0.0/33",
        ),
    ),
    case(
        "sip-number-names-no-agent",
        Case(
            {CONFIG: PLAYBOOK + "sip:\n  numbers: {'+14155550100': nobody}\n"},
            CONFIG,
            "sip.numbers.+14155550100",
            "'nobody', which is not an agent",
        ),
    ),
    case(
        "sip-digest-algorithm-unknown",
        Case(
            {CONFIG: PLAYBOOK + "sip:\n  digest_algorithms: [SHA-1]\n"},
            CONFIG,
            "sip.digest_algorithms[0]",
            "'MD5' or 'SHA-256'",
        ),
    ),
    case(
        "sip-listen-unknown-transport",
        Case(
            {CONFIG: PLAYBOOK + "sip:\n  listen: ['sctp:127.0.0.1:5060']\n"},
            CONFIG,
            "sip.listen",
            "'sctp' is not a transport (udp, tcp or tls)",
        ),
    ),
    case(
        "sip-listen-two-of-a-transport",
        Case(
            {CONFIG: PLAYBOOK + "sip:\n  listen: ['tcp:0.0.0.0:5060', 'tcp:0.0.0.0:5062']\n"},
            CONFIG,
            "sip.listen",
            "two tcp addresses",
        ),
    ),
    case(
        "sip-tls-listener-without-certificate",
        Case(
            {CONFIG: PLAYBOOK + "sip:\n  listen: ['tls:0.0.0.0:5061']\n"},
            CONFIG,
            "sip",
            "needs sip.tls: certificate and key",
        ),
    ),
    case(
        "sip-tls-certificate-missing",
        Case(
            {CONFIG: PLAYBOOK + "sip:\n  tls: {certificate: server.pem, key: server.key}\n"},
            CONFIG,
            "sip.tls.certificate",
            "server.pem is not a file",
        ),
    ),
    case(
        "sip-tls-verify-client-without-ca",
        Case(
            {
                CONFIG: PLAYBOOK + "sip:\n  tls: {certificate: a.yaml, key: a.yaml, "
                "verify_client: true}\n",
                "a.yaml": "{}\n",
            },
            CONFIG,
            "sip.tls",
            "verify_client needs ca",
        ),
    ),
    case(
        "audiosocket-route-not-a-uuid",
        Case(
            {CONFIG: PLAYBOOK + "audiosocket:\n  routes: {not-a-uuid: {agent: a}}\n"},
            CONFIG,
            "audiosocket.routes",
            "badly formed hexadecimal UUID string",
        ),
    ),
    # ---- remote tools ------------------------------------------------------------------------
    case(
        "openapi-file-missing",
        Case(
            {CONFIG: PLAYBOOK + "    tools:\n      weather:\n        openapi: weather.yaml\n"},
            CONFIG,
            "agents.a.tools.weather.openapi",
            "weather.yaml: file not found",
        ),
    ),
]


def write_files(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder / CONFIG


@pytest.mark.parametrize("c", CASES)
def test_bad_config_is_a_config_error_naming_file_and_key(tmp_path: Path, c: Case) -> None:
    config = write_files(tmp_path, c.files)
    with pytest.raises(ConfigError) as caught:
        AgentRegistry.from_file(config)
    error = caught.value
    assert error.file == str((tmp_path / c.error_file).resolve())
    assert error.key == c.key
    assert c.fragment in error.message
    # The one-line form the CLI prints leads with where the problem is.
    assert str(error).startswith(": ".join(p for p in (error.file, error.key) if p))


def test_the_good_cases_around_the_limits_load(tmp_path: Path) -> None:
    # Guards the table against passing for the wrong reason: the same shapes, fixed, load.
    flow = AgentRegistry.from_file(
        write_files(tmp_path, flow_files("{intent: confirm, call: quote, goto: done}"))
    )
    (tmp_path / "limit").mkdir()
    limit = AgentRegistry.from_file(write_files(tmp_path / "limit", {CONFIG: updates(50)}))
    try:
        assert flow.agents["f"].matcher is not None
        assert len(limit.agents["a"].update_tools["set_all"].updates) == 50
    finally:
        flow.executor.shutdown()
        limit.executor.shutdown()


@pytest.mark.parametrize(
    "files",
    [
        pytest.param({CONFIG: updates(51)}, id="51-updates"),
        pytest.param(
            {CONFIG: flow_config("{goto: done}"), FUNCTIONS: GOOD_FUNCTIONS}, id="route-no-trigger"
        ),
    ],
)
def test_messages_carry_no_pydantic_prefix(tmp_path: Path, files: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as caught:
        AgentRegistry.from_file(write_files(tmp_path, files))
    assert not caught.value.message.startswith("Value error")


def test_a_state_variable_whose_name_starts_with_secret_may_be_in_a_prompt(
    tmp_path: Path,
) -> None:
    text = PLAYBOOK.replace("You book tables.", "'Put calls through to {{secretary}}.'")
    AgentRegistry.from_file(write_files(tmp_path, {CONFIG: text}))


# ---- nothing starts half-configured ---------------------------------------------------------

GOOD_THEN_BAD = """\
default_agent: good
agents:
  good:
    prompt: You book tables.
    functions: functions.py
  bad:
    prompt: You cancel tables.
    on_enter: {retry_count: 'retry_count +'}
"""


def test_a_failed_load_gives_no_registry_and_releases_what_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[ThreadPoolExecutor] = []
    shut: list[ThreadPoolExecutor] = []

    class RecordingExecutor(ThreadPoolExecutor):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

        def shutdown(self, *args: Any, **kwargs: Any) -> None:
            shut.append(self)
            super().shutdown(*args, **kwargs)

    monkeypatch.setattr(registry_module, "ThreadPoolExecutor", RecordingExecutor)
    config = write_files(tmp_path, {CONFIG: GOOD_THEN_BAD, FUNCTIONS: GOOD_FUNCTIONS})
    result: AgentRegistry | None = None
    with pytest.raises(ConfigError) as caught:
        result = AgentRegistry.from_file(config)
    # The first agent compiled fine, yet the caller gets no registry to start it from.
    assert result is None
    assert caught.value.key == "agents.bad.on_enter.retry_count"
    assert made and shut == made


def write_cli_case(folder: Path, name: str) -> tuple[Path, Path]:
    """A bad config for the CLI, and the file its error must name."""
    if name == "invalid-yaml":
        return write_files(folder, {CONFIG: "agents: [\n"}), folder / CONFIG
    if name == "unknown-key":
        return write_files(folder, {CONFIG: PLAYBOOK + "    promt: hi\n"}), folder / CONFIG
    if name == "second-agent-bad":
        files = {CONFIG: GOOD_THEN_BAD, FUNCTIONS: GOOD_FUNCTIONS}
        return write_files(folder, files), folder / CONFIG
    if name == "module-raises":
        files = with_functions('raise RuntimeError("CRM down")\n')
        return write_files(folder, files), folder / FUNCTIONS
    assert name == "module-raises-multiline"
    files = with_functions('raise RuntimeError("CRM down\\nretry later")\n')
    return write_files(folder, files), folder / FUNCTIONS


@pytest.mark.parametrize(
    "name",
    [
        "invalid-yaml",
        "unknown-key",
        "second-agent-bad",
        "module-raises",
        "module-raises-multiline",
    ],
)
def test_check_command_exits_2_with_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    config, at_fault = write_cli_case(tmp_path, name)
    assert main(["check", "--config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no agent listed, no "OK": nothing of the config was accepted
    lines = err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("voice-agent: error: ")
    assert str(at_fault.resolve()) in lines[0]

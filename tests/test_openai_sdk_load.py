"""The `openai` SDK imports all of its API resources on a client's first `.audio` or `.chat`
(0.7-0.9 s). Hosted engines and LLM agents make it happen when they are made, at start: on a
caller's first turn it stalled the worker's event loop, and every call on it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import FIXTURES

PROBE = textwrap.dedent(
    """
    import sys
    from voice_agent.engines.stt.openai import OpenAiStt
    from voice_agent.engines.tts.base import TtsConfig
    from voice_agent.engines.tts.openai import OpenAITts
    from voice_agent.agents.registry import AgentRegistry

    def loaded():
        return "openai.resources" in sys.modules

    made = sys.argv[1]
    before = loaded()
    if made == "stt":
        OpenAiStt(base_url="http://127.0.0.1:9/v1")
    elif made == "tts":
        OpenAITts(TtsConfig(provider="openai", base_url="http://127.0.0.1:9/v1"))
    else:
        AgentRegistry.from_file(sys.argv[2])
    print(before, loaded())
    """
)


def probe(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_hosted_engines_load_the_sdk_when_made() -> None:
    assert probe("stt") == "False True"
    assert probe("tts") == "False True"


def test_an_llm_agent_loads_the_sdk_when_its_config_is_loaded() -> None:
    assert probe("registry", str(FIXTURES / "concurrency" / "agents.yaml")) == "False True"

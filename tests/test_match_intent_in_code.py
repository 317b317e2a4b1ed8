"""`flows.<name>.match_intent(text)` in a playbook's code blocks: the flow's matcher (by
meaning, as the default agent ships) read from a trigger, sync or async, as Dialogflow's code
blocks read a flow's intents; a trigger that responds means no LLM is asked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.support.configs import default_config_with
from voice_agent.agents.registry import AgentRegistry
from voice_agent.runtime.session import CallSession
from voice_agent.runtime.turn_events import AgentEvent, AgentSpeech

TRIGGERS = """
import asyncio


@BeforeModelTrigger
def sync_reader():
    if state.get("mode") != "sync":
        return
    match = flows.booking.match_intent(history.last_user_utterance)
    best = match.best
    respond(f"{best.intent} {best.parameters.get('party_size')}" if best else "nothing")


@BeforeModelTrigger
async def async_reader():
    if state.get("mode") != "async":
        return
    # Off the event loop: matching by meaning costs about 11 ms of CPU (docs/config.md).
    match = await asyncio.to_thread(flows.booking.match_intent, history.last_user_utterance)
    respond(match.best.intent if match.best else "nothing")
"""


async def spoken(stream: AsyncIterator[AgentEvent]) -> str:
    return "".join([e.text async for e in stream if isinstance(e, AgentSpeech)])


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "readers.py").write_text(TRIGGERS)
    path = default_config_with(tmp_path / "config")
    data = yaml.safe_load(path.read_text())
    data["agents"]["reader"] = {
        "brain": "playbook",
        "prompt": "You read intents.",
        "functions": str(tmp_path / "readers.py"),
        "llm": {"model": "gpt-4o-mini"},
        "args": {"mode": None},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_code_block_reads_what_the_caller_meant(config: Path, mode: str) -> None:
    registry = AgentRegistry.from_file(config)
    session = CallSession(registry, agent="reader", args={"mode": mode})
    await spoken(session.start())
    # Said in no training phrase's words: matched by meaning; it names no party size.
    said = await spoken(session.user_turn("we'll have to call the whole thing off"))
    assert said == ("cancel_booking None" if mode == "sync" else "cancel_booking")
    said = await spoken(session.user_turn("what's the weather doing this afternoon"))
    assert said == "nothing"
    await registry.aclose()


async def test_a_code_block_gets_the_parameters_of_the_match(config: Path) -> None:
    registry = AgentRegistry.from_file(config)
    session = CallSession(registry, agent="reader", args={"mode": "sync"})
    await spoken(session.start())
    said = await spoken(session.user_turn("could you fit the five of us in on saturday"))
    assert said == "book_table 5"
    await registry.aclose()

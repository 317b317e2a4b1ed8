"""The speech-to-speech brain (brains/realtime.py) in a call without a voice side (the text
simulator's), against the Realtime stand-in through the real `openai` SDK: the runtime's tools,
the prompt kept up with the state, a session that drops mid-call, a model that fails."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import speech
from tests.support.realtime_server import ModelReply, RealtimeStandIn
from voice_agent.agents.registry import AgentRegistry
from voice_agent.runtime.secrets import Secrets
from voice_agent.runtime.session import CallSession

ROOT = Path(__file__).parent.parent
CANARY = "canary-realtime-5d1e-never-sent"
BOOKING = {"party_size": 2, "when": "2026-12-24T19:30", "name": "Ada", "phone": "5550100"}


@pytest.fixture
async def model() -> AsyncIterator[RealtimeStandIn]:
    async with RealtimeStandIn(realtime_factor=50) as server:
        yield server


@pytest.fixture
async def registry(tmp_path: Path, model: RealtimeStandIn) -> AsyncIterator[AgentRegistry]:
    data = yaml.safe_load((ROOT / "config" / "agents.yaml").read_text())
    for agent in data["agents"].values():
        for key in ("functions", "intents"):
            if key in agent:
                agent[key] = str(ROOT / "config" / agent[key])
    data["agents"]["concierge"]["llm"] = {"provider": "openai_realtime", "base_url": model.base_url}
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    registry = AgentRegistry.from_file(path, Secrets({"booking_code_key": CANARY}))
    yield registry
    await registry.aclose()


async def test_a_text_call_books_through_the_models_tool_call_and_its_prompt_follows_state(
    registry: AgentRegistry, model: RealtimeStandIn
) -> None:
    session = CallSession(registry, agent="concierge")
    assert await speech(session.start()) == [
        "Hello, thanks for calling Bella Vista! How can I help?"
    ]
    model.script(
        ModelReply(tool_calls=[("book_table", BOOKING)]), ModelReply(text="You're booked.")
    )
    said = await speech(session.user_turn("a table for two on christmas eve at half seven"))
    assert said == ["You're booked."]
    code = session.state["booking_code"]
    assert len(code) == 6

    updates = [e["session"] for e in model.of_type("session.update")]
    assert updates[0]["output_modalities"] == ["text"]  # no voice side: text replies
    assert updates[0]["instructions"].endswith("booking code: .")
    # The tool changed the state the prompt shows: sent again before the model answered.
    assert updates[-1]["instructions"].endswith(f"booking code: {code}.")
    kinds = [(i["type"], i.get("role")) for i in model.items]
    assert kinds == [
        ("message", "assistant"),  # the first message, said by the server
        ("message", "user"),
        ("function_call", None),
        ("function_call_output", None),
        ("message", "assistant"),
    ]
    assert model.items[1]["content"] == [
        {"type": "input_text", "text": "a table for two on christmas eve at half seven"}
    ]
    assert json.loads(model.items[3]["output"])["code"] == code
    assert [m["role"] for m in session.context_messages()][-4:] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    await session.end()
    assert not any(CANARY in event for event in model.received)


async def test_a_session_that_drops_is_reopened_with_the_committed_history(
    registry: AgentRegistry, model: RealtimeStandIn
) -> None:
    session = CallSession(registry, agent="concierge")
    await speech(session.start())
    model.script(ModelReply(text="We open at noon."), ModelReply(drop_socket=True))
    assert await speech(session.user_turn("when do you open")) == ["We open at noon."]
    fallback = registry.agents["concierge"].config.llm.fallback_line
    assert await speech(session.user_turn("and on sundays")) == [fallback]
    errors = [e.data for e in session.audit.of_type("error")]
    assert errors and errors[0]["where"] == "realtime"

    model.script(ModelReply(text="Sundays too."))
    assert await speech(session.user_turn("what about sundays")) == ["Sundays too."]
    assert len(model.sessions) == 2
    restored = [
        (i["role"], i["content"][0].get("text")) for i in model.items if i["type"] == "message"
    ]
    assert restored == [
        ("assistant", "Hello, thanks for calling Bella Vista! How can I help?"),
        ("user", "when do you open"),
        ("assistant", "We open at noon."),
        ("user", "and on sundays"),
        ("assistant", fallback),
        ("user", "what about sundays"),  # the turn itself, once
        ("assistant", "Sundays too."),
    ]
    await session.end()


async def test_a_model_that_cannot_be_reached_gets_the_fallback_line_and_the_call_goes_on(
    tmp_path: Path,
) -> None:
    config = tmp_path / "agents.yaml"
    config.write_text(
        "default_agent: a\nagents:\n  a:\n    prompt: You book tables.\n"
        "    llm: {provider: openai_realtime, base_url: 'http://127.0.0.1:9/v1',"
        " request_timeout_s: 2}\n"
    )
    registry = AgentRegistry.from_file(config)
    session = CallSession(registry)
    await speech(session.start())
    said = await speech(session.user_turn("hello"))
    assert said == [registry.agents["a"].config.llm.fallback_line]
    (error,) = [e.data for e in session.audit.of_type("error")]
    assert error["where"] == "realtime" and "cannot open a Realtime session" in error["message"]
    await session.end()
    await registry.aclose()

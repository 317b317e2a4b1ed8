"""The speech-to-speech brain (brains/realtime.py) in a call without a voice side (the text
simulator's), against the Realtime stand-in through the real `openai` SDK: the runtime's tools,
the prompt kept up with the state, a session that drops mid-call, a model that fails."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import speech
from tests.support.realtime_server import ModelReply, RealtimeStandIn
from voice_agent.agents.registry import AgentRegistry
from voice_agent.runtime.secrets import Secrets
from voice_agent.runtime.session import CallSession
from voice_agent.runtime.turn_events import AgentSpeech, AgentSpeechEnd, CallEnd
from voice_agent.store.outcomes import outcome_for

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


async def test_a_session_that_drops_is_reopened_and_the_turn_answered_from_the_history(
    registry: AgentRegistry, model: RealtimeStandIn
) -> None:
    session = CallSession(registry, agent="concierge")
    await speech(session.start())
    model.script(
        ModelReply(text="We open at noon."),
        ModelReply(drop_socket=True),
        ModelReply(text="Sundays too."),
    )
    assert await speech(session.user_turn("when do you open")) == ["We open at noon."]
    # The socket drops before the model says a word: a new session answers the same turn.
    assert await speech(session.user_turn("and on sundays")) == ["Sundays too."]
    errors = [e.data for e in session.audit.of_type("error")]
    assert [e["where"] for e in errors] == ["realtime"]
    assert len(model.sessions) == 2
    restored = [
        (i["role"], i["content"][0].get("text")) for i in model.items if i["type"] == "message"
    ]
    assert restored == [
        ("assistant", "Hello, thanks for calling Bella Vista! How can I help?"),
        ("user", "when do you open"),
        ("assistant", "We open at noon."),
        ("user", "and on sundays"),  # the turn, restored once, and answered
        ("assistant", "Sundays too."),
    ]
    await session.end()


async def test_a_session_the_service_ends_at_its_limit_mid_reply_is_replaced_and_answers(
    tmp_path: Path,
) -> None:
    async with RealtimeStandIn(realtime_factor=50, max_session_s=1.0) as model:
        registry = _registry(tmp_path, {"base_url": model.base_url})
        session = CallSession(registry)
        await speech(session.start())
        # The model is slow to answer: the service's limit comes first and cuts the response.
        model.script(ModelReply(text="Noon.", delay_s=3.0), ModelReply(text="We open at noon."))
        assert await speech(session.user_turn("when do you open")) == ["We open at noon."]
        (error,) = [e.data for e in session.audit.of_type("error")]
        assert "maximum duration" in error["message"]
        assert len(model.sessions) == 2
        await session.end()
        await registry.aclose()


async def test_a_session_near_its_limit_is_renewed_between_turns(tmp_path: Path) -> None:
    async with RealtimeStandIn(realtime_factor=50) as model:
        registry = _registry(tmp_path, {"base_url": model.base_url, "session_max_s": 0.3})
        session = CallSession(registry)
        await speech(session.start())
        model.script(ModelReply(text="We open at noon."), ModelReply(text="Sundays too."))
        assert await speech(session.user_turn("when do you open")) == ["We open at noon."]
        assert len(model.sessions) == 1
        await asyncio.sleep(0.4)  # the session is now older than session_max_s
        assert await speech(session.user_turn("and on sundays")) == ["Sundays too."]
        assert len(model.sessions) == 2 and session.audit.of_type("error") == []
        said = [(i["role"], i["content"][0].get("text")) for i in model.items]
        assert said[-3:] == [
            ("assistant", "We open at noon."),  # restored in the new session
            ("user", "and on sundays"),
            ("assistant", "Sundays too."),
        ]
        await session.end()
        await registry.aclose()


def _registry(folder: Path, llm: dict[str, object]) -> AgentRegistry:
    config = folder / "agents.yaml"
    agent = {"prompt": "You book tables.", "llm": {"provider": "openai_realtime", **llm}}
    config.write_text(yaml.safe_dump({"default_agent": "a", "agents": {"a": agent}}))
    return AgentRegistry.from_file(config)


async def _turn(session: CallSession, text: str) -> tuple[list[str], list[CallEnd]]:
    said: list[str] = []
    ends: list[CallEnd] = []
    parts: list[str] = []
    async for event in session.user_turn(text):
        if isinstance(event, AgentSpeech):
            parts.append(event.text)
        elif isinstance(event, AgentSpeechEnd):
            said.append("".join(parts))
            parts = []
        elif isinstance(event, CallEnd):
            ends.append(event)
    return said, ends


async def test_a_model_that_cannot_be_reached_gets_the_unavailable_line_and_the_call_ends(
    tmp_path: Path,
) -> None:
    registry = _registry(tmp_path, {"base_url": "http://127.0.0.1:9/v1", "request_timeout_s": 2})
    session = CallSession(registry)
    await speech(session.start())
    said, ends = await _turn(session, "hello")
    assert said == [registry.agents["a"].config.llm.unavailable_line]
    (end,) = ends
    assert outcome_for(end.reason) == "interrupted"
    (error,) = [e.data for e in session.audit.of_type("error")]
    assert error["where"] == "realtime" and "cannot open a Realtime session" in error["message"]
    await session.end()
    await registry.aclose()


@pytest.mark.parametrize("wrong", ["api_key", "model"])
async def test_a_wrong_key_or_model_ends_each_call_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, wrong: str
) -> None:
    async with RealtimeStandIn(api_key="sk-right", models=["gpt-realtime"]) as model:
        llm: dict[str, object] = {"base_url": model.base_url, "api_key": "sk-right"}
        llm[wrong] = "sk-wrong" if wrong == "api_key" else "gpt-realtime-typo"
        registry = _registry(tmp_path, llm)
        with caplog.at_level(logging.ERROR, logger="voice_agent.brains.realtime"):
            for _ in range(2):
                session = CallSession(registry)
                await speech(session.start())
                said, ends = await _turn(session, "hello")
                assert said == [registry.agents["a"].config.llm.unavailable_line]
                assert [outcome_for(e.reason) for e in ends] == ["interrupted"]
                await session.end()
        await registry.aclose()
    expected = "Incorrect API key" if wrong == "api_key" else "gpt-realtime-typo` does not exist"
    (logged,) = [r.getMessage() for r in caplog.records]
    assert expected in logged and "agents.a.llm" in logged

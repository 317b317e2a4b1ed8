"""The LLM concierge in config/: update_state, BeforeModel/BeforeAction triggers and overrides."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import speech
from tests.support.openai_server import OpenAIStandIn, Reply
from voice_agent.agents.registry import AgentRegistry
from voice_agent.runtime.session import CallSession

CONFIG = Path(__file__).parent.parent / "config" / "agents.yaml"


@pytest.fixture
async def registry(llm: OpenAIStandIn) -> AsyncIterator[AgentRegistry]:
    registry = AgentRegistry.from_file(CONFIG)
    yield registry
    await registry.aclose()


async def test_frustration_escalates_through_update_state_and_a_trigger(
    registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = CallSession(registry, agent="concierge")
    assert await speech(session.start()) == [
        "Hello, thanks for calling Bella Vista! How can I help?"
    ]
    llm.script(Reply(tool_calls=[("track_mood", {"should_escalate": True})]))
    said = await speech(session.user_turn("this is the third time i'm calling, it's ridiculous"))
    assert said == ["I'm sorry this has been frustrating. Let me take you through it step by step."]
    # The trigger answered instead of a second model request.
    assert len(llm.requests) == 1
    assert session.state["should_escalate"] is True and session.state["retry_count"] == 1


async def test_book_then_cancel_with_an_override_lookup(
    registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = CallSession(registry, agent="concierge")
    await speech(session.start())
    booking = {"party_size": 3, "when": "2026-12-24T19:30", "name": "Ada", "phone": "5550100"}
    llm.script(Reply(tool_calls=[("book_table", booking)]), Reply(text="You're booked."))
    await speech(session.user_turn("a table for three on christmas eve at seven thirty"))
    code = session.state["booking_code"]
    assert len(code) == 6

    # A later call whose number is known: the BeforeModelTrigger looks the booking up first.
    later = CallSession(registry, agent="concierge", args={"phone": "5550100"})
    await speech(later.start())
    llm.script(Reply(tool_calls=[("cancel_booking", {"booking_code": code})]), Reply(text="Done."))
    assert await speech(later.user_turn("please cancel my booking")) == ["Done."]
    looked_up = [m for m in llm.requests[2]["messages"] if m["role"] == "tool"]
    assert json.loads(looked_up[0]["content"])["code"] == code
    assert later.audit.of_type("override")[0].data == {
        "action": "find_booking",
        "inputs": {"phone": "5550100"},
    }
    assert later.state["booking_code"] is None


async def test_cancel_without_a_booking_is_guarded(
    registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = CallSession(registry, agent="concierge")
    await speech(session.start())
    llm.script(Reply(tool_calls=[("cancel_booking", {"booking_code": "ZZZZZZ"})]))
    said = await speech(session.user_turn("cancel it"))
    assert said == ["Let me find your booking first. What phone number is it under?"]
    assert [e.data["error"] for e in session.audit.of_type("tool_call")] == [
        "not run: a BeforeActionTrigger responded instead"
    ]


async def test_code_can_use_the_flow_matcher_on_the_last_utterance(
    registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = CallSession(registry, agent="concierge")
    await speech(session.start())
    llm.script(Reply(tool_calls=[("classify_request", {})]), Reply(text="Let's cancel it."))
    await speech(session.user_turn("i want to cancel my reservation"))
    tool_message = next(m for m in llm.requests[1]["messages"] if m["role"] == "tool")
    result = json.loads(tool_message["content"])
    assert result["intent"] == "cancel_booking"


async def test_closing_the_registry_closes_the_playbooks_llm_connections(
    llm: OpenAIStandIn,
) -> None:
    """A playbook's LLM client, made on its first turn, holds a pool of HTTP connections:
    closing the registry (the server's shutdown, the CLI's exit) closes it."""
    registry = AgentRegistry.from_file(CONFIG)
    session = CallSession(registry, agent="concierge")
    await speech(session.start())
    llm.script(Reply(text="We're open from noon."))
    await speech(session.user_turn("when are you open"))
    brain = registry.agents["concierge"].brain
    client = brain.llm._client  # type: ignore[attr-defined]
    assert not client.is_closed()
    await registry.aclose()
    assert client.is_closed()

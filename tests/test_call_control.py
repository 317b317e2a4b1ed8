"""Call control in the runtime: `transfer_call` and `send_dtmf` as LLM tools and flow actions,
and the config errors that keep an agent from dialling anywhere it was not given."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.configs import default_config_with
from tests.support.openai_server import OpenAIStandIn, Reply
from voice_agent.agents.registry import AgentRegistry
from voice_agent.errors import ConfigError
from voice_agent.runtime.call_control import CallTransfer, SendDigits
from voice_agent.runtime.session import CallSession
from voice_agent.runtime.turn_events import AgentEvent, AgentSpeech, CallEnd

DESTINATIONS = {"front_desk": "sip:desk@192.0.2.10", "manager": "+14155550199"}


def booking_agent(tmp_path: Path, **changes: Any) -> Path:
    """The default booking flow, its talk_to_human route handing over to the front desk."""
    path = default_config_with(tmp_path)
    data = yaml.safe_load(path.read_text())
    agent = data["agents"]["booking"]
    agent["destinations"] = DESTINATIONS
    for route in agent["flow"]["routes"]:
        if route.get("intent") == "talk_to_human":
            route["say"] = "Putting you through to the front desk."
            route["transfer_call"] = "front_desk"
        if route.get("intent") == "opening_hours":
            route["send_dtmf"] = "12#"
    agent.update(changes)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


async def events(stream: AsyncIterator[AgentEvent]) -> list[AgentEvent]:
    return [event async for event in stream]


def spoken(items: list[AgentEvent]) -> str:
    return "".join(e.text for e in items if isinstance(e, AgentSpeech))


async def test_a_flow_route_says_its_line_then_hands_the_call_over(tmp_path: Path) -> None:
    registry = AgentRegistry.from_file(booking_agent(tmp_path))
    session = CallSession(registry, agent="booking")
    await events(session.start())
    said = await events(session.user_turn("can i speak to a person"))
    assert spoken(said) == "Putting you through to the front desk."
    transfers = [e for e in said if isinstance(e, CallTransfer)]
    assert transfers == [CallTransfer("front_desk", DESTINATIONS["front_desk"], "flow booking")]
    # The hand-over is the last thing the turn yields: nothing after it is said.
    assert said[-1] == transfers[0] and not any(isinstance(e, CallEnd) for e in said)
    await registry.aclose()


async def test_a_flow_route_presses_keys(tmp_path: Path) -> None:
    registry = AgentRegistry.from_file(booking_agent(tmp_path))
    session = CallSession(registry, agent="booking")
    await events(session.start())
    said = await events(session.user_turn("when are you open"))
    assert [e for e in said if isinstance(e, SendDigits)] == [SendDigits("12#")]
    assert "open every day" in spoken(said)
    await registry.aclose()


def edited(tmp_path: Path, edit: Any) -> Path:
    path = booking_agent(tmp_path)
    data = yaml.safe_load(path.read_text())
    edit(data["agents"]["booking"])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _route(agent: dict[str, Any], intent: str) -> dict[str, Any]:
    return next(r for r in agent["flow"]["routes"] if r.get("intent") == intent)


@pytest.mark.parametrize(
    ("edit", "key", "words"),
    [
        (
            lambda a: _route(a, "talk_to_human").update(transfer_call="kitchen"),
            "transfer_call",
            "'kitchen' is not one of this agent's destinations ['front_desk', 'manager']",
        ),
        (
            lambda a: _route(a, "opening_hours").update(send_dtmf="12x"),
            "send_dtmf",
            "not 'X'",
        ),
        (
            lambda a: a["destinations"].update(front_desk="desk at the back"),
            "destinations",
            "neither a sip:/sips:/tel: URI nor a phone number",
        ),
    ],
)
def test_bad_call_control_config_names_the_key(
    tmp_path: Path, edit: Any, key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        AgentRegistry.from_file(edited(tmp_path, edit))
    message = str(raised.value)
    assert key in message and words in message and "agents.yaml" in message


PLAYBOOK = {
    "default_agent": "concierge",
    "agents": {
        "concierge": {
            "brain": "playbook",
            "prompt": "You answer the phone for a hotel.",
            "first_message": "Hotel Aurora, how can I help?",
            "destinations": DESTINATIONS,
            "send_dtmf": True,
        }
    },
}


@pytest.fixture
def playbook(tmp_path: Path) -> Path:
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump(PLAYBOOK))
    return path


def offered(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in request.get("tools", [])}


async def test_the_llm_is_offered_the_destinations_by_name_and_transfers(
    playbook: Path, llm: OpenAIStandIn
) -> None:
    registry = AgentRegistry.from_file(playbook)
    session = CallSession(registry)
    await events(session.start())
    llm.script(
        Reply(
            text="Let me put you through.",
            tool_calls=[("transfer_call", {"destination": "manager", "reason": "a complaint"})],
        )
    )
    said = await events(session.user_turn("I want the manager"))
    tools = offered(llm.requests[0])
    enum = tools["transfer_call"]["parameters"]["properties"]["destination"]["enum"]
    assert enum == ["front_desk", "manager"] and "send_dtmf" in tools
    assert "+14155550199" not in str(tools)  # the LLM chooses a name, never an address
    assert spoken(said) == "Let me put you through."
    assert [e for e in said if isinstance(e, CallTransfer)] == [
        CallTransfer("manager", "+14155550199", "a complaint")
    ]
    assert len(llm.requests) == 1  # the turn ends with the hand-over: no second LLM step
    await registry.aclose()


async def test_an_llm_asking_for_an_unknown_destination_gets_an_error_and_no_transfer(
    playbook: Path, llm: OpenAIStandIn
) -> None:
    registry = AgentRegistry.from_file(playbook)
    session = CallSession(registry)
    await events(session.start())
    llm.script(
        Reply(tool_calls=[("transfer_call", {"destination": "+15550001111"})]),
        Reply(text="Sorry, I can't transfer you there."),
        Reply(tool_calls=[("send_dtmf", {"digits": "1 2 #"})]),
        Reply(text="Done."),
        Reply(tool_calls=[("send_dtmf", {"digits": "call me"})]),
        Reply(text="I could not press that."),
    )
    said = await events(session.user_turn("put me through to +15550001111"))
    assert not any(isinstance(e, CallTransfer) for e in said)
    result = next(m for m in llm.requests[1]["messages"] if m["role"] == "tool")["content"]
    assert "destination must be one of ['front_desk', 'manager']" in result
    pressed = await events(session.user_turn("press one two hash"))
    assert [e for e in pressed if isinstance(e, SendDigits)] == [SendDigits("12#")]
    refused = await events(session.user_turn("press call me"))
    assert not any(isinstance(e, SendDigits) for e in refused)
    errors = [e for e in session.audit.events if e.type == "tool_call" and e.data["error"]]
    assert len(errors) == 2 and "may hold only" in errors[1].data["error"]
    await registry.aclose()

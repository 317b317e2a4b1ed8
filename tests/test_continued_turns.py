"""A caller's turn continued after a pause, in the runtime: the two parts become one user
message, and the call goes back to where the first part found it unless an action ran."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from tests.support.configs import default_config_with
from voice_agent.agents.registry import AgentRegistry
from voice_agent.runtime.session import CallSession
from voice_agent.runtime.turn_events import AgentEvent, AgentSpeech


async def spoken(stream: AsyncIterator[AgentEvent]) -> str:
    return "".join([e.text async for e in stream if isinstance(e, AgentSpeech)])


def user_messages(session: CallSession) -> list[str]:
    return [m["content"] for m in session.context_messages() if m["role"] == "user"]


async def test_the_whole_sentence_is_one_message_and_is_answered_whole(tmp_path: Path) -> None:
    registry = AgentRegistry.from_file(default_config_with(tmp_path))
    session = CallSession(registry, agent="booking")
    await spoken(session.start())
    await spoken(session.user_turn("I'd like a table for"))
    whole = "I'd like a table for four on Friday at seven pm"
    answer = await spoken(session.user_turn(whole, continues=True))
    assert user_messages(session) == [whole]
    assert session.state["party_size"] == 4
    assert session.state["when"] is not None
    assert "name" in answer.lower()  # the form goes on to the next thing it needs
    (continued,) = [e for e in session.audit.events if e.data.get("continues")]
    assert continued.data["state_restored"] is True
    await registry.aclose()


async def test_the_first_part_is_undone_when_no_action_ran(tmp_path: Path) -> None:
    """ "cancel" alone would have started the cancel form; the whole sentence asks something
    else, and is answered from where the call was before the first part."""
    registry = AgentRegistry.from_file(default_config_with(tmp_path))
    session = CallSession(registry, agent="booking")
    await spoken(session.start())
    await spoken(session.user_turn("I want to book a table"))
    page = dict(session.flow_page)
    await spoken(session.user_turn("for two"))  # a turn of its own: the form takes it
    assert session.state["party_size"] == 2
    await spoken(session.user_turn("for two people tomorrow at eight", continues=True))
    assert session.state["party_size"] == 2 and session.state["when"] is not None
    assert session.flow_page == page
    assert user_messages(session) == ["I want to book a table", "for two people tomorrow at eight"]
    await registry.aclose()


async def test_what_an_action_did_is_not_undone(tmp_path: Path) -> None:
    """The phone number completed the form and quote_booking ran: a function's effects may
    reach beyond the call, so the state stays as the first part left it."""
    registry = AgentRegistry.from_file(default_config_with(tmp_path))
    session = CallSession(registry, agent="booking")
    await spoken(session.start())
    for line in ("book a table for two tomorrow at eight pm", "my name is john smith"):
        await spoken(session.user_turn(line))
    await spoken(session.user_turn("07700 900123"))
    assert session.state["when_spoken"] is not None  # quote_booking ran
    await spoken(session.user_turn("07700 900123 yes that's right", continues=True))
    (continued,) = [e for e in session.audit.events if e.data.get("continues")]
    assert continued.data["state_restored"] is False
    assert session.state["phone"] == "07700900123"
    assert user_messages(session)[-1] == "07700 900123 yes that's right"
    await registry.aclose()

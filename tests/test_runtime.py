"""The agent runtime through real turns: implicit names, tools, update_state, triggers, transfers.

The LLM is the OpenAI stand-in reached through the real `openai` SDK; the assertions read the
exact requests the LLM received.
"""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import SECRET_VALUE, WeatherServer, speech
from tests.support.openai_server import OpenAIStandIn, Reply
from voice_agent.agents.registry import AgentRegistry
from voice_agent.runtime.session import CallSession
from voice_agent.runtime.turn_events import AgentSpeech


def tool_names(request: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in request.get("tools", [])]


def tool_results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


async def started(registry: AgentRegistry, **kwargs: Any) -> CallSession:
    session = CallSession(registry, **kwargs)
    await speech(session.start())
    return session


async def test_first_message_and_prompt_are_templated_from_args(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = CallSession(seed_registry, args={"name": "Ada"})
    assert await speech(session.start()) == ["Hello Ada! How can I help?"]
    llm.script(Reply(text="Hi Ada."))
    assert await speech(session.user_turn("hello")) == ["Hi Ada."]
    system = llm.requests[0]["messages"][0]
    assert system == {
        "role": "system",
        "content": "You are a booking assistant. The caller's name is Ada. Mood: calm.",
    }
    assert session.state["started"] is True  # the BeforePlaybookTrigger ran once at start


async def test_what_is_my_name_result_goes_back_to_the_llm(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry, args={"name": "Grace"})
    llm.script(Reply(tool_calls=[("what_is_my_name", {})]), Reply(text="You are Grace."))
    assert await speech(session.user_turn("what's my name?")) == ["You are Grace."]
    second = llm.requests[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "what_is_my_name"
    assert second[-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": '{"result": "Grace"}',
    }
    assert session.context_view()["messages"] == [
        *second,
        {"role": "assistant", "content": "You are Grace."},
    ]


async def test_update_phone_writes_state_that_persists(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry)
    llm.script(Reply(tool_calls=[("update_phone", {"new_phone": "5551234"})]), Reply(text="Done."))
    await speech(session.user_turn("my new number is 5551234"))
    assert session.state["phone"] == "5551234"
    changes = [e.data for e in session.audit.of_type("state_change")]
    assert {
        "source": "update_phone",
        "diff": {"phone": {"old": "88005553535", "new": "5551234"}},
    } in changes
    # The BeforeActionTrigger queued what_is_my_name: it ran first, and the LLM saw it.
    calls = [e.data["name"] for e in session.audit.of_type("tool_call")]
    assert calls == ["what_is_my_name", "update_phone"]
    assert '{"result": "user"}' in tool_results(llm.requests[1])


async def test_context_is_the_committed_history_in_openai_format(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry)
    llm.script(Reply(tool_calls=[("last_message", {})]), Reply(text="You said that."))
    await speech(session.user_turn("remember the blue door"))
    # The function saw the caller's line as the last message at that moment.
    assert tool_results(llm.requests[1]) == ['{"result": "remember the blue door"}']


async def test_secret_reaches_the_function_but_never_the_llm_or_audit(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry)
    llm.script(Reply(tool_calls=[("call_crm", {})]), Reply(text="Found you."))
    await speech(session.user_turn("look me up"))
    assert tool_results(llm.requests[1]) == ['{"result": "CRM answered for key [secret:api_key]"}']
    everything = json.dumps(
        [llm.requests, session.audit.as_list(), session.context_view(), session.public_state()]
    )
    assert SECRET_VALUE not in everything
    assert "[secret:api_key]" in everything


async def test_failed_function_is_an_error_result_and_its_state_is_rolled_back(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry)
    llm.script(Reply(tool_calls=[("half_done_then_fail", {})]), Reply(text="Sorry."))
    assert await speech(session.user_turn("do it")) == ["Sorry."]
    assert tool_results(llm.requests[1]) == ['{"error": "ValueError: the CRM is down"}']
    assert session.state["phone"] == "88005553535"


async def test_function_timeout_is_an_error_and_rolls_back(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry)
    llm.script(Reply(tool_calls=[("slow_lookup", {})]), Reply(text="That took too long."))
    await speech(session.user_turn("look it up slowly"))
    assert tool_results(llm.requests[1]) == ['{"error": "slow_lookup timed out after 0.5 s"}']
    assert session.state["phone"] == "88005553535"
    seed_registry.agents["booking"].functions.module._release.set()  # type: ignore[union-attr]


async def test_bad_arguments_from_the_llm_become_a_readable_error(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry)
    llm.script(
        Reply(tool_calls=[("update_phone", {"phone": "1"}), ("remember", "{not json")]),
        Reply(text="Let me retry."),
    )
    await speech(session.user_turn("change my phone"))
    results = tool_results(llm.requests[1])
    # The two LLM calls answer in order; the override queued by a BeforeActionTrigger follows.
    assert "missing required argument 'new_phone'" in results[0]
    assert "not valid JSON" in results[1]
    assert results[2] == '{"result": "user"}'
    assert session.state["phone"] == "88005553535"


async def test_update_state_tool_schema_has_parameters_only_for_llm_values(
    seed_registry: AgentRegistry,
) -> None:
    tools = {
        t["function"]["name"]: t["function"] for t in seed_registry.agents["booking"].llm_tools()
    }
    assert tools["track_mood"]["parameters"] == {
        "type": "object",
        "properties": {
            "should_escalate": {
                "type": "boolean",
                "description": "User sounds frustrated with the conversation",
            },
            "mood": {"type": "string", "description": "One word for the mood"},
        },
        "required": ["should_escalate", "mood"],
        "additionalProperties": False,
    }
    assert tools["count_retry"]["parameters"]["properties"] == {}
    # Triggers are code, never tools.
    assert not {"greet_vip", "check_before_phone", "on_start", "on_digit"} & set(tools)
    assert "weather__get_weather" in tools and "transfer_to_agent" in tools


async def test_update_state_applies_and_updated_prompt_is_sent_next(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry)
    llm.script(
        Reply(tool_calls=[("track_mood", {"should_escalate": False, "mood": "angry"})]),
        Reply(text="I hear you."),
    )
    await speech(session.user_turn("this is taking forever"))
    assert session.state["mood"] == "angry"
    assert session.state["retry_count"] == 1
    assert session.state["should_escalate"] is False
    assert "Mood: angry." in llm.requests[1]["messages"][0]["content"]
    # retry_count > 3 makes should_escalate true whatever the LLM says.
    session.state["retry_count"] = 4
    llm.script(
        Reply(tool_calls=[("track_mood", {"should_escalate": "no", "mood": "tired"})]),
        Reply(text="ok"),
    )
    await speech(session.user_turn("still waiting"))
    assert session.state["should_escalate"] is True


async def test_update_state_is_atomic(seed_registry: AgentRegistry, llm: OpenAIStandIn) -> None:
    session = await started(seed_registry)
    llm.script(Reply(tool_calls=[("broken_update", {})]), Reply(text="Hmm."))
    await speech(session.user_turn("break it"))
    assert session.state["retry_count"] == 0
    assert "cannot set 'mood'" in tool_results(llm.requests[1])[0]


async def test_before_model_trigger_respond_ends_the_turn_without_the_llm(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry, args={"vip": True})
    assert await speech(session.user_turn("hi")) == ["Welcome back, valued guest."]
    assert llm.requests == []
    trigger = session.audit.of_type("trigger")[-1].data
    assert trigger == {"kind": "before_model", "function": "greet_vip", "event": None}


async def test_before_action_trigger_respond_blocks_the_action(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry, args={"blocked": True})
    llm.script(Reply(text="Checking.", tool_calls=[("call_crm", {})]))
    said = await speech(session.user_turn("look me up"))
    assert said == ["Checking.", "I can't look that up for you."]
    assert len(llm.requests) == 1
    results = [m for m in session.context_view()["messages"] if m["role"] == "tool"]
    assert "BeforeActionTrigger responded" in results[0]["content"]


async def test_remote_tool_called_from_code_is_not_shown_to_the_llm(
    seed_registry: AgentRegistry, llm: OpenAIStandIn, weather: WeatherServer
) -> None:
    session = await started(seed_registry)
    llm.script(Reply(tool_calls=[("weather_now", {"city": "Paris"})]), Reply(text="Sunny."))
    await speech(session.user_turn("weather in paris?"))
    assert weather.paths == ["/weather/Paris"]
    # The function's own return reaches the LLM; the direct tools.weather call adds no message.
    assert tool_results(llm.requests[1]) == ['{"city": "Paris", "sky": "sunny"}']
    calls = next(m for m in llm.requests[1]["messages"] if m.get("tool_calls"))["tool_calls"]
    assert [call["function"]["name"] for call in calls] == ["weather_now"]


async def test_llm_may_call_a_remote_action(
    seed_registry: AgentRegistry, llm: OpenAIStandIn, weather: WeatherServer
) -> None:
    session = await started(seed_registry)
    llm.script(
        Reply(tool_calls=[("weather__get_weather", {"city": "Oslo"})]), Reply(text="Sunny in Oslo.")
    )
    await speech(session.user_turn("weather in oslo?"))
    assert weather.paths == ["/weather/Oslo"]
    assert tool_results(llm.requests[1]) == ['{"city": "Oslo", "sky": "sunny"}']


async def test_transfer_keeps_state_extends_it_and_switches_prompt(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry, args={"name": "Linus"})
    llm.script(
        Reply(tool_calls=[("transfer_to_agent", {"agent": "support", "args": {"ticket": 7}})]),
        Reply(text="Support here."),
    )
    assert await speech(session.user_turn("I need support")) == ["Support here."]
    assert session.agent.name == "support"
    assert session.state["name"] == "Linus"  # kept: the new agent's default does not override
    assert session.state["tier"] == "gold" and session.state["ticket"] == 7
    assert session.state["support_since_turn"] == 1  # on_enter ran, after this turn's on_turn
    second = llm.requests[1]
    assert second["model"] == "support-model"
    assert (
        second["messages"][0]["content"]
        == "You are support. Caller Linus, phone 88005553535, tier gold."
    )
    transition = session.audit.of_type("transition")[0].data
    assert transition["source"] == "booking" and transition["target"] == "support"


async def test_llm_outage_says_the_fallback_line_and_the_call_goes_on(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry)
    llm.script(Reply(status=500), Reply(status=503))
    assert await speech(session.user_turn("hello?")) == ["Sorry, one moment please."]
    assert session.audit.of_type("error")[0].data["where"] == "llm"
    llm.script(Reply(text="I'm back."))
    assert await speech(session.user_turn("hello again")) == ["I'm back."]


async def test_barge_in_cancels_the_stream_and_commits_what_was_heard(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = CallSession(seed_registry, auto_commit=False)
    async for event in session.start():
        if isinstance(event, AgentSpeech):
            session.commit_reply(event.reply_id, event.text)
    llm.script(
        Reply(text="Our opening hours are noon to eleven every day.", chunk_chars=6, delay_s=0.05)
    )
    turn = session.user_turn("when are you open?")
    first = await anext(turn)
    assert isinstance(first, AgentSpeech)
    await turn.aclose()  # the caller spoke over the agent
    await llm.wait_disconnect()
    session.commit_reply(first.reply_id, "Our opening")
    messages = session.context_view()["messages"]
    assert messages[-1] == {"role": "assistant", "content": "Our opening"}
    utterance = session.audit.of_type("agent_utterance")[-1].data
    assert utterance["generated"] == first.text and utterance["committed"] == "Our opening"


async def test_reply_cut_on_first_word_is_not_committed(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = CallSession(seed_registry, auto_commit=False)
    async for _ in session.start():
        pass
    session.commit_reply(1, None)
    assert session.context_view()["messages"][1:] == []
    assert (
        session.audit.of_type("agent_utterance")[0].data["generated"]
        == "Hello user! How can I help?"
    )


async def test_event_triggers_dtmf_no_input_and_custom(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry)
    assert await speech(session.event("dtmf", digit="5")) == ["You pressed 5."]
    assert session.state["last_digit"] == "5"
    assert await speech(session.event("no-input")) == ["Are you still there?"]
    llm.script(Reply(tool_calls=[("flag_vip", {})]), Reply(text="Noted."))
    await speech(session.user_turn("I'm a regular"))
    assert session.state["vip"] is True
    await session.end("caller hung up")
    assert session.audit.events[-1].type == "call_ended"


async def test_session_values_read_the_dialogflow_way_and_on_turn_counts(
    seed_registry: AgentRegistry, llm: OpenAIStandIn
) -> None:
    session = await started(seed_registry, call_id="call-42", args={"name": "Ada"})
    llm.script(Reply(tool_calls=[("session_info", {})]), Reply(text="ok"))
    await speech(session.user_turn("who am i"))
    assert tool_results(llm.requests[1]) == ['{"id": "call-42", "name": "Ada"}']
    llm.script(Reply(text="ok"))
    await speech(session.user_turn("again"))
    assert session.state["turns"] == 2

"""The Realtime client (voice_agent/engines/realtime) through the real `openai` SDK against the
project's Realtime-protocol stand-in (tests/support/realtime_server.py) on localhost."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from tests.support.realtime_server import ModelReply, RealtimeStandIn
from voice_agent.engines.realtime import (
    AudioOut,
    FunctionCallOut,
    ModelOutput,
    RealtimeSettings,
    RealtimeSocket,
    ResponseEnd,
    TranscriptOut,
)
from voice_agent.engines.realtime.formats import PCM24, PCMU, format_for

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": "Book a table.",
            "parameters": {"type": "object", "properties": {"party_size": {"type": "integer"}}},
        },
    }
]


@pytest.fixture
async def model() -> AsyncIterator[RealtimeStandIn]:
    async with RealtimeStandIn(realtime_factor=50) as server:
        yield server


def socket_for(model: RealtimeStandIn, **restore_items: object) -> RealtimeSocket:
    settings = RealtimeSettings(model="gpt-realtime", voice="marin", base_url=model.base_url)
    return RealtimeSocket(settings, PCMU, restore=lambda: [dict(i) for i in restore_items.values()])


async def outputs(socket: RealtimeSocket) -> list[ModelOutput]:
    return [output async for output in socket.respond()]


def test_the_model_speaks_g711_to_a_g711_call_and_24_khz_pcm_to_the_rest() -> None:
    assert format_for("mulaw", 8000) is PCMU
    assert format_for("pcm16", 16000) is PCM24
    assert format_for("pcm16", 48000) is PCM24
    assert PCMU.wire() == {"type": "audio/pcmu"}
    assert PCM24.wire() == {"type": "audio/pcm", "rate": 24000}


async def test_a_session_is_set_up_and_a_reply_streams_as_audio_and_transcript(
    model: RealtimeStandIn,
) -> None:
    socket = socket_for(model)
    await socket.open("You are a restaurant's host.", TOOLS)
    await socket.add_user_text("a table for two please")
    model.script(ModelReply(text="Certainly, for what time?"))
    got = await outputs(socket)
    await socket.close()

    update = model.of_type("session.update")[0]["session"]
    assert update["instructions"] == "You are a restaurant's host."
    assert update["audio"]["input"] == {"format": {"type": "audio/pcmu"}, "turn_detection": None}
    assert update["audio"]["output"] == {"format": {"type": "audio/pcmu"}, "voice": "marin"}
    assert update["tools"] == [
        {
            "type": "function",
            "name": "book_table",
            "description": "Book a table.",
            "parameters": TOOLS[0]["function"]["parameters"],  # type: ignore[index]
        }
    ]
    audio = b"".join(o.audio for o in got if isinstance(o, AudioOut))
    text = "".join(o.text for o in got if isinstance(o, TranscriptOut))
    assert text == "Certainly, for what time?"
    item = model.assistant_items()[0]
    assert audio == model.audio[item["id"]].data and len(audio) > 8000  # over a second of it
    assert got[-1] == ResponseEnd("completed", None)


async def test_a_function_call_comes_whole_and_its_output_goes_back(
    model: RealtimeStandIn,
) -> None:
    socket = socket_for(model)
    await socket.open("", TOOLS)
    await socket.add_user_text("book for four")
    model.script(ModelReply(tool_calls=[("book_table", {"party_size": 4})]))
    got = await outputs(socket)
    call = next(o for o in got if isinstance(o, FunctionCallOut))
    assert call.name == "book_table" and json.loads(call.arguments) == {"party_size": 4}
    await socket.add_function_output(call.call_id, '{"code": "AB12CD"}')
    await model.until(lambda: model.items[-1].get("type") == "function_call_output")
    await socket.close()
    assert model.items[-1]["call_id"] == call.call_id


async def test_truncate_keeps_the_audio_heard_and_delete_drops_an_item(
    model: RealtimeStandIn,
) -> None:
    socket = socket_for(model)
    await socket.open("", [])
    await socket.add_user_text("hello")
    model.script(ModelReply(text="Good evening and welcome to the restaurant."))
    got = await outputs(socket)
    item_id = next(o.item_id for o in got if isinstance(o, AudioOut))
    words = model.audio[item_id].ends_ms
    cut_ms = int((words[1][1] + words[2][1]) / 2)  # in the third word
    await socket.truncate(item_id, cut_ms)
    await model.until(lambda: bool(model.of_type("conversation.item.truncate")))
    await model.until(lambda: model.assistant_items()[0]["content"][0]["transcript"] is None)
    assert model.heard_words(model.assistant_items()[0]) == ["Good", "evening"]

    await socket.delete(item_id)
    await model.until(lambda: not model.assistant_items())
    await socket.close()
    assert model.errors == []


async def test_an_error_answering_the_request_ends_the_response_failed(
    model: RealtimeStandIn,
) -> None:
    socket = socket_for(model)
    await socket.open("", [])
    model.script(ModelReply(error="The server had an error"))
    got = await outputs(socket)
    await socket.close()
    assert got == [ResponseEnd("failed", "server_error: The server had an error")]


async def test_malformed_events_are_skipped_and_the_reply_still_comes(
    model: RealtimeStandIn,
) -> None:
    errors: list[str] = []
    socket = RealtimeSocket(RealtimeSettings(base_url=model.base_url), PCMU, on_error=errors.append)
    await socket.open("", [])
    broken = ("not json {", json.dumps({"type": "response.output_audio.delta", "item_id": "x"}))
    model.script(ModelReply(text="Still here.", raw_before=broken))
    got = await outputs(socket)
    await socket.close()
    assert "".join(o.text for o in got if isinstance(o, TranscriptOut)) == "Still here."
    assert got[-1] == ResponseEnd("completed", None)
    assert len(errors) == 2 and all("malformed event skipped" in e for e in errors)
    assert "not json {" in errors[0] and socket.opened == 1


async def test_a_dropped_socket_is_reopened_with_the_history_restored(
    model: RealtimeStandIn,
) -> None:
    said = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    socket = socket_for(model, said=said)
    await socket.open("Be brief.", [])
    model.script(ModelReply(drop_socket=True), ModelReply(text="Hello again."))
    got = await outputs(socket)
    assert isinstance(got[-1], ResponseEnd) and got[-1].status == "failed"
    again = await outputs(socket)
    await socket.close()
    assert len(model.sessions) == 2 and socket.opened == 2
    assert model.sessions[1]["instructions"] == "Be brief."
    assert model.items[0]["content"] == said["content"]
    assert "".join(o.text for o in again if isinstance(o, TranscriptOut)) == "Hello again."


async def test_a_session_that_cannot_open_is_a_clear_error() -> None:
    settings = RealtimeSettings(base_url="http://127.0.0.1:9/v1", connect_timeout_s=2)
    socket = RealtimeSocket(settings, PCM24)
    with pytest.raises(Exception, match="cannot open a Realtime session"):
        await socket.open("", [])
    await socket.close()

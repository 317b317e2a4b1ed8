"""A speech-to-speech agent (`llm.provider: openai_realtime`) end to end over `/twilio`: the
concierge of config/agents.yaml with its model swapped for the project's Realtime stand-in
(tests/support/realtime_server.py), reached through the real `openai` SDK.

The caller plays recorded fixtures in real time and plays the agent's audio on its own clock,
echoing marks, as Twilio does. The assertions read both sides: the call record the server keeps
and the conversation the stand-in holds, which must hold only what the caller heard.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from tests.support.baresip import Baresip, write_line
from tests.support.configs import ended_call as record
from tests.support.configs import serving
from tests.support.live_calls import CallAudit, new_pipeline, recorded, words_in
from tests.support.realtime_server import ModelReply, RealtimeStandIn
from voice_agent.audio.g711 import ulaw_decode
from voice_agent.callers import TwilioClient
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
GREETING = "Hello, thanks for calling Bella Vista! How can I help?"
CANARY = "canary-7f3a9c1e-never-sent"
BOOKING = {"party_size": 2, "when": "2026-12-24T19:30", "name": "Ada", "phone": "5550100"}

pytestmark = pytest.mark.asyncio(loop_scope="module")


def ulaw(name: str) -> bytes:
    return (AUDIO / f"{name}.ulaw").read_bytes()


def realtime_config(
    folder: Path, model: RealtimeStandIn, *, transcription: str | None = None, **voice: Any
) -> Path:
    """config/agents.yaml with the concierge as the default agent, speaking through `model`."""
    data = yaml.safe_load((ROOT / "config" / "agents.yaml").read_text())
    for agent in data["agents"].values():
        for key in ("functions", "intents"):
            if key in agent:
                agent[key] = str(ROOT / "config" / agent[key])
    data["default_agent"] = "concierge"
    data["agents"]["concierge"]["llm"] = {
        "provider": "openai_realtime",
        "base_url": model.base_url,
        "voice": "marin",
    }
    if transcription:
        data["agents"]["concierge"]["llm"]["input_transcription"] = transcription
    data["voice"] = {"stt": {"provider": "pocketsphinx"}, **voice}
    # Its own call store: the session's is shared with other modules that count concierge calls.
    data["server"] = {**data.get("server", {}), "data_dir": str(folder / "data")}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "agents.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def model() -> AsyncIterator[RealtimeStandIn]:
    async with RealtimeStandIn() as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, model: RealtimeStandIn
) -> AsyncIterator[VoiceServer]:
    config = realtime_config(tmp_path_factory.mktemp("realtime"), model)
    async for voice_server in serving(config, secrets={"booking_code_key": CANARY}):
        yield voice_server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def quick_server(
    tmp_path_factory: pytest.TempPathFactory, model: RealtimeStandIn
) -> AsyncIterator[VoiceServer]:
    """Barge-in after 150 ms of speech: quick enough to cut a first word."""
    config = realtime_config(
        tmp_path_factory.mktemp("quick"),
        model,
        interruption={"min_interruption_ms": 150},
        turn={"min_speech_ms": 60},
    )
    async for voice_server in serving(config):
        yield voice_server


@pytest.fixture(autouse=True)
def fresh(model: RealtimeStandIn) -> None:
    model.replies.clear()


def twilio(server: VoiceServer, call_sid: str) -> TwilioClient:
    return TwilioClient(f"ws://127.0.0.1:{server.port}/twilio", call_sid=call_sid, timeout=60)


def messages(call: dict[str, Any], role: str) -> list[str | None]:
    return [m.get("content") for m in call["context"]["messages"] if m["role"] == role]


def audit(call: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in call["audit"] if e["type"] == kind]


def items(model: RealtimeStandIn, kind: str, role: str | None = None) -> list[dict[str, Any]]:
    return [i for i in model.items if i["type"] == kind and (role is None or i["role"] == role)]


async def test_a_tool_call_reads_and_writes_state_and_only_heard_lines_reach_the_model(
    server: VoiceServer, model: RealtimeStandIn
) -> None:
    model.script(
        ModelReply(tool_calls=[("book_table", BOOKING)]),
        ModelReply(text="You are booked for two on Christmas Eve."),
    )
    async with twilio(server, "CArtbook") as caller:
        await caller.wait_silence_after_audio(500)  # the first message, through the agent's TTS
        heard = caller.received_ms
        await caller.send_audio(ulaw("joe_book1"))
        await caller.wait_audio(heard + 1)
        await caller.wait_silence_after_audio(800)
        await caller.stop()
    call = await record(server, "CArtbook")

    # The runtime ran the model's call with the implicit state and secrets.
    assert len(call["state"]["booking_code"]) == 6 and call["state"]["phone"] == "5550100"
    assert messages(call, "assistant")[0] == GREETING
    assert messages(call, "assistant")[-1] == "You are booked for two on Christmas Eve."
    # The model's conversation: the greeting as heard, the caller's own audio (G.711, as the
    # carrier sent it), the call, its result, the spoken answer.
    greeting, answer = items(model, "message", "assistant")
    assert greeting["content"] == [{"type": "output_text", "text": GREETING}]
    (said,) = items(model, "message", "user")
    assert said["content"][0]["type"] == "input_audio"
    seconds = len(said["content"][0]["audio"]) * 3 / 4 / 8000
    assert 1.0 < seconds < len(ulaw("joe_book1")) / 8000 + 1.0
    (output,) = items(model, "function_call_output")
    assert json.loads(output["output"])["code"] == call["state"]["booking_code"]
    assert model.heard_words(answer) == "You are booked for two on Christmas Eve.".split()
    assert model.sessions[-1]["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    # The turn's latency is recorded as for any agent: caller speech end -> the model's audio.
    (turn,) = call["turns"]
    assert turn["first_audio_sent_ms"] > turn["user_turn_ms"] >= turn["speech_end_ms"]
    assert turn["speech_end_to_first_audio_ms"] > 0
    # The canary secret the function used never left the server.
    assert model.received and not any(CANARY in event for event in model.received)
    assert model.errors == []


async def test_a_barge_in_mid_sentence_leaves_the_model_the_heard_prefix(
    server: VoiceServer, model: RealtimeStandIn
) -> None:
    long_answer = (
        "We have tables at seven, at half past seven and at eight, and on the terrace "
        "there is room until ten if the weather holds."
    )
    model.script(ModelReply(text=long_answer), ModelReply(text="Of course, for how many?"))
    async with twilio(server, "CArtmid") as caller:
        await caller.wait_silence_after_audio(500)
        heard = caller.received_ms
        await caller.send_audio(ulaw("joe_book1"))
        await caller.wait_audio(heard + 2500)  # well into the model's answer
        await caller.send_audio(ulaw("joe_book1"))
        clear = await caller.wait_clear()
        played_ms = caller.played_ms(clear.at)
        await caller.wait_audio(caller.received_ms + 1)
        await caller.wait_silence_after_audio(800)
        await caller.stop()
    call = await record(server, "CArtmid")
    committed = messages(call, "assistant")[1]
    assert committed is not None
    words = committed.split()
    assert 0 < len(words) < len(long_answer.split())
    assert words == long_answer.split()[: len(words)]
    # The model's item was cut at the audio the caller heard: the same words, within one.
    cut = items(model, "message", "assistant")[1]
    assert cut["content"][0]["transcript"] is None  # truncated
    kept = model.heard_words(cut)
    assert abs(len(kept) - len(words)) <= 1
    truncate = model.of_type("conversation.item.truncate")[-1]
    assert truncate["item_id"] == cut["id"]
    assert abs(truncate["audio_end_ms"] - (played_ms - heard)) < 1500
    assert model.errors == []


async def test_a_barge_in_on_the_first_word_leaves_nothing_of_the_reply(
    quick_server: VoiceServer, model: RealtimeStandIn
) -> None:
    model.script(
        ModelReply(text="Certainly, let me look at the book for tomorrow evening for you."),
        ModelReply(text="Two people, got it."),
    )
    async with twilio(quick_server, "CArtfirst") as caller:
        await caller.wait_silence_after_audio(500)
        heard = caller.received_ms
        await caller.send_audio(ulaw("joe_book1"))
        await caller.wait_audio(heard + 1)  # the model's first audio: talk straight over it
        await caller.send_audio(ulaw("joe_book1"))
        await caller.wait_clear()
        await caller.wait_audio(caller.received_ms + 1)
        await caller.wait_silence_after_audio(800)
        await caller.stop()
    call = await record(quick_server, "CArtfirst")
    utterances = [e for e in call["audit"] if e["type"] == "agent_utterance"]
    cut = next(u for u in utterances if u["generated"].startswith("Certainly"))
    assert cut["committed"] is None
    assert not any((m or "").startswith("Certainly") for m in messages(call, "assistant"))
    deleted = {e["item_id"] for e in model.of_type("conversation.item.delete")}
    kept = [i for i in items(model, "message", "assistant") if i["id"] in deleted]
    assert deleted and kept == []
    assert not any(
        "Certainly" in " ".join(model.heard_words(i))
        for i in model.items
        if i["type"] == "message" and i["role"] == "assistant"
    )
    assert model.errors == []


async def test_a_trigger_that_blocks_an_action_is_what_the_model_learns(
    server: VoiceServer, model: RealtimeStandIn
) -> None:
    model.script(ModelReply(tool_calls=[("cancel_booking", {"booking_code": "ZZZZZZ"})]))
    async with twilio(server, "CArtguard") as caller:
        await caller.wait_silence_after_audio(500)
        heard = caller.received_ms
        await caller.send_audio(ulaw("joe_cancel1"))
        await caller.wait_audio(heard + 1)
        await caller.wait_silence_after_audio(800)
        await caller.stop()
    call = await record(server, "CArtguard")
    guard = "Let me find your booking first. What phone number is it under?"
    assert messages(call, "assistant")[-1] == guard
    (output,) = items(model, "function_call_output")
    assert json.loads(output["output"]) == {
        "error": "not run: a BeforeActionTrigger responded instead"
    }
    # The trigger's line, spoken by the agent's TTS, reached the model once heard.
    assert items(model, "message", "assistant")[-1]["content"][0]["text"] == guard
    assert len(model.of_type("response.create")) >= 1
    assert call["state"].get("booking_code") is None  # nothing was cancelled


async def test_a_sip_caller_books_and_hears_the_models_own_voice(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """baresip calls the realtime concierge over SIP: its line reaches the model as G.711, the
    model's tool call books the table, and what baresip recorded of the model's answer is
    transcribed and holds its words."""
    async with RealtimeStandIn(voice="piper") as voice_model:
        config = realtime_config(
            tmp_path_factory.mktemp("sip"), voice_model, transcription="gpt-4o-mini-transcribe"
        )
        async for server in serving(config, sip=True):
            assert server.sip is not None
            voice_model.script(
                ModelReply(tool_calls=[("book_table", BOOKING)]),
                ModelReply(text="Lovely, you are booked for two on Christmas Eve."),
            )
            line = write_line(tmp_path / "book.wav", ulaw_decode(ulaw("joe_book1")))
            phone = Baresip(tmp_path)
            await phone.start()
            try:
                known = set(server.pipelines)
                await phone.dial(f"sip:concierge@127.0.0.1:{server.sip.port}")
                pipeline = await new_pipeline(server, known)
                events = CallAudit(pipeline)
                await events.until("agent_utterance")  # the first message, played out
                await phone.say(line)
                answer = await events.until("agent_utterance")
                await phone.hang_up()
                await pipeline.finished.wait()
            finally:
                await phone.close()
            call = await record(server, pipeline.session.call_id)
    assert answer.data["committed"] == "Lovely, you are booked for two on Christmas Eve."
    assert len(call["state"]["booking_code"]) == 6
    # The model's own transcription of the caller, asked for, is in the record beside the STT's.
    transcription = voice_model.sessions[-1]["audio"]["input"]["transcription"]
    assert transcription == {"model": "gpt-4o-mini-transcribe"}
    assert [e["text"] for e in audit(call, "model_heard")] == [voice_model.heard_as]
    assert voice_model.sessions[-1]["audio"]["output"]["format"]["type"] in (
        "audio/pcmu",
        "audio/pcma",
    )
    (said,) = await words_in(recorded(phone.heard()))
    assert "christmas" in said, said  # only the model says it, over RTP in its own voice


async def test_a_sip_caller_cuts_the_model_off_and_the_model_keeps_what_went_out(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, model: RealtimeStandIn
) -> None:
    """Barge-in over SIP: baresip talks over the model's long answer; the server's RTP clock
    says how much of it the caller heard, and the model's item is truncated there: its words
    are the committed words, within one."""
    long_answer = (
        "We have tables at seven, at half past seven and at eight, and on the terrace "
        "there is room until ten if the weather holds."
    )
    model.script(ModelReply(text=long_answer), ModelReply(text="Of course, for how many?"))
    config = realtime_config(tmp_path_factory.mktemp("sipcut"), model)
    async for server in serving(config, sip=True):
        assert server.sip is not None
        line = write_line(tmp_path / "book.wav", ulaw_decode(ulaw("joe_book1")))
        phone = Baresip(tmp_path)
        await phone.start()
        try:
            known = set(server.pipelines)
            await phone.dial(f"sip:concierge@127.0.0.1:{server.sip.port}")
            pipeline = await new_pipeline(server, known)
            events = CallAudit(pipeline)
            await events.until("agent_utterance")  # the first message, played out
            await phone.say(line)
            await events.until("turn_metrics")  # the model's first audio is out
            await asyncio.sleep(2.5)  # the caller listens for a while, then talks over it
            await phone.say(line)
            cut = await events.until("agent_utterance")
            await events.until("agent_utterance")  # the answer to what the caller said
            await phone.hang_up()
            await pipeline.finished.wait()
        finally:
            await phone.close()
        call = await record(server, pipeline.session.call_id)
    # Cut while still streaming (the model sends faster than real time, not all at once).
    assert cut.data["interrupted"] and long_answer.startswith(cut.data["generated"])
    words = (cut.data["committed"] or "").split()
    assert 0 < len(words) < len(long_answer.split())
    assert words == long_answer.split()[: len(words)]
    assert messages(call, "assistant")[1] == cut.data["committed"]
    answer = next(i for i in items(model, "message", "assistant") if i["id"] in model.audio)
    truncate = model.of_type("conversation.item.truncate")[-1]
    assert truncate["item_id"] == answer["id"]
    assert abs(len(model.heard_words(answer)) - len(words)) <= 1
    assert model.errors == []

"""End to end over real WebSockets on localhost: a Twilio-like caller talks to the default agent.

The caller plays recorded fixtures in real time and plays the agent's audio on its own clock,
echoing marks when their audio has played and flushing on `clear`, as Twilio does. The
assertions read the call record the server keeps: transcripts, actions, state, context, audit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.configs import GREETING, default_config_with, serving, words_played
from tests.support.configs import ended_call as record
from voice_agent.audio.wav import read_wav, write_wav
from voice_agent.callers import NativeClient, TwilioClient
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
MANIFEST = json.loads((AUDIO / "manifest.json").read_text())

pytestmark = pytest.mark.asyncio(loop_scope="module")


def ulaw(name: str) -> bytes:
    return (AUDIO / f"{name}.ulaw").read_bytes()


def pcm16(name: str) -> bytes:
    return read_wav(AUDIO / f"{name}.wav")[0]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """The default agent hearing with pocketsphinx's domain model: these tests follow the
    scripted conversations word for word (transcripts, the phone number's eleven digits),
    which that model, built from the same phrases, gets exactly. Off-script callers and the
    default engine, Whisper: tests/test_offscript_callers.py."""
    config = default_config_with(
        tmp_path_factory.mktemp("pocketsphinx"), voice={"stt": {"provider": "pocketsphinx"}}
    )
    async for voice_server in serving(config):
        yield voice_server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def quick_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """The default agent with barge-in after 150 ms of speech: quick enough to cut a first word."""
    config = default_config_with(
        tmp_path_factory.mktemp("quick"),
        voice={"interruption": {"min_interruption_ms": 150}, "turn": {"min_speech_ms": 60}},
    )
    async for voice_server in serving(config):
        yield voice_server


def twilio(server: VoiceServer, call_sid: str, **params: str) -> TwilioClient:
    return TwilioClient(
        f"ws://127.0.0.1:{server.port}/twilio",
        call_sid=call_sid,
        custom_parameters=params,
        timeout=60,
    )


def messages(call: dict[str, Any], role: str) -> list[str | None]:
    return [m.get("content") for m in call["context"]["messages"] if m["role"] == role]


def audit(call: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [event for event in call["audit"] if event["type"] == kind]


async def say_and_wait(caller: TwilioClient | NativeClient, audio: bytes) -> None:
    """Say a line, then wait for the agent's answer to play out."""
    heard = caller.received_ms
    await caller.send_audio(audio)
    await caller.wait_audio(heard + 1)
    await caller.wait_silence_after_audio(700)


async def test_booking_conversation_over_twilio(server: VoiceServer) -> None:
    async with twilio(server, "CAbook") as caller:
        await caller.wait_silence_after_audio(500)
        for name in MANIFEST["conversations"]["joe"]["book"]:
            await say_and_wait(caller, ulaw(name))
        await caller.wait_closed()  # the agent says goodbye and ends the call
    call = await record(server, "CAbook")
    users = messages(call, "user")
    assert users[0] is not None and "book a table for two tomorrow at seven" in users[0]
    assert users[2] == "eight eight zero zero five five five three five three five"
    assert users[3] == "yes please"
    booked = [e for e in audit(call, "tool_call") if e["name"] == "book_table"]
    assert booked and booked[0]["error"] is None
    state = call["state"]
    assert state["party_size"] == 2 and state["phone"] == "88005553535"
    assert state["when"].endswith("T19:00") and len(state["booking_code"]) == 6
    assistant = messages(call, "assistant")
    assert assistant[0] == GREETING
    assert assistant[-1] == "Thanks for calling Bella Vista. Goodbye!"
    assert call["end_reason"] == "agent ended the call"
    assert len(call["turns"]) == 5
    for turn in call["turns"]:
        assert turn["first_audio_sent_ms"] >= turn["stt_final_ms"] >= turn["end_of_turn_ms"]


async def test_barge_in_on_the_first_word_commits_nothing(quick_server: VoiceServer) -> None:
    server = quick_server
    async with twilio(server, "CAfirst") as caller:
        await caller.wait_audio(1)  # the greeting has started: talk straight over it
        await caller.send_audio(ulaw("joe_book1"))
        await caller.wait_clear()
        await caller.wait_audio(caller.received_ms + 1)
        await caller.wait_silence_after_audio(500)
        await caller.stop()
    call = await record(server, "CAfirst")
    assert GREETING not in messages(call, "assistant")
    first = call["context"]["messages"][0]
    assert first["role"] == "user"
    utterance = audit(call, "agent_utterance")[0]
    assert utterance["generated"] == GREETING and utterance["committed"] is None
    barge = audit(call, "barge_in")[0]
    assert barge["heard"] == {"1": ""}


async def test_barge_in_mid_sentence_commits_the_heard_prefix(server: VoiceServer) -> None:
    async with twilio(server, "CAmid") as caller:
        await caller.wait_audio(1)
        await caller.send_silence(2500)
        await caller.send_audio(ulaw("joe_book1"))
        clear = await caller.wait_clear()
        played_ms = caller.played_ms(clear.at)
        await caller.wait_audio(caller.received_ms + 1)
        await caller.wait_silence_after_audio(500)
        await caller.stop()
    call = await record(server, "CAmid")
    committed = messages(call, "assistant")[0]
    assert committed is not None
    heard = committed.split()
    generated = GREETING.split()
    assert 0 < len(heard) < len(generated)
    assert [w.strip(",.!?") for w in heard] == [w.strip(",.!?") for w in generated[: len(heard)]]
    # Within one word of what the caller had played when the clear came, by the TTS's timings.
    assert abs(len(heard) - await words_played(server, GREETING, played_ms)) <= 1


async def test_backchannel_does_not_interrupt(server: VoiceServer) -> None:
    async with twilio(server, "CAbc") as caller:
        await caller.wait_audio(1)
        await caller.send_silence(1500)
        # STT at 8 kHz knows "yeah" from this voice; "uh-huh" comes out as a word (see README).
        await caller.send_audio(ulaw("joe_bc-yeah"))
        await caller.wait_silence_after_audio(800)
        await caller.stop()
    call = await record(server, "CAbc")
    assert messages(call, "user") == []
    assert messages(call, "assistant") == [GREETING]
    dropped = audit(call, "user_utterance_dropped")
    assert dropped and dropped[0]["reason"] == "backchannel"


async def test_noise_burst_resumes_the_agent_and_commits_nothing_of_it(
    server: VoiceServer,
) -> None:
    async with twilio(server, "CAnoise") as caller:
        await caller.wait_audio(1)
        await caller.send_silence(1500)
        await caller.send_audio(ulaw("cough"))
        clear = await caller.wait_clear()
        await caller.wait_audio_after(clear)  # the unheard rest is sent again
        await caller.wait_silence_after_audio(800)
        await caller.stop()
    call = await record(server, "CAnoise")
    assert messages(call, "user") == []
    assert messages(call, "assistant") == [GREETING]
    assert audit(call, "false_interruption")


async def test_dtmf_reaches_the_event_trigger(server: VoiceServer) -> None:
    async with twilio(server, "CAdtmf") as caller:
        await caller.wait_silence_after_audio(300)
        heard = caller.received_ms
        await caller.send_dtmf("0")
        await caller.wait_audio(heard + 1)
        await caller.wait_silence_after_audio(300)
        await caller.stop()
    call = await record(server, "CAdtmf")
    triggers = audit(call, "trigger")
    assert triggers and triggers[0]["function"] == "on_keypad"
    assert messages(call, "assistant")[-1] == "We're open every day from noon to eleven pm."


async def test_hang_up_mid_turn_keeps_the_record(server: VoiceServer) -> None:
    async with twilio(server, "CAhang") as caller:
        await caller.wait_silence_after_audio(300)
        heard = caller.received_ms
        await caller.send_audio(ulaw("joe_book1"))
        await caller.wait_audio(heard + 1)
        await caller.stop()  # gone while the agent answers
    call = await record(server, "CAhang")
    assert call["end_reason"] == "caller hung up"
    assert messages(call, "user")[0] is not None
    assert audit(call, "call_ended")
    answer = audit(call, "agent_utterance")[-1]
    assert answer["generated"] == "What name should I put the booking under?"
    assert answer["committed"] != answer["generated"]


async def test_same_conversation_over_the_native_protocol(server: VoiceServer) -> None:
    """The booking's first two turns over /ws (the whole booking runs over /twilio above: the
    protocols share everything after the framing, and the suite has its time budget)."""
    async with NativeClient(f"ws://127.0.0.1:{server.port}/ws", timeout=60) as caller:
        await caller.wait_silence_after_audio(500)
        for name in MANIFEST["conversations"]["joe"]["book"][:2]:
            await say_and_wait(caller, pcm16(name))
        await caller.stop()
    assert caller.call_id is not None
    call = await record(server, caller.call_id)
    assert messages(call, "user")[1] == "my name is john smith"
    assert call["state"]["name"] == "John Smith"
    assert messages(call, "assistant")[-1] == "And what's a good phone number to reach you?"
    finals = [e["text"] for e in caller.events_of("transcript") if e.get("final")]
    assert finals == messages(call, "user")


async def test_voice_agent_call_plays_a_wav_and_prints_the_transcript(
    server: VoiceServer, tmp_path: Path
) -> None:
    caller_wav = tmp_path / "caller.wav"
    gap = bytes(16000 * 2 * 5)  # the agent answers in the pauses
    write_wav(caller_wav, gap + pcm16("joe_book1") + gap + pcm16("joe_book2"), 16000)
    agent_wav = tmp_path / "agent.wav"
    process = await asyncio.create_subprocess_exec(
        str(ROOT / ".venv" / "bin" / "voice-agent"),
        "call",
        "--url",
        f"ws://127.0.0.1:{server.port}/ws",
        "--wav",
        str(caller_wav),
        "--out",
        str(agent_wav),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    transcript = out.decode()
    assert process.returncode == 0, transcript
    assert f"agent> {GREETING}" in transcript
    assert "agent> What name should I put the booking under?" in transcript
    assert "caller> my name is john smith" in transcript
    assert "agent> And what's a good phone number to reach you?" in transcript
    heard, rate = read_wav(agent_wav)
    assert rate == 16000 and len(heard) > 16000 * 2 * 5  # seconds of the agent, as played

"""Answering-machine detection on a call (`answering_machine: true`): a mailbox's greeting and
beep (Asterisk's own recorded prompts) raise the `voicemail` event once the message may start,
and the agent's handler leaves its message; a person's "Hello?" raises nothing."""

from __future__ import annotations

import asyncio
import json
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedOK

from tests.support.configs import QUICK_VOICE, default_config_with, ended_call, serving
from voice_agent.server.app import VoiceServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPTS = Path("/usr/share/asterisk/sounds/en")  # asterisk-core-sounds-en-wav: scripts/test
MESSAGE = "Hi, this is Bella Vista calling about your booking. Please call us back. Goodbye."


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    path = default_config_with(tmp_path_factory.mktemp("amd"), voice=QUICK_VOICE)
    data = yaml.safe_load(path.read_text())
    agent = data["agents"]["booking"]
    agent["answering_machine"] = True
    agent["flow"].setdefault("events", {})["voicemail"] = {"say": MESSAGE, "end_call": True}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    async for voice_server in serving(path):
        yield voice_server


def prompt(name: str) -> bytes:
    with wave.open(str(PROMPTS / f"{name}.wav")) as audio:
        assert audio.getframerate() == 8000 and audio.getsampwidth() == 2
        return audio.readframes(audio.getnframes())


def silence(ms: int) -> bytes:
    return bytes(16 * ms)  # 8 kHz, 16-bit


async def call(server: VoiceServer, audio: bytes, tail_ms: int) -> dict[str, Any]:
    """A /ws call that plays `audio` then silence, paced at real time, hearing the agent out
    (its marks echoed as they come); the call's record once it ends."""
    url = f"ws://127.0.0.1:{server.port}/ws"
    async with connect(url) as ws:
        start = {"type": "start", "agent": "booking"}
        await ws.send(json.dumps({**start, "audio": {"encoding": "pcm16", "sample_rate": 8000}}))
        started = json.loads(await ws.recv())
        assert started["type"] == "started", started

        async def listen() -> None:
            async for message in ws:
                if isinstance(message, str) and json.loads(message)["type"] == "mark":
                    await ws.send(message)

        listening = asyncio.ensure_future(listen())
        line = audio + silence(tail_ms)
        loop = asyncio.get_running_loop()
        begin = loop.time()
        try:
            for n, i in enumerate(range(0, len(line), 320)):
                await ws.send(line[i : i + 320])
                await asyncio.sleep(max(0.0, begin + (n + 1) * 0.02 - loop.time()))
        except ConnectionClosedOK:
            pass  # the agent hung up first
        await ws.close()
        listening.cancel()
    return await ended_call(server, started["call_id"])


def answers(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in record["audit"] if e["type"] == "answering_machine"]


async def test_a_mailbox_greeting_and_beep_get_the_agents_message_after_the_beep(
    server: VoiceServer,
) -> None:
    mailbox = silence(300) + prompt("vm-intro") + silence(200) + prompt("beep")
    record = await call(server, mailbox, tail_ms=6000)
    decided = answers(record)
    assert decided[0]["answer"] == "machine" and decided[0]["reason"] == "long greeting"
    assert decided[-1] == {**decided[-1], "answer": "message may start", "beep": True}
    event = next(e for e in record["audit"] if e["type"] == "event" and e["name"] == "voicemail")
    assert event["data"] == {"reason": "long greeting", "beep": True}
    # The message starts after the beep: its first audio after the greeting and beep ended.
    message = [e for e in record["audit"] if e["type"] == "agent_utterance"][-1]
    assert message["generated"] == MESSAGE
    assert message["started_t"] >= event["t"] and record["end_reason"] == "agent ended the call"


async def test_a_person_saying_hello_is_a_person(server: VoiceServer) -> None:
    record = await call(server, silence(300) + prompt("hello"), tail_ms=1500)
    assert [a["answer"] for a in answers(record)] == ["person"]
    assert not [e for e in record["audit"] if e["type"] == "event" and e["name"] == "voicemail"]

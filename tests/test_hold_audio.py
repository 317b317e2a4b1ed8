"""Hold audio: while a turn takes longer than `hold.after_s` (here a slow function behind a
key press), the caller hears the configured audio instead of dead air; the answer clears it
and is all that is committed."""

from __future__ import annotations

import asyncio
import json
import math
import struct
import time
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from websockets.asyncio.client import connect

from tests.support.configs import QUICK_VOICE, ended_call, serving
from voice_agent.server.app import VoiceServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parent.parent
SLOW_S = 2.5
HELLO = "Hello, press a key."
ANSWER = "We open at noon."


def tone_wav(path: Path) -> bytes:
    """Half a second of 440 Hz at 8 kHz: a hold tone unlike speech."""
    samples = [int(8000 * math.sin(2 * math.pi * 440 * n / 8000)) for n in range(4000)]
    pcm = struct.pack(f"<{len(samples)}h", *samples)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(pcm)
    return pcm


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[VoiceServer, bytes]]:
    folder = tmp_path_factory.mktemp("hold")
    tone = tone_wav(folder / "hold.wav")
    (folder / "slow.py").write_text(
        "import time\n\n\n"
        "def slow_lookup() -> str:\n"
        '    """Look the opening hours up, slowly."""\n'
        f"    time.sleep({SLOW_S})\n"
        '    return "noon"\n'
    )
    config = {
        "default_agent": "desk",
        "voice": QUICK_VOICE,
        "agents": {
            "desk": {
                "brain": "flow",
                "functions": "slow.py",
                "intents": str(ROOT / "config" / "booking_intents.yaml"),
                "hold": {"audio": "hold.wav", "after_s": 1.0},
                "flow": {
                    "start_page": "main",
                    "pages": {"main": {"message": HELLO}},
                    "events": {"dtmf": {"call": "slow_lookup", "say": "We open at {{result}}."}},
                },
            }
        },
    }
    path = folder / "agents.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    async for server in serving(path):
        yield server, tone


async def test_a_slow_turn_plays_hold_audio_then_the_answer_clears_it(
    served: tuple[VoiceServer, bytes],
) -> None:
    server, tone = served
    heard: list[tuple[float, bytes]] = []  # (arrival, audio)
    events: list[tuple[float, dict[str, Any]]] = []
    async with connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
        start = {"type": "start", "audio": {"encoding": "pcm16", "sample_rate": 8000}}
        await ws.send(json.dumps(start))
        call_id = json.loads(await ws.recv())["call_id"]

        changed = asyncio.Event()

        async def listen() -> None:
            async for message in ws:
                now = time.monotonic()
                changed.set()
                if isinstance(message, bytes):
                    heard.append((now, message))
                    continue
                event = json.loads(message)
                events.append((now, event))
                if event["type"] == "mark":
                    await ws.send(message)  # heard at once: this caller has no playout delay

        listening = asyncio.ensure_future(listen())

        async def quiet_for(seconds: float) -> None:
            """Until audio has come and then nothing for `seconds`."""
            async with asyncio.timeout(20):
                while True:
                    changed.clear()
                    try:
                        await asyncio.wait_for(changed.wait(), seconds)
                    except TimeoutError:
                        if heard:
                            return

        async def answer_text() -> None:
            async with asyncio.timeout(15):
                while not any(t > pressed and e["type"] == "agent_text" for t, e in events):
                    changed.clear()
                    await changed.wait()

        await quiet_for(0.5)  # the greeting has come
        pressed = time.monotonic()
        await ws.send(json.dumps({"type": "dtmf", "digit": "5"}))
        await answer_text()
        await quiet_for(0.5)
        await ws.close()
        listening.cancel()
    after_key = [(t - pressed, audio) for t, audio in heard if t > pressed]
    clear_at = next(t - pressed for t, e in events if t > pressed and e["type"] == "clear")
    hold = b"".join(audio for t, audio in after_key if t < clear_at)
    # Nothing for the first second, then the tone, looped, until the answer's clear.
    assert after_key and after_key[0][0] >= 0.9
    assert len(hold) >= 8000 * 2 * 1.0 and hold[: len(tone)] == tone[: len(hold)]
    assert SLOW_S - 0.3 <= clear_at <= SLOW_S + 1.5
    call = await ended_call(server, call_id)
    # Spoken lines only (the flow's function call is an assistant message without content).
    said = [m["content"] for m in call["context"]["messages"] if m["role"] == "assistant"]
    assert [line for line in said if line] == [HELLO, ANSWER]
    holds = [e for e in call["audit"] if e["type"] == "hold"]
    assert [h["started"] for h in holds] == [True, False] and holds[1]["held_ms"] >= 1000

"""Random and mutated messages at /twilio and /ws while a normal call runs alongside.

Every bad peer must get a defined answer (a close code from docs/protocol.md, or an `error`
event) and the normal call must complete as if nothing happened.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.support.configs import serving
from voice_agent.audio.wav import read_wav
from voice_agent.callers import NativeClient
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
DEFINED_CLOSE_CODES = {1000, 1002, 1003, 1008, 1009}

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VoiceServer]:
    async for voice_server in serving(ROOT / "config" / "agents.yaml"):
        yield voice_server


def twilio_messages(rng: random.Random) -> list[str | bytes]:
    sid = "MZ" + "0" * 32
    start = {
        "event": "start",
        "sequenceNumber": "1",
        "streamSid": sid,
        "start": {
            "streamSid": sid,
            "accountSid": "AC" + "0" * 32,
            "callSid": f"CAfuzz{rng.randrange(10**9)}",
            "tracks": ["inbound"],
            "customParameters": {},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        },
    }
    media = {
        "event": "media",
        "sequenceNumber": "2",
        "streamSid": sid,
        "media": {
            "track": "inbound",
            "chunk": "1",
            "timestamp": "20",
            "payload": base64.b64encode(bytes(160)).decode(),
        },
    }
    valid = [json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})]
    valid.append(json.dumps(start))
    valid.append(json.dumps(media))
    return _mutate(rng, valid)


def native_messages(rng: random.Random) -> list[str | bytes]:
    start = {"type": "start", "audio": {"encoding": "pcm16", "sample_rate": 16000}}
    valid = [json.dumps(start), json.dumps({"type": "dtmf", "digit": "5"})]
    return [*_mutate(rng, valid), bytes(rng.randrange(0, 700))]


def _mutate(rng: random.Random, valid: list[str]) -> list[str | bytes]:
    """A plausible start, then garbage of the kinds real peers produce."""
    out: list[str | bytes] = []
    for message in valid:
        choice = rng.random()
        if choice < 0.3:
            out.append(message)
        elif choice < 0.5:
            chars = list(message)
            for _ in range(rng.randrange(1, 6)):
                chars[rng.randrange(len(chars))] = chr(rng.randrange(32, 127))
            out.append("".join(chars))
        elif choice < 0.6:
            out.append(message[: rng.randrange(len(message))])
        elif choice < 0.7:
            out.append(rng.randbytes(rng.randrange(1, 400)))
        elif choice < 0.8:
            out.append(json.dumps({"event": rng.choice(["media", "mark", "stop", "nope"])}))
        elif choice < 0.9:
            out.append("x" * rng.choice([10, 70_000, 300_000]))
        else:
            out.append(json.dumps([1, 2, 3]))
    return out


async def fuzz_one(server: VoiceServer, path: str, messages: list[str | bytes]) -> int | None:
    """Send the messages; return the close code the server answered with (None: still open)."""
    async with connect(f"ws://127.0.0.1:{server.port}{path}", max_size=2**22) as ws:
        try:
            for message in messages:
                await ws.send(message)
            await ws.send(json.dumps({"event": "stop"} if path == "/twilio" else {"type": "stop"}))
            async with asyncio.timeout(10):
                async for _ in ws:
                    pass
        except ConnectionClosed:
            pass
        return ws.close_code


async def test_fuzzed_peers_get_defined_answers_while_a_real_call_completes(
    server: VoiceServer,
) -> None:
    rng = random.Random(20261130)
    caller = NativeClient(f"ws://127.0.0.1:{server.port}/ws", timeout=60)

    async def normal_call() -> list[str]:
        async with caller:
            await caller.wait_silence_after_audio(300)
            heard = caller.received_ms
            await caller.send_audio(read_wav(AUDIO / "joe_book1.wav")[0])
            await caller.wait_audio(heard + 1)
            await caller.wait_silence_after_audio(500)
            await caller.stop()
        return [e["text"] for e in caller.events_of("transcript") if e.get("final")]

    async def fuzzers() -> list[int | None]:
        codes: list[int | None] = []
        for round_ in range(30):
            path = "/twilio" if round_ % 2 else "/ws"
            messages = twilio_messages(rng) if path == "/twilio" else native_messages(rng)
            batch = [fuzz_one(server, path, messages) for _ in range(2)]
            codes.extend(await asyncio.gather(*batch))
        return codes

    finals, codes = await asyncio.gather(normal_call(), fuzzers())
    # The caller was understood and answered (the exact words are the STT tests' business).
    assert finals and "table for two" in finals[0]
    assert caller.events_of("agent_text")[-1]["text"] != caller.events_of("agent_text")[0]["text"]
    assert set(codes) <= DEFINED_CLOSE_CODES, codes
    async with httpx.AsyncClient() as http:
        health = (await http.get(f"http://127.0.0.1:{server.port}/healthz")).json()
    assert health["status"] == "ok"
    for pipeline in list(server.pipelines.values()):
        await pipeline.finished.wait()
    assert server.store.live_count() == 0

"""WebRTC calls end to end on localhost: an aiortc caller (as a browser would) talks to the
default agent over `/rtc`, with real ICE, DTLS, SRTP and Opus both ways. The browser itself is
in test_browser.py; this covers the conversation, barge-in, bad input and leaks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from aiortc import RTCPeerConnection
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support.configs import default_config_with, serving
from tests.support.configs import ended_call as record
from tests.support.rtc_caller import RtcCaller
from voice_agent.agents.registry import AgentRegistry
from voice_agent.audio.wav import read_wav
from voice_agent.runtime.secrets import Secrets
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
GREETING = (
    "Hello, thanks for calling Bella Vista! I can book, change or cancel a table. "
    "What would you like to do?"
)
TOKEN = "s3cret-page-token"

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    config = default_config_with(tmp_path_factory.mktemp("rtc"), webrtc={"ice_timeout_s": 2})
    async for voice_server in serving(config):
        yield voice_server
    assert not voice_server.rtc.peers, "peer connections left behind"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def guarded(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    config = default_config_with(
        tmp_path_factory.mktemp("guard"),
        webrtc={"allowed_origins": ["https://app.example.com"]},
        server={"api_tokens": ["page_token"]},
    )
    registry = AgentRegistry.from_file(config, Secrets({"page_token": TOKEN}))
    voice_server = VoiceServer(registry, port=0)
    await voice_server.start()
    yield voice_server
    await voice_server.shutdown(1)
    await registry.aclose()


def caller(server: VoiceServer, **kwargs: Any) -> RtcCaller:
    return RtcCaller(f"ws://127.0.0.1:{server.port}/rtc", **kwargs)


def pcm16(name: str) -> bytes:
    return read_wav(AUDIO / f"{name}.wav")[0]


def said(call: dict[str, Any], role: str) -> list[str]:
    return [m["content"] for m in call["context"]["messages"] if m["role"] == role]


async def test_a_booking_turn_over_webrtc(server: VoiceServer) -> None:
    rtc = caller(server)
    await rtc.connect()
    await rtc.wait_event(lambda e: e["type"] == "committed" and e["reply_id"] == 1)
    assert rtc.loud_ms() > 2000, "the greeting's audio did not reach the caller"
    await rtc.say(pcm16("joe_book1"))
    heard = await rtc.wait_event(lambda e: e["type"] == "transcript")
    assert "book a table" in heard["text"]
    state = await rtc.wait_event(lambda e: e["type"] == "state")
    assert state["changes"]["party_size"]["new"] == 2
    reply = await rtc.wait_event(lambda e: e["type"] == "agent_text" and e["reply_id"] != 1)
    assert reply["text"] == "What name should I put the booking under?"
    await rtc.wait_event(lambda e: e["type"] == "committed" and e["reply_id"] == reply["reply_id"])
    metrics = await rtc.wait_event(lambda e: e["type"] == "turn_metrics")
    assert metrics["metrics"]["speech_end_to_first_audio_ms"] > 0
    await rtc.hang_up()
    assert rtc.close_code == 1000

    assert rtc.call_id is not None
    call = await record(server, rtc.call_id)
    assert call["transport"] == "webrtc"
    assert said(call, "assistant") == [GREETING, "What name should I put the booking under?"]
    assert "book a table" in said(call, "user")[0]
    assert call["state"]["party_size"] == 2
    assert call["ended_at"] is not None


async def test_barge_in_commits_what_the_browser_played(server: VoiceServer) -> None:
    rtc = caller(server)
    await rtc.connect()
    await rtc.wait_loud(1500)  # the caller has heard the greeting's first words
    await rtc.say(pcm16("joe_book1"))
    committed = await rtc.wait_event(lambda e: e["type"] == "committed" and e["reply_id"] == 1)
    await rtc.wait_event(lambda e: e["type"] == "transcript")
    await rtc.hang_up()

    assert rtc.call_id is not None
    call = await record(server, rtc.call_id)
    heard = committed["text"]
    assert heard and GREETING.startswith(heard.rstrip(".,!?")), heard
    assert len(heard.split()) < len(GREETING.split())
    assert said(call, "assistant")[0] == heard
    barge_in = [e for e in call["audit"] if e["type"] == "barge_in"]
    assert barge_in and barge_in[0]["unheard"], "the audit keeps what was not heard"


async def test_a_keypad_press_on_the_data_channel_reaches_the_event_trigger(
    server: VoiceServer,
) -> None:
    rtc = caller(server)
    await rtc.connect()
    await rtc.wait_event(lambda e: e["type"] == "committed" and e["reply_id"] == 1)
    rtc.channel.send(json.dumps({"type": "dtmf", "digit": "0"}))
    rtc.channel.send(json.dumps({"type": "dtmf", "digit": "55"}))
    warning = await rtc.wait_event(lambda e: e["type"] == "error")
    hours = await rtc.wait_event(lambda e: e["type"] == "agent_text" and e["reply_id"] != 1)
    await rtc.wait_event(lambda e: e["type"] == "committed" and e["reply_id"] == hours["reply_id"])
    await rtc.hang_up()
    assert warning["code"] == "invalid_message"
    assert hours["text"] == "We're open every day from noon to eleven pm."


async def test_malformed_sdp_gets_an_error_and_a_close(server: VoiceServer) -> None:
    async with connect(f"ws://127.0.0.1:{server.port}/rtc") as ws:
        await ws.send(json.dumps({"type": "offer", "sdp": "hello"}))
        error = json.loads(await ws.recv())
        await ws.wait_closed()
    assert error["code"] == "bad_sdp"
    assert ws.close_code == 1002


async def test_an_offer_without_audio_is_refused(server: VoiceServer) -> None:
    pc = RTCPeerConnection()
    pc.createDataChannel("events")
    await pc.setLocalDescription(await pc.createOffer())
    async with connect(f"ws://127.0.0.1:{server.port}/rtc") as ws:
        await ws.send(json.dumps({"type": "offer", "sdp": pc.localDescription.sdp}))
        error = json.loads(await ws.recv())
        await ws.wait_closed()
    await pc.close()
    assert error["code"] == "no_audio"
    assert "microphone" in error["message"]
    assert ws.close_code == 1003


async def test_an_unknown_agent_is_refused(server: VoiceServer) -> None:
    rtc = caller(server, agent="nobody")
    with pytest.raises(ConnectionError, match="nobody"):
        await rtc.connect()
    await rtc.close()


async def test_a_browser_that_never_connects_ends_the_call(server: VoiceServer) -> None:
    rtc = caller(server)
    await rtc.connect(apply_answer=False)  # the answer is never applied: ICE cannot complete
    error = await rtc.wait_signal(lambda s: s["type"] == "error")
    end = await rtc.wait_signal(lambda s: s["type"] == "end")
    await rtc.close()
    assert error["code"] == "ice_failed"
    assert "did not connect within 2 s" in error["message"]
    assert rtc.call_id is not None
    call = await record(server, rtc.call_id)
    assert call["ended_at"] is not None
    assert end["reason"].startswith("ice failed")


async def test_a_peer_that_vanishes_mid_call_ends_it_cleanly(server: VoiceServer) -> None:
    rtc = caller(server)
    await rtc.connect()
    await rtc.wait_loud(500)
    await rtc.pc.close()  # no hangup: the browser tab is gone
    assert rtc.ws is not None
    await rtc.ws.close()
    assert rtc.call_id is not None
    call = await record(server, rtc.call_id)
    assert call["ended_at"] is not None
    # What was heard before the caller vanished is committed, cut to the heard words.
    assert said(call, "assistant") and GREETING.startswith(said(call, "assistant")[0][:10])
    await rtc.close()


async def test_no_peer_connection_outlives_its_call(server: VoiceServer) -> None:
    await asyncio.sleep(0)  # the calls above have all ended
    async with httpx.AsyncClient() as http:
        health = (await http.get(f"http://127.0.0.1:{server.port}/healthz")).json()
    assert health["webrtc_peers"] == 0
    assert health["live_calls"] == 0


async def test_pages_and_signalling_need_the_token_when_one_is_set(guarded: VoiceServer) -> None:
    base = f"http://127.0.0.1:{guarded.port}"
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{base}/agents")).status_code == 401
        assert (await http.get(f"{base}/agents?token=wrong")).status_code == 401
        assert (await http.get(f"{base}/?token={TOKEN}")).status_code == 200
        agents = await http.get(f"{base}/agents", headers={"Authorization": f"Bearer {TOKEN}"})
        assert agents.status_code == 200
        assert agents.json()["default"] == "booking"
        assert (await http.get(f"{base}/healthz")).status_code == 200
    url = f"ws://127.0.0.1:{guarded.port}/rtc"
    with pytest.raises(InvalidStatus) as refused:
        await connect(url)
    assert refused.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as elsewhere:
        await connect(f"{url}?token={TOKEN}", origin="https://evil.example.net")  # type: ignore[arg-type]
    assert elsewhere.value.response.status_code == 403
    listed = await connect(f"{url}?token={TOKEN}", origin="https://app.example.com")  # type: ignore[arg-type]
    await listed.send(json.dumps({"type": "hangup"}))
    error = json.loads(await listed.recv())
    assert error["code"] == "out_of_order"
    await listed.close()

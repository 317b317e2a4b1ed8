"""The media sockets over real WebSockets on localhost: each message is handled as it arrives
(voice_agent/gateways/media_socket.py), so these check what a queue and a handler task used to
give for free: nothing a caller sends while the call is being set up is lost, and a failure
while handling one call's message ends that call and no other."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from websockets.asyncio.client import connect

from tests.support.configs import ended_call, serving
from voice_agent.callers import TwilioClient
from voice_agent.gateways import carrier_call, socket_call
from voice_agent.gateways.carrier_adapter import Key
from voice_agent.gateways.media_socket import Message
from voice_agent.runtime.audit import AuditEvent
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VoiceServer]:
    async for voice_server in serving(ROOT / "config" / "agents.yaml"):
        yield voice_server


def caller(server: VoiceServer, call_sid: str) -> TwilioClient:
    return TwilioClient(f"ws://127.0.0.1:{server.port}/twilio", call_sid=call_sid, timeout=60)


def dtmf_events(audit: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in audit if e["type"] == "event" and e["name"] == "dtmf"]


async def test_messages_sent_while_the_call_is_set_up_are_kept(
    server: VoiceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The call's set-up is held open until the caller's DTMF has reached the server, so the
    # digit arrives before the call's pipeline exists.
    entered, release, dtmf_arrived, dtmf_handled = (asyncio.Event() for _ in range(4))
    start_call = server.start_call

    def on_audit(event: AuditEvent) -> None:
        if event.type == "event" and event.data.get("name") == "dtmf":
            dtmf_handled.set()

    async def held_start_call(**kwargs: Any) -> Any:
        entered.set()
        await release.wait()
        pipeline = await start_call(**kwargs)
        # Before the kept messages are replayed, which happens once this returns.
        pipeline.session.audit.subscribe(on_audit)
        return pipeline

    on_message = socket_call.SocketCall.on_message

    def noting_dtmf(self: socket_call.SocketCall, message: Message) -> None:
        if '"dtmf"' in str(message):
            dtmf_arrived.set()
        on_message(self, message)

    monkeypatch.setattr(server, "start_call", held_start_call)
    monkeypatch.setattr(socket_call.SocketCall, "on_message", noting_dtmf)

    async with caller(server, "CAheld") as phone:
        await asyncio.wait_for(entered.wait(), 20)
        await phone.send_dtmf("7")
        await asyncio.wait_for(dtmf_arrived.wait(), 20)
        release.set()
        await asyncio.wait_for(dtmf_handled.wait(), 20)
    call = await ended_call(server, "CAheld")
    assert dtmf_events(call["audit"]) == [{"digit": "7"}]


async def test_a_failure_handling_one_calls_message_ends_that_call_only(
    server: VoiceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatch = carrier_call.CarrierCall.dispatch

    def failing(self: carrier_call.CarrierCall, event: Any) -> None:
        if isinstance(event, Key) and event.digit == "9":
            raise RuntimeError("a bug in handling one message")
        dispatch(self, event)

    monkeypatch.setattr(carrier_call.CarrierCall, "dispatch", failing)
    async with caller(server, "CAfine") as fine, caller(server, "CAbroken") as broken:
        await fine.wait_audio(1)
        await broken.wait_audio(1)
        await broken.send_dtmf("9")
        code, reason = await broken.wait_closed()
        assert (code, reason) == (1011, "internal error")
        # The other call goes on: it answers what its caller says next.
        await fine.wait_silence_after_audio(500)
        heard = fine.received_ms
        await fine.send_audio((AUDIO / "joe_book1.ulaw").read_bytes())
        await fine.wait_audio(heard + 1)
        assert not fine.closed
    broken_call = await ended_call(server, "CAbroken")
    assert broken_call["end_reason"] == "connection lost"


async def test_closing_the_socket_cleanly_is_a_hang_up_and_dropping_it_is_a_lost_call(
    server: VoiceServer,
) -> None:
    url = f"ws://127.0.0.1:{server.port}/ws"
    ends = {}
    for how in ("close", "drop"):
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "start"}))
            started = json.loads(await ws.recv())
            assert started["type"] == "started"
            if how == "close":
                await ws.close()
            else:
                ws.transport.abort()
        call = await ended_call(server, started["call_id"])
        ends[how] = call["end_reason"]
    assert ends == {"close": "caller hung up", "drop": "connection lost"}


async def test_a_caller_that_does_not_take_its_audio_is_closed_with_the_reason(
    server: VoiceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the cap below zero the first thing the agent says is already too much unsent audio.
    monkeypatch.setattr(socket_call, "MAX_UNSENT_BYTES", -1)
    async with caller(server, "CAstalled") as phone:
        code, reason = await phone.wait_closed()
    assert (code, reason) == (1008, "client is not reading: outbound buffer full")
    call = await ended_call(server, "CAstalled")
    assert call["end_reason"] == "client is not reading: outbound buffer full"
    assert call["outcome"] == "error"


async def test_a_finished_call_is_freed_as_it_ends_not_by_the_garbage_collector(
    server: VoiceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What only the collector can free waits for a full collection, which pauses every call
    # on the worker; a call's own objects must go when it ends.
    handled = asyncio.Event()
    run = socket_call.SocketCall.run

    async def noting_the_end(self: socket_call.SocketCall) -> None:
        await run(self)
        handled.set()

    monkeypatch.setattr(socket_call.SocketCall, "run", noting_the_end)
    gc.collect()
    gc.disable()
    try:
        async with caller(server, "CAfreed") as phone:
            await phone.wait_audio(1)
            pipeline = weakref.ref(server.pipelines["CAfreed"])
            session = weakref.ref(server.pipelines["CAfreed"].session)
        await asyncio.wait_for(handled.wait(), 20)
        assert pipeline() is None
        assert session() is None
    finally:
        gc.enable()

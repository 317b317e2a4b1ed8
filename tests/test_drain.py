"""Draining a server: new calls refused, /healthz 503, live calls running on to their end or to
the deadline, where they hear the agent's goodbye and end `interrupted`; the process exits
after its last call. The rules on a number line, then a server in this process, then
`voice-agent serve --workers 2` as an operator runs it."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support.configs import GREETING, QUICK_VOICE, default_config_with, serving
from tests.support.sipp import run_sipp, scenario, write_rtp_pcap
from tests.test_operations import AUDIO, Served, free_port
from tests.test_sip_calls import last_call, needs_root
from tests.test_sip_calls import target as sip_target
from voice_agent.callers import TwilioClient
from voice_agent.server.app import VoiceServer
from voice_agent.server.drain import REASON, REFUSAL, Drain, Phase

TOKEN = "tok-drain-1"
GOODBYE = "I'm sorry, I have to end our call now. Goodbye."

# ---- the rules ------------------------------------------------------------------------------


def test_a_drain_runs_from_its_start_to_its_deadline_and_starts_once() -> None:
    drain = Drain(600)
    assert drain.phase(0) is Phase.SERVING and drain.time_left_s(0) is None
    assert drain.status(0, 2)["status"] == "ok"
    assert drain.start(100, "SIGTERM")
    assert not drain.start(200, "POST /admin/drain")  # asked again: the first deadline holds
    assert drain.phase(699) is Phase.DRAINING and drain.time_left_s(699) == 1
    assert drain.phase(700) is Phase.ENDING and drain.time_left_s(800) == 0
    status = drain.status(400, 3)
    assert status == {
        "status": "draining",
        "phase": "draining",
        "why": "SIGTERM",
        "live_calls": 3,
        "deadline_in_s": 300.0,
    }


def test_hurrying_brings_the_deadline_to_now() -> None:
    drain = Drain(600)
    drain.start(10, "SIGTERM")
    drain.hurry(20)
    assert drain.phase(20) is Phase.ENDING
    drain.hurry(30)  # never later than it was
    assert drain.ends_at == 20
    fresh = Drain(600)
    fresh.hurry(5)  # hurried before any drain: it drains, with nothing left to wait
    assert fresh.draining and fresh.phase(5) is Phase.ENDING


@pytest.mark.parametrize("deadline", [-1.0, float("nan")])
def test_a_deadline_below_zero_is_refused(deadline: float) -> None:
    with pytest.raises(ValueError, match="0 s or more"):
        Drain(deadline)


# ---- a server in this process ---------------------------------------------------------------


@pytest_asyncio.fixture
async def server(tmp_path: Path) -> AsyncIterator[VoiceServer]:
    config = default_config_with(
        tmp_path,
        voice=QUICK_VOICE,
        server={
            "api_tokens": ["control"],
            "control_listen": "127.0.0.1:0",
            "drain_deadline_s": 600,
            "max_loop_lag_ms": None,
        },
    )
    async for voice_server in serving(config, secrets={"control": TOKEN}):
        yield voice_server


async def post_drain(server: VoiceServer, token: str | None = TOKEN) -> httpx.Response:
    assert server.control is not None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient() as http:
        return await http.post(
            f"http://127.0.0.1:{server.control.port}/admin/drain", headers=headers
        )


async def healthz(port: int) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.get(f"http://127.0.0.1:{port}/healthz")


async def record(port: int, call_id: str) -> dict[str, Any]:
    """The call's record once it has ended."""
    async with httpx.AsyncClient() as http, asyncio.timeout(20):
        while True:
            response = await http.get(
                f"http://127.0.0.1:{port}/calls/{call_id}",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            if response.status_code == 200 and response.json().get("ended_at"):
                call: dict[str, Any] = response.json()
                return call
            await asyncio.sleep(0.05)


def agent_lines(call: dict[str, Any]) -> list[str]:
    messages = call["context"]
    if isinstance(messages, dict):
        messages = messages["messages"]
    return [m["content"] for m in messages if m["role"] == "assistant" and m.get("content")]


async def refused(port: int) -> tuple[int | None, str | None]:
    """How a new call to /twilio is answered: the close code and reason."""
    async with connect(f"ws://127.0.0.1:{port}/twilio?token={TOKEN}") as ws:
        await ws.wait_closed()
    return ws.close_code, ws.close_reason


def caller(port: int, sid: str) -> TwilioClient:
    return TwilioClient(f"ws://127.0.0.1:{port}/twilio?token={TOKEN}", call_sid=sid, timeout=30)


async def test_draining_refuses_new_calls_and_says_so_while_the_live_call_goes_on(
    server: VoiceServer,
) -> None:
    live = caller(server.port, "CA" + "1" * 32)
    await live.connect()
    await live.wait_silence_after_audio(300)  # the greeting
    assert (await post_drain(server, token=None)).status_code == 401
    assert (await post_drain(server, token="wrong")).status_code == 401
    answer = await post_drain(server)
    assert answer.status_code == 202
    assert answer.json()["status"] == "draining" and answer.json()["live_calls"] == 1
    assert (await post_drain(server)).status_code == 202  # again: the same drain
    health = await healthz(server.port)
    assert health.status_code == 503
    assert health.json()["status"] == "draining" and health.json()["deadline_in_s"] > 590
    assert await refused(server.port) == (1013, REFUSAL)
    assert server.control is not None
    async with httpx.AsyncClient() as http:  # nor does it place calls
        placed = await http.post(
            f"http://127.0.0.1:{server.control.port}/calls",
            json={"to": "+14155550123"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    assert placed.status_code == 503 and "draining" in placed.json()["error"]
    assert placed.headers["Retry-After"] == "5"
    # The live call goes on: the caller books, the agent answers, the caller hangs up.
    heard = live.received_ms
    await live.send_audio((AUDIO / "joe_book1.ulaw").read_bytes())
    await live.wait_audio(heard + 1000)
    await live.wait_silence_after_audio(400)
    assert not server.drained.is_set()  # a live call: the server waits for it
    await live.stop()
    call = await record(server.port, "CA" + "1" * 32)
    assert call["outcome"] == "caller_hung_up"
    async with asyncio.timeout(10):
        await server.drained.wait()  # the last call has ended: the process may exit


async def upgrade_refused(port: int) -> tuple[int, str, str]:
    """How a new call to /twilio is refused before its WebSocket opens: HTTP status, the
    Retry-After header and the body."""
    with pytest.raises(InvalidStatus) as refusal:
        async with connect(f"ws://127.0.0.1:{port}/twilio?token={TOKEN}"):
            pass
    response = refusal.value.response
    return response.status_code, response.headers["Retry-After"], response.body.decode().strip()


async def test_a_balancer_gets_the_refusal_as_http_503_so_it_can_try_another_host(
    tmp_path: Path,
) -> None:
    # The test is the balancer: its address is a trusted proxy.
    config = default_config_with(
        tmp_path,
        voice=QUICK_VOICE,
        server={
            "api_tokens": ["control"],
            "control_listen": "127.0.0.1:0",
            "trusted_proxies": ["127.0.0.1/32"],
            "max_calls": 1,
            "max_loop_lag_ms": None,
        },
    )
    async for server in serving(config, secrets={"control": TOKEN}):
        live = caller(server.port, "CA" + "5" * 32)
        await live.connect()
        await live.wait_audio(100)
        # Full: refused before the handshake, as while draining.
        status, retry_after, reason = await upgrade_refused(server.port)
        assert (status, retry_after) == (503, "5") and "limit of 1 calls" in reason
        assert (await post_drain(server)).status_code == 202
        assert await upgrade_refused(server.port) == (503, "5", REFUSAL)
        assert server.refused_calls == 2
        # The live call is not touched by either refusal.
        heard = live.received_ms
        await live.send_audio((AUDIO / "joe_book1.ulaw").read_bytes())
        await live.wait_audio(heard + 1000)
        await live.stop()
        assert (await record(server.port, live.call_sid))["outcome"] == "caller_hung_up"


async def test_at_the_deadline_the_live_call_hears_the_goodbye_and_ends_interrupted(
    server: VoiceServer,
) -> None:
    live = caller(server.port, "CA" + "3" * 32)
    await live.connect()
    # The greeting's first sentence has played: the deadline cuts the rest.
    await live.wait_until(lambda: live.marks_echoed or None, "the greeting's first sentence")
    server.start_drain("SIGTERM")
    server.hurry_drain()  # a second SIGTERM: the deadline is now
    assert await live.wait_closed() == (1001, REASON)
    call = await record(server.port, live.call_sid)
    assert call["outcome"] == "interrupted" and call["end_reason"] == REASON
    lines = agent_lines(call)
    # What was heard of the greeting, cut short, then the goodbye, heard to its end (a
    # reply is committed as heard once the caller's player has played it).
    assert lines[-1] == GOODBYE
    assert len(lines) == 2 and GREETING.startswith(lines[0]) and lines[0] != GREETING
    async with asyncio.timeout(10):
        await server.drained.wait()


@needs_root
async def test_a_sip_call_at_the_deadline_hears_the_goodbye_then_gets_a_bye(
    tmp_path: Path,
) -> None:
    config = default_config_with(tmp_path, voice=QUICK_VOICE, server={"max_loop_lag_ms": None})
    async for server in serving(config, sip=True):
        quiet = tmp_path / "quiet.pcap"
        write_rtp_pcap(quiet, b"\xff" * 8000, payload_type=0)  # a second of a quiet line
        xml = scenario(
            "server_bye", tmp_path, before_ms="500", speech=str(quiet), bye_timeout_ms="30000"
        )
        sipp = asyncio.ensure_future(run_sipp(sip_target(server), tmp_path, scenario_file=xml))
        deadline = time.monotonic() + 10
        while not server.pipelines and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # sipp is another process: polled
        server.start_drain("SIGTERM")
        server.hurry_drain()
        result = await sipp  # it waits for the server's BYE and answers it
        assert result.ok, result.stderr + result.messages[-3000:]
        call = await last_call(server)
        assert call["outcome"] == "interrupted" and call["end_reason"] == REASON
        assert agent_lines(call)[-1] == GOODBYE


# ---- `voice-agent serve --workers 2` ----------------------------------------------------------


async def test_sigterm_drains_every_worker_and_a_second_one_ends_the_calls(
    tmp_path: Path,
) -> None:
    served = Served(tmp_path / "data", free_port(), "--workers", "2")
    try:
        await asyncio.to_thread(served.wait_ready)
        live = caller(served.port, "CA" + "4" * 32)
        await live.connect()
        await live.wait_silence_after_audio(300)
        served.process.send_signal(signal.SIGTERM)
        # Every worker drains: /healthz, from whichever worker the kernel picks, soon answers
        # 503 every time (ten in a row: a worker still serving would break the run).
        in_a_row = 0
        async with asyncio.timeout(20):
            while in_a_row < 10:
                health = await healthz(served.port)
                draining = health.status_code == 503 and health.json()["status"] == "draining"
                in_a_row = in_a_row + 1 if draining else 0
        assert await refused(served.port) == (1013, REFUSAL)
        # The live call goes on, and the server waits for it.
        heard = live.received_ms
        await live.send_audio((AUDIO / "joe_book1.ulaw").read_bytes())
        await live.wait_audio(heard + 1000)
        assert served.process.poll() is None
        served.process.send_signal(signal.SIGTERM)  # again: the operator will not wait
        assert await live.wait_closed() == (1001, REASON)
        assert await asyncio.to_thread(served.process.wait, 20) == 0
    finally:
        if served.process.poll() is None:  # a failure above: stop it as an operator would
            for _ in range(2):
                served.process.send_signal(signal.SIGTERM)
            served.process.wait(30)

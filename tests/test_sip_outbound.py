"""Calls the server places: POST /calls on the control API dials through the SIP trunk (sipp
as the trunk and callee), with the trunk's digest challenge answered; the agent talks once the
callee answers; a busy line and bad requests end as the caller of the API would expect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.support.configs import GREETING, QUICK_VOICE, default_config_with, serving
from tests.support.sipp import SippCallee, free_udp_port, scenario, write_rtp_pcap
from tests.test_sip_calls import GREETING_MS, messages, needs_root, received, spoken_ulaw
from voice_agent.core.callee_hello import QUIET_MS
from voice_agent.server.app import VoiceServer
from voice_agent.server.control_api import RateLimit

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "tok-outbound-123"
TRUNK_PORT = free_udp_port()  # where each test's sipp callee listens, one after the other


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    config = default_config_with(
        tmp_path_factory.mktemp("sip-out"),
        voice=QUICK_VOICE,
        server={"api_tokens": ["control"], "control_listen": "127.0.0.1:0"},
        sip={
            "trunk": {
                "address": f"127.0.0.1:{TRUNK_PORT}",
                "username": "trunkuser",
                "password_secret": "trunk_password",
                "caller_id": "+14155550100",
                "ring_timeout_s": 20,
                # Each test's sipp callee takes one call and nothing else: no OPTIONS probe.
                "options_interval_s": 0,
            }
        },
    )
    secrets = {"control": TOKEN, "trunk_password": "trunk-secret"}
    async for voice_server in serving(config, sip=True, secrets=secrets):
        yield voice_server


async def place(server: VoiceServer, body: Any, token: str | None = TOKEN) -> httpx.Response:
    assert server.control is not None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient() as http:
        return await http.post(
            f"http://127.0.0.1:{server.control.port}/calls", json=body, headers=headers
        )


async def record_when_ended(server: VoiceServer, call_id: str) -> dict[str, Any]:
    """The call's record once it has an outcome (a call never answered has no pipeline)."""
    pipeline = server.pipelines.get(call_id)
    if pipeline is not None:
        await pipeline.finished.wait()
    async with httpx.AsyncClient() as http, asyncio.timeout(20):
        while True:
            response = await http.get(
                f"http://127.0.0.1:{server.port}/calls/{call_id}",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            if response.status_code == 200 and response.json().get("outcome"):
                record: dict[str, Any] = response.json()
                return record
            await asyncio.sleep(0.1)


@needs_root
async def test_a_placed_call_answered_after_the_trunks_challenge_talks_to_the_agent(
    server: VoiceServer, tmp_path: Path
) -> None:
    pcap = tmp_path / "goodbye.pcap"
    write_rtp_pcap(pcap, await asyncio.to_thread(spoken_ulaw, "Goodbye."), payload_type=0)
    xml = scenario(
        "callee_answers", tmp_path,
        # The callee says nothing on answering: the agent greets after QUIET_MS of it.
        before_ms=str(round(QUIET_MS) + GREETING_MS), speech=str(pcap), bye_timeout_ms="20000",
    )  # fmt: skip
    callee = SippCallee(tmp_path, xml, port=TRUNK_PORT)
    await callee.start()
    try:
        response = await place(server, {"to": "+14155550123", "args": {"name": "Ada"}})
        assert response.status_code == 202, response.text
        call_id = response.json()["call_id"]
        result = await callee.result()
    finally:
        await callee.stop()
    assert result.ok, result.stderr + result.messages
    invites = [m for m in received(result) if m.method == "INVITE"]
    # The number at the trunk's host (the datagrams go to its port); challenged, then sent
    # again with the trunk's credentials.
    assert [m.uri for m in invites] == ["sip:+14155550123@127.0.0.1"] * 2
    assert invites[0].get("proxy-authorization") is None
    assert 'username="trunkuser"' in (invites[1].get("proxy-authorization") or "")
    call = await record_when_ended(server, call_id)
    assert call["transport"] == "sip" and call["state"]["callee"] == "+14155550123"
    assert call["state"]["name"] == "Ada"
    assert messages(call, "assistant")[0] == GREETING
    assert messages(call, "user") == ["goodbye"]
    assert call["end_reason"] == "agent ended the call"


@needs_root
@pytest.mark.parametrize(
    ("status", "outcome", "reason"),
    [
        ("486 Busy Here", "busy", "busy: 486 Busy Here"),
        ("404 Not Found", "failed", "call failed: 404 Not Found (bad number)"),
    ],
)
async def test_a_call_the_trunk_refuses_ends_the_record_with_its_outcome(
    server: VoiceServer, tmp_path: Path, status: str, outcome: str, reason: str
) -> None:
    xml = scenario("callee_refuses", tmp_path, status=status)
    callee = SippCallee(tmp_path, xml, port=TRUNK_PORT)
    await callee.start()
    try:
        response = await place(server, {"to": "sip:bob@127.0.0.1"})
        assert response.status_code == 202, response.text
        call = await record_when_ended(server, response.json()["call_id"])
        result = await callee.result()
    finally:
        await callee.stop()
    assert result.ok, (call["end_reason"], result.stderr + result.messages)
    assert (call["outcome"], call["end_reason"]) == (outcome, reason)
    assert [e["type"] for e in call["audit"]] == ["dial"]


@pytest.mark.parametrize(
    ("body", "token", "status", "words"),
    [
        ({"to": "+14155550123"}, None, 401, "valid API token"),
        ({"to": "+14155550123"}, "wrong", 401, "valid API token"),
        ({"to": "call my mum"}, TOKEN, 400, "to: a phone number"),
        ({"to": "+14155550123", "agnet": "x"}, TOKEN, 400, "unknown key 'agnet'"),
        ({"to": "+14155550123", "args": {"n": [1]}}, TOKEN, 400, "args.n"),
        ({"to": "+14155550123", "agent": "nope"}, TOKEN, 404, "no agent named 'nope'"),
        ({"to": "+14155550123", "via": "fax"}, TOKEN, 400, "via: one of sip, twilio"),
        # A carrier this server has no config for: the key to set is named.
        ({"to": "+14155550123", "via": "plivo"}, TOKEN, 409, "needs carriers.plivo"),
    ],
)
async def test_bad_requests_are_refused_and_dial_nothing(
    server: VoiceServer, body: Any, token: str | None, status: int, words: str
) -> None:
    before = len(server.sip.calls) if server.sip else 0
    response = await place(server, body, token)
    assert response.status_code == status and words in response.json()["error"]
    assert server.sip is not None and len(server.sip.calls) == before


async def test_the_rate_limit_is_a_sliding_minute() -> None:
    now = [0.0]
    limit = RateLimit(2, clock=lambda: now[0])
    assert limit.take() is None and limit.take() is None
    assert limit.take() == 60.0
    now[0] = 59.0
    assert limit.take() == 1.0
    now[0] = 60.0
    assert limit.take() is None

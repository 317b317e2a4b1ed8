"""Transfers on /twilio through Twilio's REST API: a stand-in speaking its "Modify a live call"
endpoint (form-encoded `Twiml`, HTTP basic auth with an API key) gets the call redirected to
`<Dial>`; a redirect Twilio refuses is the agent's `transfer_failed` event, and the call goes
on. (Twilio's API cannot be reached from CI: the stand-in is the allowed exception.)"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

import pytest
import pytest_asyncio
import yaml
from aiohttp import web

from tests.support.configs import GREETING, QUICK_VOICE, default_config_with, ended_call, serving
from tests.test_sip_calls import spoken_ulaw
from voice_agent.callers import TwilioClient
from voice_agent.server.app import VoiceServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

API_KEY, API_SECRET = "SK" + "a" * 32, "api-secret-123"
ACCOUNT = "AC" + "1" * 32
MANAGER = "+14155550199"
SORRY = "Sorry, nobody can take your call right now. I can book, change or cancel a table."


class TwilioApi:
    """POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json as Twilio answers it: 200
    with the call resource for a live call it knows, 404 with Twilio's error JSON otherwise;
    401 for credentials other than the API key's."""

    def __init__(self) -> None:
        self.live_calls: set[str] = set()
        self.redirects: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/2010-04-01/Accounts/{account}/Calls/{call}.json", self._update)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _update(self, request: web.Request) -> web.Response:
        expected = "Basic " + base64.b64encode(f"{API_KEY}:{API_SECRET}".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return web.json_response({"code": 20003, "message": "Authenticate"}, status=401)
        form = parse_qs(await request.text())
        call = request.match_info["call"]
        self.redirects.append({"account": request.match_info["account"], "call": call, **form})
        self.arrived.set()
        if call not in self.live_calls:
            message = f"The requested resource /Calls/{call}.json was not found"
            return web.json_response({"code": 20404, "message": message}, status=404)
        return web.json_response({"sid": call, "status": "in-progress"})


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def twilio_api() -> AsyncIterator[TwilioApi]:
    api = TwilioApi()
    await api.start()
    yield api
    await api.stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, twilio_api: TwilioApi
) -> AsyncIterator[VoiceServer]:
    path = default_config_with(
        tmp_path_factory.mktemp("twilio-transfer"),
        voice=QUICK_VOICE,
        server={
            "twilio_api_key": API_KEY,
            "twilio_api_secret": "twilio_api_secret",
            "twilio_api_url": twilio_api.url,
        },
    )
    data = yaml.safe_load(path.read_text())
    agent = data["agents"]["booking"]
    agent["destinations"] = {"manager": MANAGER}
    for route in agent["flow"]["routes"]:
        if route.get("intent") == "talk_to_human":
            route["say"] = "Putting you through to the manager."
            route["transfer_call"] = "manager"
    agent["flow"].setdefault("events", {})["transfer_failed"] = {"say": SORRY}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    async for voice_server in serving(path, secrets={"twilio_api_secret": API_SECRET}):
        yield voice_server


async def asks_for_a_person(caller: TwilioClient) -> None:
    line = await asyncio.to_thread(spoken_ulaw, "Can I speak to a person?")
    await caller.wait_silence_after_audio(300)  # the greeting, heard out
    await caller.send_audio(line)


async def test_a_transfer_redirects_the_call_to_dial(
    server: VoiceServer, twilio_api: TwilioApi
) -> None:
    sid = "CA" + "7" * 32
    twilio_api.live_calls.add(sid)
    twilio_api.arrived.clear()
    url = f"ws://127.0.0.1:{server.port}/twilio"
    async with TwilioClient(url, call_sid=sid, account_sid=ACCOUNT, timeout=60) as caller:
        await asks_for_a_person(caller)
        await asyncio.wait_for(twilio_api.arrived.wait(), 30)
        # What Twilio does once the call has new TwiML: the stream stops.
        await caller.stop()
    (redirect,) = [r for r in twilio_api.redirects if r["call"] == sid]
    assert redirect["account"] == ACCOUNT
    assert redirect["Twiml"] == [f"<Response><Dial>{MANAGER}</Dial></Response>"]
    call = await ended_call(server, sid)
    said = [m["content"] for m in call["context"]["messages"] if m["role"] == "assistant"]
    assert said == [GREETING, "Putting you through to the manager."]
    assert call["end_reason"] == "transferred to manager" and call["outcome"] == "transferred"


async def test_a_redirect_twilio_refuses_is_said_and_the_call_goes_on(
    server: VoiceServer, twilio_api: TwilioApi
) -> None:
    sid = "CA" + "8" * 32  # not live at the stand-in: 404
    twilio_api.arrived.clear()
    url = f"ws://127.0.0.1:{server.port}/twilio"
    async with TwilioClient(url, call_sid=sid, account_sid=ACCOUNT, timeout=60) as caller:
        await asks_for_a_person(caller)
        await asyncio.wait_for(twilio_api.arrived.wait(), 30)
        heard = caller.received_ms
        await caller.wait_audio(heard + 1)  # the agent's answer to the failure
        await caller.wait_silence_after_audio(700)
        await caller.stop()
    call = await ended_call(server, sid)
    (error,) = [e for e in call["audit"] if e["type"] == "error" and e["where"] == "transfer_call"]
    assert "HTTP 404: 20404" in error["message"]
    said = [m["content"] for m in call["context"]["messages"] if m["role"] == "assistant"]
    assert said[-2:] == ["Putting you through to the manager.", SORRY]
    assert call["end_reason"] == "caller hung up"

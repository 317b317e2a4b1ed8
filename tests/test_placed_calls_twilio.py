"""Calls placed through Twilio: `POST /calls` with `via: twilio` asks a stand-in speaking
Twilio's "Create a Call" endpoint (form-encoded, HTTP basic auth with the API key) to dial; the
test then does what Twilio does: signed status callbacks to the URL it was given, and on answer
the Media Stream to the TwiML's `<Stream url>`, signed, with its `<Parameter>`s. (Twilio cannot
be reached from CI: the stand-in is the allowed exception.)

What a user of the API sees: the agent greets the callee after their hello, under the call id
POST /calls returned, with the request's args; a busy line, a number Twilio refuses and a
machine Twilio's detection hears each end or steer the call as they should; forged callbacks
and a replayed stream change nothing."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
import pytest_asyncio
from aiohttp import web

from tests.support import placed_calls as placed
from tests.support.configs import GREETING, serving
from tests.support.placed_calls import MESSAGE, on_control_port
from tests.test_carrier_call_control import StandIn
from tests.test_sip_calls import spoken_ulaw
from voice_agent.callcontrol.twilio_rest import twilio_signature
from voice_agent.callers import TwilioClient
from voice_agent.server.app import VoiceServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

API_KEY, API_SECRET = "SK" + "b" * 32, "api-secret-456"
AUTH_TOKEN = "auth-token-789"
ACCOUNT = "AC" + "2" * 32
CALLER_ID = "+14155550100"
CONTROL_PUBLIC = placed.CONTROL_PUBLIC
TOKEN = "control-token-1"
BAD_NUMBER = "+15005550001"  # Twilio's test number for "invalid"


class TwilioCalls(StandIn):
    """POST /2010-04-01/Accounts/{AccountSid}/Calls.json as Twilio answers it: 201 with the
    call resource, 400 with Twilio's error JSON for a number it cannot dial, 401 for other
    credentials. Each call it takes is put on `created` for the test to play Twilio's part."""

    def __init__(self) -> None:
        super().__init__()
        self.created: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._sids = iter(f"CA{n:032d}" for n in range(1, 1000))

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/2010-04-01/Accounts/{account}/Calls.json", self._create)

    async def _create(self, request: web.Request) -> web.Response:
        expected = "Basic " + base64.b64encode(f"{API_KEY}:{API_SECRET}".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return web.json_response({"code": 20003, "message": "Authenticate"}, status=401)
        form = parse_qs(await request.text())
        to = form["To"][0]
        if to == BAD_NUMBER:
            message = f"The 'To' number {to} is not a valid phone number."
            return web.json_response({"code": 21211, "message": message}, status=400)
        sid = next(self._sids)
        await self.created.put({"account": request.match_info["account"], "sid": sid, **form})
        return web.json_response({"sid": sid, "status": "queued"}, status=201)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def twilio() -> AsyncIterator[TwilioCalls]:
    api = TwilioCalls()
    await api.start()
    yield api
    await api.stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, twilio: TwilioCalls
) -> AsyncIterator[VoiceServer]:
    path = placed.placing_config(
        tmp_path_factory.mktemp("twilio-placed"),
        server={
            "twilio_auth_token": "twilio_auth_token",
            "twilio_api_key": API_KEY,
            "twilio_api_secret": "twilio_api_secret",
            "twilio_api_url": twilio.url,
        },
        carriers={
            "twilio": {"account_sid": ACCOUNT, "caller_id": CALLER_ID},
            "carrier_amd": True,
            "ring_timeout_s": 30,
        },
    )
    secrets = {
        "control": TOKEN,
        "twilio_auth_token": AUTH_TOKEN,
        "twilio_api_secret": API_SECRET,
    }
    async for voice_server in serving(path, secrets=secrets):
        yield voice_server


async def place(server: VoiceServer, body: dict[str, Any]) -> httpx.Response:
    return await placed.place(server, TOKEN, body)


async def callback(
    server: VoiceServer, url: str, form: dict[str, str], *, token: str = AUTH_TOKEN
) -> httpx.Response:
    """Twilio's POST to a callback URL it was given: signed over that URL and the form; sent
    to the control port the URL's public address stands for."""
    signature = twilio_signature(url, form, token)
    async with httpx.AsyncClient() as http:
        return await http.post(
            on_control_port(server, url), data=form, headers={"X-Twilio-Signature": signature}
        )


def stream_of(twiml: str) -> tuple[str, dict[str, str]]:
    """The `<Stream url>` of the TwiML and its `<Parameter>`s."""
    (url,) = re.findall(r'<Stream url="([^"]+)"', twiml)
    return url, dict(re.findall(r'<Parameter name="([^"]+)" value="([^"]+)"/>', twiml))


def answered_stream(server: VoiceServer, created: dict[str, Any]) -> TwilioClient:
    """The Media Stream Twilio opens once the callee answers, signed for the TwiML's URL."""
    url, parameters = stream_of(created["Twiml"][0])
    assert url == "wss://voice.example.com/twilio"
    caller = TwilioClient(
        f"ws://127.0.0.1:{server.port}/twilio",
        call_sid=created["sid"],
        account_sid=ACCOUNT,
        custom_parameters=parameters,
        timeout=60,
    )
    caller.headers["X-Twilio-Signature"] = twilio_signature(url, {}, AUTH_TOKEN)
    return caller


async def get_record(server: VoiceServer, call_id: str) -> httpx.Response:
    return await placed.get_record(server, TOKEN, call_id)


async def record_when_ended(server: VoiceServer, call_id: str) -> dict[str, Any]:
    return await placed.record_when_ended(server, TOKEN, call_id)


def said(call: dict[str, Any], role: str) -> list[str]:
    return [m["content"] for m in call["context"]["messages"] if m["role"] == role]


async def test_the_agent_greets_the_callee_after_their_hello(
    server: VoiceServer, twilio: TwilioCalls
) -> None:
    response = await place(server, {"to": "+14155550123", "via": "twilio", "args": {"name": "Ada"}})
    assert response.status_code == 202, response.text
    call_id = response.json()["call_id"]
    created = await asyncio.wait_for(twilio.created.get(), 10)
    assert created["account"] == ACCOUNT
    assert created["To"] == ["+14155550123"] and created["From"] == [CALLER_ID]
    (status_url,) = created["StatusCallback"]
    assert status_url.startswith(f"{CONTROL_PUBLIC}/callbacks/{call_id}?key=")
    assert "MachineDetection" not in created  # the booking agent has no answering_machine
    for status in ("initiated", "ringing", "in-progress"):
        reply = await callback(
            server, status_url, {"CallSid": created["sid"], "CallStatus": status}
        )
        assert reply.status_code == 200, reply.text
    hello = await asyncio.to_thread(spoken_ulaw, "Hello?")
    async with answered_stream(server, created) as callee:
        await callee.send_audio(hello)
        await callee.wait_audio(1)
        await callee.wait_silence_after_audio(400)
        await callee.stop()
    call = await record_when_ended(server, call_id)
    assert call["transport"] == "twilio"
    assert call["state"]["callee"] == "+14155550123" and call["state"]["name"] == "Ada"
    assert "placed_call" not in call["state"]
    assert said(call, "assistant") == [GREETING]
    assert said(call, "user") == []  # the hello is answered by the greeting, not a turn
    kinds = [e["type"] for e in call["audit"]]
    assert kinds.index("waiting_for_callee") < kinds.index("callee_hello")
    (hello_event,) = [e for e in call["audit"] if e["type"] == "callee_hello"]
    assert hello_event["heard"] is True
    # The same stream again (a replay, or Twilio reconnecting): the placed call is taken.
    async with answered_stream(server, created) as again:
        code, reason = await again.wait_closed()
    assert code == 1008 and "placed call" in (reason or ""), (code, reason)
    # Twilio's `completed` after the stream: the call is over; nothing to change.
    reply = await callback(
        server, status_url, {"CallSid": created["sid"], "CallStatus": "completed"}
    )
    assert reply.status_code == 404


async def test_a_busy_line_and_a_number_twilio_refuses_end_their_records(
    server: VoiceServer, twilio: TwilioCalls
) -> None:
    busy = (await place(server, {"to": "+14155550124", "via": "twilio"})).json()["call_id"]
    created = await asyncio.wait_for(twilio.created.get(), 10)
    (status_url,) = created["StatusCallback"]
    form = {"CallSid": created["sid"], "CallStatus": "busy"}
    # Not Twilio's: signed with another token, or to a URL without the call's key.
    forged = await callback(server, status_url, form, token="not-the-auth-token")
    assert forged.status_code == 403
    keyless = status_url.split("?")[0] + "?key=guess"
    assert (await callback(server, keyless, form)).status_code == 404
    still = await get_record(server, busy)
    assert still.status_code == 404  # still dialling: no record yet, nothing ended it
    assert (await callback(server, status_url, form)).status_code == 200
    call = await record_when_ended(server, busy)
    assert call["outcome"] == "busy" and call["transport"] == "twilio"
    assert call["end_reason"] == "busy: the callee's line was busy"

    bad = (await place(server, {"to": BAD_NUMBER, "via": "twilio"})).json()["call_id"]
    call = await record_when_ended(server, bad)
    assert call["outcome"] == "failed"
    assert "HTTP 400: 21211 The 'To' number" in call["end_reason"]


async def test_a_machine_twilios_detection_hears_gets_the_agents_message(
    server: VoiceServer, twilio: TwilioCalls
) -> None:
    body = {"to": "+14155550125", "via": "twilio", "agent": "reminder"}
    call_id = (await place(server, body)).json()["call_id"]
    created = await asyncio.wait_for(twilio.created.get(), 10)
    assert created["MachineDetection"] == ["DetectMessageEnd"] and created["AsyncAmd"] == ["true"]
    (status_url,) = created["StatusCallback"]
    assert created["AsyncAmdStatusCallback"] == [status_url]
    await callback(server, status_url, {"CallSid": created["sid"], "CallStatus": "in-progress"})
    async with answered_stream(server, created) as machine:
        # The machine's greeting ends in a beep; Twilio's detection says so.
        verdict = {"CallSid": created["sid"], "AnsweredBy": "machine_end_beep"}
        assert (await callback(server, status_url, verdict)).status_code == 200
        code, _ = await machine.wait_closed()  # the agent leaves its message and hangs up
    assert code == 1000
    call = await record_when_ended(server, call_id)
    assert said(call, "assistant") == [MESSAGE]  # no greeting spoken to the machine
    (answer,) = [e for e in call["audit"] if e["type"] == "answering_machine"]
    assert answer["source"] == "carrier" and answer["beep"] is True
    assert call["end_reason"] == "agent ended the call"

"""Calls placed through Telnyx and Plivo: `POST /calls` with `via: telnyx` / `via: plivo` asks
a stand-in speaking the carrier's create-call request (Telnyx's Dial, `POST /v2/calls` with its
Bearer key; Plivo's Make a call, `POST /v1/Account/{auth_id}/Call/` with basic auth) to dial;
the test then plays the carrier's part: its callbacks to the URLs it was given (Telnyx's JSON
webhooks signed with Ed25519; Plivo's answer URL fetched for its XML and its hangup and machine
posts) and, on answer, the media stream (the carriers' clients of the stream tests) to the URL
the carrier was told. (The carriers cannot be reached from CI: stand-ins are the allowed
exception.)"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import AsyncIterator
from secrets import token_hex
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import pytest
import pytest_asyncio
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tests.support import placed_calls as placed
from tests.support.configs import GREETING, serving
from tests.support.placed_calls import MESSAGE, on_control_port
from tests.test_carrier_call_control import StandIn
from tests.test_carrier_calls_telnyx_plivo import (
    FakePlivo,
    FakeTelnyx,
    live_committed,
    telnyx_call_id,
)
from tests.test_sip_calls import spoken_ulaw
from voice_agent.callcontrol.plivo_rest import v3_signature
from voice_agent.server.app import VoiceServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

TELNYX_KEY = "KEY0123456789abcdef"
PLIVO_ID, PLIVO_TOKEN = "MAXXXXXXXXXXXXXXXXXX", "plivo-token-123"
CONNECTION = "1494404757140276705"
TOKEN = "control-token-2"
CONTROL_PUBLIC = placed.CONTROL_PUBLIC
BAD_NUMBER = "+15005550001"
SIGNING_KEY = Ed25519PrivateKey.generate()  # the portal's key pair, for this test run
PUBLIC_KEY = base64.b64encode(
    SIGNING_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
).decode()


class CarrierCalls(StandIn):
    """Both carriers' create-call endpoints; each call taken goes on `created[carrier]`."""

    def __init__(self) -> None:
        super().__init__()
        self.created: dict[str, asyncio.Queue[dict[str, Any]]] = {
            "telnyx": asyncio.Queue(),
            "plivo": asyncio.Queue(),
        }

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v2/calls", self._telnyx)
        app.router.add_post("/v1/Account/{auth_id}/Call/", self._plivo)

    async def _telnyx(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TELNYX_KEY}":
            error = {"code": "10009", "title": "Authentication failed"}
            return web.json_response({"errors": [error]}, status=401)
        body = await request.json()
        if body["to"] == BAD_NUMBER:
            error = {"code": "10016", "title": "Invalid phone number", "detail": "not dialable"}
            return web.json_response({"errors": [error]}, status=422)
        control_id = telnyx_call_id()
        await self.created["telnyx"].put({**body, "call_control_id": control_id})
        data = {"call_control_id": control_id, "call_leg_id": "leg", "is_alive": False}
        return web.json_response({"data": data})

    async def _plivo(self, request: web.Request) -> web.Response:
        expected = "Basic " + base64.b64encode(f"{PLIVO_ID}:{PLIVO_TOKEN}".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return web.json_response({"api_id": "x", "error": "not authorized"}, status=401)
        if request.match_info["auth_id"] != PLIVO_ID:
            return web.json_response({"api_id": "x", "error": "wrong account"}, status=404)
        body = await request.json()
        uuid = f"req-{self.created['plivo'].qsize() + 1}"
        await self.created["plivo"].put({**body, "request_uuid": uuid})
        return web.json_response(
            {"api_id": "a", "message": "call fired", "request_uuid": uuid}, status=201
        )


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def carriers() -> AsyncIterator[CarrierCalls]:
    api = CarrierCalls()
    await api.start()
    yield api
    await api.stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, carriers: CarrierCalls
) -> AsyncIterator[VoiceServer]:
    path = placed.placing_config(
        tmp_path_factory.mktemp("carriers-placed"),
        server={},
        carriers={
            "telnyx": {
                "api_key_secret": "telnyx_key",
                "api_url": carriers.url,
                "connection_id": CONNECTION,
                "caller_id": "+13125550100",
                "webhook_public_key": PUBLIC_KEY,
            },
            "plivo": {
                "auth_id": PLIVO_ID,
                "auth_token_secret": "plivo_token",
                "api_url": carriers.url,
                "caller_id": "+13125550101",
            },
            "carrier_amd": True,
        },
    )
    secrets = {"control": TOKEN, "telnyx_key": TELNYX_KEY, "plivo_token": PLIVO_TOKEN}
    async for voice_server in serving(path, secrets=secrets):
        yield voice_server


async def place(server: VoiceServer, body: dict[str, Any]) -> str:
    response = await placed.place(server, TOKEN, body)
    assert response.status_code == 202, response.text
    call_id: str = response.json()["call_id"]
    return call_id


async def telnyx_webhook(
    server: VoiceServer, url: str, kind: str, payload: dict[str, Any], *, key: Any = None
) -> httpx.Response:
    """A Call Control webhook as Telnyx sends it: JSON, signed with Ed25519 over
    `<timestamp>|<body>`."""
    event = {"data": {"record_type": "event", "event_type": kind, "payload": payload}}
    body = json.dumps(event).encode()
    timestamp = str(int(time.time()))
    signature = (key or SIGNING_KEY).sign(timestamp.encode() + b"|" + body)
    headers = {
        "Content-Type": "application/json",
        "telnyx-timestamp": timestamp,
        "telnyx-signature-ed25519": base64.b64encode(signature).decode(),
    }
    async with httpx.AsyncClient() as http:
        return await http.post(on_control_port(server, url), content=body, headers=headers)


def plivo_signed(method: str, url: str, params: dict[str, str], token: str) -> dict[str, str]:
    """Plivo's V3 signature headers for a request to `url` (as Plivo was given it)."""
    nonce = token_hex(10)
    signature = v3_signature(token, method, url, params, nonce)
    return {"X-Plivo-Signature-V3": signature, "X-Plivo-Signature-V3-Nonce": nonce}


async def plivo_post(
    server: VoiceServer, url: str, form: dict[str, str], *, token: str = PLIVO_TOKEN
) -> httpx.Response:
    """A Plivo callback: a form post, signed (V3) with the account's auth token."""
    headers = plivo_signed("POST", url, form, token)
    async with httpx.AsyncClient() as http:
        return await http.post(on_control_port(server, url), data=form, headers=headers)


async def plivo_get(server: VoiceServer, url: str, params: dict[str, str]) -> httpx.Response:
    """Plivo fetching a GET callback (the answer URL): its call parameters added to the query."""
    full = f"{url}&{urlencode(params)}"
    headers = plivo_signed("GET", full, {}, PLIVO_TOKEN)
    async with httpx.AsyncClient() as http:
        return await http.get(on_control_port(server, full), headers=headers)


def stream_base(server: VoiceServer, stream_url: str, path: str) -> tuple[str, str]:
    """(the server's ws:// base, the stream URL's query) for a carrier told `stream_url`."""
    parts = urlsplit(stream_url)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == f"wss://voice.example.com{path}"
    return f"ws://127.0.0.1:{server.port}", f"?{parts.query}"


async def record_when_ended(server: VoiceServer, call_id: str) -> dict[str, Any]:
    return await placed.record_when_ended(server, TOKEN, call_id)


def said(call: dict[str, Any]) -> list[str]:
    return [m["content"] for m in call["context"]["messages"] if m["role"] == "assistant"]


async def telnyx_machine(server: VoiceServer, carriers: CarrierCalls) -> None:
    """Telnyx dials for the reminder agent; a machine answers; Telnyx's detection says so,
    then that its greeting ended with a beep: the agent leaves its message."""
    call_id = await place(server, {"to": "+13125550123", "via": "telnyx", "agent": "reminder"})
    created = await asyncio.wait_for(carriers.created["telnyx"].get(), 10)
    assert created["connection_id"] == CONNECTION and created["from"] == "+13125550100"
    assert created["stream_bidirectional_mode"] == "rtp"
    assert created["answering_machine_detection"] == "detect_beep"
    url = created["webhook_url"]
    assert url.startswith(f"{CONTROL_PUBLIC}/callbacks/{call_id}?key=")
    control = {"call_control_id": created["call_control_id"]}
    # Signed with another key: not Telnyx's, refused, and nothing changes.
    forged = await telnyx_webhook(
        server, url, "call.hangup", control, key=Ed25519PrivateKey.generate()
    )
    assert forged.status_code == 403
    assert (await telnyx_webhook(server, url, "call.answered", control)).status_code == 200
    base, query = stream_base(server, created["stream_url"], "/telnyx")
    async with FakeTelnyx(base, call_id=created["call_control_id"], query=query) as machine:
        verdict = {**control, "result": "machine"}
        await telnyx_webhook(server, url, "call.machine.detection.ended", verdict)
        greeting = {**control, "result": "beep_detected"}
        await telnyx_webhook(server, url, "call.machine.greeting.ended", greeting)
        await machine.wait_closed()  # the message, then the agent hangs up
    call = await record_when_ended(server, call_id)
    assert call["transport"] == "telnyx" and call["state"]["callee"] == "+13125550123"
    assert said(call) == [MESSAGE]
    answers = [e for e in call["audit"] if e["type"] == "answering_machine"]
    assert [(a["answer"], a["source"]) for a in answers] == [
        ("machine", "carrier"),
        ("message may start", "carrier"),
    ]


async def plivo_person(server: VoiceServer, carriers: CarrierCalls) -> None:
    """Plivo dials for the booking agent; on answer it fetches the XML, streams; the callee
    says hello and the agent greets them."""
    body = {"to": "+13125550124", "via": "plivo", "args": {"name": "Ada"}}
    call_id = await place(server, body)
    created = await asyncio.wait_for(carriers.created["plivo"].get(), 10)
    assert created["from"] == "+13125550101" and created["to"] == "+13125550124"
    assert "machine_detection" not in created  # the booking agent has no answering_machine
    assert created["answer_method"] == "GET"
    answer = await plivo_get(server, created["answer_url"], {"CallUUID": "abc"})
    assert answer.status_code == 200
    (stream_url,) = re.findall(r">(wss://[^<]+)</Stream>", answer.text)
    assert 'bidirectional="true"' in answer.text
    base, query = stream_base(server, stream_url, "/plivo")
    hello = await asyncio.to_thread(spoken_ulaw, "Hello?")
    async with FakePlivo(base, call_id="abc", query=query) as callee:
        await callee.say(hello)
        # The whole greeting played (its marks reported: committed), then the callee hangs up.
        heard = lambda: GREETING in live_committed(server, call_id)  # noqa: E731
        await callee.wait_until("the greeting", heard)
    call = await record_when_ended(server, call_id)
    assert call["transport"] == "plivo" and call["state"]["name"] == "Ada"
    assert said(call)[0] == GREETING
    assert [m for m in call["context"]["messages"] if m["role"] == "user"] == []
    hung_up = {"CallUUID": "abc", "CallStatus": "completed", "HangupCause": "Normal Hangup"}
    assert (await plivo_post(server, created["hangup_url"], hung_up)).status_code == 404


async def test_a_machine_on_telnyx_and_a_person_on_plivo(
    server: VoiceServer, carriers: CarrierCalls
) -> None:
    await asyncio.gather(telnyx_machine(server, carriers), plivo_person(server, carriers))


async def test_busy_lines_and_a_refused_number_end_their_records(
    server: VoiceServer, carriers: CarrierCalls
) -> None:
    telnyx = await place(server, {"to": "+13125550125", "via": "telnyx"})
    created = await asyncio.wait_for(carriers.created["telnyx"].get(), 10)
    hangup = {"call_control_id": created["call_control_id"], "hangup_cause": "user_busy"}
    await telnyx_webhook(server, created["webhook_url"], "call.hangup", hangup)
    plivo = await place(server, {"to": "+13125550126", "via": "plivo"})
    created = await asyncio.wait_for(carriers.created["plivo"].get(), 10)
    form = {"CallUUID": "x", "CallStatus": "busy", "HangupCause": "Busy Line"}
    # Signed with another token, or not at all: not Plivo's, refused, and nothing changes.
    forged = await plivo_post(server, created["hangup_url"], form, token="not-the-token")
    assert forged.status_code == 403
    async with httpx.AsyncClient() as http:
        unsigned = await http.post(on_control_port(server, created["hangup_url"]), data=form)
        odd = [
            (b"X-Plivo-Signature-V3", "\xe9t\xe9".encode("latin-1")),
            (b"X-Plivo-Signature-V3-Nonce", b"1"),
        ]
        garbled = await http.post(
            on_control_port(server, created["hangup_url"]), data=form, headers=odd
        )
    assert unsigned.status_code == 403 and garbled.status_code == 403
    assert (await plivo_post(server, created["hangup_url"], form)).status_code == 200
    bad = await place(server, {"to": BAD_NUMBER, "via": "telnyx"})
    calls = [await record_when_ended(server, call_id) for call_id in (telnyx, plivo, bad)]
    assert [(c["transport"], c["outcome"]) for c in calls] == [
        ("telnyx", "busy"),
        ("plivo", "busy"),
        ("telnyx", "failed"),
    ]
    assert calls[1]["end_reason"] == "busy: the callee's line was busy (Busy Line)"
    assert "HTTP 422: 10016 Invalid phone number: not dialable" in calls[2]["end_reason"]


async def test_junk_at_the_callbacks_changes_nothing_and_the_port_answers_on(
    server: VoiceServer, carriers: CarrierCalls
) -> None:
    """The one part of the control port carriers reach: whatever comes to it, a defined answer
    and no placed call changed or added."""
    assert server.control is not None
    call_id = await place(server, {"to": "+13125550127", "via": "telnyx"})
    created = await asyncio.wait_for(carriers.created["telnyx"].get(), 10)
    url = on_control_port(server, created["webhook_url"])
    base = f"http://127.0.0.1:{server.control.port}/callbacks"
    before = len(server.dialer.calls)
    async with httpx.AsyncClient() as http:
        answers = [
            (await http.post(f"{base}/nope?key=x", content=bytes(range(256)))).status_code,
            (await http.get(f"{base}/{call_id}?key=wrong")).status_code,
            (await http.get(f"{base}/{call_id}")).status_code,
            (await http.post(url, content=b"x" * 70_000)).status_code,  # over the body limit
            (await http.post(f"{base}/{call_id}/../../calls", content=b"{}")).status_code,
            (await http.request("PUT", url, content=b"{}")).status_code,
        ]
    # (The dots are resolved to /calls, which wants the API token.)
    assert answers == [404, 404, 404, 413, 401, 405], answers
    assert len(server.dialer.calls) == before
    # Telnyx's, but a hang-up without a cause: a failed call, a record, not a crash.
    hangup = await telnyx_webhook(server, created["webhook_url"], "call.hangup", {})
    assert hangup.status_code == 200
    record = await record_when_ended(server, call_id)
    assert record["end_reason"] == "call failed: Telnyx ended the call (unspecified)"

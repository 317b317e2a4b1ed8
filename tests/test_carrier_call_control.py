"""Call control on the carriers' streams: transfers and keys out on /telnyx, /plivo and /vonage
through stand-ins speaking each carrier's REST API, and the reasons where there is none.

The stand-ins are not the carriers (none can be reached from CI), they answer as their
references document: Telnyx's Call Control commands with its Bearer key and `errors` list;
Plivo's "Transfer a call" with basic auth, answering 202 and then fetching the XML from the
`aleg_url` it was given, as Plivo does, through the public URL (it stands in for the proxy
too); Vonage's call update and DTMF endpoints, checking the JWT's RS256 signature with the
application's public key, its RFC 7807 problems. The callers are the carrier clients of
tests/test_carrier_calls_*.py; the Plivo one also takes the `sendDTMF` the server sends it.

The agent is a flow whose every key press says a line, presses 1, 2, # and hands the call to
the manager: one call per carrier where the carrier takes it, one where it refuses.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import pytest_asyncio
import yaml
from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from websockets.datastructures import Headers

from tests.support.configs import QUICK_VOICE, default_config_with, ended_call, serving
from tests.test_carrier_calls_telnyx_plivo import (
    FakeCarrier,
    FakePlivo,
    FakeTelnyx,
    audit,
    live_committed,
    messages,
    telnyx_call_id,
)
from tests.test_carrier_calls_vonage_exotel_jambonz import FakeVonage
from voice_agent.agents.registry import AgentRegistry
from voice_agent.callcontrol.apis import NO_APIS, CallControlApis, call_control_apis
from voice_agent.callcontrol.plivo_rest import PlivoRest, dial_response, dial_xml
from voice_agent.callcontrol.telnyx_rest import transfer_to
from voice_agent.callcontrol.vonage_rest import VonageRest, application_jwt, connect_endpoint
from voice_agent.errors import ConfigError
from voice_agent.gateways.carriers import CARRIERS
from voice_agent.runtime.call_control import CallTransfer
from voice_agent.runtime.secrets import Secrets
from voice_agent.server.app import VoiceServer
from voice_agent.server.auth import AccessPolicy
from voice_agent.transports import plivo

# The calls share the module's server and stand-ins, so its event loop.
on_module_loop = pytest.mark.asyncio(loop_scope="module")

PUBLIC_URL = "https://voice.example.com"  # behind a proxy: the Plivo stand-in resolves it
MANAGER = "+14155550199"
HELLO = "Press any key for the manager."
PUT_THROUGH = "Putting you through."
SORRY = "Sorry, nobody can take your call right now."
KEYS = "12#"
TELNYX_KEY = "KEY0123456789ABCDEF_telnyx"
PLIVO_ID, PLIVO_TOKEN = "MAXXXXXXXXXXXXXXXXXX", "plivo-auth-token-123"
VONAGE_APP = "aaaaaaaa-bbbb-cccc-dddd-0123456789ab"
TIMEOUT_S = 20.0


@functools.cache
def vonage_key() -> rsa.RSAPrivateKey:
    """The Vonage application's key pair: generated once, its private half the server's."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def vonage_pem() -> str:
    return (
        vonage_key()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )


def b64url_decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def verified_claims(token: str, public_key: rsa.RSAPublicKey) -> dict[str, Any]:
    """The claims of an RS256 JWT whose signature `public_key` verifies (InvalidSignature)."""
    header, claims, signature = token.split(".")
    assert json.loads(b64url_decode(header)) == {"alg": "RS256", "typ": "JWT"}
    public_key.verify(
        b64url_decode(signature),
        f"{header}.{claims}".encode("ascii"),
        padding.PKCS1v15(),
        hashes.SHA256(),
    )
    decoded: dict[str, Any] = json.loads(b64url_decode(claims))
    return decoded


# -- the carriers' APIs, as their references describe them ---------------------------------------


class StandIn:
    """An aiohttp app on a free localhost port."""

    def __init__(self) -> None:
        self.url = ""
        self.live: set[str] = set()  # the calls the carrier knows as in progress
        self._runner: web.AppRunner | None = None

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        app = web.Application()
        self.routes(app)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class TelnyxApi(StandIn):
    """`POST /v2/calls/{call_control_id}/actions/{transfer|send_dtmf}`: 200 for a live call,
    422 with Telnyx's `errors` for one that has ended, 401 without the Bearer key."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[tuple[str, str, dict[str, Any]]] = []  # (call, action, body)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v2/calls/{call}/actions/{action}", self._command)

    async def _command(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TELNYX_KEY}":
            error = {"code": "10009", "title": "Authentication failed", "detail": "bad key"}
            return web.json_response({"errors": [error]}, status=401)
        call, action = request.match_info["call"], request.match_info["action"]
        self.commands.append((call, action, await request.json()))
        if call not in self.live:
            error = {
                "code": "90018",
                "title": "Call has already ended",
                "detail": "This call is no longer active and can't receive commands.",
            }
            return web.json_response({"errors": [error]}, status=422)
        return web.json_response({"data": {"result": "ok"}})


class PlivoApi(StandIn):
    """`POST /v1/Account/{auth_id}/Call/{call_uuid}/` with a JSON body and basic auth: 202,
    then the A leg's XML fetched with GET from `aleg_url` (Plivo's call parameters added to its
    query), as Plivo runs a transfer; 404 with Plivo's `error` for a call it does not know."""

    def __init__(self) -> None:
        super().__init__()
        self.server_url = ""  # where PUBLIC_URL leads: set once the server listens
        self.transfers: list[tuple[str, dict[str, Any]]] = []
        self.dialled: dict[str, asyncio.Future[list[tuple[str, str]]]] = {}
        self._fetches: set[asyncio.Task[None]] = set()

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/Account/{auth_id}/Call/{call}/", self._transfer)

    def dial_for(self, call: str) -> asyncio.Future[list[tuple[str, str]]]:
        return self.dialled.setdefault(call, asyncio.get_running_loop().create_future())

    async def _transfer(self, request: web.Request) -> web.Response:
        expected = "Basic " + base64.b64encode(f"{PLIVO_ID}:{PLIVO_TOKEN}".encode()).decode()
        api_id = str(uuid.uuid4())
        if request.headers.get("Authorization") != expected:
            return web.json_response({"api_id": api_id, "error": "not authorized"}, status=401)
        if request.content_type != "application/json":
            return web.json_response({"api_id": api_id, "error": "json only"}, status=400)
        call, body = request.match_info["call"], await request.json()
        self.transfers.append((call, body))
        if request.match_info["auth_id"] != PLIVO_ID or call not in self.live:
            return web.json_response({"api_id": api_id, "error": "call not found"}, status=404)
        task = asyncio.ensure_future(self._run_transfer(call, body["aleg_url"]))
        self._fetches.add(task)
        task.add_done_callback(self._fetches.discard)
        return web.json_response({"message": "call transferred", "api_id": api_id}, status=202)

    async def _run_transfer(self, call: str, aleg_url: str) -> None:
        """What Plivo does after its 202: GET the XML (adding its own parameters to the query)
        and dial what it says. The proxy at PUBLIC_URL forwards to the server."""
        found = self.dial_for(call)
        try:
            assert aleg_url.startswith(f"{PUBLIC_URL}/plivo/dial?"), aleg_url
            parts = urlsplit(aleg_url)
            plivo_params = f"&CallUUID={call}&Direction=inbound&From=14155550100&To=14155550111"
            async with httpx.AsyncClient() as http:
                response = await http.get(
                    f"{self.server_url}{parts.path}?{parts.query}{plivo_params}",
                    headers={"Host": parts.netloc},
                )
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == "application/xml"
            dial = ET.fromstring(response.content).find("Dial")
            assert dial is not None, response.text
            found.set_result([(child.tag, (child.text or "").strip()) for child in dial])
        except Exception as exc:
            found.set_exception(exc)


class VonageApi(StandIn):
    """`PUT /v1/calls/{uuid}` (a transfer) and `PUT /v1/calls/{uuid}/dtmf`, authorised by a JWT
    the application's public key verifies: 204 / 200 for a live call, 404 with an RFC 7807
    problem for another, 401 for a bad token."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, str, dict[str, Any]]] = []  # (call, "transfer"|"dtmf", body)
        self.token_ids: list[str] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_put("/v1/calls/{call}", self._request)
        app.router.add_put("/v1/calls/{call}/dtmf", self._request)

    async def _request(self, request: web.Request) -> web.Response:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        try:
            assert scheme == "Bearer"
            claims = verified_claims(token, vonage_key().public_key())
            assert claims["application_id"] == VONAGE_APP
            assert claims["iat"] <= time.time() + 5 < claims["exp"] + 5
        except (AssertionError, InvalidSignature, ValueError) as exc:
            problem = {"title": "Unauthorized", "detail": f"bad JWT: {exc!r}"}
            return web.json_response(problem, status=401)
        self.token_ids.append(claims["jti"])
        call = request.match_info["call"]
        kind = "dtmf" if request.path.endswith("/dtmf") else "transfer"
        self.requests.append((call, kind, await request.json()))
        if call not in self.live:
            problem = {
                "type": "https://developer.nexmo.com/api-errors#not-found",
                "title": "Not Found",
                "detail": f"Call {call} does not exist or has already completed",
            }
            return web.json_response(problem, status=404)
        if kind == "dtmf":
            return web.json_response({"message": "DTMF sent", "uuid": call})
        return web.Response(status=204)


# -- the callers -----------------------------------------------------------------------------------


class PlivoTakingKeys(FakePlivo):
    """Plivo's stream, which also takes `sendDTMF` and plays the keys into the call."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.keys: list[str] = []

    def on_text(self, message: dict[str, Any], text: str) -> list[str]:
        if message.get("event") == "sendDTMF" and set(message) == {"event", "dtmf"}:
            self.keys.append(message["dtmf"])
            return []
        return super().on_text(message, text)


Caller = FakeCarrier | FakeVonage


def new_caller(kind: str, base_url: str) -> Caller:
    if kind == "telnyx":
        return FakeTelnyx(base_url, call_id=telnyx_call_id(), params={"agent": "desk"})
    if kind == "plivo":
        return PlivoTakingKeys(base_url, call_id=str(uuid.uuid4()), extra_headers="agent=desk")
    return FakeVonage(base_url, agent="desk")


# -- fixtures ----------------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def apis() -> AsyncIterator[dict[str, Any]]:
    stand_ins: dict[str, Any] = {
        "telnyx": TelnyxApi(),
        "plivo": PlivoApi(),
        "vonage": VonageApi(),
    }
    for stand_in in stand_ins.values():
        await stand_in.start()
    yield stand_ins
    for stand_in in stand_ins.values():
        await stand_in.stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, apis: dict[str, Any]
) -> AsyncIterator[VoiceServer]:
    path = default_config_with(
        tmp_path_factory.mktemp("carrier-call-control"),
        voice=QUICK_VOICE,
        server={"public_url": PUBLIC_URL},
        carriers={
            "telnyx": {"api_key_secret": "telnyx_key", "api_url": apis["telnyx"].url},
            "plivo": {
                "auth_id": PLIVO_ID,
                "auth_token_secret": "plivo_token",
                "api_url": apis["plivo"].url,
            },
            "vonage": {
                "application_id": VONAGE_APP,
                "private_key_secret": "vonage_key",
                "api_url": apis["vonage"].url,
            },
        },
    )
    data = yaml.safe_load(path.read_text())
    data["agents"]["desk"] = {
        "brain": "flow",
        "description": "Puts the caller through to the manager on any key.",
        "intents": data["agents"]["booking"]["intents"],
        "destinations": {"manager": MANAGER},
        "flow": {
            "start_page": "welcome",
            "pages": {"welcome": {"message": HELLO}},
            "events": {
                "dtmf": {"say": PUT_THROUGH, "send_dtmf": KEYS, "transfer_call": "manager"},
                "transfer_failed": {"say": SORRY},
            },
        },
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    secrets = {"telnyx_key": TELNYX_KEY, "plivo_token": PLIVO_TOKEN, "vonage_key": vonage_pem()}
    async for voice_server in serving(path, secrets=secrets):
        apis["plivo"].server_url = voice_server.url
        yield voice_server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def base_url(server: VoiceServer) -> str:
    return f"ws://127.0.0.1:{server.port}"


def said(call: dict[str, Any]) -> list[str | None]:
    return messages(call, "assistant")


def errors(call: dict[str, Any], where: str) -> list[str]:
    return [e["message"] for e in audit(call, "error") if e.get("where") == where]


async def press_a_key(server: VoiceServer, caller: Caller) -> None:
    """The welcome heard out, then a key: the agent's line, its keys and the transfer follow."""
    await caller.wait_until(
        "the welcome to be committed", lambda: HELLO in live_committed(server, caller.call_id)
    )
    await caller.send_dtmf("5")


# -- calls: a transfer the carrier takes -----------------------------------------------------------


@on_module_loop
async def test_each_carrier_takes_the_transfer_and_the_call_ends_transferred(
    server: VoiceServer, base_url: str, apis: dict[str, Any]
) -> None:
    """Telnyx, Plivo and Vonage side by side; a failure names its carrier."""
    await asyncio.gather(*(transfer_taken(server, base_url, apis, kind) for kind in apis))


async def transfer_taken(
    server: VoiceServer, base_url: str, apis: dict[str, Any], kind: str
) -> None:
    caller = new_caller(kind, base_url)
    api = apis[kind]
    api.live.add(caller.call_id)
    async with caller:
        await press_a_key(server, caller)
        # The carrier has the call now: the server lets the stream go.
        await caller.wait_until("the server to close the stream", lambda: caller.closed)
    assert caller.close_code == 1000, (kind, caller.close_reason)
    call = await ended_call(server, caller.call_id)
    assert call["transport"] == kind and call["agent"] == "desk"
    assert said(call) == [HELLO, PUT_THROUGH], kind
    assert call["end_reason"] == "transferred to manager" and call["outcome"] == "transferred"
    (transferred,) = audit(call, "transferred")
    assert transferred["target"] == MANAGER
    assert [e["digits"] for e in audit(call, "dtmf_sent")] == [KEYS]
    assert not audit(call, "error"), audit(call, "error")
    if kind == "telnyx":
        mine = [
            (action, body) for call_id, action, body in api.commands if call_id == caller.call_id
        ]
        # The keys went out before the hand-over, as the route asked.
        assert mine == [
            ("send_dtmf", {"digits": KEYS, "duration_millis": 250}),
            ("transfer", {"to": MANAGER}),
        ]
    elif kind == "plivo":
        assert isinstance(caller, PlivoTakingKeys) and caller.keys == [KEYS]
        ((call_uuid, body),) = [t for t in api.transfers if t[0] == caller.call_id]
        assert body["legs"] == "aleg" and body["aleg_method"] == "GET"
        # Plivo fetches the XML after its 202, when the stream may already be gone.
        dialled = await asyncio.wait_for(api.dial_for(call_uuid), TIMEOUT_S)
        assert dialled == [("Number", MANAGER)]
    else:
        mine = [(kind_, body) for call_id, kind_, body in api.requests if call_id == caller.call_id]
        number = {"type": "phone", "number": MANAGER.lstrip("+")}
        ncco = [{"action": "connect", "endpoint": [number]}]
        assert mine == [
            ("dtmf", {"digits": KEYS}),
            ("transfer", {"action": "transfer", "destination": {"type": "ncco", "ncco": ncco}}),
        ]
        assert len(set(api.token_ids)) == len(api.token_ids)  # a fresh JWT per request


# -- calls: a transfer the carrier refuses ---------------------------------------------------------


@on_module_loop
async def test_a_refused_transfer_is_said_and_each_carriers_call_goes_on(
    server: VoiceServer, base_url: str, apis: dict[str, Any]
) -> None:
    """The carriers do not know these calls: each says so its way, the agent says its
    transfer_failed line and the caller is still there to hang up."""
    await asyncio.gather(*(transfer_refused(server, base_url, apis, kind) for kind in apis))


async def transfer_refused(
    server: VoiceServer, base_url: str, apis: dict[str, Any], kind: str
) -> None:
    caller = new_caller(kind, base_url)
    async with caller:
        await press_a_key(server, caller)
        await caller.wait_until(
            "the transfer_failed line", lambda: SORRY in live_committed(server, caller.call_id)
        )
        assert not caller.closed
    call = await ended_call(server, caller.call_id)
    assert said(call) == [HELLO, PUT_THROUGH, SORRY], kind
    assert call["end_reason"] == "caller hung up"
    (transfer_error,) = errors(call, "transfer_call")
    keys_errors = errors(call, "send_dtmf")
    if kind == "telnyx":
        refusal = "HTTP 422: 90018 Call has already ended: This call is no longer active"
        assert transfer_error.startswith(f"Telnyx refused the transfer: {refusal}")
        assert keys_errors == [transfer_error.replace("the transfer", "the keys")]
    elif kind == "plivo":
        assert transfer_error == "Plivo refused the transfer: HTTP 404: call not found"
        assert isinstance(caller, PlivoTakingKeys) and caller.keys == [KEYS]  # on the stream
        assert not keys_errors
        assert caller.call_id not in apis["plivo"].dialled  # nothing to fetch
    else:
        detail = f"Not Found: Call {caller.call_id} does not exist or has already completed"
        assert transfer_error == f"Vonage refused the transfer: HTTP 404: {detail}"
        assert keys_errors == [f"Vonage refused the keys: HTTP 404: {detail}"]


# -- unit: the pieces ------------------------------------------------------------------------------


def test_the_vonage_jwt_verifies_with_the_public_key_and_carries_its_claims() -> None:
    token = application_jwt(VONAGE_APP, vonage_key(), now=1_700_000_000, jti="abc")
    claims = verified_claims(token, vonage_key().public_key())
    assert claims == {
        "application_id": VONAGE_APP,
        "iat": 1_700_000_000,
        "exp": 1_700_000_300,
        "jti": "abc",
    }
    # Another key does not verify it, and a changed claim breaks the signature.
    other = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
    with pytest.raises(InvalidSignature):
        verified_claims(token, other)
    header, _, signature = token.split(".")
    forged = json.dumps({**claims, "application_id": "someone-else"}).encode()
    tampered = f"{header}.{base64.urlsafe_b64encode(forged).rstrip(b'=').decode()}.{signature}"
    with pytest.raises(InvalidSignature):
        verified_claims(tampered, vonage_key().public_key())
    # Each token its own id.
    first, second = (application_jwt(VONAGE_APP, vonage_key()) for _ in range(2))
    ids = {verified_claims(t, vonage_key().public_key())["jti"] for t in (first, second)}
    assert len(ids) == 2


def test_the_plivo_dial_page_answers_only_its_own_signature() -> None:
    rest = PlivoRest(PLIVO_ID, PLIVO_TOKEN)
    call = str(uuid.uuid4())
    url = urlsplit(rest.dial_url(PUBLIC_URL, call, MANAGER))
    target = f"{url.path}?{url.query}&CallUUID={call}&From=1415"  # Plivo adds its parameters
    good = dial_response(target, rest.dial_key)
    assert good.status_code == 200 and good.headers["Content-Type"] == "application/xml"
    assert good.body == dial_xml(MANAGER).encode()
    assert ET.fromstring(good.body).find("Dial/Number").text == MANAGER  # type: ignore[union-attr]
    elsewhere = target.replace("%2B14155550199", "%2B19005550123")  # the number changed
    assert elsewhere != target
    for refused in (
        elsewhere,
        target.replace(f"call={call}", f"call={uuid.uuid4()}"),  # another call's signature
        target.replace("sig=", "sig=0"),
        target.split("&sig=")[0],  # none
        f"{target}&to=%2B19005550123",  # a second destination
    ):
        assert dial_response(refused, rest.dial_key).status_code == 403, refused
    # Signed with another account's token: refused. Without Plivo configured: nothing there.
    assert dial_response(target, PlivoRest(PLIVO_ID, "other").dial_key).status_code == 403
    assert dial_response(target, None).status_code == 404


def test_the_dial_page_is_open_without_a_token_and_nothing_else_is() -> None:
    policy = AccessPolicy(["the-token"])
    assert policy.check("/plivo/dial?to=1&call=2&sig=3", Headers(), "192.0.2.1").allowed
    for path in ("/plivo/dial/x", "/plivo/dialx", "/calls"):
        assert policy.check(path, Headers(), "192.0.2.1").status == 401, path


def test_destinations_in_each_carriers_words() -> None:
    sip = "sip:desk@pbx.example.com"
    assert dial_xml(sip).endswith(f"<Response><Dial><User>{sip}</User></Dial></Response>")
    assert dial_xml("tel:+14155550199").endswith("<Number>+14155550199</Number></Dial></Response>")
    assert connect_endpoint(sip) == {"type": "sip", "uri": sip}
    assert connect_endpoint("tel:+14155550199") == {"type": "phone", "number": "14155550199"}
    assert transfer_to(sip) == sip and transfer_to("tel:+14155550199") == MANAGER
    assert plivo.send_dtmf_message("12#") == '{"event":"sendDTMF","dtmf":"12#"}'
    with pytest.raises(ValueError):
        plivo.send_dtmf_message("12x")


async def test_without_a_carriers_api_call_control_says_what_to_set() -> None:
    transfer = CallTransfer("manager", MANAGER, "")
    carriers = {path: make(path) for path, make in CARRIERS.items()}
    transfers = {path: await c.transfer(NO_APIS, transfer) for path, c in carriers.items()}
    assert transfers["/telnyx"] == "transfers on /telnyx need Telnyx's API: set carriers.telnyx"
    assert transfers["/plivo"] == "transfers on /plivo need Plivo's API: set carriers.plivo"
    assert transfers["/vonage"] == "transfers on /vonage need Vonage's API: set carriers.vonage"
    assert "Connect applet after the Voicebot applet" in str(transfers["/exotel"])
    assert "the application's next verb" in str(transfers["/jambonz"])
    keys = {path: c.sends_keys for path, c in carriers.items()}
    assert keys == {
        "/telnyx": True,
        "/plivo": True,
        "/vonage": True,
        "/exotel": False,
        "/jambonz": False,
    }
    assert await carriers["/telnyx"].send_digits(NO_APIS, KEYS) == (
        "keys on /telnyx need Telnyx's API: set carriers.telnyx"
    )
    # Plivo's API alone is not enough: Plivo must reach the server for the XML.
    plivo_only = CallControlApis(plivo=PlivoRest(PLIVO_ID, PLIVO_TOKEN))
    assert "need server.public_url" in str(await carriers["/plivo"].transfer(plivo_only, transfer))
    # Vonage's stream names no call unless the NCCO passes its uuid.
    vonage_only = CallControlApis(vonage=VonageRest(VONAGE_APP, vonage_pem()))
    reason = await carriers["/vonage"].transfer(vonage_only, transfer)
    assert "endpoint's 'uuid' header" in str(reason)


@pytest.mark.parametrize(
    ("section", "secrets", "key"),
    [
        ({"telnyx": {"api_key_secret": "telnyx_key"}}, {}, "carriers.telnyx.api_key_secret"),
        (
            {"plivo": {"auth_id": PLIVO_ID, "auth_token_secret": "plivo_token"}},
            {},
            "carriers.plivo.auth_token_secret",
        ),
        (
            {"vonage": {"application_id": VONAGE_APP, "private_key_secret": "vonage_key"}},
            {"vonage_key": "not a key"},
            "carriers.vonage.private_key_secret",
        ),
    ],
)
async def test_a_carrier_api_without_its_secret_is_a_config_error(
    tmp_path: Path, section: dict[str, Any], secrets: dict[str, str], key: str
) -> None:
    registry = AgentRegistry.from_file(
        default_config_with(tmp_path, carriers=section), Secrets(secrets)
    )
    try:
        with pytest.raises(ConfigError) as raised:
            call_control_apis(registry)
        assert key in str(raised.value)
    finally:
        await registry.aclose()

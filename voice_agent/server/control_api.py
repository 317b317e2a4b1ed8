"""The control API: `POST /calls` places a call, on its own port (`server.control_listen`).

Why a second port: the main port is the `websockets` server, whose HTTP side reads GET
requests only (it is a WebSocket handshake parser: websockets.http11.Request refuses any other
method), and placing a call is a POST with a body. aiohttp (already installed with the openai
SDK's aiohttp extra) serves this small API; operators keep it off the public balancer.

    POST /calls  Authorization: Bearer <API token>
    {"to": "+14155550123" | "sip:bob@10.0.0.7", "agent": "booking", "args": {"name": "Ada"},
     "via": "sip" | "twilio" | "telnyx" | "plivo"}
    -> 202 {"call_id": "...", "status": "dialing", "record": "/calls/<call_id>"}

`via` picks the way out: the SIP trunk (`sip.trunk`) or a carrier's REST API (`carriers.*`,
callcontrol/carrier_dialer.py); without it, the only one configured (the trunk, when there are
several). Carriers' status callbacks for those calls come to `/callbacks/<call_id>?key=...`
on this port (GET or POST): the key in the URL, random per call, is their credential (and
each carrier's own signature where it signs), so only `/callbacks/` need be reachable from the
carriers (`server.control_public_url`).

    POST /admin/drain  Authorization: Bearer <API token>
    -> 202 {"status": "draining", "phase": "draining", "live_calls": 3, "deadline_in_s": 600, ...}

drains the server (voice_agent/server/drain.py, as SIGTERM does): new calls are refused, live
ones run until `server.drain_deadline_s`, and the process exits after its last call. Asking
again changes nothing and answers the same way.

The call's record (`GET /calls/<call_id>` on the main port) has the agent's conversation once
the callee answers; a call never answered ends `busy`, `no_answer` or `failed` with what the
far end said. Refusals: 401 without a valid token (an open dialer is toll fraud: this API
takes no call without `server.api_tokens`), 400 for a body that is not the object above (the
key is named), 404 for an unknown agent, 409 when there is no way out (no `sip.trunk`, or the
carrier `via` names is not configured: the missing key is named), 429 past the way out's
`calls_per_minute` (with Retry-After), 503 while the worker drains or is at its admission
limits (with Retry-After).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from voice_agent.callcontrol.carrier_dialer import CALLBACK_PREFIX, Callback, Reply
from voice_agent.callcontrol.placed_calls import CARRIER_VIAS
from voice_agent.destination import DESTINATION

VIAS = ("sip", *CARRIER_VIAS)

log = logging.getLogger("voice_agent.server")

MAX_BODY_BYTES = 16 * 1024
BUSY_RETRY_AFTER_S = 5  # a draining or full worker: another host, or this one soon
MAX_ARGS = 32
WINDOW_S = 60.0


@dataclass(frozen=True)
class CallRequest:
    to: str
    agent: str | None
    args: dict[str, Any]
    via: str | None = None


class BadRequest(ValueError):
    pass


def parse_call_request(body: bytes) -> CallRequest:
    """The body of POST /calls, or BadRequest naming what is wrong."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = sorted(set(data) - {"to", "agent", "args", "via"})
    if unknown:
        raise BadRequest(f"unknown key {unknown[0]!r}: the keys are to, agent, args and via")
    to = data.get("to")
    if not isinstance(to, str) or not DESTINATION.fullmatch(to):
        raise BadRequest("to: a phone number (+14155550123) or a sip: URI is required")
    agent = data.get("agent")
    if agent is not None and not isinstance(agent, str):
        raise BadRequest("agent: must be an agent's name")
    args = data.get("args") or {}
    if not isinstance(args, dict) or len(args) > MAX_ARGS:
        raise BadRequest(f"args: must be an object of at most {MAX_ARGS} values")
    for key, value in args.items():
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise BadRequest(f"args.{key}: must be a string or a whole number")
    via = data.get("via")
    if via is not None and via not in VIAS:
        raise BadRequest(f"via: one of {', '.join(VIAS)}")
    return CallRequest(to, agent, dict(args), via)


class RateLimit:
    """At most `per_minute` calls in any sliding minute."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._times: deque[float] = deque()

    def take(self) -> float | None:
        """None when a call may go now (and counts it), else seconds until one may."""
        now = self._clock()
        while self._times and now - self._times[0] >= WINDOW_S:
            self._times.popleft()
        if len(self._times) >= self.per_minute:
            return WINDOW_S - (now - self._times[0])
        self._times.append(now)
        return None


PlaceCall = Callable[[CallRequest], Awaitable[str]]  # -> the call id; raises LookupError/...
# A carrier's callback: (call id, key, the request) -> the reply.
OnCallback = Callable[[str, str, Callback], Reply]


class NoWayOut(Exception):
    """POST /calls names a way out that is not configured (409)."""


class ControlApi:
    """The aiohttp app and its runner on `host:port`."""

    def __init__(
        self,
        *,
        tokens: Sequence[str],
        place: PlaceCall,
        rate_limits: Mapping[str, RateLimit],
        default_via: Callable[[], str | None],
        on_callback: OnCallback | None = None,
        drain: Callable[[], dict[str, Any]] | None = None,
        busy: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._tokens = [t.encode() for t in tokens]
        self._place = place
        self._rates = dict(rate_limits)
        self._default_via = default_via
        self._on_callback = on_callback
        self._drain = drain
        self._busy = busy  # why no call can be placed now (draining, full), or None
        self._runner: web.AppRunner | None = None
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/calls", self._calls)
        app.router.add_route("GET", CALLBACK_PREFIX + "{call_id}", self._callback)
        app.router.add_route("POST", CALLBACK_PREFIX + "{call_id}", self._callback)
        app.router.add_post("/admin/drain", self._admin_drain)
        return app

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_port=reuse_port or None)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else port
        log.info("control API on http %s:%d (POST /calls, POST /admin/drain)", host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        presented = token.strip().encode()
        return any(hmac.compare_digest(presented, known) for known in self._tokens)

    async def _admin_drain(self, request: web.Request) -> web.Response:
        if not self._tokens:
            return _error(401, "draining needs server.api_tokens: none is configured")
        if not self._authorized(request):
            return _error(401, "a valid API token is required (Authorization: Bearer ...)")
        if self._drain is None:
            return _error(409, "this server cannot drain")
        return web.json_response(self._drain(), status=202)

    async def _calls(self, request: web.Request) -> web.Response:
        if not self._tokens:
            return _error(401, "placing calls needs server.api_tokens: none is configured")
        if not self._authorized(request):
            return _error(401, "a valid API token is required (Authorization: Bearer ...)")
        refusal = self._busy()
        if refusal is not None:
            response = _error(503, refusal)
            response.headers["Retry-After"] = str(BUSY_RETRY_AFTER_S)
            return response
        try:
            call = parse_call_request(await request.read())
        except BadRequest as exc:
            return _error(400, str(exc))
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
        via = call.via or self._default_via()
        if via is None:
            return _error(
                409, "nowhere to place calls: configure sip.trunk or a carrier (carriers.*)"
            )
        rate = self._rates.get(via)
        if rate is not None:
            wait_s = rate.take()
            if wait_s is not None:
                response = _error(429, f"at most {rate.per_minute} placed calls a minute")
                response.headers["Retry-After"] = str(max(1, round(wait_s)))
                return response
        try:
            call_id = await self._place(CallRequest(call.to, call.agent, call.args, via))
        except NoWayOut as exc:
            return _error(409, str(exc))

        except LookupError as exc:
            return _error(404, str(exc.args[0]) if exc.args else "no such agent")
        return web.json_response(
            {"call_id": call_id, "status": "dialing", "record": f"/calls/{call_id}"}, status=202
        )

    async def _callback(self, request: web.Request) -> web.Response:
        """A carrier's status callback for a placed call: the key in its URL, no token."""
        if self._on_callback is None:
            return _error(404, "no carrier places calls here")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
        form: dict[str, str] = dict(request.query)
        form.pop("key", None)
        if request.content_type == "application/x-www-form-urlencoded":
            form = {k: v for k, v in parse_qsl(body.decode("utf-8", "replace"), True)}
        callback = Callback(request.method, str(request.url), dict(request.headers), body, form)
        reply = self._on_callback(
            request.match_info["call_id"], request.query.get("key", ""), callback
        )
        return web.Response(status=reply.code, text=reply.body, content_type=reply.content_type)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)

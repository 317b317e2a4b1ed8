"""The control API: `POST /calls` places a call, on its own port (`server.control_listen`).

Why a second port: the main port is the `websockets` server, whose HTTP side reads GET
requests only (it is a WebSocket handshake parser: websockets.http11.Request refuses any other
method), and placing a call is a POST with a body. aiohttp (already installed with the openai
SDK's aiohttp extra) serves this small API; operators keep it off the public balancer.

    POST /calls  Authorization: Bearer <API token>
    {"to": "+14155550123" | "sip:bob@10.0.0.7", "agent": "booking", "args": {"name": "Ada"}}
    -> 202 {"call_id": "...", "status": "dialing", "record": "/calls/<call_id>"}

    POST /admin/drain  Authorization: Bearer <API token>
    -> 202 {"status": "draining", "phase": "draining", "live_calls": 3, "deadline_in_s": 600, ...}

drains the server (voice_agent/server/drain.py, as SIGTERM does): new calls are refused, live
ones run until `server.drain_deadline_s`, and the process exits after its last call. Asking
again changes nothing and answers the same way.

The call's record (`GET /calls/<call_id>` on the main port) has the agent's conversation once
the callee answers; a call never answered ends `busy`, `no_answer` or `failed` with what the
far end said. Refusals: 401 without a valid token (an open dialer is toll fraud: this API
takes no call without `server.api_tokens`), 400 for a body that is not the object above (the
key is named), 404 for an unknown agent, 409 without `sip.trunk`, 429 past the trunk's
`calls_per_minute` (with Retry-After).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from voice_agent.runtime.call_control import DESTINATION

log = logging.getLogger("voice_agent.server")

MAX_BODY_BYTES = 16 * 1024
MAX_ARGS = 32
WINDOW_S = 60.0


@dataclass(frozen=True)
class CallRequest:
    to: str
    agent: str | None
    args: dict[str, Any]


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
    unknown = sorted(set(data) - {"to", "agent", "args"})
    if unknown:
        raise BadRequest(f"unknown key {unknown[0]!r}: the keys are to, agent and args")
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
    return CallRequest(to, agent, dict(args))


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


class ControlApi:
    """The aiohttp app and its runner on `host:port`."""

    def __init__(
        self,
        *,
        tokens: Sequence[str],
        place: PlaceCall,
        rate_limit: RateLimit | None,
        has_trunk: bool,
        drain: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self._tokens = [t.encode() for t in tokens]
        self._place = place
        self._rate = rate_limit
        self._has_trunk = has_trunk
        self._drain = drain
        self._runner: web.AppRunner | None = None
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/calls", self._calls)
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
        if not self._has_trunk:
            return _error(409, "no sip.trunk is configured: there is nowhere to place calls")
        try:
            call = parse_call_request(await request.read())
        except BadRequest as exc:
            return _error(400, str(exc))
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
        if self._rate is not None:
            wait_s = self._rate.take()
            if wait_s is not None:
                response = _error(429, f"at most {self._rate.per_minute} placed calls a minute")
                response.headers["Retry-After"] = str(max(1, round(wait_s)))
                return response
        try:
            call_id = await self._place(call)
        except LookupError as exc:
            return _error(404, str(exc.args[0]) if exc.args else "no such agent")
        return web.json_response(
            {"call_id": call_id, "status": "dialing", "record": f"/calls/{call_id}"}, status=202
        )


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)

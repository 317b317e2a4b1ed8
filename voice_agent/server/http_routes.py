"""The main port's plain HTTP answers: health, metrics, the agents, the call records and their
recordings, the viewer and the page files, and Plivo's transfer XML.

`websockets` parses every request on the main port; `VoiceServer.process_request` checks
access and admits the calls' WebSocket upgrades, then hands every other request here. Only
GET reaches this far (the handshake parser takes nothing else); `POST /calls` is the control
API's, on its own port.
"""

from __future__ import annotations

import asyncio
import http
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from voice_agent import __version__
from voice_agent.callcontrol.plivo_rest import PLIVO_DIAL_PATH, dial_response
from voice_agent.gateways.webrtc import AVAILABLE as WEBRTC_AVAILABLE
from voice_agent.pipeline.recording import FORMATS, find_recording, recordings_dir
from voice_agent.server.pages import calls_view_response, static_response

if TYPE_CHECKING:
    from voice_agent.server.app import VoiceServer

__all__ = ["answer_http", "json_response"]


def json_response(status: http.HTTPStatus, body: Any) -> Response:
    data = json.dumps(body, ensure_ascii=False, default=str).encode()
    headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return Response(status.value, status.phrase, headers, data)


async def answer_http(server: VoiceServer, path: str, request: Request) -> Response:
    """The answer to a request for `path` (the request target without its query)."""
    if path == PLIVO_DIAL_PATH:
        plivo = server.carrier_apis.plivo
        return dial_response(request.path, plivo.dial_key if plivo is not None else None)
    if path == "/healthz":
        return _health(server)
    if path == "/metrics":
        shared = server.shared_metrics
        body, content_type = shared.render() if shared is not None else server.metrics.render()
        headers = Headers([("Content-Type", content_type), ("Content-Length", str(len(body)))])
        return Response(http.HTTPStatus.OK.value, "OK", headers, body)
    if path == "/agents":
        return json_response(http.HTTPStatus.OK, _agents(server))
    viewer = calls_view_response(path)
    if viewer is not None:
        return viewer
    if path == "/calls":
        return await _list_calls(server, request)
    if path.startswith("/calls/") and path.endswith("/recording"):
        return await _recording(server, path[len("/calls/") : -len("/recording")])
    if path.startswith("/calls/"):
        call = await server.store.get(path[len("/calls/") :])
        if call is None:
            return json_response(http.HTTPStatus.NOT_FOUND, {"error": "no such call"})
        return json_response(http.HTTPStatus.OK, call)
    page = static_response(path)
    if page is not None:
        return page
    return json_response(http.HTTPStatus.NOT_FOUND, {"error": f"nothing at {path}"})


def _health(server: VoiceServer) -> Response:
    # 503 while draining: a balancer's health check (HAProxy's httpchk) takes the host out
    # of rotation; the body says why, and how long the live calls have left.
    draining = server.drain_state.status(time.monotonic(), server.live.live_count())
    return json_response(
        http.HTTPStatus.SERVICE_UNAVAILABLE if server.drain_state.draining else http.HTTPStatus.OK,
        {
            **draining,
            "version": __version__,
            "webrtc_peers": len(server.rtc.peers),
            "worker": server.worker_id,
            "pid": os.getpid(),
            "loop_lag_ms": round(server.loop_lag_ms, 1),
            "loop_lag_max_ms": round(server.loop_lag_max_ms, 1),
            "refused_calls": server.refused_calls,
            # Each registrar's last word on this server's binding (sip.registrations).
            "sip_registrations": server.sip.registrations.states if server.sip else {},
            "sip_trunk": server.sip.registrations.trunk_state if server.sip else None,
            # For leak soaks: these return to their idle values between calls.
            "asyncio_tasks": len(asyncio.all_tasks()),
            "threads": threading.active_count(),
        },
    )


def _agents(server: VoiceServer) -> dict[str, Any]:
    return {
        "default": server.registry.loaded.config.default_agent,
        "agents": [
            {"name": name, "description": agent.config.description}
            for name, agent in server.registry.agents.items()
        ],
        "webrtc": WEBRTC_AVAILABLE,
        "ice_servers": server.rtc.ice_servers(),
    }


async def _recording(server: VoiceServer, call_id: str) -> Response:
    # Found by listing the recordings folder, never by a path built from the request.
    found = await asyncio.to_thread(find_recording, recordings_dir(server.data_dir), call_id)
    if found is None:
        return json_response(http.HTTPStatus.NOT_FOUND, {"error": "no recording of that call"})
    path, format_name = found
    body = await asyncio.to_thread(path.read_bytes)
    headers = Headers(
        [
            ("Content-Type", FORMATS[format_name].media_type),
            ("Content-Length", str(len(body))),
            ("Content-Disposition", f'inline; filename="{path.name}"'),
        ]
    )
    return Response(http.HTTPStatus.OK.value, "OK", headers, body)


async def _list_calls(server: VoiceServer, request: Request) -> Response:
    query = parse_qs(urlsplit(request.path).query)

    def one(name: str) -> str | None:
        values = query.get(name)
        return values[0] if values else None

    try:
        page = await server.store.list_calls(
            limit=int(one("limit") or 50),
            offset=int(one("offset") or 0),
            agent=one("agent"),
            outcome=one("outcome"),
            since=one("since"),
            until=one("until"),
            text=one("text") or one("q"),
        )
    except ValueError as exc:
        return json_response(http.HTTPStatus.BAD_REQUEST, {"error": str(exc)})
    return json_response(http.HTTPStatus.OK, page)

"""OpenAIStandIn, a real OpenAI-compatible chat-completions server on 127.0.0.1 for tests, and
Reply, the scripted answer (text, tool calls, HTTP errors, broken or stalled streams)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web


@dataclass
class Reply:
    """One scripted answer to one chat-completions request.

    The streamed form is what OpenAI sends: a role chunk, the text in `chunk_chars` pieces, each
    tool call as a header fragment then its arguments in `chunk_chars` pieces, a chunk carrying
    finish_reason, an optional usage chunk, then `data: [DONE]`. "Chunks" below count every
    `data: {...}` event of that sequence, the role chunk included. A non-streaming request gets
    the same content as one chat.completion object; `delay_s` is then waited once, `malformed`
    cuts the JSON in half and `stall_after_chunks` (any value) hangs before answering.
    """

    text: str = ""
    # (name, arguments): a mapping is sent as its JSON, a str is sent as is (e.g. invalid JSON).
    tool_calls: Sequence[tuple[str, Mapping[str, Any] | str]] = ()
    chunk_chars: int = 4
    delay_s: float = 0.0
    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    malformed: bool = False
    stall_after_chunks: int | None = None
    # The extras below have defaults that keep the reply an ordinary one.
    error_message: str | None = None  # the error body's message when `status` is set
    malformed_after_chunks: int = 1  # where the broken chunk goes; 1 = before any content
    truncate_after_chunks: int | None = None  # end the body cleanly without finish_reason/[DONE]
    hold: asyncio.Event | None = None  # wait for this event after `hold_after_chunks` chunks
    hold_after_chunks: int = 2
    interleave_tool_calls: bool = False  # send the calls' fragments round-robin
    finish_reason: str | None = None  # default: "tool_calls" when there are calls, else "stop"


Responder = Callable[[dict[str, Any]], Reply]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_denied",
    404: "invalid_request_error",
    429: "rate_limit_exceeded",
}


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _arguments_text(arguments: Mapping[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(dict(arguments))


class OpenAIStandIn:
    """A chat-completions server answering from a script of `Reply`s, then from `responder`.

    Use as `async with OpenAIStandIn() as server:` (or `await start()` / `await close()`), point a
    client at `server.base_url`, queue answers with `server.script(...)`, and inspect
    `server.requests`. Tool-call ids are "call_1", "call_2", ... numbered across the server's life.
    With nothing scripted and no responder every chat request gets HTTP 500 saying so.
    """

    def __init__(
        self,
        *,
        sock: socket.socket | None = None,
        models: Sequence[str] = ("gpt-4o-mini",),
        responder: Responder | None = None,
    ) -> None:
        # A caller-provided socket may be bound but not yet listening: connections to it are
        # refused until start(), which lets a test turn a dead endpoint into a live one.
        self._sock = sock
        self.models = list(models)
        self.responder: Responder | None = responder
        self.requests: list[dict[str, Any]] = []
        self.last_api_key: str | None = None
        self.disconnects = 0
        self.completed = 0  # responses sent in full ([DONE] written, or the JSON body)
        self._queue: deque[Reply | Responder] = deque()
        self._next_call_id = 1
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> OpenAIStandIn:
        if self._sock is None:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._sock.bind(("127.0.0.1", 0))
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        # handler_cancellation: a client that goes away while a stream sleeps or stalls must be
        # noticed at once, not at the next write.
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        await runner.setup()
        await web.SockSite(runner, self._sock).start()
        self._runner = runner
        host, port = self._sock.getsockname()[:2]
        self.base_url = f"http://{host}:{port}/v1"
        return self

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._sock is not None:
            self._sock.close()

    async def __aenter__(self) -> OpenAIStandIn:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ---- scripting and observation ---------------------------------------------------------

    def script(self, *replies: Reply | Responder) -> None:
        """Queue replies, consumed one per chat request; a callable gets the request body."""
        self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """Scripted replies not yet consumed."""
        return len(self._queue)

    async def wait_disconnect(self, count: int = 1) -> None:
        """Return once `count` clients in total have gone away mid-response."""
        while self.disconnects < count:
            await self._changed.wait()

    async def wait_requests(self, count: int) -> None:
        """Return once `count` chat requests in total have been received."""
        while len(self.requests) < count:
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- handlers --------------------------------------------------------------------------

    def _check_auth(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or not header[len("Bearer ") :].strip():
            return self._error_response(
                401, "You didn't provide an API key (Authorization: Bearer ...).", {}
            )
        self.last_api_key = header[len("Bearer ") :].strip()
        return None

    async def _models(self, request: web.Request) -> web.Response:
        if (denied := self._check_auth(request)) is not None:
            return denied
        created = int(time.time())
        data = [
            {"id": m, "object": "model", "created": created, "owned_by": "stand-in"}
            for m in self.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._answer_chat(request)
        except asyncio.CancelledError:
            # With handler_cancellation this is how a client leaving mid-response shows up.
            if not self._closing.is_set():
                self._note_disconnect()
            raise

    async def _answer_chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            return self._error_response(400, f"The request body is not valid JSON: {exc}", {})
        if not isinstance(body, dict):
            return self._error_response(400, "The request body must be a JSON object.", {})
        self.requests.append(body)
        self._notify()
        if (denied := self._check_auth(request)) is not None:
            return denied
        reply = self._next_reply(body)
        if reply is None:
            return self._error_response(
                500,
                "OpenAIStandIn: nothing was scripted for this request "
                f"(request #{len(self.requests)}); call script(...) or set responder",
                {},
            )
        if reply.status is not None:
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            message = reply.error_message or f"OpenAIStandIn scripted HTTP {reply.status}"
            return self._error_response(reply.status, message, reply.headers)
        model = str(body.get("model", ""))
        calls = [
            (f"call_{self._take_call_id()}", name, _arguments_text(args))
            for name, args in reply.tool_calls
        ]
        if body.get("stream"):
            return await self._stream(request, body, reply, model, calls)
        return await self._complete(reply, model, calls)

    def _next_reply(self, body: dict[str, Any]) -> Reply | None:
        if self._queue:
            item = self._queue.popleft()
        elif self.responder is not None:
            item = self.responder
        else:
            return None
        return item if isinstance(item, Reply) else item(body)

    def _take_call_id(self) -> int:
        n = self._next_call_id
        self._next_call_id += 1
        return n

    def _error_response(
        self, status: int, message: str, headers: Mapping[str, str]
    ) -> web.Response:
        error_type = _ERROR_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request"
        )
        body = {"error": {"message": message, "type": error_type, "param": None, "code": None}}
        return web.json_response(body, status=status, headers=dict(headers))

    async def _complete(
        self, reply: Reply, model: str, calls: list[tuple[str, str, str]]
    ) -> web.Response:
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.stall_after_chunks is not None:
            await self._stall()
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text if reply.text or not calls else None,
            "refusal": None,
        }
        if calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in calls
            ]
        document = {
            "id": f"chatcmpl-standin-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self._finish_reason(reply, calls),
                }
            ],
            "usage": self._usage(reply, calls),
        }
        if reply.malformed:
            text = json.dumps(document)
            return web.Response(
                text=text[: len(text) // 2], content_type="application/json", headers=reply.headers
            )
        self.completed += 1
        self._notify()
        return web.json_response(document, headers=dict(reply.headers))

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        reply: Reply,
        model: str,
        calls: list[tuple[str, str, str]],
    ) -> web.StreamResponse:
        chunk_id = f"chatcmpl-standin-{len(self.requests)}"
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }

        chunks = [
            chunk(
                {
                    "role": "assistant",
                    "content": "" if reply.text or not calls else None,
                    "refusal": None,
                }
            )
        ]
        chunks += [chunk({"content": piece}) for piece in _pieces(reply.text, reply.chunk_chars)]
        chunks += [chunk({"tool_calls": [frag]}) for frag in self._call_fragments(reply, calls)]
        chunks.append(chunk({}, self._finish_reason(reply, calls)))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            usage = chunk({})
            usage["choices"] = []
            usage["usage"] = self._usage(reply, calls)
            chunks.append(usage)

        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **reply.headers,
            }
        )
        try:
            await response.prepare(request)
            for sent, data in enumerate(chunks):
                if reply.stall_after_chunks is not None and sent == reply.stall_after_chunks:
                    await self._stall()
                    return response
                if reply.truncate_after_chunks is not None and sent == reply.truncate_after_chunks:
                    await response.write_eof()
                    return response
                if reply.hold is not None and sent == reply.hold_after_chunks:
                    await reply.hold.wait()
                if reply.malformed and sent == reply.malformed_after_chunks:
                    await response.write(b'data: {"id": "' + chunk_id.encode() + b'", "choi\n\n')
                    await response.write_eof()
                    return response
                if reply.delay_s:
                    await asyncio.sleep(reply.delay_s)
                await response.write(f"data: {json.dumps(data)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            self._note_disconnect()
            return response
        self.completed += 1
        self._notify()
        return response

    def _call_fragments(
        self, reply: Reply, calls: list[tuple[str, str, str]]
    ) -> list[dict[str, Any]]:
        per_call: list[list[dict[str, Any]]] = []
        for index, (cid, name, args) in enumerate(calls):
            head = {
                "index": index,
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            tail = [
                {"index": index, "function": {"arguments": piece}}
                for piece in _pieces(args, reply.chunk_chars)
            ]
            per_call.append([head, *tail])
        if not reply.interleave_tool_calls:
            return [frag for frags in per_call for frag in frags]
        out: list[dict[str, Any]] = []
        for position in range(max((len(f) for f in per_call), default=0)):
            out += [frags[position] for frags in per_call if position < len(frags)]
        return out

    def _note_disconnect(self) -> None:
        self.disconnects += 1
        self._notify()

    async def _stall(self) -> None:
        # Hang until the client goes away (handler cancellation) or the server closes.
        await self._closing.wait()

    @staticmethod
    def _finish_reason(reply: Reply, calls: list[tuple[str, str, str]]) -> str:
        if reply.finish_reason is not None:
            return reply.finish_reason
        return "tool_calls" if calls else "stop"

    @staticmethod
    def _usage(reply: Reply, calls: list[tuple[str, str, str]]) -> dict[str, int]:
        completion = len(reply.text.split()) + sum(len(args) // 4 + 1 for _, _, args in calls)
        return {"prompt_tokens": 1, "completion_tokens": completion, "total_tokens": completion + 1}

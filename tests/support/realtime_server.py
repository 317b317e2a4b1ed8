"""RealtimeStandIn: a Realtime-protocol server on 127.0.0.1 for tests, the way OpenAI's Realtime
API behaves as its API reference (and the `openai` SDK's event types) describe it, and
ModelReply, one scripted response.

What it does, event by event (GA names):
- On connect: `session.created`. `session.update` merges the session and answers
  `session.updated`.
- `conversation.item.create`: the item is kept (the client's id, else one made here; an id in
  use is an error), answered `conversation.item.added` then `conversation.item.done`; a user
  audio item, when the session asks for input transcription, then gets
  `conversation.item.input_audio_transcription.completed` (with `heard_as`: no recogniser here).
- `conversation.item.delete`: the item goes, `conversation.item.deleted`; an unknown id is an
  error.
- `conversation.item.truncate`: only an assistant message with audio; `audio_end_ms` past the
  audio's length is an error. The audio is cut there and the item's text transcript deleted
  (the reference: "Truncating audio will delete the server-side text transcript"), answered
  `conversation.item.truncated`.
- `response.create`: the next scripted reply, as `response.created`, per output item
  `response.output_item.added`, for a message `response.content_part.added`, the audio in
  `response.output_audio.delta` pieces each after its transcript's
  `response.output_audio_transcript.delta`, the `.done` events, `response.output_item.done`, then
  `response.done` with the response's status and items (no audio in it). A function call
  streams `response.function_call_arguments.delta` pieces and `.done`. A second
  `response.create` while one runs is an error (`conversation_already_has_active_response`).
- `response.cancel`: the running response stops, `response.done` with status `cancelled`; with
  none running, an error (`response_cancel_not_active`).
- Anything else: an `invalid_request_error` naming the event type. Every error names the
  client's `event_id` that caused it.

Refusals and limits, as the service gives them (set per test):
- `api_key`: a request without `Authorization: Bearer <it>` is refused at the handshake with
  HTTP 401 and OpenAI's JSON error body (`invalid_api_key`), as OpenAI's REST endpoints do.
- `models`: a session for a model not in it gets an `error` event (`model_not_found`, OpenAI's
  wording "The model `x` does not exist or you do not have access to it.") and is closed.
- `max_session_s`: a session that has run this long gets an `error` event (`session_expired`,
  "Your session hit the maximum duration of ...", what OpenAI sends at its limit of an hour; the
  reference does not list it, clients in the wild match that code) and is closed, a response
  under way cut off with it.

The reply's audio is a TTS (eSpeak NG, or Piper) speaking its text word by word, so the
stand-in knows where each word ends: `heard_words(item)` is the words of an assistant item
within its (truncated) audio; a text said once is not synthesised again. Audio is sent faster
than real time, as the real service does (`realtime_factor`).

Sessions are independent (each WebSocket has its own conversation and response), so a load run
can hold hundreds; what tests read (`items`, `audio`) is the latest session's. Scripted replies
are taken in order by whichever session asks; with none left, `default_reply`. `record=False`
keeps no copy of the events received (a load run's memory).
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import WSMsgType, web

from voice_agent.audio.codec import CarrierFormat
from voice_agent.audio.resample import resample
from voice_agent.engines.tts import TtsConfig, make_tts

_FORMATS = {"audio/pcm": ("pcm16", 24000), "audio/pcmu": ("mulaw", 8000)}
_FORMATS["audio/pcma"] = ("alaw", 8000)


@dataclass
class ModelReply:
    """One scripted response: `text` spoken (then its tool calls), or an error."""

    text: str = ""
    tool_calls: Sequence[tuple[str, Mapping[str, Any]]] = ()
    delay_s: float = 0.0  # before the first event after response.created
    error: str | None = None  # answer with this error event instead
    drop_socket: bool = False  # close the WebSocket instead of answering
    # Messages sent as they are after response.created, before the reply: a broken endpoint.
    raw_before: Sequence[str] = ()


@dataclass
class _Audio:
    data: bytes
    format: str
    ends_ms: list[tuple[str, float]] = field(default_factory=list)  # (word, end)


@dataclass
class _Connection:
    """One session: its socket, settings, conversation and the response it is giving."""

    ws: web.WebSocketResponse
    session: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)
    audio: dict[str, _Audio] = field(default_factory=dict)  # assistant item id -> its audio
    response: asyncio.Task[None] | None = None


def _ms(data: bytes, fmt: str) -> float:
    encoding, rate = _FORMATS[fmt]
    return len(data) / CarrierFormat(encoding, rate).bytes_per_ms  # type: ignore[arg-type]


class RealtimeStandIn:
    def __init__(
        self,
        *,
        realtime_factor: float = 4.0,
        piece_ms: float = 100.0,
        voice: str = "espeak",
        record: bool = True,
        api_key: str | None = None,
        models: Sequence[str] | None = None,
        max_session_s: float | None = None,
    ) -> None:
        self.api_key = api_key
        self.models = models
        self.max_session_s = max_session_s
        self.realtime_factor = realtime_factor
        self.piece_ms = piece_ms
        self.record = record
        self.replies: list[ModelReply] = []
        self.default_reply = ModelReply(text="I have nothing to say.")
        self.sessions: list[dict[str, Any]] = []
        self.received: list[str] = []  # every client event as sent, in order
        self.errors: list[dict[str, Any]] = []
        self.open_sessions = 0
        # What its input transcription says of any caller audio (when the session asks for one).
        self.heard_as = "a table for two please"
        # The model's voice: eSpeak NG, or Piper's joe ("piper") where Whisper must read it.
        config = TtsConfig(provider="piper") if voice == "piper" else TtsConfig(provider="espeak")
        self._tts = make_tts(config)
        self._spoken: dict[tuple[str, str], _Audio] = {}
        self._latest: _Connection | None = None
        self._runner: web.AppRunner | None = None
        self._changed = asyncio.Event()
        self.port = 0

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> RealtimeStandIn:
        app = web.Application()
        app.router.add_get("/v1/realtime", self._session)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock)
        await site.start()
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self._tts.aclose()

    async def __aenter__(self) -> RealtimeStandIn:
        return await self.start()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def script(self, *replies: ModelReply) -> None:
        self.replies.extend(replies)

    async def until(self, predicate: Any, timeout_s: float = 30.0) -> None:
        """Wait until `predicate()` holds, checked whenever an event has been handled."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

    # ---- what tests read ---------------------------------------------------------------

    @property
    def items(self) -> list[dict[str, Any]]:
        """The conversation of the latest session."""
        return self._latest.items if self._latest is not None else []

    @property
    def audio(self) -> dict[str, _Audio]:
        """The latest session's assistant audio, by item id."""
        return self._latest.audio if self._latest is not None else {}

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in map(json.loads, self.received) if e.get("type") == kind]

    def assistant_items(self) -> list[dict[str, Any]]:
        return [i for i in self.items if i.get("type") == "message" and i["role"] == "assistant"]

    def heard_words(self, item: Mapping[str, Any]) -> list[str]:
        """The words of an assistant item whose audio is in it (all of it, or up to the cut)."""
        audio = self.audio.get(str(item["id"]))
        if audio is None:
            return [str(p.get("text", "")) for p in item["content"]]
        length = _ms(audio.data, audio.format)
        return [word for word, end in audio.ends_ms if end <= length + 1]

    # ---- the session -------------------------------------------------------------------

    async def _session(self, request: web.Request) -> web.StreamResponse:
        if self.api_key is not None and request.headers.get("Authorization") != (
            f"Bearer {self.api_key}"
        ):
            error = {
                "message": "Incorrect API key provided.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
            return web.json_response({"error": error}, status=401)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        session: dict[str, Any] = {
            "id": f"sess_{uuid.uuid4().hex[:16]}",
            "type": "realtime",
            "model": request.query.get("model", ""),
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}}},
        }
        if self.record:
            self.sessions.append(session)
        conn = self._latest = _Connection(ws, session)
        self.open_sessions += 1
        limit = None
        if self.max_session_s is not None:
            limit = asyncio.get_running_loop().call_later(
                self.max_session_s, lambda: asyncio.ensure_future(self._expire(conn))
            )
        try:
            await self._send(conn, {"type": "session.created", "session": session})
            asked = session["model"]
            if self.models is not None and asked not in self.models:
                refusal = f"The model `{asked}` does not exist or you do not have access to it."
                await self._error(conn, {}, "model_not_found", refusal)
                await ws.close()
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    continue
                if self.record:
                    self.received.append(message.data)
                try:
                    await self._handle(conn, json.loads(message.data))
                except ConnectionResetError:
                    break
                self._changed.set()
        finally:
            if limit is not None:
                limit.cancel()
            self.open_sessions -= 1
            if conn.response is not None:
                conn.response.cancel()
            self._changed.set()
        return ws

    async def _expire(self, conn: _Connection) -> None:
        minutes = (self.max_session_s or 0) / 60
        message = f"Your session hit the maximum duration of {minutes:g} minutes."
        if conn.response is not None:
            conn.response.cancel()
        await self._error(conn, {}, "session_expired", message)
        await conn.ws.close()

    async def _send(self, conn: _Connection, event: dict[str, Any]) -> None:
        if not conn.ws.closed:
            event = {"event_id": f"event_{uuid.uuid4().hex[:12]}", **event}
            await conn.ws.send_str(json.dumps(event))

    async def _error(
        self, conn: _Connection, cause: Mapping[str, Any], code: str, message: str
    ) -> None:
        error = {
            "type": "invalid_request_error",
            "code": code,
            "message": message,
            "event_id": cause.get("event_id"),
        }
        self.errors.append(error)
        await self._send(conn, {"type": "error", "error": error})

    async def _handle(self, conn: _Connection, event: dict[str, Any]) -> None:
        kind = event.get("type")
        session = conn.session
        if kind == "session.update":
            update = event.get("session", {})
            for key, value in update.items():
                session[key] = value
            await self._send(conn, {"type": "session.updated", "session": session})
        elif kind == "conversation.item.create":
            await self._create_item(conn, event)
        elif kind == "conversation.item.delete":
            item = self._item(conn, event.get("item_id"))
            if item is None:
                await self._error(
                    conn, event, "item_not_found", f"no item {event.get('item_id')!r}"
                )
                return
            conn.items.remove(item)
            await self._send(conn, {"type": "conversation.item.deleted", "item_id": item["id"]})
        elif kind == "conversation.item.truncate":
            await self._truncate(conn, event)
        elif kind == "response.create":
            if conn.response is not None and not conn.response.done():
                await self._error(
                    conn,
                    event,
                    "conversation_already_has_active_response",
                    "Conversation already has an active response in progress",
                )
                return
            conn.response = asyncio.ensure_future(self._respond(conn, event))
        elif kind == "response.cancel":
            if conn.response is None or conn.response.done():
                await self._error(conn, event, "response_cancel_not_active", "no active response")
                return
            conn.response.cancel()
        else:
            await self._error(conn, event, "unknown_event", f"unsupported event type {kind!r}")

    def _item(self, conn: _Connection, item_id: Any) -> dict[str, Any] | None:
        return next((i for i in conn.items if i.get("id") == item_id), None)

    async def _create_item(self, conn: _Connection, event: dict[str, Any]) -> None:
        item = dict(event.get("item", {}))
        item.setdefault("id", f"item_{uuid.uuid4().hex[:16]}")
        if self._item(conn, item["id"]) is not None:
            await self._error(conn, event, "item_id_in_use", f"item {item['id']!r} exists")
            return
        if len(str(item["id"])) > 32:
            await self._error(conn, event, "invalid_value", "an item id is at most 32 characters")
            return
        previous = conn.items[-1]["id"] if conn.items else None
        conn.items.append(item)
        for kind in ("conversation.item.added", "conversation.item.done"):
            await self._send(conn, {"type": kind, "previous_item_id": previous, "item": item})
        transcribing = conn.session.get("audio", {}).get("input", {}).get("transcription")
        audio = [p for p in item.get("content", ()) if p.get("type") == "input_audio"]
        if transcribing and audio:
            # Run apart from any response, as the API's is; the stand-in "hears" a fixed line.
            await self._send(
                conn,
                {
                    "type": "conversation.item.input_audio_transcription.completed",
                    "item_id": item["id"],
                    "content_index": 0,
                    "transcript": self.heard_as,
                    "usage": {"type": "duration", "seconds": 1.0},
                },
            )

    async def _truncate(self, conn: _Connection, event: dict[str, Any]) -> None:
        item = self._item(conn, event.get("item_id"))
        audio = conn.audio.get(str(event.get("item_id")))
        if item is None or item.get("role") != "assistant" or audio is None:
            await self._error(
                conn, event, "invalid_item", "only assistant audio items can be truncated"
            )
            return
        end_ms = int(event.get("audio_end_ms", -1))
        length = _ms(audio.data, audio.format)
        if end_ms < 0 or end_ms > length + 1:
            await self._error(
                conn,
                event,
                "invalid_value",
                f"audio_end_ms {end_ms} is past the audio ({length:.0f})",
            )
            return
        encoding, rate = _FORMATS[audio.format]
        per_ms = CarrierFormat(encoding, rate).bytes_per_ms  # type: ignore[arg-type]
        keep = int(end_ms * per_ms)
        keep -= keep % CarrierFormat(encoding, rate).sample_bytes  # type: ignore[arg-type]
        audio.data = audio.data[:keep]
        item["content"] = [{"type": "output_audio", "transcript": None}]
        await self._send(
            conn,
            {
                "type": "conversation.item.truncated",
                "item_id": item["id"],
                "content_index": 0,
                "audio_end_ms": end_ms,
            },
        )

    # ---- responses ---------------------------------------------------------------------

    async def _speak(self, text: str, fmt: str) -> _Audio:
        spoken = self._spoken.get((text, fmt))
        if spoken is not None:  # a copy: a truncate cuts one item's audio, not the text's
            return _Audio(spoken.data, fmt, list(spoken.ends_ms))
        encoding, rate = _FORMATS[fmt]
        target = CarrierFormat(encoding, rate)  # type: ignore[arg-type]
        audio = _Audio(b"", fmt)
        for word in text.split():
            pcm = b"".join([chunk.pcm async for chunk in self._tts.synthesize(word)])
            data = target.encode(resample(pcm, self._tts.sample_rate, rate))
            audio.data += data
            audio.ends_ms.append((word, _ms(audio.data, fmt)))
        self._spoken[(text, fmt)] = _Audio(audio.data, fmt, list(audio.ends_ms))
        return audio

    async def _respond(self, conn: _Connection, event: Mapping[str, Any]) -> None:
        response_id = f"resp_{uuid.uuid4().hex[:16]}"
        response: dict[str, Any] = {"id": response_id, "status": "in_progress", "output": []}
        reply = self.replies.pop(0) if self.replies else self.default_reply
        if reply.drop_socket:
            await conn.ws.close()
            return
        if reply.error is not None:
            await self._error(conn, event, "server_error", reply.error)
            return
        await self._send(conn, {"type": "response.created", "response": response})
        for text in reply.raw_before:
            await conn.ws.send_str(text)
        fmt = (
            conn.session.get("audio", {})
            .get("output", {})
            .get("format", {})
            .get("type", "audio/pcm")
        )
        status = "completed"
        try:
            await asyncio.sleep(reply.delay_s)
            index = 0
            if reply.text:
                await self._message(conn, response, index, reply.text, fmt)
                index += 1
            for name, arguments in reply.tool_calls:
                await self._function_call(conn, response, index, name, arguments)
                index += 1
        except asyncio.CancelledError:
            status = "cancelled"
        response["status"] = status
        if status == "cancelled":
            response["status_details"] = {"type": "cancelled", "reason": "client_cancelled"}
        await asyncio.shield(self._send(conn, {"type": "response.done", "response": response}))

    async def _message(
        self, conn: _Connection, response: dict[str, Any], index: int, text: str, fmt: str
    ) -> None:
        item_id = f"item_{uuid.uuid4().hex[:16]}"
        voiced = conn.session.get("output_modalities", ["audio"]) == ["audio"]
        part_type = "output_audio" if voiced else "output_text"
        item: dict[str, Any] = {
            "id": item_id,
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        conn.items.append(item)
        response["output"].append(item)
        where = {"response_id": response["id"], "item_id": item_id, "output_index": index}
        added = {"response_id": response["id"], "output_index": index, "item": item}
        await self._send(conn, {"type": "response.output_item.added", **added})
        part = {"type": part_type, "transcript": ""} if voiced else {"type": part_type, "text": ""}
        item["content"] = [part]
        await self._send(
            conn, {"type": "response.content_part.added", "content_index": 0, "part": part, **where}
        )
        at = {**where, "content_index": 0}
        if not voiced:
            for word in text.split(" "):
                part["text"] += ("" if not part["text"] else " ") + word
                delta = word if part["text"] == word else " " + word
                await self._send(conn, {"type": "response.output_text.delta", "delta": delta, **at})
            await self._send(conn, {"type": "response.output_text.done", "text": text, **at})
        else:
            audio = conn.audio[item_id] = await self._speak(text, fmt)
            said = 0
            step = int(self.piece_ms * CarrierFormat(*_FORMATS[fmt]).bytes_per_ms)  # type: ignore[arg-type]
            step -= step % 2
            whole = audio.data
            for start in range(0, len(whole), step):
                piece = whole[start : start + step]
                sent_ms = _ms(whole[: start + len(piece)], fmt)
                words = [w for w, end in audio.ends_ms if end <= sent_ms + self.piece_ms]
                if len(words) > said:
                    delta = " ".join(words[said:])
                    delta = delta if said == 0 else " " + delta
                    part["transcript"] += delta
                    said = len(words)
                    kind = "response.output_audio_transcript.delta"
                    await self._send(conn, {"type": kind, "delta": delta, **at})
                encoded = base64.b64encode(piece).decode("ascii")
                await self._send(
                    conn, {"type": "response.output_audio.delta", "delta": encoded, **at}
                )
                await asyncio.sleep(self.piece_ms / 1000 / self.realtime_factor)
            await self._send(conn, {"type": "response.output_audio.done", **at})
            transcript = part["transcript"]
            kind = "response.output_audio_transcript.done"
            await self._send(conn, {"type": kind, "transcript": transcript, **at})
        item["status"] = "completed"
        await self._send(
            conn, {"type": "response.content_part.done", "content_index": 0, "part": part, **where}
        )
        await self._send(
            conn,
            {
                "type": "response.output_item.done",
                "response_id": response["id"],
                "output_index": index,
                "item": item,
            },
        )

    async def _function_call(
        self,
        conn: _Connection,
        response: dict[str, Any],
        index: int,
        name: str,
        arguments: Mapping[str, Any],
    ) -> None:
        item_id = f"item_{uuid.uuid4().hex[:16]}"
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        text = json.dumps(arguments)
        item = {
            "id": item_id,
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": name,
            "arguments": "",
        }
        conn.items.append(item)
        response["output"].append(item)
        where = {"response_id": response["id"], "item_id": item_id, "output_index": index}
        added = {"response_id": response["id"], "output_index": index, "item": item}
        await self._send(conn, {"type": "response.output_item.added", **added})
        for start in range(0, len(text), 8):
            kind = "response.function_call_arguments.delta"
            await self._send(
                conn, {"type": kind, "call_id": call_id, "delta": text[start : start + 8], **where}
            )
        item["arguments"] = text
        item["status"] = "completed"
        done = {"call_id": call_id, "name": name, "arguments": text}
        await self._send(conn, {"type": "response.function_call_arguments.done", **done, **where})
        await self._send(
            conn,
            {
                "type": "response.output_item.done",
                "response_id": response["id"],
                "output_index": index,
                "item": item,
            },
        )

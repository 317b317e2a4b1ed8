"""One call's session with a speech-to-speech model over the Realtime protocol, through the
`openai` SDK's realtime client (`client.realtime.connect`, a WebSocket).

The session's conversation is edited item by item from here: the caller's turns go in as
audio items, the model's answers stream out as audio and transcript deltas, tool results go in
as `function_call_output` items, and what the caller did not hear is truncated or deleted.
The owner (brains/realtime.py) decides what goes in; this class only speaks the protocol.

Turn detection stays with the server (`turn_detection: null`): the server's VAD and end-of-turn
rule decide when the caller has finished, as for every other agent, and a response starts only
when asked for (`response.create`).

Every session starts from `restore()`: the call's committed history as text items. That is
nothing at a call's start; when the socket has dropped mid-call (the next request opens a new
session), when the owner `renew()`s a session near the service's time limit, or when the call
was transferred to this agent, the model goes on knowing what was said (not the caller's
earlier audio, which the server does not keep).

A refusal no retry can mend (the key rejected at the handshake, 401/403; the model unknown,
404 or an error event saying so) is a `RealtimeError` with `lasting` set, and the socket
does not try again: every later use raises the same error at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from voice_agent.engines.realtime.formats import AudioFormat

log = logging.getLogger(__name__)

# Sent when no key is configured: local compatible servers ignore it, and the SDK refuses to
# build a client without one.
_PLACEHOLDER_KEY = "no-key-configured"

# The GA event names, then the beta ones some compatible servers still send.
_AUDIO_DELTA = frozenset({"response.output_audio.delta", "response.audio.delta"})
_TRANSCRIPT_DELTA = frozenset(
    {"response.output_audio_transcript.delta", "response.audio_transcript.delta"}
)
_TEXT_DELTA = frozenset({"response.output_text.delta", "response.text.delta"})


# Error codes of the service meaning the key or the model is wrong: no session will open.
_LASTING_CODES = frozenset({"invalid_api_key", "model_not_found", "insufficient_quota"})
_LASTING_STATUS = frozenset({401, 403, 404})
# Codes of errors after which the service closes the session (its time limit); the next use
# opens a new one.
_ENDING_CODES = frozenset({"session_expired"})


class RealtimeError(Exception):
    """The model's session could not be opened or used; `lasting`: it never will be (a wrong
    key or model), so nothing should wait to try again."""

    def __init__(self, message: str, *, lasting: bool = False) -> None:
        super().__init__(message)
        self.lasting = lasting


@dataclass(frozen=True)
class RealtimeSettings:
    model: str = "gpt-realtime"
    voice: str | None = None  # None: the model's default voice
    base_url: str | None = None  # None: OPENAI_BASE_URL, else the SDK's default
    api_key: str | None = None  # None: OPENAI_API_KEY, else a placeholder (local servers)
    # The model's own transcription of the caller's audio, for the record; None: not asked.
    input_transcription: str | None = None
    connect_timeout_s: float = 8.0
    # A response's first event must come within this; later ones within `read_timeout_s`.
    response_timeout_s: float = 12.0
    read_timeout_s: float = 8.0


@dataclass(frozen=True)
class AudioOut:
    item_id: str
    audio: bytes  # in the session's output format


@dataclass(frozen=True)
class TranscriptOut:
    item_id: str
    text: str


@dataclass(frozen=True)
class FunctionCallOut:
    item_id: str
    call_id: str
    name: str
    arguments: str  # the model's JSON text, unchecked


@dataclass(frozen=True)
class ResponseEnd:
    status: str  # "completed", "cancelled", "incomplete", "failed"
    detail: str | None = None


ModelOutput = AudioOut | TranscriptOut | FunctionCallOut | ResponseEnd


def function_tools(chat_tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat-completions tool schemas (`{"type": "function", "function": {...}}`) as the
    Realtime session takes them (the function's fields one level up)."""
    tools: list[dict[str, Any]] = []
    for tool in chat_tools:
        function = tool.get("function", {})
        tools.append(
            {
                "type": "function",
                "name": function.get("name", ""),
                "description": function.get("description", ""),
                "parameters": function.get("parameters", {"type": "object", "properties": {}}),
            }
        )
    return tools


def new_item_id() -> str:
    # The protocol lets the client name its items (at most 32 characters): the owner knows an
    # item's id before the server has seen it, so nothing waits for an acknowledgement.
    return f"va_{uuid.uuid4().hex[:24]}"


class _Response:
    def __init__(self, event_id: str) -> None:
        self.event_id = event_id
        self.id: str | None = None
        self.outputs: asyncio.Queue[ModelOutput] = asyncio.Queue()


class RealtimeSocket:
    """One call's Realtime session: `open`, then items in and responses out, then `close`."""

    def __init__(
        self,
        settings: RealtimeSettings,
        audio: AudioFormat,
        *,
        modality: str = "audio",
        restore: Callable[[], list[dict[str, Any]]] = list,
        on_input_transcript: Callable[[str, str], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.audio = audio
        self.modality = modality  # "audio", or "text" for a call with no voice side
        self._restore = restore
        self._on_input_transcript = on_input_transcript
        self._on_error = on_error
        self._client: Any = None
        self._connection: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._response: _Response | None = None
        self._instructions = ""
        self._tools: list[dict[str, Any]] = []
        # Items this session holds: one made before a reconnect is not here, and a truncate or
        # delete of it would be an error event.
        self._items: set[str] = set()
        self._lock = asyncio.Lock()
        # No response running on the server: a cancelled one runs until its response.done, and
        # a response.create before that is refused (conversation_already_has_active_response).
        self._idle = asyncio.Event()
        self._idle.set()
        self.opened = 0  # sessions opened so far: 2 or more means it reconnected
        self.closed = False
        self._clock = clock
        self._opened_at = 0.0
        self._refused: RealtimeError | None = None  # a lasting refusal: no more tries
        # The service said it is ending the session (its time limit): not open, though the
        # socket may not have closed yet.
        self._ending = False

    # ---- the session -------------------------------------------------------------------

    async def open(self, instructions: str, tools: Sequence[Mapping[str, Any]]) -> None:
        """Open the session (or reopen one that dropped, its conversation restored); on one
        open already, only the instructions are brought up to date."""
        if self.is_open:
            await self.set_instructions(instructions)
            return
        self._instructions = instructions
        self._tools = function_tools(tools)
        await self._ensure_open()

    @property
    def is_open(self) -> bool:
        reading = self._reader is not None and not self._reader.done()
        return self._connection is not None and reading and not self._ending

    @property
    def age_s(self) -> float:
        """How long the open session has run (0 with none open)."""
        return self._clock() - self._opened_at if self.is_open else 0.0

    async def renew(self) -> None:
        """Replace the open session with a new one, restored from the call's history (before the
        service's own limit on a session's length ends it mid-reply)."""
        async with self._lock:
            await self._drop()
        await self._ensure_open()

    async def _ensure_open(self) -> None:
        if self.closed:
            raise RealtimeError("the model's session is closed")
        if self._refused is not None:
            raise self._refused
        if self.is_open:
            return
        async with self._lock:
            if self.is_open:
                return
            await self._drop()
            try:
                await asyncio.wait_for(self._connect(), self.settings.connect_timeout_s)
            except TimeoutError:
                raise RealtimeError(
                    f"no Realtime session within {self.settings.connect_timeout_s:g} s"
                ) from None
            except RealtimeError:
                raise
            except Exception as exc:
                status, said = _handshake_refusal(exc)
                error = RealtimeError(
                    f"cannot open a Realtime session: {_describe(exc)}{said}",
                    lasting=status in _LASTING_STATUS,
                )
                if error.lasting:
                    self._refused = error
                raise error from exc

    async def _connect(self) -> None:
        from openai import AsyncOpenAI  # the SDK's import is paid by the brain at load

        settings = self.settings
        if self._client is None:
            key = settings.api_key or os.environ.get("OPENAI_API_KEY") or _PLACEHOLDER_KEY
            self._client = AsyncOpenAI(base_url=settings.base_url, api_key=key, max_retries=0)
        manager = self._client.realtime.connect(model=settings.model)
        self._connection = await manager.enter()
        self.opened += 1
        self._opened_at = self._clock()
        self._items = set()
        self._ending = False
        try:
            await self._send({"type": "session.update", "session": self._session_config()})
        except RealtimeError:
            # Closed by the service already: the error it sent first says why, if it did.
            await self._confirmed(self._connection)
            raise
        await self._confirmed(self._connection)
        restored = self._restore()
        for item in restored:
            await self._add(item)
        if restored:
            log.info("Realtime session opened, %d items of the call restored", len(restored))
        self._reader = asyncio.get_running_loop().create_task(self._read(self._connection))

    async def _confirmed(self, connection: Any) -> None:
        """Wait for the service to take the session's settings (`session.updated`): a wrong
        model, voice or format is its error here, at open, not a silent socket later."""
        while True:
            try:
                event = await connection.recv()
            except Exception as exc:
                raise RealtimeError(
                    f"the Realtime session closed as it opened: {_describe(exc)}"
                ) from exc
            kind = getattr(event, "type", "")
            if kind == "session.updated":
                return
            if kind == "error":
                code, text = _error_text(event)
                error = RealtimeError(
                    f"the Realtime service refused the session: {text}",
                    lasting=code in _LASTING_CODES,
                )
                if error.lasting:
                    self._refused = error
                raise error

    def _session_config(self) -> dict[str, Any]:
        settings = self.settings
        audio_in: dict[str, Any] = {"format": self.audio.wire(), "turn_detection": None}
        if settings.input_transcription:
            audio_in["transcription"] = {"model": settings.input_transcription}
        audio_out: dict[str, Any] = {"format": self.audio.wire()}
        if settings.voice:
            audio_out["voice"] = settings.voice
        return {
            "type": "realtime",
            "model": settings.model,
            "output_modalities": [self.modality],
            "instructions": self._instructions,
            "audio": {"input": audio_in, "output": audio_out},
            "tools": self._tools,
            "tool_choice": "auto",
        }

    async def set_instructions(self, instructions: str) -> None:
        """The agent's prompt as the state now renders it; sent only when it changed."""
        if instructions == self._instructions:
            return
        self._instructions = instructions
        if self.is_open:
            session = {"type": "realtime", "instructions": instructions}
            await self._send({"type": "session.update", "session": session})

    async def close(self) -> None:
        self.closed = True
        await self._drop()
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _drop(self) -> None:
        reader, self._reader = self._reader, None
        connection, self._connection = self._connection, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()
        self._end_response("failed", "the session's socket closed")
        self._idle.set()

    # ---- the conversation --------------------------------------------------------------

    async def add_user_audio(self, audio: bytes) -> str:
        """The caller's turn as audio in the session's input format; its item's id."""
        content = {"type": "input_audio", "audio": base64.b64encode(audio).decode("ascii")}
        return await self.add({"type": "message", "role": "user", "content": [content]})

    async def add_user_text(self, text: str) -> str:
        content = {"type": "input_text", "text": text}
        return await self.add({"type": "message", "role": "user", "content": [content]})

    async def add_assistant_text(self, text: str) -> str:
        """What the agent said by other means (a fixed line, through TTS), as the model's own."""
        content = {"type": "output_text", "text": text}
        return await self.add({"type": "message", "role": "assistant", "content": [content]})

    async def add_function_output(self, call_id: str, output: str) -> str:
        return await self.add(
            {"type": "function_call_output", "call_id": call_id, "output": output}
        )

    async def add(self, item: Mapping[str, Any]) -> str:
        await self._ensure_open()
        return await self._add(item)

    async def _add(self, item: Mapping[str, Any]) -> str:
        item = dict(item)
        item_id = str(item.setdefault("id", new_item_id()))
        await self._send({"type": "conversation.item.create", "item": item})
        self._items.add(item_id)
        return item_id

    def holds(self, item_id: str) -> bool:
        """Whether this session (not one before a reconnect) has the item."""
        return item_id in self._items

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """Keep the first `audio_end_ms` of the model's audio item: what the caller heard."""
        if self.is_open and item_id in self._items:
            event = {
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": max(0, int(audio_end_ms)),
            }
            await self._send(event)

    async def delete(self, item_id: str) -> None:
        if self.is_open and item_id in self._items:
            self._items.discard(item_id)
            await self._send({"type": "conversation.item.delete", "item_id": item_id})

    # ---- responses ---------------------------------------------------------------------

    async def respond(self) -> AsyncIterator[ModelOutput]:
        """Ask for a response and stream it; always ends with one ResponseEnd. Stopping early
        (break, cancellation) cancels the response on the server."""
        await self._ensure_open()
        try:
            await asyncio.wait_for(self._idle.wait(), self.settings.read_timeout_s)
        except TimeoutError:
            pass  # never told the last one ended: ask anyway, and hear the error if it runs
        event_id = f"evt_{uuid.uuid4().hex[:20]}"
        response = self._response = _Response(event_id)
        self._idle.clear()
        finished = False
        try:
            await self._send({"type": "response.create", "event_id": event_id})
            timeout = self.settings.response_timeout_s
            while True:
                try:
                    output = await asyncio.wait_for(response.outputs.get(), timeout)
                except TimeoutError:
                    finished = True
                    yield ResponseEnd("failed", f"no response event within {timeout:g} s")
                    return
                timeout = self.settings.read_timeout_s
                if isinstance(output, FunctionCallOut | AudioOut | TranscriptOut):
                    self._items.add(output.item_id)
                if isinstance(output, ResponseEnd):
                    finished = True
                    yield output
                    return
                yield output
        finally:
            if self._response is response:
                self._response = None
            if not finished and self.is_open:
                with contextlib.suppress(Exception):
                    await self._send({"type": "response.cancel"})

    def _end_response(self, status: str, detail: str | None) -> None:
        response = self._response
        if response is not None:
            self._response = None
            response.outputs.put_nowait(ResponseEnd(status, detail))

    # ---- the socket --------------------------------------------------------------------

    async def _send(self, event: Mapping[str, Any]) -> None:
        connection = self._connection
        if connection is None:
            raise RealtimeError("the model's session is not open")
        event = {"event_id": f"evt_{uuid.uuid4().hex[:20]}", **event}
        try:
            await connection.send(event)
        except Exception as exc:
            raise RealtimeError(f"the model's socket failed: {_describe(exc)}") from exc

    async def _read(self, connection: Any) -> None:
        from websockets.exceptions import ConnectionClosedOK

        while True:
            try:
                data = await connection.recv_bytes()
            except asyncio.CancelledError:
                raise
            except ConnectionClosedOK:
                break
            except Exception as exc:
                log.warning("Realtime session lost: %s", _describe(exc))
                break
            # One event the endpoint got wrong (not JSON, a field missing) is skipped: the
            # session and the call go on.
            try:
                self._dispatch(connection.parse_event(data))
            except Exception as exc:
                text = f"a malformed event skipped ({_describe(exc)}): {data[:120]!r}"
                log.warning("Realtime session: %s", text)
                if self._on_error is not None:
                    self._on_error(text)
        self._end_response("failed", "the session's socket closed")
        self._idle.set()

    def _dispatch(self, event: Any) -> None:
        kind = getattr(event, "type", "")
        response = self._response
        if kind == "error":
            code, text = _error_text(event)
            caused_by = getattr(getattr(event, "error", None), "event_id", None)
            if code in _LASTING_CODES:
                # The service closes the socket after it: the next use must not reopen.
                self._refused = RealtimeError(f"the Realtime service refused: {text}", lasting=True)
            if code in _LASTING_CODES or code in _ENDING_CODES:
                self._ending = True
            # Every event sent here carries an id: an error naming another one is about that
            # event (a truncate of an item gone), one naming none is the session's own.
            if response is not None and caused_by in (None, response.event_id):
                if caused_by is not None:
                    self._idle.set()  # refused: it never ran
                self._end_response("failed", text)
            elif self._on_error is not None:
                self._on_error(text)
            return
        if kind == "conversation.item.input_audio_transcription.completed":
            if self._on_input_transcript is not None:
                self._on_input_transcript(str(event.item_id), str(event.transcript))
            return
        if kind == "response.done":
            self._idle.set()
        if response is None:
            return  # the tail of a response given up on
        if kind == "response.created":
            response.id = getattr(event.response, "id", None) or "response"
        elif kind in _AUDIO_DELTA:
            response.outputs.put_nowait(AudioOut(event.item_id, base64.b64decode(event.delta)))
        elif kind in _TRANSCRIPT_DELTA or kind in _TEXT_DELTA:
            response.outputs.put_nowait(TranscriptOut(event.item_id, event.delta))
        elif kind == "response.function_call_arguments.done":
            call = FunctionCallOut(event.item_id, event.call_id, event.name, event.arguments)
            response.outputs.put_nowait(call)
        elif kind == "response.done":
            done = event.response
            status = getattr(done, "status", None) or "completed"
            details = getattr(done, "status_details", None)
            reason = getattr(details, "reason", None) if details is not None else None
            error = getattr(details, "error", None) if details is not None else None
            detail = getattr(error, "message", None) or reason
            self._response = None
            response.outputs.put_nowait(ResponseEnd(str(status), detail))


def _error_text(event: Any) -> tuple[str | None, str]:
    """An error event's code and its text for the log and the audit."""
    error = getattr(event, "error", None)
    message = getattr(error, "message", None) or "unknown error"
    code = getattr(error, "code", None)
    return code, f"{code}: {message}" if code else str(message)


def _handshake_refusal(exc: BaseException) -> tuple[int | None, str]:
    """The HTTP status a WebSocket handshake was refused with (websockets' InvalidStatus), and
    the service's own message from the body (OpenAI's `{"error": {"message": ...}}`), if that
    is what `exc` is."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if not isinstance(status, int):
        return None, ""
    body = getattr(response, "body", b"") or b""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace").strip()[:200] if isinstance(body, bytes) else ""
    return status, f" ({message})" if message else ""


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text

"""The WebSocket endpoints: /twilio and /ws move messages between a socket and a call pipeline.

The protocol logic lives in voice_agent.transports (sans-I/O); these only read, write and
translate. Outbound messages go through one sender task per call with a bounded queue, so a
client that stops reading cannot make the server buffer without end.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from voice_agent.audio.codec import CarrierFormat, Encoding
from voice_agent.errors import VoiceAgentError
from voice_agent.server.pipeline import CallPipeline
from voice_agent.transports import native, twilio
from voice_agent.transports.errors import POLICY_VIOLATION, ProtocolError, ProtocolWarning

log = logging.getLogger("voice_agent.server")

# 60 s of 20 ms frames: far more than any healthy client lets queue up.
MAX_OUTBOUND_MESSAGES = 3000
TWILIO_FRAME_BYTES = twilio.FRAME_BYTES

StartCall = Callable[..., Awaitable[CallPipeline]]


@dataclass(frozen=True, slots=True)
class _Outgoing:
    message: str | bytes | None  # None: close the connection with `close`
    is_audio: bool = False
    close: tuple[int, str] | None = None


class SocketOutbound:
    """Queues what the pipeline sends; one task writes it to the socket in order."""

    def __init__(
        self,
        ws: ServerConnection,
        *,
        audio: Callable[[bytes], list[str | bytes]],
        mark: Callable[[str], str],
        clear: Callable[[], str],
        event: Callable[[dict[str, Any]], str | None],
    ) -> None:
        self._ws = ws
        self._encode_audio = audio
        self._encode_mark = mark
        self._encode_clear = clear
        self._encode_event = event
        self._queue: asyncio.Queue[_Outgoing] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._send_forever())
        self.overflowed = False

    def _put(self, item: _Outgoing) -> None:
        if self.overflowed:
            return
        if self._queue.qsize() >= MAX_OUTBOUND_MESSAGES:
            self.overflowed = True
            reason = "client is not reading: outbound queue full"
            self._queue.put_nowait(_Outgoing(None, close=(POLICY_VIOLATION, reason)))
            return
        self._queue.put_nowait(item)

    def audio(self, data: bytes) -> None:
        for message in self._encode_audio(data):
            self._put(_Outgoing(message, is_audio=True))

    def mark(self, name: str) -> None:
        self._put(_Outgoing(self._encode_mark(name)))

    def clear(self) -> None:
        # Audio still queued here would play after the clear: drop it too.
        kept = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if not item.is_audio:
                kept.append(item)
        for item in kept:
            self._queue.put_nowait(item)
        self._put(_Outgoing(self._encode_clear()))

    def event(self, payload: dict[str, Any]) -> None:
        message = self._encode_event(payload)
        if message is not None:
            self._put(_Outgoing(message))

    def close(self, code: int, reason: str) -> None:
        self._put(_Outgoing(None, close=(code, reason)))

    async def _send_forever(self) -> None:
        try:
            while True:
                item = await self._queue.get()
                if item.message is None:
                    code, reason = item.close or (1000, "")
                    await self._ws.close(code, reason)
                    return
                await self._ws.send(item.message)
        except ConnectionClosed:
            return

    async def aclose(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def _split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def _close(ws: ServerConnection, error: ProtocolError) -> None:
    log.info("closing %s: %s", ws.remote_address, error.reason)
    await ws.close(error.code, error.close_reason)


async def twilio_endpoint(ws: ServerConnection, start_call: StartCall) -> None:
    stream = twilio.TwilioStream()
    pipeline: CallPipeline | None = None
    outbound: SocketOutbound | None = None
    reason = "caller hung up"
    try:
        async for message in ws:
            if isinstance(message, bytes):
                stream.receive_bytes(message)
            for event in stream.receive(message):
                if isinstance(event, twilio.Media):
                    if pipeline is not None:
                        pipeline.audio(event.payload)
                elif isinstance(event, twilio.Mark):
                    if pipeline is not None:
                        pipeline.mark(event.name)
                elif isinstance(event, twilio.Start):
                    outbound = SocketOutbound(
                        ws,
                        audio=lambda data: [
                            stream.media_message(f) for f in _split(data, TWILIO_FRAME_BYTES)
                        ],
                        mark=stream.mark_message,
                        clear=stream.clear_message,
                        event=lambda payload: None,  # Twilio takes media, marks and clears only
                    )
                    try:
                        pipeline = await start_call(
                            transport="twilio",
                            agent=event.agent,
                            args=event.agent_args,
                            call_id=event.call_id,
                            carrier=CarrierFormat("mulaw", twilio.SAMPLE_RATE),
                            out=outbound,
                        )
                    except VoiceAgentError as exc:
                        await ws.close(POLICY_VIOLATION, str(exc)[:120])
                        return
                    await pipeline.start()
                elif isinstance(event, twilio.Dtmf):
                    if pipeline is not None:
                        pipeline.dtmf(event.digit)
                elif isinstance(event, twilio.Stop):
                    return
                elif isinstance(event, ProtocolWarning):
                    log.info("twilio stream %s: %s", ws.remote_address, event)
    except ProtocolError as error:
        reason = f"protocol error: {error.reason}"
        await _close(ws, error)
    except ConnectionClosed:
        reason = "connection lost"
    finally:
        if pipeline is not None:
            await pipeline.hang_up(reason)
        if outbound is not None:
            await outbound.aclose()


def _native_event(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=str)


async def native_endpoint(ws: ServerConnection, start_call: StartCall) -> None:
    stream = native.NativeStream()
    pipeline: CallPipeline | None = None
    outbound: SocketOutbound | None = None
    reason = "caller hung up"
    try:
        async for message in ws:
            if isinstance(message, bytes):
                events = stream.receive_bytes(message)
            else:
                events = stream.receive_text(message)
            for event in events:
                if isinstance(event, native.Audio):
                    if pipeline is not None:
                        pipeline.audio(event.data)
                elif isinstance(event, native.Mark):
                    if pipeline is not None:
                        pipeline.mark(event.name)
                elif isinstance(event, native.Start):
                    audio = event.audio
                    # At most 1 s of audio per binary frame.
                    frame = audio.bytes_for_ms(1000)

                    def audio_frames(data: bytes, size: int = frame) -> list[str | bytes]:
                        return list(_split(data, size))

                    outbound = SocketOutbound(
                        ws,
                        audio=audio_frames,
                        mark=native.mark_event,
                        clear=native.clear_event,
                        event=_native_event,
                    )
                    try:
                        pipeline = await start_call(
                            transport="ws",
                            agent=event.agent,
                            args=event.args,
                            call_id=None,
                            carrier=CarrierFormat(
                                cast(Encoding, audio.encoding), audio.sample_rate
                            ),
                            out=outbound,
                        )
                    except VoiceAgentError as exc:
                        await ws.send(native.error_event("bad_start", str(exc)))
                        await ws.close(POLICY_VIOLATION, str(exc)[:120])
                        return
                    await ws.send(native.started_event(pipeline.session.call_id, agent=event.agent))
                    await pipeline.start()
                elif isinstance(event, native.Dtmf):
                    if pipeline is not None:
                        pipeline.dtmf(event.digit)
                elif isinstance(event, native.Stop):
                    return
                elif isinstance(event, ProtocolWarning):
                    await ws.send(native.error_event(event.kind, event.message))
    except ProtocolError as error:
        reason = f"protocol error: {error.reason}"
        try:
            await ws.send(native.error_event(error.kind, error.reason))
        except ConnectionClosed:
            pass
        await _close(ws, error)
    except ConnectionClosed:
        reason = "connection lost"
    finally:
        if pipeline is not None:
            await pipeline.hang_up(reason)
        if outbound is not None:
            await outbound.aclose()

"""The WebSocket endpoints: /twilio and /ws move messages between a socket and a call pipeline.

The protocol logic lives in voice_agent.transports (sans-I/O); these only translate. Each
message is handled synchronously as it arrives (see media_socket), and what the pipeline sends
is written to the socket at once. A client that stops reading fills the transport's buffer;
past MAX_UNSENT_BYTES the call is closed rather than buffered without end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, cast

from voice_agent.audio.codec import CarrierFormat, Encoding
from voice_agent.callcontrol.twilio_rest import TwilioRest
from voice_agent.errors import ConfigError, VoiceAgentError
from voice_agent.gateways.media_socket import MediaConnection, Message
from voice_agent.pipeline.driver import CallPipeline
from voice_agent.runtime.call_control import CallTransfer
from voice_agent.transports import native, twilio
from voice_agent.transports.errors import (
    POLICY_VIOLATION,
    ProtocolError,
    ProtocolWarning,
    close_reason,
)

log = logging.getLogger("voice_agent.server")

# About a minute of agent audio in either protocol's encoding: far more than a healthy client
# lets pile up, little enough that a stalled one costs no real memory.
MAX_UNSENT_BYTES = 2 * 1024 * 1024
# Twilio plays whatever length a media message holds and buffers ahead; one message per half
# second instead of per 20 ms frame sends 25 times fewer messages for the same audio.
TWILIO_OUTBOUND_BYTES = 4000  # 500 ms of 8 kHz mu-law
INTERNAL_ERROR = 1011

StartCall = Callable[..., Awaitable[CallPipeline]]
# A carrier's call id names the call's files (recordings) and its /calls URL: Twilio's CallSid,
# Asterisk's `[systemname-]epoch.sequence`, Telnyx's `v3:...` and the others' UUIDs fit.
_CALL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def refusal_text(exc: VoiceAgentError) -> str:
    """Why a call was refused, for the caller: a config error's message without the server's
    file path (which is the operator's business and would push the reason out of the 123
    bytes a close frame holds)."""
    return exc.message if isinstance(exc, ConfigError) else str(exc)


def usable_call_id(value: str | None) -> str | None:
    """`value` when it can name a call (see _CALL_ID), else None: the server makes one up."""
    if value and _CALL_ID.fullmatch(value) and ".." not in value:
        return value
    return None


class SocketOutbound:
    """What the pipeline sends, encoded for the call's protocol and written to the socket."""

    def __init__(
        self,
        ws: MediaConnection,
        *,
        audio: Callable[[bytes], list[Message]],
        mark: Callable[[str], str],
        clear: Callable[[], str],
        event: Callable[[dict[str, Any]], str | None],
    ) -> None:
        self._ws = ws
        self._encode_audio = audio
        self._encode_mark = mark
        self._encode_clear = clear
        self._encode_event = event
        self._closing: asyncio.Task[None] | None = None
        self.overflowed: str | None = None  # why the call was closed for not reading

    def _write(self, message: Message) -> None:
        if self._closing is not None:
            return
        self._ws.write(message)
        if self._ws.buffered_bytes() > MAX_UNSENT_BYTES:
            self.overflowed = "client is not reading: outbound buffer full"
            self.close(POLICY_VIOLATION, self.overflowed)

    def audio(self, data: bytes) -> None:
        for message in self._encode_audio(data):
            self._write(message)

    def mark(self, name: str) -> None:
        self._write(self._encode_mark(name))

    def clear(self) -> None:
        # Audio already written is on its way; the clear tells the client to drop it unplayed.
        self._write(self._encode_clear())

    def event(self, payload: dict[str, Any]) -> None:
        message = self._encode_event(payload)
        if message is not None:
            self._write(message)

    def close(self, code: int, reason: str) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._ws.close(code, reason))

    async def aclose(self) -> None:
        if self._closing is not None:
            await asyncio.gather(self._closing, return_exceptions=True)


def _split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


class SocketCall:
    """One call's socket: feeds its messages to the protocol codec and the pipeline.

    Messages arriving while the call is being set up (`start_call` awaits the store and the
    agent) are kept and replayed in order once the pipeline exists, so no audio is lost.
    """

    transport = ""

    def __init__(self, ws: MediaConnection, start_call: StartCall) -> None:
        self.ws = ws
        self.start_call = start_call
        self.pipeline: CallPipeline | None = None
        self.outbound: SocketOutbound | None = None
        self._backlog: list[Any] | None = None
        self._starting: asyncio.Task[None] | None = None
        self._ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    # ---- subclass hooks ------------------------------------------------------------------

    def receive(self, message: Message) -> list[Any]:
        raise NotImplementedError

    def dispatch(self, event: Any) -> None:
        raise NotImplementedError

    async def set_up(self, event: Any) -> None:
        raise NotImplementedError

    def protocol_error(self, error: ProtocolError) -> None:
        self.ws.fail(error.code, error.close_reason)

    # ---- driving -----------------------------------------------------------------------

    async def run(self) -> None:
        self.ws.deliver_to(self.on_message)
        closed: asyncio.Future[Any] = asyncio.ensure_future(self.ws.wait_closed())
        try:
            waiting: set[asyncio.Future[Any]] = {self._ended, closed}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            reason = self._ended.result() if self._ended.done() else self._close_reason()
        finally:
            closed.cancel()
            if self._starting is not None and not self._starting.done():
                self._starting.cancel()
                await asyncio.gather(self._starting, return_exceptions=True)
        if not self._ended.done():
            self._ended.set_result(reason)
        try:
            if self.pipeline is not None:
                await self.pipeline.hang_up(reason)
            if self.outbound is not None:
                await self.outbound.aclose()
        finally:
            self.ws.detach()

    def _close_reason(self) -> str:
        # A clean closing handshake is a hang-up without a stop message; anything else (the
        # TCP connection dropped, an error code) is a lost connection.
        if self.outbound is not None and self.outbound.overflowed:
            return self.outbound.overflowed
        return "caller hung up" if self.ws.closed_cleanly() else "connection lost"

    def end(self, reason: str) -> None:
        if not self._ended.done():
            self._ended.set_result(reason)

    def on_message(self, message: Message) -> None:
        if self._ended.done():
            return
        try:
            events = self.receive(message)
        except ProtocolError as error:
            log.info("closing %s: %s", self.ws.remote_address, error.reason)
            self.end(f"protocol error: {error.reason}")
            self.protocol_error(error)
            return
        for event in events:
            if self._backlog is not None:
                self._backlog.append(event)
            else:
                self.dispatch(event)

    def begin_start(self, event: Any) -> None:
        if self.pipeline is not None or self._starting is not None:
            return  # the codec refuses a second start; nothing to do here
        self._backlog = []
        self._starting = asyncio.ensure_future(self._start(event))

    async def _start(self, event: Any) -> None:
        try:
            await self.set_up(event)
        except Exception as exc:
            log.exception("call set-up failed on %s", self.ws.remote_address)
            self.end(f"set-up failed: {type(exc).__name__}")
            self.ws.fail(INTERNAL_ERROR, "internal error")
            return
        backlog, self._backlog = self._backlog or [], None
        for queued in backlog:
            if self._ended.done():
                return
            self.dispatch(queued)


class TwilioOutbound(SocketOutbound):
    """/twilio's Outbound, with a transfer through Twilio's REST API
    (callcontrol/twilio_rest.py)."""

    def __init__(
        self, ws: MediaConnection, start: twilio.Start, rest: TwilioRest | None, **encoders: Any
    ) -> None:
        super().__init__(ws, **encoders)
        self._start = start
        self._rest = rest

    async def transfer(self, transfer: CallTransfer) -> str | None:
        if self._rest is None:
            return (
                "transfers on /twilio need Twilio's REST API: set server.twilio_api_key and"
                " server.twilio_api_secret (or server.twilio_auth_token)"
            )
        start = self._start
        return await self._rest.transfer(start.account_sid, start.call_sid, transfer)


class _TwilioCall(SocketCall):
    def __init__(
        self, ws: MediaConnection, start_call: StartCall, rest: TwilioRest | None = None
    ) -> None:
        super().__init__(ws, start_call)
        self.stream = twilio.TwilioStream()
        self.rest = rest

    def on_message(self, message: Message) -> None:
        # A call's media, 50 messages a second, goes straight from the codec to the pipeline;
        # everything else, and media the fast path declines, takes the general path.
        pipeline = self.pipeline
        if (
            pipeline is not None
            and self._backlog is None
            and message.__class__ is str
            and not self._ended.done()
        ):
            audio = self.stream.media_payload(cast(str, message))
            if audio is not None:
                pipeline.audio(audio)
                return
        super().on_message(message)

    def receive(self, message: Message) -> list[Any]:
        if isinstance(message, bytes):
            self.stream.receive_bytes(message)
        return list(self.stream.receive(cast(str, message)))

    def dispatch(self, event: Any) -> None:
        pipeline = self.pipeline
        if isinstance(event, twilio.Media):
            if pipeline is not None:
                pipeline.audio(event.payload)
        elif isinstance(event, twilio.Mark):
            if pipeline is not None:
                pipeline.mark(event.name)
        elif isinstance(event, twilio.Start):
            self.begin_start(event)
        elif isinstance(event, twilio.Dtmf):
            if pipeline is not None:
                pipeline.dtmf(event.digit)
        elif isinstance(event, twilio.Stop):
            self.end("caller hung up")
        elif isinstance(event, ProtocolWarning):
            log.info("twilio stream %s: %s", self.ws.remote_address, event)

    async def set_up(self, event: twilio.Start) -> None:
        stream = self.stream
        self.outbound = TwilioOutbound(
            self.ws,
            event,
            self.rest,
            audio=lambda data: [
                stream.media_message(f) for f in _split(data, TWILIO_OUTBOUND_BYTES)
            ],
            mark=stream.mark_message,
            clear=stream.clear_message,
            event=lambda payload: None,  # Twilio takes media, marks and clears only
        )
        try:
            self.pipeline = await self.start_call(
                transport="twilio",
                agent=event.agent,
                args=event.agent_args,
                call_id=event.call_id,
                carrier=CarrierFormat("mulaw", twilio.SAMPLE_RATE),
                out=self.outbound,
            )
        except VoiceAgentError as exc:
            self.end(f"refused: {exc}")
            self.outbound.close(POLICY_VIOLATION, close_reason(refusal_text(exc)))
            return
        await self.pipeline.start()


def _native_event(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=str)


class _NativeCall(SocketCall):
    def __init__(self, ws: MediaConnection, start_call: StartCall) -> None:
        super().__init__(ws, start_call)
        self.stream = native.NativeStream()

    def receive(self, message: Message) -> list[Any]:
        if isinstance(message, bytes):
            return list(self.stream.receive_bytes(message))
        return list(self.stream.receive_text(message))

    def protocol_error(self, error: ProtocolError) -> None:
        self.ws.write(native.error_event(error.kind, error.reason))
        super().protocol_error(error)

    def dispatch(self, event: Any) -> None:
        pipeline = self.pipeline
        if isinstance(event, native.Audio):
            if pipeline is not None:
                pipeline.audio(event.data)
        elif isinstance(event, native.Mark):
            if pipeline is not None:
                pipeline.mark(event.name)
        elif isinstance(event, native.Start):
            self.begin_start(event)
        elif isinstance(event, native.Dtmf):
            if pipeline is not None:
                pipeline.dtmf(event.digit)
        elif isinstance(event, native.Stop):
            self.end("caller hung up")
        elif isinstance(event, ProtocolWarning):
            self.ws.write(native.error_event(event.kind, event.message))

    async def set_up(self, event: native.Start) -> None:
        audio = event.audio
        frame = audio.bytes_for_ms(native.MAX_AUDIO_FRAME_MS)
        self.outbound = SocketOutbound(
            self.ws,
            audio=lambda data: list(_split(data, frame)),
            mark=native.mark_event,
            clear=native.clear_event,
            event=_native_event,
        )
        try:
            self.pipeline = await self.start_call(
                transport="ws",
                agent=event.agent,
                args=event.args,
                call_id=None,
                carrier=CarrierFormat(cast(Encoding, audio.encoding), audio.sample_rate),
                out=self.outbound,
            )
        except VoiceAgentError as exc:
            self.end(f"refused: {exc}")
            self.ws.write(native.error_event("bad_start", refusal_text(exc)))
            self.outbound.close(POLICY_VIOLATION, close_reason(refusal_text(exc)))
            return
        self.ws.write(native.started_event(self.pipeline.session.call_id, agent=event.agent))
        await self.pipeline.start()


async def twilio_endpoint(
    ws: MediaConnection, start_call: StartCall, rest: TwilioRest | None = None
) -> None:
    await _TwilioCall(ws, start_call, rest).run()


async def native_endpoint(ws: MediaConnection, start_call: StartCall) -> None:
    await _NativeCall(ws, start_call).run()

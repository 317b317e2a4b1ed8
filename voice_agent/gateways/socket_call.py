"""One call on a WebSocket: the socket's messages to a protocol codec and the call pipeline, and
what the pipeline sends back out (the base of the carrier streams' driver, carrier_call.py, and
of Asterisk's chan_websocket, asterisk_ws.py).

The protocol logic lives in voice_agent.transports (sans-I/O); this only translates. Each
message is handled synchronously as it arrives (see media_socket), and what the pipeline sends
is written to the socket at once. A client that stops reading fills the transport's buffer;
past MAX_UNSENT_BYTES the call is closed rather than buffered without end.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from voice_agent.errors import ConfigError, VoiceAgentError
from voice_agent.gateways.media_socket import MediaConnection, Message
from voice_agent.pipeline.driver import CallPipeline
from voice_agent.transports.errors import POLICY_VIOLATION, ProtocolError

log = logging.getLogger("voice_agent.server")

# About a minute of agent audio in either protocol's encoding: far more than a healthy client
# lets pile up, little enough that a stalled one costs no real memory.
MAX_UNSENT_BYTES = 2 * 1024 * 1024
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
    """What the pipeline sends, encoded for the call's protocol and written to the socket: each
    encoder gives the messages that carry its part (none where the protocol has no such
    thing, as most carriers have no place for the server's events)."""

    def __init__(
        self,
        ws: MediaConnection,
        *,
        audio: Callable[[bytes], list[Message]],
        mark: Callable[[str], list[Message]],
        clear: Callable[[], list[Message]],
        event: Callable[[dict[str, Any]], list[Message]],
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

    def write_all(self, messages: list[Message]) -> None:
        for message in messages:
            self._write(message)

    def audio(self, data: bytes) -> None:
        self.write_all(self._encode_audio(data))

    def mark(self, name: str) -> None:
        self.write_all(self._encode_mark(name))

    def clear(self) -> None:
        # Audio already written is on its way; the clear tells the client to drop it unplayed.
        self.write_all(self._encode_clear())

    def event(self, payload: dict[str, Any]) -> None:
        self.write_all(self._encode_event(payload))

    def close(self, code: int, reason: str) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._ws.close(code, reason))

    async def aclose(self) -> None:
        if self._closing is not None:
            await asyncio.gather(self._closing, return_exceptions=True)


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

"""Asterisk AudioSocket calls: a TCP listener that runs each connection on the call pipeline.

Asterisk reaches it with the `AudioSocket(uuid,host:port)` dialplan application (8 kHz slin,
every version since 18) or `Dial(AudioSocket/host:port/${UUID})` (the channel driver; add
`/c(slin16)` and the like for a higher rate on Asterisk 20.17 / 21.12 / 22.7 / 23.1 and later,
`/c(slin)` on older ones). The wire format and what each Asterisk version sends:
voice_agent.transports.audiosocket.

One connection, one call:

1. The UUID must come first, within `uuid_timeout_s`; then admission (`admit`) may refuse the
   call: the server sends a hang-up (0x00) and closes. 0x00 is the only message every Asterisk
   version acts on cleanly (20.14+ fails the channel on an error message from a server).
2. The pipeline starts on the first audio message, whose kind gives the call's rate (the
   carrier is `pcm16` at that rate); a peer that sends no audio within `first_audio_wait_s`
   gets 8 kHz, the only rate the dialplan application has. Audio at another rate later is a
   protocol error.
3. `routes` maps a UUID to (agent, args): such UUIDs are fixed in the dialplan to pick an
   agent, so they are not call ids (the call gets a new one); the args get `uuid` too. Any
   other UUID is the call's own (`${UUID}` in the dialplan): the default agent takes it with
   args {"uuid": ...}, and it becomes the call id, so /calls/{uuid} finds the call Asterisk
   logged (unless a live call of this server already has it).
4. Hang-up both ways: 0x00 or the socket closing from Asterisk ends the call ("caller hung
   up"); when the agent ends it (`Outbound.close`), the server sends 0x00 and closes. A
   malformed message ends only that call ("protocol error: ..."), with a hang-up sent.

The agent's audio: Asterisk plays each message the moment it arrives, with no buffer to clear,
so the server paces it: one clock for every call, one 20 ms frame per call per tick from a
monotonic deadline grid (voice_agent.audio.pacing.Pacer), nothing queued ahead in the socket. Each
call's `RtpPlayout` holds what the pipeline sent: a barge-in's `clear` drops it at once, and a
mark is heard once its audio was sent and `playout_delay_ms` has passed. A quiet agent sends
nothing: Asterisk needs no comfort noise from a server.

AudioSocket has no authentication: listen on an address only the Asterisk hosts can reach.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from voice_agent.audio.codec import CarrierFormat
from voice_agent.audio.pacing import Pacer
from voice_agent.audio.playout import RtpPlayout
from voice_agent.config import split_host_port
from voice_agent.errors import ConfigError, VoiceAgentError
from voice_agent.pipeline.driver import CallPipeline
from voice_agent.transports import audiosocket as wire
from voice_agent.transports.errors import ProtocolError, ProtocolWarning

log = logging.getLogger("voice_agent.server")

StartCall = Callable[..., Awaitable[CallPipeline]]
Admit = Callable[[str], str | None]  # where the call comes in -> why it is refused, or None
Route = tuple[str | None, Mapping[str, Any]]

TRANSPORT = "audiosocket"
UUID_TIMEOUT_S = 10.0
# Asterisk sends audio from the moment the channel is up; a silence-suppressing phone may not.
FIRST_AUDIO_WAIT_S = 1.0
DEFAULT_RATE = wire.AUDIO_KINDS[wire.KIND_AUDIO]
# Between a frame's write and the caller hearing it: the socket, Asterisk and the caller's leg
# (a SIP phone's jitter buffer). Asterisk itself buffers nothing.
PLAYOUT_DELAY_MS = 40.0
# Agent audio in the socket's send buffer beyond which the peer is taken as not reading: paced
# frames never pile up in a healthy connection.
MAX_UNSENT_MS = 2000
# Caller audio kept while the call is set up (start_call is quick; this is a bound, not a wait).
BACKLOG_FRAMES = 100


class AudioSocketOutbound:
    """The pipeline's Outbound for an AudioSocket call: audio and marks to the playout that the
    server's clock drains; `clear` drops what is not yet sent (Asterisk holds nothing, so a
    barge-in is immediate); `close` is a hang-up. No event channel: events stay in the audit."""

    def __init__(self, connection: _Connection, playout: RtpPlayout) -> None:
        self._connection = connection
        self._playout = playout

    def audio(self, data: bytes) -> None:
        self._playout.audio(data)

    def mark(self, name: str) -> None:
        self._playout.mark(name)

    def clear(self) -> None:
        self._playout.clear()

    def event(self, payload: dict[str, Any]) -> None:
        pass

    def close(self, code: int, reason: str) -> None:
        self._connection.end(reason)


class _Connection(asyncio.Protocol):
    """One TCP connection: its bytes through the reader to the pipeline, as they arrive."""

    def __init__(self, server: AudioSocketServer) -> None:
        self.server = server
        self.reader = wire.AudioSocketReader()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        loop = asyncio.get_running_loop()
        self.call_uuid: asyncio.Future[str] = loop.create_future()
        self.first_rate: asyncio.Future[int] = loop.create_future()
        self.ended: asyncio.Future[str] = loop.create_future()
        self.pipeline: CallPipeline | None = None
        self.playout: RtpPlayout | None = None
        self.sample_rate = DEFAULT_RATE
        self._header = b""
        self._max_unsent = 0
        self._backlog: deque[wire.Audio | wire.Dtmf] | None = deque(maxlen=BACKLOG_FRAMES)
        self.task: asyncio.Task[None] | None = None

    # ---- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                # A 20 ms frame must leave now, not wait for Nagle to fill a segment (Asterisk
                # sets TCP_NODELAY on its side too).
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.server._connections.add(self)
        self.task = asyncio.ensure_future(self.server._run(self))
        self.task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            log.error("audiosocket %s: %s", self.peer, error, exc_info=error)

    def data_received(self, data: bytes) -> None:
        if self.ended.done():
            return
        failure: ProtocolError | None = None
        try:
            events = self.reader.feed(data)
        except wire.AudioSocketProtocolError as error:
            events, failure = error.events, error
        try:
            for event in events:
                self._dispatch(event)
        except Exception as exc:  # one call's failure must not reach the loop or other calls
            log.exception("audiosocket %s: handling a message failed", self.peer)
            self.end(f"media failed: {type(exc).__name__}")
            return
        if failure is not None:
            # Logged and the call hung up: the caller hears the end, not silence.
            log.info("audiosocket %s: %s", self.peer, failure.reason)
            self.end(f"protocol error: {failure.reason}")

    def eof_received(self) -> bool | None:
        self.end("caller hung up")
        return None  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.end("caller hung up" if exc is None else "connection lost")

    # ---- messages ------------------------------------------------------------------------

    def _dispatch(self, event: wire.AudioSocketEvent) -> None:
        if isinstance(event, wire.Audio):  # 50 a second: first
            pipeline = self.pipeline
            if pipeline is not None and self._backlog is None:
                if event.sample_rate != self.sample_rate:
                    self._rate_mismatch(event)
                    return
                pipeline.audio(event.pcm)
                return
            if not self.first_rate.done():
                self.first_rate.set_result(event.sample_rate)
            if self._backlog is not None:
                self._backlog.append(event)
        elif isinstance(event, wire.Dtmf):
            if self.pipeline is not None and self._backlog is None:
                self.pipeline.dtmf(event.digit)
            elif self._backlog is not None:
                self._backlog.append(event)
        elif isinstance(event, wire.Uuid):
            self.call_uuid.set_result(event.call_id)
        elif isinstance(event, wire.Hangup):
            self.end("caller hung up")
        elif isinstance(event, wire.Error):
            log.info("audiosocket %s: peer reported %s", self.peer, event.description)
            # 0x01 alone is Asterisk's "hangup of calling party": an ordinary end.
            self.end("caller hung up" if event.code == 0x01 else event.description)
        elif isinstance(event, ProtocolWarning):
            log.info("audiosocket %s: %s", self.peer, event.message)

    def _rate_mismatch(self, event: wire.Audio) -> None:
        # Only after the 8 kHz fallback: the reader itself refuses a rate change.
        reason = (
            f"{wire.kind_name(event.kind)} audio in a call that started at {self.sample_rate} Hz"
        )
        log.info("audiosocket %s: %s", self.peer, reason)
        self.end(f"protocol error: {reason}")

    def start_media(self, sample_rate: int, delay_ms: float) -> RtpPlayout:
        self.sample_rate = sample_rate
        self.playout = RtpPlayout(sample_rate, wire.FRAME_MS, wire.SAMPLE_BYTES, delay_ms=delay_ms)
        kind = wire.AUDIO_KIND_FOR_RATE[sample_rate]
        self._header = wire.audio_header(self.playout.frame_bytes, kind)
        self._max_unsent = wire.frame_bytes(sample_rate, MAX_UNSENT_MS)
        return self.playout

    def replay_backlog(self) -> None:
        """What came while the call was set up, in order; then messages go straight through."""
        backlog, self._backlog = self._backlog, None
        for event in backlog or ():
            if self.ended.done():
                return
            self._dispatch(event)

    # ---- the agent's side ----------------------------------------------------------------

    def send_frame(self, now_ms: float) -> None:
        """One tick of the server's clock: the next 20 ms of the agent, if it is speaking."""
        playout, pipeline, transport = self.playout, self.pipeline, self.transport
        if playout is None or pipeline is None or transport is None or self.ended.done():
            return
        speaking = playout.pending_ms > 0
        frame, heard = playout.next_frame(now_ms)
        if speaking:
            transport.write(self._header + frame)
            if transport.get_write_buffer_size() > self._max_unsent:
                self.end("client is not reading: outbound buffer full", abort=True)
                return
        for name in heard:
            pipeline.mark(name)

    def end(self, reason: str, *, abort: bool = False) -> None:
        """The call is over: hang up on Asterisk (unless it is gone) and close the socket. The
        connection's task then ends the pipeline with `reason`. `abort`: drop the socket at
        once, for a peer that does not read (a close would wait for it to)."""
        if self.ended.done():
            return
        self.ended.set_result(reason)
        if self.playout is not None:
            self.playout.clear()
        transport = self.transport
        if transport is None:
            return
        if abort:
            transport.abort()
        elif not transport.is_closing():
            transport.write(wire.hangup_message())
            transport.close()  # after what is buffered, the hang-up included, has gone


class AudioSocketServer:
    """The AudioSocket listener; `start_call` and `admit` are VoiceServer's.

    `listen` is "HOST:PORT" (port 0: any free one, then `.port` says which). `routes` maps a
    UUID (any form `uuid.UUID` parses) to the agent (None: the default) and args of its calls.
    """

    def __init__(
        self,
        listen: str,
        *,
        start_call: StartCall,
        admit: Admit,
        routes: Mapping[str, Route] | None = None,
        uuid_timeout_s: float = UUID_TIMEOUT_S,
        first_audio_wait_s: float = FIRST_AUDIO_WAIT_S,
        playout_delay_ms: float = PLAYOUT_DELAY_MS,
        reuse_port: bool = False,
    ) -> None:
        try:
            self.host, self.port = split_host_port(listen)
        except ValueError as exc:
            raise ConfigError(str(exc), key="audiosocket.listen") from None
        self.routes: dict[str, tuple[str | None, dict[str, Any]]] = {}
        for key, (agent, args) in (routes or {}).items():
            try:
                canonical = str(uuid.UUID(key))
            except ValueError:
                raise ConfigError(
                    f"{key!r} is not a UUID (e.g. 40325ec2-5efd-4bd3-805f-53576e581d13)",
                    key=f"audiosocket.routes.{key}",
                ) from None
            self.routes[canonical] = (agent, dict(args))
        self.uuid_timeout_s = uuid_timeout_s
        self.first_audio_wait_s = first_audio_wait_s
        self.playout_delay_ms = playout_delay_ms
        self.reuse_port = reuse_port
        self._start_call = start_call
        self._admit = admit
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connections: set[_Connection] = set()
        self._live: set[_Connection] = set()  # calls whose pipeline runs: the clock's
        self._call_ids: set[str] = set()  # UUIDs in use as call ids by this server's calls
        self._pacer: Pacer | None = None
        self._ticker: asyncio.TimerHandle | None = None

    @property
    def connections(self) -> int:
        """Open connections, calls being set up included."""
        return len(self._connections)

    @property
    def live_calls(self) -> int:
        return len(self._live)

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            lambda: _Connection(self),
            self.host,
            self.port,
            reuse_port=self.reuse_port or None,
        )
        sockets = self._server.sockets
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("AudioSocket on tcp %s:%d", self.host, self.port)

    async def stop(self, reason: str = "server shutting down") -> None:
        """Stop listening, end every call with `reason` (a hang-up to Asterisk), wait for them."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.end(reason)
        tasks = [c.task for c in self._connections if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    # ---- one connection ------------------------------------------------------------------

    def _route(self, call_uuid: str) -> tuple[str | None, dict[str, Any], str | None]:
        """The agent, args and call id (None: a new one) of the call with `call_uuid`."""
        route = self.routes.get(call_uuid)
        if route is not None:
            agent, args = route
            return agent, {"uuid": call_uuid, **args}, None
        if call_uuid in self._call_ids:
            return None, {"uuid": call_uuid}, None
        return None, {"uuid": call_uuid}, call_uuid

    async def _run(self, connection: _Connection) -> None:
        reason = "caller hung up"
        call_id: str | None = None
        try:
            if not await _settled(connection.call_uuid, connection.ended, self.uuid_timeout_s):
                if not connection.ended.done():
                    log.info(
                        "audiosocket %s: no UUID within %g s: closing",
                        connection.peer,
                        self.uuid_timeout_s,
                    )
                    connection.end("no UUID")
                return
            call_uuid = connection.call_uuid.result()
            refusal = self._admit(TRANSPORT)
            if refusal is not None:
                log.info("audiosocket call %s refused: %s", call_uuid, refusal)
                connection.end(f"refused: {refusal}")
                return
            # The carrier follows the first audio message's kind; none in time means 8 kHz.
            await _settled(connection.first_rate, connection.ended, self.first_audio_wait_s)
            if connection.ended.done():
                return
            rate = connection.first_rate.result() if connection.first_rate.done() else DEFAULT_RATE
            agent, args, call_id = self._route(call_uuid)
            if call_id is not None:
                self._call_ids.add(call_id)
            playout = connection.start_media(rate, self.playout_delay_ms)
            try:
                connection.pipeline = await self._start_call(
                    transport=TRANSPORT,
                    agent=agent,
                    args=args,
                    call_id=call_id,
                    carrier=CarrierFormat("pcm16", rate),
                    out=AudioSocketOutbound(connection, playout),
                )
            except VoiceAgentError as exc:
                log.warning("audiosocket call %s could not start: %s", call_uuid, exc)
                connection.end(f"call could not start: {exc}")
                return
            pipeline = connection.pipeline
            log.info(
                "audiosocket %s: UUID %s is call %s at %d Hz",
                connection.peer,
                call_uuid,
                pipeline.session.call_id,
                rate,
            )
            self._live.add(connection)
            self._start_clock()
            await pipeline.start()
            connection.replay_backlog()
            finished: asyncio.Future[Any] = asyncio.ensure_future(pipeline.finished.wait())
            try:
                await _settled(finished, connection.ended, None)
            finally:
                finished.cancel()
            reason = connection.ended.result() if connection.ended.done() else "call ended"
        except Exception as exc:  # a bug here must end this call only, with a reason
            log.exception("audiosocket %s: the call failed", connection.peer)
            connection.end(f"call failed: {type(exc).__name__}")
        finally:
            self._live.discard(connection)
            self._connections.discard(connection)
            if call_id is not None:
                self._call_ids.discard(call_id)
            if connection.ended.done():
                reason = connection.ended.result()
            connection.end(reason)
            if connection.pipeline is not None:
                await connection.pipeline.hang_up(reason)

    # ---- the media clock -----------------------------------------------------------------

    def _now_ms(self) -> float:
        assert self._loop is not None
        return self._loop.time() * 1000

    def _start_clock(self) -> None:
        if self._ticker is None:
            self._pacer = Pacer(self._now_ms(), wire.FRAME_MS)
            self._tick()

    def _tick(self) -> None:
        assert self._loop is not None and self._pacer is not None
        now = self._now_ms()
        # After a stall the pacer hands out a few frames at once, never seconds of them.
        frames = self._pacer.due(now)
        for connection in list(self._live):
            try:
                for _ in range(frames):
                    connection.send_frame(now)
            except Exception as exc:  # one call's failure must not stop every call's clock
                log.exception("audiosocket %s: media tick failed", connection.peer)
                connection.end(f"media failed: {type(exc).__name__}")
        if not self._live:
            self._ticker = None
            return
        self._ticker = self._loop.call_at(self._pacer.next_deadline_ms / 1000, self._tick)


async def _settled(
    wanted: asyncio.Future[Any], ended: asyncio.Future[str], within_s: float | None
) -> bool:
    """Wait until `wanted` is done (True), or `ended` is or `within_s` passes (False)."""
    futures: set[asyncio.Future[Any]] = {wanted, ended}
    await asyncio.wait(futures, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    return wanted.done()

"""A `websockets` server connection that hands call media to the call as each message arrives.

A call's socket carries 50 small messages a second each way. Going through the stock
`recv()` costs an assembler put, a future and a wake-up of the handler task per message, and
`websockets`' generator-based frame parser was then the largest single cost left (about a
sixth of a worker's main thread at 100 calls). So once a call's socket is open, the bytes the
client sends go through our own frame reader (websocket_frames.py): complete messages go
straight to a synchronous callback, and outbound messages straight to the sans-I/O protocol
and the transport, with no queue and no task in between.

`websockets` keeps the rest, through documented seams only (docs/performance.md, "The media
socket's footing"): `serve(create_connection=...)` makes this subclass; `websockets` performs
the opening handshake and owns the connection's lifetime (keepalive pings, the closing
handshake and its timeout, the TCP close). Each control frame the reader finds goes back whole
to `websockets`' own `data_received`, so it sees a valid stream made of nothing but control
frames and answers pings, takes keepalive pongs and runs the closing handshake itself; what
goes out is written with the sans-I/O `send_text`, `send_binary`, `fail` and `data_to_send`.
Connections that never call `hold_messages` (the /rtc signalling, HTTP) behave exactly like a
stock `ServerConnection`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, cast

from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ProtocolError
from websockets.frames import Close, CloseCode
from websockets.protocol import State
from websockets.server import ServerProtocol

from voice_agent.gateways.websocket_frames import CLOSE, ClientFrameReader, ControlFrame, Violation

log = logging.getLogger("voice_agent.server")

Message = str | bytes
Sink = Callable[[Message], None]

# Messages that may arrive between the handshake and the handler attaching its callback: a
# well-behaved caller sends a few; a flood before the call even starts is refused.
MAX_HELD_MESSAGES = 200

_CLEAN = {1000, 1001}  # normal closure, going away
_END_OF_HEAD = b"\r\n\r\n"


class MediaConnection(ServerConnection):
    """`hold_messages(limit)` then `deliver_to(sink)` switch the connection from `recv()` to
    calling `sink(message)` for every message."""

    _reader: ClientFrameReader | None = None
    _held: list[Message] | None = None
    _sink: Sink | None = None
    # True while the reader takes every incoming byte; False before (the handshake), and
    # again once the connection failed or the client's close frame came: from then on
    # `websockets` gets the bytes, and discards them as RFC 6455 section 7.1.7 asks.
    _reading = False
    # Where the opening handshake's request ends, found as its bytes pass through, and
    # whether `websockets` was given anything after it (see _start_reading).
    _head_bytes = 0
    _head_tail = b""
    _request_end: int | None = None
    _read_past_request = False

    def __init__(self, protocol: ServerProtocol, server: Server, **kwargs: Any) -> None:
        super().__init__(protocol, server, **kwargs)
        # Kept under our own names: the constructor's argument and connection_made's are
        # documented, the attributes `websockets` stores them in are not.
        self._sans_io = protocol
        self._wire: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._wire = cast(asyncio.Transport, transport)

    def hold_messages(self, max_message_bytes: int | None) -> None:
        """This connection carries a call whose messages are at most `max_message_bytes`:
        keep them from now on for the sink the handler will attach (call this from
        process_request, before any message can arrive)."""
        if self._reader is None:
            self._reader = ClientFrameReader(max_message_bytes)
        if self._sink is None and self._held is None:
            self._held = []

    def deliver_to(self, sink: Sink) -> None:
        assert self._reader is not None, "hold_messages() first, from process_request"
        held, self._held = self._held or [], None
        self._sink = sink
        if not self._reading and self._sans_io.state is State.OPEN:
            # A client that sent everything early and now waits gets its answer now.
            self._start_reading()
        for message in held:
            self._deliver(message)

    def detach(self) -> None:
        """The call is over: drop its handler, which holds the call's objects, while this
        connection may still live on (in `websockets`' own reference cycles) until collected.
        Messages from now on are dropped."""
        self._held = None
        self._sink = _drop

    def write(self, message: Message) -> bool:
        """Send one message now; False when the connection is no longer open."""
        protocol, wire = self._sans_io, self._wire
        if protocol.state is not State.OPEN or wire is None or wire.is_closing():
            return False
        if isinstance(message, str):
            protocol.send_text(message.encode())
        else:
            protocol.send_binary(message)
        self._send()
        return True

    def buffered_bytes(self) -> int:
        """Bytes written but not yet taken by the kernel: grows when the peer stops reading."""
        return self._wire.get_write_buffer_size() if self._wire is not None else 0

    def fail(self, code: int, reason: str) -> None:
        """Close at once from a callback (no await): the closing handshake runs on its own."""
        if self._sans_io.state is State.OPEN:
            self._fail(code, reason)

    def closed_cleanly(self) -> bool:
        """Once closed: whether both sides sent a close frame saying all was well."""
        closed = self._sans_io.close_exc
        received, sent = closed.rcvd, closed.sent
        return received is not None and sent is not None and {received.code, sent.code} <= _CLEAN

    # ---- the bytes in ------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if not self._reading:
            self._before_reading(data)
            return
        reader = self._reader
        assert reader is not None
        for event in reader.feed(data):
            kind = type(event)
            if kind is str or kind is bytes:
                if not self._reading:  # the call failed the connection on an earlier message
                    return
                sink = self._sink
                if sink is None:
                    self._hold(event)  # type: ignore[arg-type]
                    continue
                try:  # what _deliver does, without its call: this runs for every message
                    sink(event)  # type: ignore[arg-type]
                except Exception:
                    self._sink_failed()
            elif kind is ControlFrame:
                self._control(event)  # type: ignore[arg-type]
            else:
                assert isinstance(event, Violation)
                self._fail(event.code, event.reason)

    def _before_reading(self, data: bytes) -> None:
        protocol = self._sans_io
        if protocol.state is State.CONNECTING:
            if self.request is None:
                self._note_request_bytes(data)
            elif data:
                # After the request, before our response: RFC 6455 section 4.1 forbids it.
                self._read_past_request = True
            super().data_received(data)
            return
        if self._reader is not None and protocol.state is State.OPEN and self._start_reading():
            self.data_received(data)
            return
        super().data_received(data)

    def _note_request_bytes(self, data: bytes) -> None:
        # The request ends at its first blank line: `websockets` reads no body, and refuses a
        # request with one (or with a bare CR or LF that would put the blank line elsewhere).
        if self._request_end is None:
            seen = self._head_tail + data
            found = seen.find(_END_OF_HEAD)
            if found >= 0:
                self._request_end = self._head_bytes - len(self._head_tail) + found + 4
            self._head_tail = seen[-3:]
        self._head_bytes += len(data)
        if self._request_end is not None and self._head_bytes > self._request_end:
            self._read_past_request = True

    def _start_reading(self) -> bool:
        """Take every incoming byte from now on; False when the connection cannot be read so."""
        if self._read_past_request:
            # `websockets` has read frames of it already, and where in them it stopped is its
            # own business: this caller must wait for the 101 as RFC 6455 section 4.1 asks.
            self._fail(CloseCode.PROTOCOL_ERROR, "data before the handshake response")
            return False
        response = self.response
        if response is not None and "Sec-WebSocket-Extensions" in response.headers:
            # The reader knows no extension (a compressed frame has RSV1 set).
            log.error("media sockets need serve(compression=None)")
            self._fail(CloseCode.INTERNAL_ERROR, "internal error")
            return False
        self._reading = True
        return True

    def _control(self, frame: ControlFrame) -> None:
        protocol = self._sans_io
        if frame.inside_message:
            self._close_inside_message(frame.payload)
            return
        was_open = protocol.state is State.OPEN
        # A whole, valid control frame: `websockets`' parser, which sees no other frame,
        # answers a ping, takes a pong for its keepalive and runs the closing handshake.
        super().data_received(frame.raw)
        if frame.opcode == CLOSE or (was_open and protocol.state is not State.OPEN):
            self._reading = False

    def _close_inside_message(self, payload: bytes) -> None:
        # What `websockets` answers a close frame that interrupts a fragmented message: the
        # close frame's own fault if it has one, else the interruption.
        try:
            Close.parse(payload)
        except ProtocolError as exc:
            self._fail(CloseCode.PROTOCOL_ERROR, str(exc))
        except UnicodeDecodeError as exc:
            self._fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
        else:
            self._fail(CloseCode.PROTOCOL_ERROR, "incomplete fragmented message")

    def _hold(self, message: Message) -> None:
        assert self._held is not None
        if len(self._held) >= MAX_HELD_MESSAGES:
            self.fail(CloseCode.POLICY_VIOLATION, "too many messages before the call started")
            return
        self._held.append(message)

    def _deliver(self, message: Message) -> None:
        assert self._sink is not None
        try:
            self._sink(message)
        except Exception:
            self._sink_failed()

    def _sink_failed(self) -> None:
        # A bug in one call's handling ends that call only, as an unhandled exception in a
        # handler task would.
        log.exception("error handling a message from %s", self.remote_address)
        self._sink = _drop
        self.fail(CloseCode.INTERNAL_ERROR, "internal error")

    # ---- the bytes out -----------------------------------------------------------------

    def _fail(self, code: int, reason: str) -> None:
        # Also when closing (we sent a close frame): `websockets` then sends no second one but
        # still ends the TCP stream and discards whatever else arrives.
        self._reading = False
        self._sans_io.fail(code, reason)
        self._send()

    def _send(self) -> None:
        # As websockets' Sans-I/O guide says: an empty chunk ends our half of the TCP stream.
        wire = self._wire
        if wire is None:
            return
        for data in self._sans_io.data_to_send():
            if data:
                wire.write(data)
            elif wire.can_write_eof():
                # Which exceptions write_eof raises is not documented (uvloop: RuntimeError);
                # the connection is ending either way.
                with contextlib.suppress(OSError, RuntimeError):
                    wire.write_eof()
            else:
                wire.close()


def _drop(message: Message) -> None:
    pass

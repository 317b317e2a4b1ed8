"""A `websockets` server connection that hands call media to the call as each message arrives.

A call's socket carries 50 small messages a second each way. Going through the stock
`recv()` costs an assembler put, a future and a wake-up of the handler task per message; at
hundreds of calls that was a large share of a core. Here the frames the sans-I/O protocol
parses in `data_received` go straight to a synchronous callback, and outbound messages go
straight to the sans-I/O protocol and the transport, with no queue and no task in between.

Everything else (the opening and closing handshakes, pings, UTF-8 and size limits, the
connection's lifetime) stays `websockets`' own. Connections that never call `deliver_to`
(the /rtc signalling, HTTP) behave exactly like a stock `ServerConnection`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from websockets.asyncio.server import ServerConnection
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import Event, State

log = logging.getLogger("voice_agent.server")

Message = str | bytes
Sink = Callable[[Message], None]

# Messages that may arrive between the handshake and the handler attaching its callback: a
# well-behaved caller sends a few; a flood before the call even starts is refused.
MAX_HELD_MESSAGES = 200


class MediaConnection(ServerConnection):
    """`deliver_to(sink)` switches the connection from `recv()` to calling `sink(message)`."""

    _held: list[Message] | None = None
    _sink: Sink | None = None
    _fragments: list[Frame] | None = None

    def hold_messages(self) -> None:
        """Keep messages from now on for the sink the handler will attach (call this from
        process_request, before any message can arrive)."""
        if self._sink is None and self._held is None:
            self._held = []

    def deliver_to(self, sink: Sink) -> None:
        held, self._held = self._held or [], None
        self._sink = sink
        for message in held:
            self._deliver(message)

    def write(self, message: Message) -> bool:
        """Send one message now; False when the connection is no longer open."""
        if self.protocol.state is not State.OPEN or self.transport.is_closing():
            return False
        if isinstance(message, str):
            self.protocol.send_text(message.encode())
        else:
            self.protocol.send_binary(message)
        self.send_data()
        return True

    def buffered_bytes(self) -> int:
        """Bytes written but not yet taken by the kernel: grows when the peer stops reading."""
        return self.transport.get_write_buffer_size()

    def fail(self, code: int, reason: str) -> None:
        """Close at once from a callback (no await): the closing handshake runs on its own."""
        if self.protocol.state is State.OPEN:
            self.protocol.fail(CloseCode(code), reason)
            self.send_data()

    # ---- websockets hook -----------------------------------------------------------------

    def process_event(self, event: Event) -> None:
        if self._sink is None and self._held is None:
            super().process_event(event)
            return
        assert isinstance(event, Frame)
        if event.opcode is Opcode.TEXT or event.opcode is Opcode.BINARY:
            if event.fin:
                self._complete([event])
            else:
                self._fragments = [event]
        elif event.opcode is Opcode.CONT and self._fragments is not None:
            self._fragments.append(event)
            if event.fin:
                frames, self._fragments = self._fragments, None
                self._complete(frames)
        else:
            super().process_event(event)  # pongs acknowledge keepalive pings

    def _complete(self, frames: list[Frame]) -> None:
        data = frames[0].data if len(frames) == 1 else b"".join(f.data for f in frames)
        message: Message
        if frames[0].opcode is Opcode.TEXT:
            try:
                message = bytes(data).decode()
            except UnicodeDecodeError as exc:
                self.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
                return
        else:
            message = bytes(data)
        if self._sink is None:
            assert self._held is not None
            if len(self._held) >= MAX_HELD_MESSAGES:
                self.fail(CloseCode.POLICY_VIOLATION, "too many messages before the call started")
                return
            self._held.append(message)
            return
        self._deliver(message)

    def _deliver(self, message: Message) -> None:
        assert self._sink is not None
        try:
            self._sink(message)
        except Exception:
            # A bug in one call's handling ends that call only, as an unhandled exception in a
            # handler task would.
            log.exception("error handling a message from %s", self.remote_address)
            self._sink = _drop
            self.fail(CloseCode.INTERNAL_ERROR, "internal error")


def _drop(message: Message) -> None:
    pass

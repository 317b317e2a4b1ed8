"""A `websockets` server connection that hands call media to the call as each message arrives.

A call's socket carries 50 small messages a second each way. Going through the stock
`recv()` costs an assembler put, a future and a wake-up of the handler task per message; at
hundreds of calls that was a large share of a core. Here the frames the sans-I/O protocol
parses in `data_received` go straight to a synchronous callback, and outbound messages go
straight to the sans-I/O protocol and the transport, with no queue and no task in between.

Receiving, the common case takes a shortcut past `websockets`' frame parser, whose
generator steps were the largest single cost of a call's media (about a sixth of a worker's
main thread at 100 calls): incoming bytes are cut at frame boundaries, and a complete, final,
masked text or binary frame within the size limit, arriving while no fragmented message is
under way, is unmasked (with `websockets`' own C `apply_mask`) and delivered here. Every other
frame (pings, pongs, close, fragments, anything malformed) goes whole to `websockets`, so its
parser always starts at a frame boundary and stays the authority on the protocol: the opening
and closing handshakes, pings, UTF-8 and size limits, protocol errors and the connection's
lifetime are its own. Connections that never call `deliver_to` (the /rtc signalling, HTTP)
behave exactly like a stock `ServerConnection`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from websockets.asyncio.server import ServerConnection
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import Event, State

try:
    from websockets.speedups import apply_mask
except ImportError:  # websockets built without its C extension
    from websockets.utils import apply_mask

log = logging.getLogger("voice_agent.server")

Message = str | bytes
Sink = Callable[[Message], None]

# Messages that may arrive between the handshake and the handler attaching its callback: a
# well-behaved caller sends a few; a flood before the call even starts is refused.
MAX_HELD_MESSAGES = 200

# First header byte of a final text / binary frame with no RSV bits (no extension is in use).
_FINAL_TEXT = 0x81
_FINAL_BINARY = 0x82


class MediaConnection(ServerConnection):
    """`deliver_to(sink)` switches the connection from `recv()` to calling `sink(message)`."""

    _held: list[Message] | None = None
    _sink: Sink | None = None
    _fragments: list[Frame] | None = None
    # Bytes of an incomplete frame, kept until the rest arrives (shortcut only). A bytearray:
    # a frame trickled in a byte at a time must cost amortized appends, not a copy of all
    # that came before on every byte.
    _partial: bytearray
    # Set for good once the stream holds something the shortcut cannot size (an unmasked or
    # over-long frame): from then on every byte goes to `websockets`, which fails the
    # connection with the right close code.
    _bypass: bool = False
    _cutting: bool = False

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

    def detach(self) -> None:
        """The call is over: drop its handler, which holds the call's objects, while this
        connection may still live on (in `websockets`' own reference cycles) until collected.
        Messages from now on are dropped."""
        self._held = None
        self._sink = _drop

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

    # ---- websockets hooks ----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        protocol = self.protocol
        if self._bypass or (self._sink is None and self._held is None):
            super().data_received(data)
            return
        if not self._cutting:
            if protocol.state is not State.OPEN:
                super().data_received(data)  # the handshake's bytes
                return
            # The shortcut must start at a frame boundary: with nothing left in `websockets`'
            # reader it does (a client may send frames only after the 101 response, RFC 6455
            # section 4.1, so nothing of a frame was read before).
            self._cutting = True
            self._partial = bytearray()
            if protocol.reader.buffer:
                self._bypass = True
                super().data_received(data)
                return
        partial = self._partial
        buffer: bytes | bytearray
        if partial:
            partial += data
            buffer = partial
        else:
            buffer = data
        limit = protocol.max_message_size
        size = len(buffer)
        start = 0
        while start < size:
            # The frame header (RFC 6455 section 5.2): lengths of 126 and 127 announce a 16-
            # and a 64-bit length; a client's frames carry a 4-byte mask before the payload.
            if size - start < 2:
                break
            head1 = buffer[start]
            head2 = buffer[start + 1]
            length = head2 & 0x7F
            at = start + 2
            if length == 126:
                if size - at < 2:
                    break
                length = int.from_bytes(buffer[at : at + 2], "big")
                at += 2
            elif length == 127:
                if size - at < 8:
                    break
                length = int.from_bytes(buffer[at : at + 8], "big")
                at += 8
            if not head2 & 0x80 or (limit is not None and length > limit):
                self._bypass = True
                rest = bytes(buffer[start:])
                partial.clear()
                super().data_received(rest)
                return
            end = at + 4 + length
            if end > size:
                break
            if (
                (head1 == _FINAL_TEXT or head1 == _FINAL_BINARY)
                and protocol.state is State.OPEN
                and protocol.current_size is None  # no fragmented message under way
            ):
                payload = apply_mask(buffer[at + 4 : end], buffer[at : at + 4])
                self._complete(head1 == _FINAL_TEXT, payload)
            else:
                super().data_received(buffer[start:end])
            start = end
        if buffer is partial:
            del partial[:start]
        elif start < size:
            partial += memoryview(buffer)[start:]

    def process_event(self, event: Event) -> None:
        if self._sink is None and self._held is None:
            super().process_event(event)
            return
        assert isinstance(event, Frame)
        if event.opcode is Opcode.TEXT or event.opcode is Opcode.BINARY:
            if event.fin:
                self._complete(event.opcode is Opcode.TEXT, event.data)
            else:
                self._fragments = [event]
        elif event.opcode is Opcode.CONT and self._fragments is not None:
            self._fragments.append(event)
            if event.fin:
                frames, self._fragments = self._fragments, None
                data = b"".join(f.data for f in frames)
                self._complete(frames[0].opcode is Opcode.TEXT, data)
        else:
            super().process_event(event)  # pongs acknowledge keepalive pings

    def _complete(self, text: bool, data: bytes | bytearray) -> None:
        message: Message
        if text:
            try:
                message = data.decode()
            except UnicodeDecodeError as exc:
                self.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
                return
        else:
            message = bytes(data)
        sink = self._sink
        if sink is None:
            assert self._held is not None
            if len(self._held) >= MAX_HELD_MESSAGES:
                self.fail(CloseCode.POLICY_VIOLATION, "too many messages before the call started")
                return
            self._held.append(message)
            return
        try:  # what _deliver does, without its call: this runs for every message
            sink(message)
        except Exception:
            self._sink_failed()

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


def _drop(message: Message) -> None:
    pass

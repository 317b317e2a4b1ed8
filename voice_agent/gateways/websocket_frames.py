"""RFC 6455 section 5 for a server: a client's bytes cut into messages and control frames.

Sans-I/O like `websockets`' own parser, whose generator steps were the largest single cost of a
call's media; here a whole frame is read by a few lines of straight code. The reader answers
nothing itself: control frames come out whole for their owner to handle (media_socket hands
them back to `websockets`), and a protocol violation comes out as the close code and reason
`websockets` would give it, so that a client cannot tell the two apart
(tests/test_media_frames.py checks it against `websockets` byte by byte).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

# Close codes (RFC 6455 section 7.4.1) of the violations found here.
PROTOCOL_ERROR = 1002
INVALID_DATA = 1007
MESSAGE_TOO_BIG = 1009

# Opcodes (section 5.2).
CONT, TEXT, BINARY = 0x0, 0x1, 0x2
CLOSE, PING, PONG = 0x8, 0x9, 0xA
_OPCODES = frozenset({CONT, TEXT, BINARY, CLOSE, PING, PONG})

# First header byte of a final text / binary frame with no RSV bits: all but a few frames.
_FINAL_TEXT = 0x80 | TEXT
_FINAL_BINARY = 0x80 | BINARY

Message = str | bytes


@dataclass(frozen=True, slots=True)
class ControlFrame:
    """A close, ping or pong, valid as a frame (section 5.5); `raw` is exactly what arrived."""

    opcode: int
    raw: bytes
    payload: bytes  # unmasked
    # A close that arrives inside a fragmented message: `websockets` fails the connection for
    # it (RFC 6455 allows it; reading on would hand the caller half a message).
    inside_message: bool


@dataclass(frozen=True, slots=True)
class Violation:
    """The client broke the protocol: fail the connection with this code and reason."""

    code: int
    reason: str


Event = Message | ControlFrame | Violation


def _unmask_in_python(data: bytes | bytearray | memoryview, mask: bytes | bytearray) -> bytes:
    # XOR the payload with the key repeated to its length (section 5.3), as one integer: a
    # Python loop over the bytes would cost a microsecond per ten bytes.
    size = len(data)
    key = (bytes(mask) * (size // 4 + 1))[:size]
    order = sys.byteorder
    return (int.from_bytes(data, order) ^ int.from_bytes(key, order)).to_bytes(size, order)


try:
    # `websockets`' C implementation: undocumented, unchanged since 2018, and 15 times faster
    # than the integer XOR on a Twilio frame (0.09 against 1.3 us). Without it everything
    # still works, a little slower; tests/test_media_frames.py says loudly when it is gone.
    from websockets.speedups import apply_mask as _unmask_in_c
except ImportError:  # websockets built without its C extension
    apply_mask = _unmask_in_python
else:
    apply_mask = _unmask_in_c


def _too_big(length: int, under_way: int | None, limit: int) -> str:
    after = "" if under_way is None else f"after reading {under_way} bytes "
    return f"frame with {length} bytes {after}exceeds limit of {limit} bytes"


class ClientFrameReader:
    """Feed it what a client sends after the opening handshake; it returns, in order, the
    messages (text decoded), the control frames and at most one violation, after which, or
    after a close frame, it reads nothing more (sections 1.4 and 7.1.7).

    Checks come in `websockets`' order, so that a stream cut short fails, or does not, as it
    would there: the opcode and the mask bit from the first two bytes, the size limit from the
    length, the reserved bits and the control frames' rules once the payload is in.
    """

    def __init__(self, max_message_bytes: int | None) -> None:
        self.max_message_bytes = max_message_bytes
        # Bytes of an incomplete frame. A bytearray: a frame trickled in a byte at a time must
        # cost amortized appends, not a copy of all that came before on every byte.
        self._pending = bytearray()
        self._done = False
        # A fragmented message under way (section 5.4): its bytes so far, its pieces, its type.
        self._fragment_bytes: int | None = None
        self._fragments: list[bytes] = []
        self._fragment_text = False

    @property
    def done(self) -> bool:
        """After a close frame or a violation: nothing more is read."""
        return self._done

    def feed(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        if self._done:
            return events
        pending = self._pending
        buffer: bytes | bytearray
        if pending:
            pending += data
            buffer = pending
        else:
            buffer = data
        limit = self.max_message_bytes
        size = len(buffer)
        start = 0
        while size - start >= 2:
            # The header (section 5.2): lengths of 126 and 127 announce a 16- and a 64-bit
            # length; a client's frames carry a 4-byte mask key before the payload.
            head1 = buffer[start]
            head2 = buffer[start + 1]
            if head1 & 0x0F not in _OPCODES:
                return self._violate(events, PROTOCOL_ERROR, "invalid opcode")
            if not head2 & 0x80:
                return self._violate(events, PROTOCOL_ERROR, "incorrect masking")
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
            under_way = self._fragment_bytes
            if limit is not None and length > (limit if under_way is None else limit - under_way):
                return self._violate(events, MESSAGE_TOO_BIG, _too_big(length, under_way, limit))
            end = at + 4 + length
            if end > size:
                break
            if (head1 == _FINAL_TEXT or head1 == _FINAL_BINARY) and under_way is None:
                payload = apply_mask(buffer[at + 4 : end], buffer[at : at + 4])
                if head1 == _FINAL_BINARY:
                    events.append(payload)
                else:
                    try:
                        events.append(payload.decode())
                    except UnicodeDecodeError as exc:
                        return self._violate(events, INVALID_DATA, _utf8_reason(exc))
            elif not self._other_frame(events, buffer, start, at, end, head1):
                return events
            start = end
        if buffer is pending:
            del pending[:start]
        elif start < size:
            pending += memoryview(buffer)[start:]
        return events

    def _other_frame(
        self,
        events: list[Event],
        buffer: bytes | bytearray,
        start: int,
        at: int,
        end: int,
        head1: int,
    ) -> bool:
        """A complete frame outside the common case; False once nothing more is to be read."""
        if head1 & 0x70:
            self._violate(events, PROTOCOL_ERROR, "reserved bits must be 0")
            return False
        opcode = head1 & 0x0F
        fin = bool(head1 & 0x80)
        payload = apply_mask(buffer[at + 4 : end], buffer[at : at + 4])
        if opcode & 0x8:
            if len(payload) > 125:
                self._violate(events, PROTOCOL_ERROR, "control frame too long")
                return False
            if not fin:
                self._violate(events, PROTOCOL_ERROR, "fragmented control frame")
                return False
            inside = opcode == CLOSE and self._fragment_bytes is not None
            events.append(ControlFrame(opcode, bytes(buffer[start:end]), payload, inside))
            if opcode == CLOSE:
                self._stop()
                return False
            return True
        if opcode == CONT:
            if self._fragment_bytes is None:
                self._violate(events, PROTOCOL_ERROR, "unexpected continuation frame")
                return False
            self._fragments.append(payload)
            if not fin:
                self._fragment_bytes += len(payload)
                return True
            data = b"".join(self._fragments)
            text = self._fragment_text
            self._fragment_bytes, self._fragments = None, []
            if not text:
                events.append(data)
                return True
            try:
                events.append(data.decode())
            except UnicodeDecodeError as exc:
                self._violate(events, INVALID_DATA, _utf8_reason(exc))
                return False
            return True
        # TEXT or BINARY outside the common case: the first piece of a fragmented message, or
        # a new message while one is under way.
        if self._fragment_bytes is not None:
            self._violate(events, PROTOCOL_ERROR, "expected a continuation frame")
            return False
        self._fragment_bytes = len(payload)
        self._fragments = [payload]
        self._fragment_text = opcode == TEXT
        return True

    def _violate(self, events: list[Event], code: int, reason: str) -> list[Event]:
        events.append(Violation(code, reason))
        self._stop()
        return events

    def _stop(self) -> None:
        self._done = True
        self._pending = bytearray()
        self._fragments = []


def _utf8_reason(exc: UnicodeDecodeError) -> str:
    # As `websockets` words it when a message it assembled is not UTF-8.
    return f"{exc.reason} at position {exc.start}"

"""SIP over a connection (TCP, TLS), sans-I/O: the bytes of one connection cut into messages
(RFC 3261 section 18.3: a message's end is its Content-Length, which a stream must carry) and
the keep-alives of RFC 5626 section 3.5.1 (a CRLFCRLF ping, answered with one CRLF pong).

    framer = StreamFramer()
    for item in framer.feed(data):     # bytes as the connection gave them
        if item == PING: send(PONG)
        else: endpoint.datagram(item, peer, now_ms)   # one whole message, as a datagram
    if framer.error: close the connection # it can be read no further
    framer.pending                      # bytes of a message not yet whole (a slow sender)

A connection that breaks the framing (no Content-Length, a header section or body over the
limits, a length that is not a number) cannot be read any further: `error` says what was
wrong, and the I/O layer closes that connection. The messages that were whole before it, in
the same read too, are returned all the same; nothing of another connection is touched.
"""

from __future__ import annotations

import re
from typing import Final

from voice_agent.sip.message import MAX_MESSAGE_BYTES

# A request's header section: a busy proxy's INVITE (Via, Record-Route, Route of a few hops,
# an identity header) is 2-4 KB; 16 KB leaves room and bounds what a connection can hold.
MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = MAX_MESSAGE_BYTES - MAX_HEADER_BYTES  # an SDP offer is under 2 KB

PING: Final = b"\r\n\r\n"
PONG: Final = b"\r\n"

_CONTENT_LENGTH = re.compile(rb"^(?:content-length|l)[ \t]*:[ \t]*(.*?)[ \t]*$", re.I | re.M)


class FramingError(Exception):
    """The connection's bytes are not SIP messages framed as section 18.3 asks."""


class StreamFramer:
    """One connection's inbound bytes as whole messages and pings."""

    def __init__(
        self, *, max_header_bytes: int = MAX_HEADER_BYTES, max_body_bytes: int = MAX_BODY_BYTES
    ) -> None:
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self._buffer = bytearray()
        self._body_size: int | None = None  # the message under way's, once its header is read
        self._header_size = 0
        self.error: str | None = None  # why the connection can be read no further

    @property
    def pending(self) -> int:
        """Bytes held of a message not yet whole (0 between messages, and for the line ends
        of a keep-alive not yet whole)."""
        buffer = self._buffer
        if self._body_size is None and PING.startswith(bytes(buffer[:4])) and len(buffer) < 4:
            return 0
        return len(buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """The messages (and PINGs) `data` completes, in order, up to a break of the framing
        (then `error` says what it was, and nothing more is read)."""
        if self.error is not None:
            return []
        self._buffer += data
        items: list[bytes] = []
        while True:
            try:
                item = self._next()
            except FramingError as exc:
                self.error = str(exc)
                self._buffer.clear()
                return items
            if item is None:
                return items
            items.append(item)

    def _next(self) -> bytes | None:
        buffer = self._buffer
        if self._body_size is None:
            # Section 7.5: CRLFs before a start line are ignored; two of them are a ping.
            if buffer.startswith(PING):
                del buffer[:4]
                return PING
            if buffer.startswith(b"\r\n"):
                if len(buffer) < 4 and PING.startswith(bytes(buffer)):
                    return None  # the rest of a ping may come
                del buffer[:2]  # a pong, or a stray line end
                return self._next()
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > self.max_header_bytes:
                    raise FramingError(f"no end of the header section in {len(buffer)} bytes")
                return None
            header_size = end + 4
            if header_size > self.max_header_bytes:
                raise FramingError(f"a header section of {header_size} bytes")
            self._body_size = _content_length(bytes(buffer[:end]), self.max_body_bytes)
            self._header_size = header_size
        size = self._header_size + self._body_size
        if len(buffer) < size:
            return None
        message = bytes(buffer[:size])
        del buffer[:size]
        self._body_size = None
        return message


def _content_length(header: bytes, max_body_bytes: int) -> int:
    found = _CONTENT_LENGTH.findall(header)
    if not found:
        raise FramingError("a message without Content-Length (section 18.3 needs one here)")
    if len({value.strip() for value in found}) > 1:
        raise FramingError("Content-Length given twice, differently")
    value = found[0]
    if not value.isdigit() or len(value) > 9:
        raise FramingError(f"Content-Length {value[:20].decode('latin-1')!r} is not a length")
    size = int(value)
    if size > max_body_bytes:
        raise FramingError(f"a body of {size} bytes, over {max_body_bytes}")
    return size

"""The media sockets' shortcut past `websockets`' frame parser (voice_agent/server/media_socket.py),
fed bytes the way a transport hands them over, cut at every place a TCP segment could end: every
message arrives once, whole and in order, and everything outside the shortcut's case (pings,
fragments, close, malformed frames) gets `websockets`' own answer."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import pytest
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.frames import Close, CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from voice_agent.server.media_socket import MediaConnection, Message

pytestmark = pytest.mark.asyncio

MAX_SIZE = 2**16


class Wire(asyncio.Transport):
    """The server's side of a socket, keeping what the server writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += data

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def frames(self) -> list[Frame]:
        """The frames the server wrote, parsed by a client."""
        client = opened(ClientProtocol(parse_uri("ws://caller/")))
        client.receive_data(bytes(self.written))
        return [event for event in client.events_received() if isinstance(event, Frame)]


P = TypeVar("P", ClientProtocol, ServerProtocol)


def opened(protocol: P) -> P:
    """The protocol as the opening handshake leaves it: open, its parser reading frames."""
    protocol.state = State.OPEN
    protocol.parser = protocol.parse()
    next(protocol.parser)
    return protocol


class NoHandler:
    """Stands for the `websockets` server, whose only part here would start the handler."""

    def start_connection_handler(self, connection: MediaConnection) -> None:
        pass


def connection() -> tuple[MediaConnection, Wire, list[Message]]:
    protocol = opened(ServerProtocol(max_size=MAX_SIZE))
    conn = MediaConnection(protocol, server=NoHandler(), ping_interval=None)  # type: ignore[arg-type]
    wire = Wire()
    conn.connection_made(wire)
    conn.request = Request("/twilio", Headers())  # received in the handshake
    got: list[Message] = []
    conn.hold_messages()
    conn.deliver_to(got.append)
    return conn, wire, got


def client_frame(opcode: Opcode, data: bytes, fin: bool = True) -> bytes:
    return Frame(opcode, data, fin).serialize(mask=True, extensions=[])


def feed(conn: MediaConnection, data: bytes, cuts: list[int]) -> None:
    start = 0
    for cut in [*cuts, len(data)]:
        if cut > start:
            conn.data_received(data[start:cut])
            start = cut


MESSAGES: list[Message] = [
    '{"event":"media","media":{"payload":"' + "x" * 300 + '"}}',  # a 16-bit length
    "short",
    b"\x00\x01binary",
    "after the ping",
    "one message in two fragments",
    "é, two bytes in UTF-8",
]


def stream() -> bytes:
    fragmented = str(MESSAGES[4]).encode()
    return b"".join(
        [
            client_frame(Opcode.TEXT, str(MESSAGES[0]).encode()),
            client_frame(Opcode.TEXT, b"short"),
            client_frame(Opcode.BINARY, b"\x00\x01binary"),
            client_frame(Opcode.PING, b"are you there"),
            client_frame(Opcode.TEXT, b"after the ping"),
            client_frame(Opcode.TEXT, fragmented[:10], fin=False),
            client_frame(Opcode.CONT, fragmented[10:]),
            client_frame(Opcode.TEXT, str(MESSAGES[5]).encode()),
        ]
    )


async def test_messages_arrive_whole_and_in_order_wherever_the_bytes_are_cut() -> None:
    data = stream()
    every_byte = list(range(1, len(data)))
    splits: list[list[int]] = [[], every_byte] + [[cut] for cut in every_byte]
    for cuts in splits:
        conn, wire, got = connection()
        feed(conn, data, cuts)
        assert got == MESSAGES, cuts
        # websockets answered the ping, and nothing else
        assert [(f.opcode, f.data) for f in wire.frames()] == [(Opcode.PONG, b"are you there")]
        assert conn.protocol.state is State.OPEN


async def test_invalid_utf8_closes_with_1007() -> None:
    conn, wire, got = connection()
    conn.data_received(client_frame(Opcode.TEXT, b"ok") + client_frame(Opcode.TEXT, b"\xff\xfe"))
    assert got == ["ok"]
    [close] = wire.frames()
    assert Close.parse(close.data).code == CloseCode.INVALID_DATA


async def test_a_frame_over_the_size_limit_is_refused_from_its_header() -> None:
    conn, wire, got = connection()
    header = client_frame(Opcode.TEXT, b"x" * (MAX_SIZE + 1))[:14]
    conn.data_received(header)  # no payload has arrived, and none needs to
    [close] = wire.frames()
    assert Close.parse(close.data).code == CloseCode.MESSAGE_TOO_BIG
    assert got == []


async def test_an_unmasked_frame_is_a_protocol_error() -> None:
    conn, wire, got = connection()
    conn.data_received(Frame(Opcode.TEXT, b"bare").serialize(mask=False, extensions=[]))
    [close] = wire.frames()
    assert Close.parse(close.data).code == CloseCode.PROTOCOL_ERROR
    assert got == []


async def test_nothing_after_the_callers_close_frame_is_delivered() -> None:
    conn, wire, got = connection()
    close = Close(CloseCode.NORMAL_CLOSURE, "bye").serialize()
    data = (
        client_frame(Opcode.TEXT, b"before")
        + client_frame(Opcode.CLOSE, close)
        + client_frame(Opcode.TEXT, b"after")
    )
    for cut in range(len(data) + 1):
        conn, wire, got = connection()
        feed(conn, data, [cut])
        assert got == ["before"], cut
        assert conn.protocol.state is State.CLOSING
        [echo] = wire.frames()
        assert Close.parse(echo.data).code == CloseCode.NORMAL_CLOSURE


async def test_a_new_message_inside_a_fragmented_one_is_a_protocol_error() -> None:
    conn, wire, got = connection()
    conn.data_received(
        client_frame(Opcode.TEXT, b"first half", fin=False) + client_frame(Opcode.TEXT, b"new")
    )
    [close] = wire.frames()
    assert Close.parse(close.data) == Close(
        CloseCode.PROTOCOL_ERROR, "expected a continuation frame"
    )
    assert got == []

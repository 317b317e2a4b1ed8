"""The media sockets read a call's frames themselves (voice_agent/gateways/websocket_frames.py,
voice_agent/gateways/media_socket.py). Fed bytes the way a transport hands them over, cut
anywhere, they must make of any stream exactly what `websockets`' own parser makes of it: the
same messages, and the same bytes back (pongs, close frames with their codes and reasons, the
end of the TCP stream). Over real sockets, `websockets` still answers pings, takes the pongs of
its keepalive and runs the closing handshake."""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close, CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from voice_agent.gateways import websocket_frames
from voice_agent.gateways.media_socket import MediaConnection, Message

MAX_SIZE = 2**16
SMALL_LIMIT = 600  # for the property test: messages past it are quick to make


class Wire(asyncio.Transport):
    """The server's side of a socket, keeping what the server writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.eof = False
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
        self.eof = True

    def frames(self) -> list[Frame]:
        """The frames the server wrote, parsed by a client."""
        client = ClientProtocol(parse_uri("ws://caller/"), state=State.OPEN)
        client.receive_data(bytes(self.written))
        return [event for event in client.events_received() if isinstance(event, Frame)]


class NoServer:
    """Stands for the `websockets` server, whose only part here would start the handler: a
    connection calls it from connection_made, as websockets 16 and 17 each do in their own
    undocumented way (so this test double has both)."""

    def __init__(self) -> None:
        self.handler_tasks: set[asyncio.Task[None]] = set()

    def start_connection_handler(self, connection: MediaConnection) -> None:  # 16
        pass

    async def handler(self, connection: MediaConnection) -> None:  # 17
        pass


def connection(limit: int = MAX_SIZE) -> tuple[MediaConnection, Wire, list[Message]]:
    """A call's socket as the opening handshake leaves it, its messages kept in a list."""
    protocol = ServerProtocol(max_size=limit, state=State.OPEN)
    conn = MediaConnection(protocol, server=NoServer(), ping_interval=None)  # type: ignore[arg-type]
    wire = Wire()
    conn.connection_made(wire)
    conn.request = Request("/twilio", Headers())  # received in the handshake
    got: list[Message] = []
    conn.hold_messages(limit)
    conn.deliver_to(got.append)
    return conn, wire, got


def client_frame(opcode: Opcode, data: bytes, fin: bool = True) -> bytes:
    return Frame(opcode, data, fin).serialize(mask=True, extensions=[])


def feed(conn: MediaConnection, data: bytes, cuts: list[int]) -> None:
    start = 0
    for cut in [*sorted(cuts), len(data)]:
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
        assert conn.state is State.OPEN


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
        assert conn.state is State.CLOSING
        [echo] = wire.frames()
        assert Close.parse(echo.data).code == CloseCode.NORMAL_CLOSURE
        assert wire.eof  # a server ends the TCP stream once close frames crossed


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


async def test_a_call_that_fails_its_socket_gets_no_further_message() -> None:
    conn, wire, _ = connection()
    got: list[Message] = []

    def refusing(message: Message) -> None:
        got.append(message)
        conn.fail(CloseCode.POLICY_VIOLATION, "not in this protocol")

    conn.deliver_to(refusing)
    conn.data_received(client_frame(Opcode.TEXT, b"one") + client_frame(Opcode.TEXT, b"two"))
    conn.data_received(client_frame(Opcode.TEXT, b"three"))
    assert got == ["one"]
    [close] = wire.frames()
    assert Close.parse(close.data) == Close(CloseCode.POLICY_VIOLATION, "not in this protocol")


# ---- the same as websockets, byte by byte ---------------------------------------------------

# Close codes a client may or may not send (RFC 6455 section 7.4): valid, reserved, unassigned.
_CLOSE_CODES = [1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1011, 1015, 2999, 3000, 4999, 5000]


@dataclass(frozen=True)
class RawFrame:
    """A client frame as bytes, free to break any rule of RFC 6455 section 5.2."""

    first_byte: int
    payload: bytes
    masked: bool = True
    length_bytes: int = 0  # 0: the shortest encoding; 2 or 8: that extended length, always
    declared: int | None = None  # a length that is not the payload's

    def serialize(self) -> bytes:
        length = len(self.payload) if self.declared is None else self.declared
        second = 0x80 if self.masked else 0
        if self.length_bytes == 8 or length > 0xFFFF:
            header = bytes((self.first_byte, second | 127)) + struct.pack("!Q", length)
        elif self.length_bytes == 2 or length > 125:
            header = bytes((self.first_byte, second | 126)) + struct.pack("!H", length)
        else:
            header = bytes((self.first_byte, second | length))
        if not self.masked:
            return header + self.payload
        mask = os.urandom(4)
        return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(self.payload))


_texts = st.one_of(
    st.text(max_size=40).map(str.encode),
    st.text(max_size=40).map(str.encode),
    st.binary(max_size=40),  # mostly not UTF-8
    st.integers(SMALL_LIMIT - 3, SMALL_LIMIT + 3).map(lambda n: b"x" * n),
)
_close_payloads = st.one_of(
    st.builds(
        lambda code, reason: struct.pack("!H", code) + reason,
        st.sampled_from(_CLOSE_CODES),
        st.one_of(st.text(max_size=20).map(str.encode), st.just(b"\xc3\x28")),
    ),
    st.binary(max_size=2),
)


@st.composite
def raw_frames(draw: st.DrawFn) -> RawFrame:
    """Mostly frames a client may send; now and then one breaking a rule."""
    opcode = draw(st.sampled_from([0x1] * 5 + [0x2] * 2 + [0x0, 0x8, 0x8, 0x9, 0x9, 0xA, 0x3, 0xB]))
    fin = draw(st.sampled_from([True] * 5 + [False]))
    rsv = draw(st.sampled_from([0] * 12 + [0x10, 0x40]))
    if opcode == 0x8:
        payload = draw(_close_payloads)
    elif opcode in (0x9, 0xA):
        payload = draw(st.one_of(st.binary(max_size=20), st.integers(120, 130).map(bytes)))
    else:
        payload = draw(_texts)
    return RawFrame(
        (0x80 if fin else 0) | rsv | opcode,
        payload,
        masked=draw(st.sampled_from([True] * 15 + [False])),
        length_bytes=draw(st.sampled_from([0] * 8 + [2, 8])),
        declared=draw(st.sampled_from([None] * 40 + [2**40, 2**63 + 1])),
    )


@st.composite
def fragmented_messages(draw: st.DrawFn) -> list[RawFrame]:
    """A message in pieces, perhaps with pings between them: what splitting a valid message
    looks like, which random frames rarely are."""
    text = draw(st.booleans())
    if draw(st.booleans()):
        data = draw(st.text(min_size=1, max_size=30)).encode() if text else draw(st.binary())
    else:  # around the size limit, which counts all the pieces
        data = b"y" * draw(st.integers(SMALL_LIMIT - 20, SMALL_LIMIT + 20))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=3)))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    frames = []
    for i, piece in enumerate(pieces):
        opcode = (0x1 if text else 0x2) if i == 0 else 0x0
        frames.append(RawFrame((0x80 if i == len(pieces) - 1 else 0) | opcode, piece))
        if draw(st.booleans()):
            frames.append(RawFrame(0x89, b"between"))
    return frames


_streams = st.lists(
    st.one_of(raw_frames().map(lambda frame: [frame]), fragmented_messages()),
    min_size=1,
    max_size=10,
).map(lambda groups: b"".join(frame.serialize() for group in groups for frame in group))


@dataclass
class Outcome:
    messages: list[Message]
    written: bytes
    eof: bool
    state: State


def as_websockets_reads(data: bytes, limit: int) -> Outcome:
    """What a stock `websockets` server makes of `data`, its application reading each message
    as soon as it is whole (`recv()` in a loop), which is when `websockets` checks UTF-8. Fed a
    byte at a time, so that each message is seen before the frame after it."""
    protocol = ServerProtocol(max_size=limit, state=State.OPEN)
    messages: list[Message] = []
    pieces: list[bytes] = []
    text = False
    written = bytearray()
    eof = False
    for i in range(len(data)):
        protocol.receive_data(data[i : i + 1])
        for frame in protocol.events_received():
            assert isinstance(frame, Frame)
            if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                text, pieces = frame.opcode is Opcode.TEXT, []
            if frame.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                pieces.append(frame.data)
            if frame.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT) and frame.fin:
                message = b"".join(pieces)
                if not text:
                    messages.append(message)
                    continue
                try:
                    messages.append(message.decode())
                except UnicodeDecodeError as exc:  # as websockets' recv() answers it
                    protocol.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
        for chunk in protocol.data_to_send():
            if chunk:
                written += chunk
            else:
                eof = True
    return Outcome(messages, bytes(written), eof, protocol.state)


def as_media_socket_reads(data: bytes, limit: int, cuts: list[int]) -> Outcome:
    conn, wire, got = connection(limit)
    feed(conn, data, cuts)
    return Outcome(got, bytes(wire.written), wire.eof, conn.state)


@settings(max_examples=400, deadline=None)
@given(_streams, st.data())
def test_any_stream_reads_as_websockets_reads_it(data: bytes, draw: st.DataObject) -> None:
    if draw.draw(st.sampled_from([False, False, False, True]), label="cut short"):
        data = data[: draw.draw(st.integers(0, len(data)), label="the stream ends at")]
    cuts = draw.draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=6), label="cuts")

    async def both() -> tuple[Outcome, Outcome]:
        return as_websockets_reads(data, SMALL_LIMIT), as_media_socket_reads(
            data, SMALL_LIMIT, cuts
        )

    expected, got = asyncio.run(both())
    assert got == expected


def _frames(*frames: RawFrame) -> bytes:
    return b"".join(frame.serialize() for frame in frames)


# Rules broken alone and together, where the order of `websockets`' checks decides the answer;
# and valid streams the random ones rarely make.
BROKEN_RULES = {
    "an unknown opcode, unmasked": _frames(RawFrame(0x83, b"abc", masked=False)),
    "unmasked and too big": _frames(RawFrame(0x81, b"x" * (SMALL_LIMIT + 1), masked=False)),
    "reserved bits, too big": _frames(RawFrame(0xC1, b"x" * (SMALL_LIMIT + 1))),
    "reserved bits on a ping": _frames(RawFrame(0xC9, b"hi")),
    "a ping too long and fragmented": _frames(RawFrame(0x09, bytes(130))),
    "a continuation of nothing": _frames(RawFrame(0x80, b"x")),
    "a close too long inside a message": _frames(
        RawFrame(0x01, b"half"), RawFrame(0x88, struct.pack("!H", 1000) + b"x" * 124)
    ),
    "a fragmented close inside a message": _frames(
        RawFrame(0x01, b"half"), RawFrame(0x08, struct.pack("!H", 1000))
    ),
    "pieces past the limit together": _frames(
        RawFrame(0x01, b"x" * 300), RawFrame(0x00, b"y" * 200), RawFrame(0x80, b"z" * 101)
    ),
    "pieces up to the limit": _frames(RawFrame(0x02, b"x" * 300), RawFrame(0x80, b"z" * 300)),
    "a ping between pieces": _frames(
        RawFrame(0x01, b"one "), RawFrame(0x89, b"?"), RawFrame(0x80, b"message")
    ),
    "a character split between pieces": _frames(
        RawFrame(0x01, "é".encode()[:1]), RawFrame(0x80, "é".encode()[1:])
    ),
    "bad UTF-8 across pieces": _frames(RawFrame(0x01, b"ok \xc3"), RawFrame(0x80, b"(")),
    "a close with a code nobody may send": _frames(RawFrame(0x88, struct.pack("!H", 1006))),
    "a close one byte long": _frames(RawFrame(0x88, b"\x03")),
    "a pong, then a close with a reason": _frames(
        RawFrame(0x8A, b""), RawFrame(0x88, struct.pack("!H", 1001) + "adieu é".encode())
    ),
    "a 64-bit length with its top bit set": _frames(RawFrame(0x82, b"", declared=2**63)),
    "a long length for a short frame": _frames(RawFrame(0x81, b"short", length_bytes=8)),
}


@pytest.mark.parametrize("name", BROKEN_RULES)
async def test_each_broken_rule_reads_as_websockets_reads_it(name: str) -> None:
    data = BROKEN_RULES[name]
    expected = as_websockets_reads(data, SMALL_LIMIT)
    for cuts in [[], list(range(1, len(data)))] + [[cut] for cut in range(1, len(data))]:
        assert as_media_socket_reads(data, SMALL_LIMIT, cuts) == expected, cuts


async def test_close_frames_inside_fragmented_messages_get_websockets_answers() -> None:
    # RFC 6455 lets a close come between a message's pieces; `websockets` fails the connection
    # for it, after checking the close frame itself. The random streams rarely hit these.
    opening = RawFrame(0x01, b"half of it").serialize()
    closes = [
        struct.pack("!H", 1000) + b"bye",
        struct.pack("!H", 1005),  # may not be sent
        b"\x03",  # too short
        struct.pack("!H", 1000) + b"\xc3\x28",  # not UTF-8
        b"",
    ]
    for payload in closes:
        data = opening + RawFrame(0x88, payload).serialize()
        assert as_media_socket_reads(data, MAX_SIZE, []) == as_websockets_reads(data, MAX_SIZE)


def test_the_reader_unmasks_with_websockets_c_code_and_without_it_alike() -> None:
    # `websockets.speedups.apply_mask` is undocumented: if a release drops it, this fails
    # loudly (the media path would run, 1.2 us a frame slower, on the Python fallback).
    from websockets.speedups import apply_mask

    assert websocket_frames.apply_mask is apply_mask
    for size in (0, 1, 3, 4, 5, 160, 333, 1500):
        data, mask = os.urandom(size), os.urandom(4)
        expected = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        assert websocket_frames._unmask_in_python(data, mask) == expected
        assert apply_mask(data, mask) == expected


# ---- over real sockets ----------------------------------------------------------------------


@dataclass
class Served:
    url: str
    port: int
    connections: list[MediaConnection]
    messages: list[Message]


async def _hold(connection: ServerConnection, request: Request) -> Response | None:
    assert isinstance(connection, MediaConnection)
    connection.hold_messages(MAX_SIZE)
    return None


@asynccontextmanager
async def served(**options: Any) -> AsyncIterator[Served]:
    found = Served("", 0, [], [])

    async def handler(ws: ServerConnection) -> None:
        assert isinstance(ws, MediaConnection)
        found.connections.append(ws)
        ws.deliver_to(found.messages.append)
        await ws.wait_closed()

    options.setdefault("compression", None)
    async with serve(
        handler,
        "127.0.0.1",
        0,
        process_request=_hold,
        create_connection=MediaConnection,
        max_size=MAX_SIZE,
        **options,
    ) as server:
        found.port = next(iter(server.sockets)).getsockname()[1]
        found.url = f"ws://127.0.0.1:{found.port}/twilio"
        yield found


async def test_over_a_socket_websockets_keeps_pings_keepalive_and_the_closing_handshake() -> None:
    async with served() as server:
        async with connect(server.url) as ws:
            await ws.send("hello")
            await asyncio.wait_for(await ws.ping(b"client"), 10)  # answered by websockets
            [media] = server.connections
            # The server's own ping: its pong comes back through the media socket's reader.
            await asyncio.wait_for(await media.ping(b"keepalive"), 10)
            await ws.send(b"\x00\x01")
        await asyncio.wait_for(media.wait_closed(), 10)
        assert server.messages == ["hello", b"\x00\x01"]
        assert media.closed_cleanly()


async def test_a_client_that_sends_before_the_handshake_response_is_refused() -> None:
    # RFC 6455 section 4.1: a client waits for the 101 before it sends frames.
    async with served() as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        request = (
            "GET /twilio HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        )
        writer.write(request.encode() + client_frame(Opcode.TEXT, b"too early"))
        answer = await asyncio.wait_for(reader.read(), 10)  # until the server ends the stream
        writer.close()
        head, _, frames = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101")
        client = ClientProtocol(parse_uri("ws://caller/"), state=State.OPEN)
        client.receive_data(frames)
        [close] = [e for e in client.events_received() if isinstance(e, Frame)]
        assert Close.parse(close.data) == Close(
            CloseCode.PROTOCOL_ERROR, "data before the handshake response"
        )
        assert server.messages == []


async def test_media_sockets_refuse_to_run_with_compression(caplog: Any) -> None:
    # The reader knows no extension; a server set up with one fails its calls loudly.
    async with served(compression="deflate") as server:
        async with connect(server.url) as ws:
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
        assert ws.close_code == CloseCode.INTERNAL_ERROR
        assert "media sockets need serve(compression=None)" in caplog.text
        assert server.messages == []

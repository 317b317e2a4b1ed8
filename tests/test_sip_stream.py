"""SIP on a connection cut into messages (voice_agent/sip/stream.py, RFC 3261 section 18.3,
RFC 5626 keep-alives), sans-I/O: bytes in however the network splits them, whole messages out,
and every way a peer can break the framing refused with its reason."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from voice_agent.sip.message import parse_message
from voice_agent.sip.stream import (
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    PING,
    StreamFramer,
)

BODY = b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"


def message(method: str = "OPTIONS", body: bytes = b"", length: str | None = None) -> bytes:
    lines = [
        f"{method} sip:agent@127.0.0.1 SIP/2.0",
        "Via: SIP/2.0/TCP 127.0.0.1:5061;branch=z9hG4bK1",
        "From: <sip:a@b>;tag=1",
        "To: <sip:agent@127.0.0.1>",
        "Call-ID: c1",
        f"CSeq: 1 {method}",
    ]
    if length != "":
        lines.append(f"Content-Length: {len(body) if length is None else length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


STREAM = [message(), message("INVITE", BODY), PING, message("BYE")]


@given(st.lists(st.integers(min_value=1, max_value=len(b"".join(STREAM)) - 1), max_size=12))
def test_however_the_bytes_are_split_the_same_messages_come_out(cuts: list[int]) -> None:
    data = b"".join(STREAM)
    edges = [0, *sorted(set(cuts)), len(data)]
    framer = StreamFramer()
    out: list[bytes] = []
    for start, end in itertools.pairwise(edges):
        out += framer.feed(data[start:end])
    assert out == STREAM
    assert framer.pending == 0
    assert parse_message(out[1]).body == BODY


def test_a_partial_message_is_pending_and_line_ends_between_messages_are_not() -> None:
    framer = StreamFramer()
    whole = message()
    assert framer.feed(whole[:30]) == [] and framer.pending == 30
    assert framer.feed(whole[30:] + b"\r\n") == [whole]
    assert framer.pending == 0  # a lone CRLF: a pong, or the start of a ping
    assert framer.feed(b"\r\n") == [PING]
    assert framer.feed(b"\r\n" + whole) == [whole]  # a stray CRLF before a start line


def test_the_compact_content_length_frames_too() -> None:
    data = message("INFO", b"Signal=5\r\n").replace(b"Content-Length:", b"l:")
    assert StreamFramer().feed(data) == [data]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (message(length=""), "without Content-Length"),
        (message(length="ten"), "is not a length"),
        (message(length="-1"), "is not a length"),
        (message(length=str(MAX_BODY_BYTES + 1)), f"a body of {MAX_BODY_BYTES + 1} bytes"),
        (
            message().replace(b"Content-Length: 0", b"Content-Length: 0\r\nContent-Length: 9"),
            "given twice",
        ),
        (b"INVITE " + b"x" * (MAX_HEADER_BYTES + 1), "no end of the header section"),
        (
            message().replace(b"Call-ID: c1", b"X-Pad: " + b"p" * MAX_HEADER_BYTES),
            "a header section of",
        ),
    ],
)
def test_a_broken_framing_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    """What was whole before it comes out; nothing after it is read: the caller closes the
    connection."""
    framer = StreamFramer()
    first = message()
    assert framer.feed(first + data) == [first]
    assert framer.error is not None and reason in framer.error
    assert framer.feed(message()) == [] and framer.pending == 0


def test_what_was_whole_before_a_lie_is_kept() -> None:
    """A Content-Length larger than what comes holds the connection's bytes, bounded: the
    messages before it are out already, and the I/O layer's read deadline ends the wait."""
    framer = StreamFramer()
    first = message()
    lie = message("INFO", b"x", length="40000")
    assert framer.feed(first + lie) == [first]
    assert framer.pending == len(lie)

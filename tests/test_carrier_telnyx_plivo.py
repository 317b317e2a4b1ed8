"""The /telnyx and /plivo wire codecs: the carriers' documented messages parsed to typed events,
the encoders' output against the documented shapes, Telnyx's chunk reordering, the limits and
the errors, and random JSON objects raising nothing but ProtocolError."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voice_agent.transports import plivo, telnyx
from voice_agent.transports.errors import ProtocolError, ProtocolWarning
from voice_agent.transports.plivo import PlivoStream
from voice_agent.transports.telnyx import ChunkReorder, TelnyxStream

ULAW = bytes(range(96, 256))  # 160 bytes: one 20 ms frame of 8 kHz mu-law
B64 = base64.b64encode(ULAW).decode()


def dumps(message: dict[str, Any]) -> str:
    return json.dumps(message, indent=2)


def kinds(events: list[Any]) -> list[str]:
    return [e.kind for e in events if isinstance(e, ProtocolWarning)]


def media_of(events: list[Any], module: Any) -> list[Any]:
    return [e for e in events if isinstance(e, module.Media)]


# == Telnyx ======================================================================================

# https://developers.telnyx.com/api-reference/websockets/stream-call-media-over-websocket
# (the AsyncAPI examples) and https://developers.telnyx.com/docs/voice/programmable-voice/
# media-streaming (the media, stop, mark, dtmf and error examples), copied as shown.
T_STREAM = "32DE0DEA-53CB-4B21-89A4-9E1819C043BC"
T_CALL = "v2:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ"
T_USER = "3E6F995F-85F7-4705-9741-53B116D28237"
T_CONNECTED: dict[str, Any] = {"event": "connected", "version": "1.0.0"}
T_START: dict[str, Any] = {
    "event": "start",
    "sequence_number": "1",
    "stream_id": T_STREAM,
    "start": {
        "user_id": T_USER,
        "call_control_id": T_CALL,
        "call_session_id": "ff55a038-6f5d-11ef-9692-02420aeffb1f",
        "from": "+13122010094",
        "to": "+13122123456",
        "tags": ["TAG1", "TAG2"],
        "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d",
        "custom_parameters": {"customer_id": "customer_123"},
        "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
    },
}
# The older page's start (docs/v2/.../media_streaming_over_websockets): "audio/x-mulaw", no
# call_session_id, from or to, stream_id after the start object.
T_START_V2: dict[str, Any] = {
    "event": "start",
    "sequence_number": "1",
    "start": {
        "user_id": "3e6f995f-85f7-4705-9741-53b116d28237",
        "call_control_id": "v3:MdI91X4lWFEs7IgbBEOT9M4AigoY08M0WWZFISt1Yw2axZ_IiE4pqg",
        "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d",
        "media_format": {"encoding": "audio/x-mulaw", "sample_rate": 8000, "channels": 1},
    },
    "stream_id": "32de0dea-53cb-4b21-89a4-9e1819c043bc",
}
T_STOP: dict[str, Any] = {
    "event": "stop",
    "sequence_number": "5",
    "stop": {"user_id": T_USER, "call_control_id": T_CALL},
    "stream_id": T_STREAM,
}
T_MARK: dict[str, Any] = {
    "event": "mark",
    "stream_id": T_STREAM,
    "sequence_number": "5",
    "mark": {"name": "some_mark_name"},
}
T_DTMF: dict[str, Any] = {
    "event": "dtmf",
    "stream_id": T_STREAM,
    "occurred_at": "2025-06-05T08:54:19.698408Z",
    "sequence_number": "5",
    "dtmf": {"digit": "1"},
}
T_ERROR: dict[str, Any] = {
    "event": "error",
    "payload": {
        "code": 100002,
        "title": "unknown_error",
        "detail": "An unknown error occurred on the stream",
    },
    "stream_id": "uuid",
}


def t_media(n: int, payload: str | None = B64, **changes: Any) -> str:
    """The documented media example ("track": "inbound/outbound" made "inbound", the elided
    payload a real frame), for chunk `n`; a field given as None is left out."""
    body: dict[str, Any] = {
        "track": "inbound",
        "chunk": str(n),
        "timestamp": str(20 * n),
        "payload": payload,
    }
    message: dict[str, Any] = {
        "event": "media",
        "sequence_number": str(n + 2),
        "media": body,
        "stream_id": T_STREAM,
    }
    for key, value in changes.items():
        (body if key in body else message)[key] = value
    for target in (body, message):
        for key in [key for key, value in target.items() if value is None]:
            del target[key]
    return json.dumps(message)


def t_start_with(**start_changes: Any) -> str:
    message = copy.deepcopy(T_START)
    for key, value in start_changes.items():
        if value is None:
            del message["start"][key]
        else:
            message["start"][key] = value
    return dumps(message)


def t_started() -> TelnyxStream:
    stream = TelnyxStream()
    stream.receive(dumps(T_CONNECTED))
    stream.receive(dumps(T_START))
    return stream


def t_chunks(stream: TelnyxStream, order: list[int]) -> list[Any]:
    events: list[Any] = []
    for chunk in order:
        events.extend(
            stream.receive(t_media(chunk, payload=base64.b64encode(bytes([chunk])).decode()))
        )
    return events


def test_telnyx_parses_a_whole_stream() -> None:
    stream = TelnyxStream()
    events = [
        *stream.receive(dumps(T_CONNECTED)),
        *stream.receive(dumps(T_START)),
        *stream.receive(t_media(2)),
        *stream.receive(dumps(T_DTMF)),
        *stream.receive(dumps(T_MARK)),
        *stream.receive(dumps(T_ERROR)),
        *stream.receive(dumps(T_STOP)),
    ]
    start = stream.start
    assert start is not None
    assert events == [
        telnyx.Connected("1.0.0"),
        start,
        telnyx.Media(sequence=4, chunk=2, timestamp_ms=40, track="inbound", payload=ULAW),
        telnyx.Dtmf(5, "1", "2025-06-05T08:54:19.698408Z"),
        telnyx.Mark(5, "some_mark_name"),
        telnyx.StreamError(100002, "unknown_error", "An unknown error occurred on the stream"),
        telnyx.Stop(5, T_CALL, T_USER),
    ]
    assert stream.state is telnyx.StreamState.STOPPED


def test_telnyx_start_names_the_call_agent_and_args() -> None:
    [start] = TelnyxStream().receive(dumps(T_START))
    assert isinstance(start, telnyx.Start)
    assert (start.stream_id, start.call_id, start.call_session_id) == (
        T_STREAM,
        T_CALL,
        "ff55a038-6f5d-11ef-9692-02420aeffb1f",
    )
    assert (start.from_, start.to, start.user_id) == ("+13122010094", "+13122123456", T_USER)
    assert (start.tags, start.client_state) == (("TAG1", "TAG2"), "aGF2ZSBhIG5pY2UgZGF5ID1d")
    assert start.media_format == telnyx.MediaFormat("PCMU", 8000, 1)
    assert start.media_format.carrier_encoding == "mulaw"
    # TeXML <Parameter name="agent" value="booking"/> / Call Control custom_parameters.
    assert start.agent is None
    assert start.agent_args == {"customer_id": "customer_123"}
    params = {"agent": "booking", "customer_id": "customer_123"}
    [chosen] = TelnyxStream().receive(t_start_with(custom_parameters=params))
    assert isinstance(chosen, telnyx.Start)
    assert (chosen.agent, chosen.agent_args) == ("booking", {"customer_id": "customer_123"})


def test_telnyx_takes_the_older_pages_start_and_other_formats() -> None:
    [old] = TelnyxStream().receive(dumps(T_START_V2))
    assert isinstance(old, telnyx.Start)
    assert old.media_format.carrier_encoding == "mulaw"
    assert (old.call_session_id, old.from_, old.to, old.custom_parameters) == ("", "", "", {})
    for encoding, rate, carrier, per_ms in [
        ("PCMA", 8000, "alaw", 8.0),
        ("L16", 16000, "pcm16", 32.0),
        ("L16", 8000, "pcm16", 16.0),
    ]:
        fmt = {"encoding": encoding, "sample_rate": rate, "channels": 1}
        [start] = TelnyxStream().receive(t_start_with(media_format=fmt))
        assert isinstance(start, telnyx.Start)
        assert (start.media_format.carrier_encoding, start.media_format.bytes_per_ms) == (
            carrier,
            per_ms,
        )


def test_telnyx_connected_carries_the_streaming_auth_token() -> None:
    stream = TelnyxStream()
    message = {**T_CONNECTED, "connected": {"x-telnyx-streaming-auth-token": "s3cret"}}
    assert stream.receive(json.dumps(message)) == [telnyx.Connected("1.0.0", "s3cret")]
    assert stream.connected == telnyx.Connected("1.0.0", "s3cret")
    # connected is optional
    assert isinstance(TelnyxStream().receive(dumps(T_START))[0], telnyx.Start)


def test_telnyx_out_of_order_chunks_come_out_in_order() -> None:
    stream = t_started()
    events = t_chunks(stream, [1, 3, 2, 5, 4, 6])
    assert [m.chunk for m in media_of(events, telnyx)] == [1, 2, 3, 4, 5, 6]
    assert [m.payload for m in media_of(events, telnyx)] == [bytes([c]) for c in range(1, 7)]
    assert kinds(events) == []


def test_telnyx_a_lost_chunk_is_given_up_after_the_window() -> None:
    stream = t_started()
    events = t_chunks(stream, [1, 3, 4, 5, 6])
    assert [m.chunk for m in media_of(events, telnyx)] == [1]  # 3..6 held, waiting for 2
    events = t_chunks(stream, [7])  # the fifth one held: 2 is given up
    assert [m.chunk for m in media_of(events, telnyx)] == [3, 4, 5, 6, 7]
    assert kinds(events) == ["chunk_gap"]
    assert "1 media chunk(s) of track 'inbound' missing before 3" in events[0].message
    late = t_chunks(stream, [2])
    assert media_of(late, telnyx) == []
    assert kinds(late) == ["late_chunk"]


def test_telnyx_duplicate_and_too_old_chunks_are_dropped() -> None:
    stream = t_started()
    events = t_chunks(stream, [1, 2, 2, 4, 4, 3, 1])
    assert [m.chunk for m in media_of(events, telnyx)] == [1, 2, 3, 4]
    assert kinds(events) == ["duplicate_chunk", "duplicate_chunk", "duplicate_chunk"]
    assert [w.message for w in events if isinstance(w, ProtocolWarning)] == [
        "media chunk 2 of track 'inbound' dropped: already played",
        "media chunk 4 of track 'inbound' dropped: already held",
        "media chunk 1 of track 'inbound' dropped: already played",
    ]


def test_telnyx_a_restarted_chunk_count_is_followed() -> None:
    stream = t_started()
    t_chunks(stream, list(range(100, 160)))
    events = t_chunks(stream, [1, 2])
    assert [m.chunk for m in media_of(events, telnyx)] == [1, 2]
    assert kinds(events) == ["chunk_reset"]


def test_telnyx_stop_flushes_held_chunks_first() -> None:
    stream = t_started()
    t_chunks(stream, [1, 3, 4])
    events = stream.receive(dumps(T_STOP))
    assert [type(e).__name__ for e in events] == ["Media", "Media", "Stop"]
    assert [m.chunk for m in media_of(events, telnyx)] == [3, 4]


def test_telnyx_tracks_are_reordered_apart() -> None:
    stream = t_started()
    order = [(1, "inbound"), (1, "outbound"), (3, "inbound"), (2, "outbound"), (2, "inbound")]
    events: list[Any] = []
    for chunk, track in order:
        events.extend(stream.receive(t_media(chunk, track=track)))
    assert [(m.track, m.chunk) for m in media_of(events, telnyx)] == [
        ("inbound", 1),
        ("outbound", 1),
        ("outbound", 2),
        ("inbound", 2),
        ("inbound", 3),
    ]
    assert kinds(stream.receive(t_media(9, track="third"))) == ["unknown_track"]


def test_reorder_window_holds_at_most_its_size() -> None:
    reorder = ChunkReorder(window=3)
    out = reorder.push(telnyx.Media(0, 10, 0, "inbound", b"a"))
    assert [m.chunk for m in out if isinstance(m, telnyx.Media)] == [10]
    for chunk in (13, 14):
        assert reorder.push(telnyx.Media(0, chunk, 0, "inbound", b"a")) == []
    assert reorder.held == 2
    out = reorder.push(telnyx.Media(0, 16, 0, "inbound", b"a"))
    assert reorder.held == 1  # 16 still waits for 15
    assert [m.chunk for m in out if isinstance(m, telnyx.Media)] == [13, 14]
    with pytest.raises(ValueError):
        ChunkReorder(window=0)


def test_telnyx_media_payload_fast_path() -> None:
    stream = t_started()
    assert stream.media_payload(t_media(1)) == ULAW
    assert stream.media_payload(t_media(3)) is None  # out of order: receive holds it
    assert media_of(stream.receive(t_media(3)), telnyx) == []
    assert stream.media_payload(t_media(2)) is None  # something is held
    assert [m.chunk for m in media_of(stream.receive(t_media(2)), telnyx)] == [2, 3]
    assert stream.media_payload(t_media(4)) == ULAW
    assert stream.media_payload(t_media(5, track="outbound")) is None
    assert stream.media_payload(t_media(5, stream_id="other")) is None
    assert stream.media_payload(dumps(T_MARK)) is None
    assert TelnyxStream().media_payload(t_media(1)) is None  # not started


def test_telnyx_harmless_problems_are_warnings() -> None:
    stream = TelnyxStream()
    assert kinds(stream.receive(t_media(1))) == ["before_start"]
    stream.receive(dumps(T_START))
    assert kinds(stream.receive('{"event": "transcription", "x": 1}')) == ["unknown_event"]
    bad_digit = {**T_DTMF, "dtmf": {"digit": "Z"}}
    assert kinds(stream.receive(json.dumps(bad_digit))) == ["invalid_dtmf"]
    assert kinds(stream.receive(t_media(1, payload=""))) == ["empty_payload"]
    stream.receive(dumps(T_STOP))
    assert kinds(stream.receive(t_media(2))) == ["after_stop"]
    # An error frame is news at any time, and a stop before start still ends the call.
    fresh = TelnyxStream()
    assert fresh.receive(json.dumps({"event": "error"})) == [telnyx.StreamError(0, "", "")]
    assert fresh.receive('{"event": "stop"}') == [telnyx.Stop(0, "")]


G722 = {"encoding": "G722", "sample_rate": 8000, "channels": 1}
STEREO = {"encoding": "PCMU", "sample_rate": 8000, "channels": 2}
L16_24K = {"encoding": "L16", "sample_rate": 24000, "channels": 1}
T_FORMATS = "is not PCMU/PCMA 8000 or L16 8000/16000 Hz mono"
T_BAD_JSON = "message is not valid JSON: unexpected character, expected a string key"
EARLY = [t_media(n) for n in range(1, telnyx.MAX_EARLY_MEDIA + 1)]
T_START_TEXT = dumps(T_START)

# (id, messages before, message, close code, kind, reason)
TELNYX_ERRORS: list[tuple[str, list[str], str, int, str, str]] = [
    ("not json", [], "{event: media}",
     1002, "malformed_message", f"{T_BAD_JSON}: line 1 column 2 (char 1)"),
    ("not an object", [], "[1, 2]", 1002, "malformed_message", "message is not a JSON object"),
    ("no event", [], '{"stream_id": "x"}',
     1002, "malformed_message", 'message has no "event" string'),
    ("too big", [], " " * 32_769,
     1009, "message_too_big", "message of 32769 characters exceeds the 32768 limit"),
    ("media long before start", EARLY, t_media(9),
     1002, "out_of_order", "media message before start (6 of them)"),
    ("dtmf first", [], dumps(T_DTMF), 1002, "out_of_order", "dtmf message before start"),
    ("mark first", [], dumps(T_MARK), 1002, "out_of_order", "mark message before start"),
    ("second start", [T_START_TEXT], T_START_TEXT, 1002, "out_of_order", "second start message"),
    ("second connected", [dumps(T_CONNECTED)], dumps(T_CONNECTED),
     1002, "out_of_order", "connected message after connected"),
    ("no call_control_id", [], t_start_with(call_control_id=None),
     1002, "malformed_message", "start.call_control_id is missing"),
    ("no stream_id", [], json.dumps({k: v for k, v in T_START.items() if k != "stream_id"}),
     1002, "malformed_message", "stream_id is missing"),
    ("no media_format", [], t_start_with(media_format=None),
     1002, "malformed_message", "start.media_format is missing"),
    ("rate not a number", [], t_start_with(media_format={"encoding": "PCMU", "sample_rate": "8k"}),
     1002, "malformed_message",
     'start.media_format.sample_rate is not a non-negative integer (got "8k")'),
    ("tags not a list", [], t_start_with(tags="TAG1"),
     1002, "malformed_message", "start.tags is not a list of strings"),
    ("parameter not text", [], t_start_with(custom_parameters={"party": 2}),
     1002, "malformed_message", "start.custom_parameters.party is not a string"),
    ("g722", [], t_start_with(media_format=G722),
     1003, "unsupported_media_format", f"media_format G722 8000 Hz x1 {T_FORMATS}"),
    ("stereo", [], t_start_with(media_format=STEREO),
     1003, "unsupported_media_format", f"media_format PCMU 8000 Hz x2 {T_FORMATS}"),
    ("l16 24k", [], t_start_with(media_format=L16_24K),
     1003, "unsupported_media_format", f"media_format L16 24000 Hz x1 {T_FORMATS}"),
    ("bad base64", [T_START_TEXT], t_media(1, payload="not base64!"),
     1002, "invalid_payload", "media.payload is not valid base64"),
    ("payload too big", [T_START_TEXT], t_media(1, payload=base64.b64encode(bytes(6401)).decode()),
     1008, "payload_too_large", "media.payload of 6401 bytes exceeds 6400"),
    ("no payload", [T_START_TEXT], t_media(1, payload=None),
     1002, "malformed_message", "media.payload is missing"),
    ("chunk not a number", [T_START_TEXT], t_media(1, chunk="one"),
     1002, "malformed_message", 'media.chunk is not a non-negative integer (got "one")'),
    ("negative timestamp", [T_START_TEXT], t_media(1, timestamp=-5),
     1002, "malformed_message", "media.timestamp is not a non-negative integer (got -5)"),
    ("no track", [T_START_TEXT], t_media(1, track=None),
     1002, "malformed_message", "media.track is missing"),
    ("no sequence_number", [T_START_TEXT], t_media(1, sequence_number=None),
     1002, "malformed_message", "sequence_number is missing"),
    ("other stream", [T_START_TEXT], t_media(1, stream_id="other"),
     1002, "wrong_stream", f"stream_id 'other' is not this stream's '{T_STREAM}'"),
    ("media without stream_id", [T_START_TEXT], t_media(1, stream_id=None),
     1002, "malformed_message", "media message has no stream_id"),
    ("mark without name", [T_START_TEXT], json.dumps({**T_MARK, "mark": {}}),
     1002, "malformed_message", "mark.name is missing"),
    ("dtmf without digit", [T_START_TEXT], json.dumps({**T_DTMF, "dtmf": {"digit": ""}}),
     1002, "malformed_message", "dtmf.digit is not a non-empty string"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("before", "text", "code", "kind", "reason"),
    [case[1:] for case in TELNYX_ERRORS],
    ids=[case[0] for case in TELNYX_ERRORS],
)
def test_telnyx_protocol_errors(
    before: list[str], text: str, code: int, kind: str, reason: str
) -> None:
    stream = TelnyxStream()
    for message in before:
        stream.receive(message)
    assert stream.media_payload(text) is None  # the fast path declines it, untouched
    with pytest.raises(ProtocolError) as caught:
        stream.receive(text)
    assert (caught.value.code, caught.value.kind, caught.value.reason) == (code, kind, reason)
    assert len(caught.value.close_reason.encode()) <= 123


def test_telnyx_binary_frames_are_refused() -> None:
    with pytest.raises(ProtocolError) as caught:
        TelnyxStream().receive_bytes(b"\x00" * 8)
    assert (caught.value.code, caught.value.kind) == (1003, "binary_frame")


def test_telnyx_encoders_produce_the_documented_messages() -> None:
    # https://developers.telnyx.com/docs/voice/programmable-voice/media-streaming
    # "Sending RTP Stream", "Clear Message", "Mark Message".
    stream = t_started()
    assert json.loads(stream.media_message(ULAW)) == {"event": "media", "media": {"payload": B64}}
    assert stream.media_message(ULAW) == telnyx.media_message(ULAW)
    assert json.loads(stream.clear_message()) == {"event": "clear"}
    assert json.loads(stream.mark_message("some_mark_name")) == {
        "event": "mark",
        "mark": {"name": "some_mark_name"},
    }
    assert json.loads(telnyx.mark_message('a "quoted" name')) == {
        "event": "mark",
        "mark": {"name": 'a "quoted" name'},
    }


# == Plivo =======================================================================================

# https://plivo.com/docs/voice/audio-streaming/audio-streaming (start) and
# https://www.plivo.com/docs/voice-agents/audio-streaming/concepts/audio-streaming-reference
# (media), copied as shown but for media's elided payload.
P_STREAM = "87654321-4321-4321-4321-cba987654321"
P_CALL = "12345678-1234-1234-1234-123456789abc"
P_START: dict[str, Any] = {
    "event": "start",
    "sequenceNumber": 1,
    "start": {
        "callId": P_CALL,
        "streamId": P_STREAM,
        "accountId": "MAXXXXXXXXXXXXXXXXXX",
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000},
    },
    "extra_headers": "userId=12345;sessionId=abc-xyz",
}
# .../xml/audiostream/stream-events-to-plivo/checkpoint-event (playedStream) and the support
# article 32800291247001 (clearedAudio): another stream's id, so a start of that stream.
P_CHECKPOINT_STREAM = "20170ada-f610-433b-8758-c02a2aab3662"
P_PLAYED: dict[str, Any] = {
    "event": "playedStream",
    "streamId": P_CHECKPOINT_STREAM,
    "name": "customer greeting audio",
}
P_CLEARED: dict[str, Any] = {
    "sequenceNumber": 0,
    "event": "clearedAudio",
    "streamId": P_CHECKPOINT_STREAM,
}
# No dtmf example was in the stored pages; its fields (dtmf.digit) as Plivo's
# agent-transport library and Pipecat's Plivo serializer read them.
P_DTMF: dict[str, Any] = {
    "event": "dtmf",
    "sequenceNumber": 43,
    "streamId": P_STREAM,
    "dtmf": {"digit": "5", "track": "inbound"},
}


def p_media(sequence: int = 42, payload: Any = B64, **changes: Any) -> str:
    body: dict[str, Any] = {
        "track": "inbound",
        "timestamp": "1705312200000",
        "chunk": sequence - 1,
        "payload": payload,
    }
    message: dict[str, Any] = {
        "event": "media",
        "sequenceNumber": sequence,
        "streamId": P_STREAM,
        "media": body,
        "extra_headers": "userId=12345;sessionId=abc-xyz",
    }
    for key, value in changes.items():
        (body if key in body else message)[key] = value
    for target in (body, message):
        for key in [key for key, value in target.items() if value is None]:
            del target[key]
    return json.dumps(message)


def p_start_with(outer: dict[str, Any] | None = None, **start_changes: Any) -> str:
    message = copy.deepcopy(P_START)
    message.update(outer or {})
    for key, value in start_changes.items():
        if value is None:
            del message["start"][key]
        else:
            message["start"][key] = value
    return dumps(message)


P_START_TEXT = dumps(P_START)


def p_started(**start_changes: Any) -> PlivoStream:
    stream = PlivoStream()
    stream.receive(p_start_with(**start_changes))
    return stream


def test_plivo_parses_a_whole_stream() -> None:
    stream = PlivoStream()
    events = [
        *stream.receive(P_START_TEXT),
        *stream.receive(p_media()),
        *stream.receive(dumps(P_DTMF)),
        *stream.receive('{"event": "stop"}'),
    ]
    start = stream.start
    assert start is not None
    assert events == [
        start,
        plivo.Media(42, 41, 1705312200000, "inbound", ULAW),
        plivo.Dtmf(43, "5", "inbound"),
        plivo.Stop(0),
    ]
    assert (start.stream_id, start.call_id, start.account_id, start.tracks) == (
        P_STREAM,
        P_CALL,
        "MAXXXXXXXXXXXXXXXXXX",
        ("inbound",),
    )
    assert start.media_format == plivo.MediaFormat("audio/x-mulaw", 8000)
    assert start.media_format.carrier_encoding == "mulaw"
    assert start.extra_headers == {"userId": "12345", "sessionId": "abc-xyz"}
    assert stream.state is plivo.StreamState.STOPPED


def test_plivo_checkpoint_answers_are_marks() -> None:
    stream = p_started(streamId=P_CHECKPOINT_STREAM)
    assert stream.receive(dumps(P_PLAYED)) == [plivo.Mark(0, "customer greeting audio")]
    assert stream.receive(dumps(P_CLEARED)) == [plivo.Cleared(0)]
    # A support article names the answer "played"; peers may leave the streamId out.
    assert stream.receive('{"event": "played", "name": "n2"}') == [plivo.Mark(0, "n2")]


def test_plivo_extra_headers_name_the_agent_and_args() -> None:
    # The XML page's example format is "test1=12,test2=123".
    stream = PlivoStream()
    [start] = stream.receive(p_start_with({"extra_headers": "agent=booking,customer=12345"}))
    assert isinstance(start, plivo.Start)
    assert (start.agent, start.agent_args) == ("booking", {"customer": "12345"})
    for raw, expected in [
        ("test1=12,test2=123", {"test1": "12", "test2": "123"}),
        ("userId=12345;sessionId=abc-xyz", {"userId": "12345", "sessionId": "abc-xyz"}),
        ("a=1;;b=2,", {"a": "1", "b": "2"}),
        ("{}", {}),
        ('{"agent": "sales", "tier": 2}', {"agent": "sales", "tier": "2"}),
        ({"agent": "sales"}, {"agent": "sales"}),
        ("", {}),
        (None, {}),
        ("k=", {"k": ""}),
    ]:
        assert plivo.parse_extra_headers(raw) == expected, raw
    [bare] = PlivoStream().receive(
        json.dumps({k: v for k, v in P_START.items() if k != "extra_headers"})
    )
    assert isinstance(bare, plivo.Start)
    assert (bare.agent, bare.agent_args) == (None, {})


def test_plivo_takes_l16_at_both_rates() -> None:
    for rate, per_ms in [(8000, 16.0), (16000, 32.0)]:
        stream = p_started(mediaFormat={"encoding": "audio/x-l16", "sampleRate": str(rate)})
        assert stream.start is not None
        assert stream.start.media_format.carrier_encoding == "pcm16"
        assert stream.start.media_format.bytes_per_ms == per_ms
        assert json.loads(stream.media_message(b"\x01\x02")) == {
            "event": "playAudio",
            "media": {"contentType": "audio/x-l16", "sampleRate": rate, "payload": "AQI="},
        }


def test_plivo_encoders_produce_the_documented_messages() -> None:
    # .../stream-events-to-plivo/play-audio-event, checkpoint-event, clear-audio-stream.
    stream = p_started(streamId=P_CHECKPOINT_STREAM)
    assert json.loads(stream.media_message(ULAW)) == {
        "event": "playAudio",
        "media": {"contentType": "audio/x-mulaw", "sampleRate": 8000, "payload": B64},
    }
    assert stream.media_message(ULAW) == plivo.play_audio_message(ULAW, "audio/x-mulaw", 8000)
    assert json.loads(stream.mark_message("customer greeting audio")) == {
        "event": "checkpoint",
        "streamId": P_CHECKPOINT_STREAM,
        "name": "customer greeting audio",
    }
    assert json.loads(plivo.clear_audio_message("b77e037d-4119-44b5-902d-25826b654539")) == {
        "event": "clearAudio",
        "streamId": "b77e037d-4119-44b5-902d-25826b654539",
    }
    assert json.loads(stream.clear_message()) == {
        "event": "clearAudio",
        "streamId": P_CHECKPOINT_STREAM,
    }
    assert json.loads(plivo.play_audio_message(b"\x00\x00", "audio/x-l16", 16000))["media"] == {
        "contentType": "audio/x-l16",
        "sampleRate": 16000,
        "payload": "AAA=",
    }
    for content_type, rate in [("audio/x-mulaw", 16000), ("audio/wav", 8000)]:
        with pytest.raises(ValueError):
            plivo.play_audio_message(ULAW, content_type, rate)
    with pytest.raises(RuntimeError):
        PlivoStream().media_message(ULAW)


def test_plivo_media_payload_fast_path() -> None:
    stream = p_started()
    assert stream.media_payload(p_media()) == ULAW
    assert stream.media_payload(p_media(streamId=None)) == ULAW
    assert stream.media_payload(p_media(track="outbound")) is None
    assert stream.media_payload(p_media(streamId="other")) is None
    assert stream.media_payload(p_media(chunk="x")) is None
    assert stream.media_payload(dumps(P_DTMF)) is None
    assert PlivoStream().media_payload(p_media()) is None


def test_plivo_harmless_problems_are_warnings() -> None:
    stream = p_started()
    assert kinds(stream.receive('{"event": "muteStream"}')) == ["unknown_event"]
    bad_digit = {**P_DTMF, "dtmf": {"digit": "Z"}}
    assert kinds(stream.receive(json.dumps(bad_digit))) == ["invalid_dtmf"]
    assert kinds(stream.receive(p_media(payload=""))) == ["empty_payload"]
    stream.receive('{"event": "stop", "sequenceNumber": 9}')
    assert kinds(stream.receive(p_media())) == ["after_stop"]
    assert PlivoStream().receive('{"event": "stop"}') == [plivo.Stop(0)]


P_BAD_JSON = "message is not valid JSON: unexpected character, expected a string key"
P_FORMATS = "is not audio/x-mulaw 8000 or audio/x-l16 8000/16000 Hz"

PLIVO_ERRORS: list[tuple[str, list[str], str, int, str, str]] = [
    ("not json", [], "{event: media}",
     1002, "malformed_message", f"{P_BAD_JSON}: line 1 column 2 (char 1)"),
    ("not an object", [], '"start"', 1002, "malformed_message", "message is not a JSON object"),
    ("event not text", [], '{"event": 7}',
     1002, "malformed_message", 'message has no "event" string'),
    ("too big", [], " " * 16_385,
     1009, "message_too_big", "message of 16385 characters exceeds the 16384 limit"),
    ("media first", [], p_media(), 1002, "out_of_order", "media message before start"),
    ("dtmf first", [], dumps(P_DTMF), 1002, "out_of_order", "dtmf message before start"),
    ("played first", [], dumps(P_PLAYED),
     1002, "out_of_order", "playedStream message before start"),
    ("cleared first", [], dumps(P_CLEARED),
     1002, "out_of_order", "clearedAudio message before start"),
    ("second start", [P_START_TEXT], P_START_TEXT, 1002, "out_of_order", "second start message"),
    ("no callId", [], p_start_with(callId=None),
     1002, "malformed_message", "start.callId is missing"),
    ("empty streamId", [], p_start_with(streamId=""),
     1002, "malformed_message", "start.streamId is not a non-empty string"),
    ("no mediaFormat", [], p_start_with(mediaFormat=None),
     1002, "malformed_message", "start.mediaFormat is missing"),
    ("no sampleRate", [], p_start_with(mediaFormat={"encoding": "audio/x-mulaw"}),
     1002, "malformed_message", "start.mediaFormat.sampleRate is missing"),
    ("tracks not a list", [], p_start_with(tracks="inbound"),
     1002, "malformed_message", "start.tracks is not a list of strings"),
    ("accountId not text", [], p_start_with(accountId=5),
     1002, "malformed_message", "start.accountId is not a string"),
    ("sequence not a number", [], p_start_with({"sequenceNumber": "one"}),
     1002, "malformed_message", 'sequenceNumber is not a non-negative integer (got "one")'),
    ("header not key=value", [], p_start_with({"extra_headers": "agent"}),
     1002, "malformed_message", "extra_headers entry 'agent' is not key=value"),
    ("header json broken", [], p_start_with({"extra_headers": "{agent"}),
     1002, "malformed_message", "extra_headers is not a valid JSON object"),
    ("header not text", [], p_start_with({"extra_headers": {"agent": ["a"]}}),
     1002, "malformed_message", "extra_headers.agent is not a string"),
    ("headers a number", [], p_start_with({"extra_headers": 12}),
     1002, "malformed_message", "extra_headers is not a string or an object"),
    ("wav", [], p_start_with(mediaFormat={"encoding": "audio/wav", "sampleRate": 8000}),
     1003, "unsupported_media_format", f"mediaFormat audio/wav 8000 Hz {P_FORMATS}"),
    ("mulaw 16k", [], p_start_with(mediaFormat={"encoding": "audio/x-mulaw", "sampleRate": 16000}),
     1003, "unsupported_media_format", f"mediaFormat audio/x-mulaw 16000 Hz {P_FORMATS}"),
    ("bad base64", [P_START_TEXT], p_media(payload="AAA"),
     1002, "invalid_payload", "media.payload is not valid base64"),
    ("payload too big", [P_START_TEXT], p_media(payload=base64.b64encode(bytes(6401)).decode()),
     1008, "payload_too_large", "media.payload of 6401 bytes exceeds 6400"),
    ("payload not text", [P_START_TEXT], p_media(payload=5),
     1002, "malformed_message", "media.payload is not a string"),
    ("no media object", [P_START_TEXT], json.dumps({"event": "media", "streamId": P_STREAM}),
     1002, "malformed_message", "media is missing"),
    ("no chunk", [P_START_TEXT], p_media(chunk=None),
     1002, "malformed_message", "media.chunk is missing"),
    ("timestamp not a number", [P_START_TEXT], p_media(timestamp="soon"),
     1002, "malformed_message", 'media.timestamp is not a non-negative integer (got "soon")'),
    ("no track", [P_START_TEXT], p_media(track=None),
     1002, "malformed_message", "media.track is missing"),
    ("other stream", [P_START_TEXT], p_media(streamId="other"),
     1002, "wrong_stream", f"streamId 'other' is not this stream's '{P_STREAM}'"),
    ("played without name", [P_START_TEXT], '{"event": "playedStream"}',
     1002, "malformed_message", "name is missing"),
    ("dtmf without dtmf", [P_START_TEXT], '{"event": "dtmf"}',
     1002, "malformed_message", "dtmf is missing"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("before", "text", "code", "kind", "reason"),
    [case[1:] for case in PLIVO_ERRORS],
    ids=[case[0] for case in PLIVO_ERRORS],
)
def test_plivo_protocol_errors(
    before: list[str], text: str, code: int, kind: str, reason: str
) -> None:
    stream = PlivoStream()
    for message in before:
        stream.receive(message)
    assert stream.media_payload(text) is None
    with pytest.raises(ProtocolError) as caught:
        stream.receive(text)
    assert (caught.value.code, caught.value.kind, caught.value.reason) == (code, kind, reason)
    assert len(caught.value.close_reason.encode()) <= 123


def test_plivo_binary_frames_are_refused() -> None:
    with pytest.raises(ProtocolError) as caught:
        PlivoStream().receive_bytes(b"\x00")
    assert (caught.value.code, caught.value.kind) == (1003, "binary_frame")


# == Random JSON: nothing but ProtocolError ======================================================

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 2**40)
    | st.sampled_from(["", "1", "inbound", "PCMU", "audio/x-mulaw", B64, "a=b", "{}"])
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_TELNYX_DOCS = [T_CONNECTED, T_START, T_STOP, T_MARK, T_DTMF, T_ERROR, json.loads(t_media(1))]
_PLIVO_DOCS = [P_START, P_PLAYED, P_CLEARED, P_DTMF, json.loads(p_media())]


def _paths(value: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            paths.extend(_paths(item, (*prefix, key)))
    return paths


@st.composite
def _mutated(draw: st.DrawFn, documents: list[dict[str, Any]]) -> dict[str, Any]:
    """A documented message with one field replaced by random JSON, or removed; or an object
    of random fields around a known or random event."""
    if draw(st.booleans()):
        message = copy.deepcopy(draw(st.sampled_from(documents)))
        path = draw(st.sampled_from(_paths(message)))
        parent = message
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(_JSON)
        return message
    events = sorted({str(d.get("event")) for d in documents} | {"media", "stop"})
    message = draw(
        st.dictionaries(st.sampled_from(sorted(_all_keys(documents))), _JSON, max_size=4)
    )
    message["event"] = draw(st.sampled_from(events) | _JSON)
    return message


def _all_keys(documents: list[dict[str, Any]]) -> set[str]:
    return {path[-1] for document in documents for path in _paths(document)}


TELNYX_EVENTS = (
    telnyx.Connected,
    telnyx.Start,
    telnyx.Media,
    telnyx.Dtmf,
    telnyx.Mark,
    telnyx.StreamError,
    telnyx.Stop,
    ProtocolWarning,
)
PLIVO_EVENTS = (
    plivo.Start,
    plivo.Media,
    plivo.Dtmf,
    plivo.Mark,
    plivo.Cleared,
    plivo.Stop,
    ProtocolWarning,
)


def _feed(stream: Any, allowed: tuple[type, ...], message: dict[str, Any]) -> None:
    text = json.dumps(message)
    try:
        events = stream.receive(text)
    except ProtocolError as error:
        assert error.code in (1002, 1003, 1008, 1009)
        assert error.reason and len(error.close_reason.encode()) <= 123
        return
    assert isinstance(events, list)
    assert all(isinstance(e, allowed) for e in events), events


@settings(max_examples=75, deadline=None, database=None)
@given(_mutated(_TELNYX_DOCS), st.booleans())
def test_telnyx_random_json_raises_only_protocol_errors(
    message: dict[str, Any], started: bool
) -> None:
    stream = t_started() if started else TelnyxStream()
    stream.media_payload(json.dumps(message))
    _feed(stream, TELNYX_EVENTS, message)


@settings(max_examples=75, deadline=None, database=None)
@given(_mutated(_PLIVO_DOCS), st.booleans())
def test_plivo_random_json_raises_only_protocol_errors(
    message: dict[str, Any], started: bool
) -> None:
    stream = p_started() if started else PlivoStream()
    stream.media_payload(json.dumps(message))
    _feed(stream, PLIVO_EVENTS, message)


@settings(max_examples=100, deadline=None, database=None)
@given(st.lists(st.integers(1, 40), max_size=60))
def test_reorder_output_is_increasing_and_accounts_for_every_chunk(chunks: list[int]) -> None:
    reorder = ChunkReorder()
    out: list[telnyx.Media | ProtocolWarning] = []
    for chunk in chunks:
        out.extend(reorder.push(telnyx.Media(0, chunk, 0, "inbound", b"x")))
        assert reorder.held < reorder.window
    out.extend(reorder.flush())
    played = [m.chunk for m in out if isinstance(m, telnyx.Media)]
    assert played == sorted(set(played))  # in order, each chunk once
    dropped = [w for w in out if isinstance(w, ProtocolWarning) and w.kind != "chunk_gap"]
    assert len(played) + len(dropped) == len(chunks)

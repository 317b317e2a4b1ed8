"""The /twilio and /ws wire codecs (parsing, ordering, limits, builders) and the test callers."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from voice_agent.callers import ManualClock, NativeClient, TwilioClient, client_frame
from voice_agent.transports import native, twilio
from voice_agent.transports.errors import ProtocolError, ProtocolWarning, close_reason
from voice_agent.transports.native import AudioFormat, NativeStream
from voice_agent.transports.twilio import (
    Connected,
    Dtmf,
    Media,
    MediaFormat,
    Start,
    Stop,
    TwilioStream,
)

STREAM = "MZ18ad3ab5a668481ce02b83e7395059f0"
CALL = "CA362bd27f25d74ba43297c16b5d1f4c5c"
ACCOUNT = "AC25e16e9a716a4a1786a7c83f58e30482"
ULAW = bytes(range(96, 256))  # 160 bytes: one 20 ms frame
B64 = base64.b64encode(ULAW).decode()

# Shaped as Twilio's documentation shows them, whitespace included.
CONNECTED = '{\n  "event": "connected",\n  "protocol": "Call",\n  "version": "1.0.0"\n}'
START_MESSAGE: dict[str, Any] = {
    "event": "start",
    "sequenceNumber": "1",
    "start": {
        "accountSid": ACCOUNT,
        "streamSid": STREAM,
        "callSid": CALL,
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"agent": "booking", "caller_name": "Jane"},
    },
    "streamSid": STREAM,
}
START = json.dumps(START_MESSAGE, indent=2)


def media(sequence: int, payload: str | None = B64, **changes: Any) -> str:
    """A media message as Twilio sends it; a field given as None is left out."""
    body: dict[str, Any] = {
        "track": "inbound",
        "chunk": str(sequence - 1),
        "timestamp": str(20 * sequence),
        "payload": payload,
    }
    message: dict[str, Any] = {
        "event": "media",
        "sequenceNumber": str(sequence),
        "media": body,
        "streamSid": STREAM,
    }
    for key, value in changes.items():
        (body if key in body else message)[key] = value
    for target in (body, message):
        for key in [key for key, value in target.items() if value is None]:
            del target[key]
    return json.dumps(message)


def dtmf(sequence: int, digit: str) -> str:
    return json.dumps(
        {
            "event": "dtmf",
            "streamSid": STREAM,
            "sequenceNumber": str(sequence),
            "dtmf": {"track": "inbound_track", "digit": digit},
        }
    )


def mark(sequence: int, name: str) -> str:
    return json.dumps(
        {
            "event": "mark",
            "sequenceNumber": str(sequence),
            "streamSid": STREAM,
            "mark": {"name": name},
        }
    )


STOP = json.dumps(
    {
        "event": "stop",
        "sequenceNumber": "5",
        "streamSid": STREAM,
        "stop": {"accountSid": ACCOUNT, "callSid": CALL},
    }
)


def started() -> TwilioStream:
    stream = TwilioStream()
    stream.receive(CONNECTED)
    stream.receive(START)
    return stream


def start_with(**start_changes: Any) -> str:
    message = json.loads(START)
    for key, value in start_changes.items():
        if value is None:
            del message["start"][key]
        else:
            message["start"][key] = value
    return json.dumps(message)


# -- Twilio: parsing --------------------------------------------------------------------------


def test_twilio_parses_a_whole_stream() -> None:
    stream = TwilioStream()
    events = [
        event
        for text in (CONNECTED, START, media(2), dtmf(3, "5"), mark(4, "reply-1:end"), STOP)
        for event in stream.receive(text)
    ]
    assert events == [
        Connected("Call", "1.0.0"),
        Start(
            sequence=1,
            stream_sid=STREAM,
            call_sid=CALL,
            account_sid=ACCOUNT,
            tracks=("inbound",),
            media_format=MediaFormat("audio/x-mulaw", 8000, 1),
            custom_parameters={"agent": "booking", "caller_name": "Jane"},
        ),
        Media(sequence=2, chunk=1, timestamp_ms=40, track="inbound", payload=ULAW),
        Dtmf(sequence=3, digit="5", track="inbound_track"),
        twilio.Mark(sequence=4, name="reply-1:end"),
        Stop(sequence=5, account_sid=ACCOUNT, call_sid=CALL),
    ]
    assert stream.state is twilio.StreamState.STOPPED


def test_twilio_start_names_the_call_agent_and_args() -> None:
    [start] = TwilioStream().receive(START)
    assert isinstance(start, Start)
    assert (start.call_id, start.agent, start.agent_args) == (
        CALL,
        "booking",
        {"caller_name": "Jane"},
    )
    [bare] = TwilioStream().receive(start_with(customParameters=None))
    assert isinstance(bare, Start)
    assert (bare.agent, bare.agent_args) == (None, {})


def test_twilio_connected_is_optional() -> None:
    stream = TwilioStream()
    assert isinstance(stream.receive(START)[0], Start)
    assert stream.receive(media(2))[0] == Media(2, 1, 40, "inbound", ULAW)


@pytest.mark.parametrize("size", [1, 80, 160, 320, 1600])
def test_twilio_takes_any_payload_size_up_to_the_limit(size: int) -> None:
    payload = bytes(size)
    [event] = started().receive(media(2, base64.b64encode(payload).decode()))
    assert event == Media(2, 1, 40, "inbound", payload)


def test_twilio_takes_numbers_sent_as_numbers() -> None:
    [event] = started().receive(media(2, sequenceNumber=2, chunk=1, timestamp=40))
    assert event == Media(2, 1, 40, "inbound", ULAW)


def test_twilio_passes_outbound_track_media_through() -> None:
    [event] = started().receive(media(2, track="outbound"))
    assert isinstance(event, Media) and event.track == "outbound"


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        (
            json.dumps({"event": "transcription", "streamSid": STREAM}),
            "unknown_event",
            "unknown event 'transcription' ignored",
        ),
        (media(2, payload=""), "empty_payload", "media chunk 1 has no audio"),
        (dtmf(2, "x"), "invalid_dtmf", "dtmf.digit 'x' ignored"),
    ],
)
def test_twilio_harmless_problems_are_warnings(text: str, kind: str, message: str) -> None:
    assert started().receive(text) == [ProtocolWarning(kind, message)]


def test_twilio_sequence_gaps_warn_and_keep_the_media() -> None:
    stream = started()
    assert stream.receive(media(2)) == [Media(2, 1, 40, "inbound", ULAW)]
    assert stream.receive(media(5)) == [
        ProtocolWarning("sequence_gap", "sequenceNumber 5 after 2: 2 missing"),
        Media(5, 4, 100, "inbound", ULAW),
    ]
    assert stream.receive(media(4))[0] == ProtocolWarning(
        "sequence_gap", "sequenceNumber 4 after 5: out of order"
    )
    assert stream.receive(media(6)) == [Media(6, 5, 120, "inbound", ULAW)]


def test_twilio_messages_after_stop_are_ignored() -> None:
    stream = started()
    stream.receive(STOP)
    assert stream.receive(media(6)) == [
        ProtocolWarning("after_stop", "media message after stop ignored")
    ]
    assert stream.receive(mark(7, "x")) == [
        ProtocolWarning("after_stop", "mark message after stop ignored")
    ]


def test_twilio_stop_before_start_ends_the_call() -> None:
    assert TwilioStream().receive(STOP) == [Stop(5, ACCOUNT, CALL)]


TOO_BIG = base64.b64encode(bytes(1601)).decode()
HUGE = base64.b64encode(bytes(9000)).decode()

LINEAR16 = {"encoding": "audio/l16", "sampleRate": 16000, "channels": 1}
STEREO = {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 2}
NO_MEDIA = json.dumps({"event": "media", "sequenceNumber": "2", "streamSid": STREAM})
NAMELESS = json.dumps({"event": "mark", "sequenceNumber": "2", "streamSid": STREAM, "mark": {}})
BAD_JSON = "message is not valid JSON: unexpected character, expected a string key"
MONO_8K = "audio/x-mulaw 8000 Hz mono"
ULAW_LIMIT = "exceeds 1600 (200 ms of 8 kHz mu-law)"

# (id, messages before, message, close code, kind, reason)
TWILIO_ERRORS: list[tuple[str, list[str], str, int, str, str]] = [
    ("not json", [], "{event: media}",
     1002, "malformed_message", f"{BAD_JSON}: line 1 column 2 (char 1)"),
    ("not an object", [], "[1, 2]", 1002, "malformed_message", "message is not a JSON object"),
    ("no event", [], '{"streamSid": "MZ1"}',
     1002, "malformed_message", 'message has no "event" string'),
    ("too big", [], " " * 16_385,
     1009, "message_too_big", "message of 16385 characters exceeds the 16384 limit"),
    ("media first", [], media(2), 1002, "out_of_order", "media message before start"),
    ("media after connected", [CONNECTED], media(2),
     1002, "out_of_order", "media message before start"),
    ("dtmf first", [], dtmf(2, "1"), 1002, "out_of_order", "dtmf message before start"),
    ("mark first", [], mark(2, "a"), 1002, "out_of_order", "mark message before start"),
    ("second start", [START], START, 1002, "out_of_order", "second start message"),
    ("second connected", [CONNECTED], CONNECTED,
     1002, "out_of_order", "connected message after connected"),
    ("connected after start", [START], CONNECTED,
     1002, "out_of_order", "connected message after started"),
    ("no callSid", [], start_with(callSid=None),
     1002, "malformed_message", "start.callSid is missing"),
    ("empty streamSid", [], start_with(streamSid=""),
     1002, "malformed_message", "start.streamSid is not a non-empty string"),
    ("no mediaFormat", [], start_with(mediaFormat=None),
     1002, "malformed_message", "start.mediaFormat is missing"),
    ("tracks not a list", [], start_with(tracks="inbound"),
     1002, "malformed_message", "start.tracks is not a list of strings"),
    ("parameter not text", [], start_with(customParameters={"party": 2}),
     1002, "malformed_message", "start.customParameters.party is not a string"),
    ("linear16", [], start_with(mediaFormat=LINEAR16),
     1003, "unsupported_media_format", f"mediaFormat audio/l16 16000 Hz x1 is not {MONO_8K}"),
    ("stereo", [], start_with(mediaFormat=STEREO),
     1003, "unsupported_media_format", f"mediaFormat audio/x-mulaw 8000 Hz x2 is not {MONO_8K}"),
    ("bad base64", [START], media(2, payload="not base64!"),
     1002, "invalid_payload", "media.payload is not valid base64"),
    ("bad padding", [START], media(2, payload="AAA"),
     1002, "invalid_payload", "media.payload is not valid base64"),
    ("payload too big", [START], media(2, payload=TOO_BIG),
     1008, "payload_too_large", f"media.payload of 1601 bytes {ULAW_LIMIT}"),
    ("payload absurd", [START], media(2, payload=HUGE),
     1008, "payload_too_large", f"media.payload of 9000 bytes {ULAW_LIMIT}"),
    ("no payload", [START], media(2, payload=None),
     1002, "malformed_message", "media.payload is missing"),
    ("no media object", [START], NO_MEDIA, 1002, "malformed_message", "media is missing"),
    ("chunk not a number", [START], media(2, chunk="one"),
     1002, "malformed_message", 'media.chunk is not an integer (got "one")'),
    ("no timestamp", [START], media(2, timestamp=None),
     1002, "malformed_message", "media.timestamp is missing"),
    ("no track", [START], media(2, track=None),
     1002, "malformed_message", "media.track is missing"),
    ("no sequenceNumber", [START], media(2, sequenceNumber=None),
     1002, "malformed_message", "sequenceNumber is missing"),
    ("other stream", [START], media(2, streamSid="MZother"),
     1002, "wrong_stream", f"streamSid 'MZother' is not this stream's '{STREAM}'"),
    ("no streamSid", [START], media(2, streamSid=None),
     1002, "malformed_message", "media message has no streamSid"),
    ("mark without name", [START], NAMELESS, 1002, "malformed_message", "mark.name is missing"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("before", "text", "code", "kind", "reason"),
    [case[1:] for case in TWILIO_ERRORS],
    ids=[case[0] for case in TWILIO_ERRORS],
)
def test_twilio_protocol_errors(
    before: list[str], text: str, code: int, kind: str, reason: str
) -> None:
    stream = TwilioStream()
    for message in before:
        stream.receive(message)
    # The server's fast path for media declines it and leaves the stream as it was.
    assert stream.media_payload(text) is None
    with pytest.raises(ProtocolError) as caught:
        stream.receive(text)
    assert (caught.value.code, caught.value.kind, caught.value.reason) == (code, kind, reason)
    assert len(caught.value.close_reason.encode()) <= 123


def test_twilio_media_payload_takes_in_order_media_and_declines_the_rest() -> None:
    # The server's fast path for media: whatever it declines, `receive` must still see as if
    # the fast path had never looked at it.
    stream = started()
    assert stream.media_payload(media(2)) == ULAW
    assert stream.media_payload(media(3, track="outbound")) == ULAW
    for declined in (media(5), media(3), mark(4, "a"), dtmf(4, "1"), "[1]", "{", " " * 16_385):
        assert stream.media_payload(declined) is None
    assert stream.receive(media(5)) == [
        ProtocolWarning("sequence_gap", "sequenceNumber 5 after 3: 1 missing"),
        Media(5, 4, 100, "inbound", ULAW),
    ]
    stream.receive(STOP)
    assert stream.media_payload(media(6)) is None
    assert TwilioStream().media_payload(media(2)) is None  # before start


def test_twilio_binary_frames_are_unsupported_data() -> None:
    with pytest.raises(ProtocolError) as caught:
        started().receive_bytes(ULAW)
    assert caught.value.code == 1003
    assert caught.value.reason == (
        "binary frame of 160 bytes: Twilio Media Streams messages are JSON text"
    )


def test_twilio_limits_can_be_set_per_stream() -> None:
    stream = TwilioStream(max_payload_bytes=160)
    stream.receive(START)
    assert stream.receive(media(2))[0] == Media(2, 1, 40, "inbound", ULAW)
    with pytest.raises(ProtocolError, match="161 bytes exceeds 160"):
        stream.receive(media(3, payload=base64.b64encode(bytes(161)).decode()))


# -- Twilio: outbound -------------------------------------------------------------------------


def test_twilio_builders_write_exactly_what_twilio_expects() -> None:
    assert twilio.media_message(STREAM, ULAW) == (
        f'{{"event":"media","streamSid":"{STREAM}","media":{{"payload":"{B64}"}}}}'
    )
    assert twilio.mark_message(STREAM, "reply-3") == (
        f'{{"event":"mark","streamSid":"{STREAM}","mark":{{"name":"reply-3"}}}}'
    )
    assert twilio.clear_message(STREAM) == f'{{"event":"clear","streamSid":"{STREAM}"}}'


def test_twilio_builders_escape_names_and_match_json_dumps() -> None:
    name = 'say "hi" \\ café\n'
    assert json.loads(twilio.mark_message(STREAM, name)) == {
        "event": "mark",
        "streamSid": STREAM,
        "mark": {"name": name},
    }
    odd_sid = 'MZ"quoted"'
    expected = {"event": "media", "streamSid": odd_sid, "media": {"payload": B64}}
    assert twilio.media_message(odd_sid, ULAW) == json.dumps(expected, separators=(",", ":"))


def test_twilio_stream_builds_for_its_own_stream() -> None:
    stream = TwilioStream()
    with pytest.raises(RuntimeError):
        stream.media_message(ULAW)
    stream.receive(START)
    assert stream.media_message(ULAW) == twilio.media_message(STREAM, ULAW)
    assert stream.mark_message("m") == twilio.mark_message(STREAM, "m")
    assert stream.clear_message() == twilio.clear_message(STREAM)


def test_close_reasons_fit_a_close_frame_on_a_character_boundary() -> None:
    assert close_reason("short") == "short"
    cut = close_reason("é" * 100)
    assert len(cut.encode()) <= 123 and cut.endswith("…") and cut.startswith("é" * 60)
    error = ProtocolError(1002, "x" * 500)
    assert error.reason == "x" * 500 and len(error.close_reason.encode()) == 123


# -- native: parsing --------------------------------------------------------------------------


def native_started(**start: Any) -> NativeStream:
    stream = NativeStream()
    stream.receive_text(json.dumps({"type": "start", **start}))
    return stream


def test_native_start_defaults_to_the_default_agent_and_pcm16_16k() -> None:
    assert NativeStream().receive_text('{"type":"start"}') == [
        native.Start(agent=None, args={}, audio=AudioFormat("pcm16", 16000))
    ]


@pytest.mark.parametrize(
    ("encoding", "rate"),
    [("pcm16", 8000), ("pcm16", 16000), ("pcm16", 24000), ("pcm16", 48000), ("mulaw", 8000),
     ("alaw", 8000)],
)  # fmt: skip
def test_native_start_takes_every_supported_format(encoding: str, rate: int) -> None:
    text = json.dumps(
        {
            "type": "start",
            "agent": "booking",
            "args": {"party_size": 2, "vip": True},
            "audio": {"encoding": encoding, "sample_rate": rate},
        }
    )
    stream = NativeStream()
    assert stream.receive_text(text) == [
        native.Start("booking", {"party_size": 2, "vip": True}, AudioFormat(encoding, rate))
    ]
    assert stream.audio.bytes_per_second == rate * (2 if encoding == "pcm16" else 1)


RATES = "must be 8000, 16000, 24000 or 48000"
ENCODINGS = "must be 'pcm16', 'mulaw' or 'alaw'"
NOT_A_FIELD = "is not a field of this message"

NATIVE_START_ERRORS: list[tuple[dict[str, Any], int, str, str]] = [
    ({"audio": {"sample_rate": 44100}},
     1003, "unsupported_audio", f"start: audio.sample_rate {RATES} (got 44100)"),
    ({"audio": {"encoding": "opus"}},
     1003, "unsupported_audio", f'start: audio.encoding {ENCODINGS} (got "opus")'),
    ({"audio": {"encoding": "mulaw", "sample_rate": 16000}},
     1003, "unsupported_audio", "start: audio.sample_rate must be 8000 for mulaw (got 16000)"),
    ({"audio": {"encoding": "pcm16", "channels": 2}},
     1002, "invalid_start", f"start: audio.channels {NOT_A_FIELD}"),
    ({"audio": "pcm16"}, 1002, "invalid_start", 'start: audio must be an object (got "pcm16")'),
    ({"agent": 7}, 1002, "invalid_start", "start: agent must be a string (got 7)"),
    ({"agent": ""}, 1002, "invalid_start", 'start: agent must not be empty (got "")'),
    ({"args": ["party", 2]}, 1002, "invalid_start", "start: args must be an object"),
    ({"agnet": "booking"}, 1002, "invalid_start", f"start: agnet {NOT_A_FIELD}"),
    ({"agent": 7, "audio": {"sample_rate": 1}},
     1002, "invalid_start",
     f"start: agent must be a string (got 7); audio.sample_rate {RATES} (got 1)"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "code", "kind", "reason"), NATIVE_START_ERRORS)
def test_native_start_validation_names_the_field(
    fields: dict[str, Any], code: int, kind: str, reason: str
) -> None:
    with pytest.raises(ProtocolError) as caught:
        NativeStream().receive_text(json.dumps({"type": "start", **fields}))
    assert (caught.value.code, caught.value.kind, caught.value.reason) == (code, kind, reason)


STARTED = ['{"type":"start"}']
NATIVE_ORDER_ERRORS: list[tuple[str, list[str], str | bytes, int, str, str]] = [
    ("audio first", [], b"\x00\x00", 1002, "out_of_order", "audio before the start message"),
    ("dtmf first", [], '{"type":"dtmf","digit":"1"}',
     1002, "out_of_order", "expected a start message first, got 'dtmf'"),
    ("untyped first", [], '{"agent":"booking"}',
     1002, "out_of_order", "expected a start message first, got a message without type"),
    ("second start", STARTED, '{"type":"start"}', 1002, "out_of_order", "second start message"),
    ("not json", STARTED, "stop",
     1002, "malformed_message",
     "message is not valid JSON: Expecting value: line 1 column 1 (char 0)"),
    ("not an object", [], '"start"', 1002, "malformed_message", "message is not a JSON object"),
    ("text too big", [], " " * 65_537,
     1009, "message_too_big", "message of 65537 characters exceeds the 65536 limit"),
    ("frame too big", STARTED, bytes(32_001),
     1009, "message_too_big", "audio frame of 32001 bytes exceeds 32000 (1000 ms)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("before", "message", "code", "kind", "reason"),
    [case[1:] for case in NATIVE_ORDER_ERRORS],
    ids=[case[0] for case in NATIVE_ORDER_ERRORS],
)
def test_native_protocol_errors(
    before: list[str], message: str | bytes, code: int, kind: str, reason: str
) -> None:
    stream = NativeStream()
    for text in before:
        stream.receive_text(text)
    with pytest.raises(ProtocolError) as caught:
        if isinstance(message, bytes):
            stream.receive_bytes(message)
        else:
            stream.receive_text(message)
    assert (caught.value.code, caught.value.kind, caught.value.reason) == (code, kind, reason)


def test_native_control_messages() -> None:
    stream = native_started()
    assert stream.receive_text('{"type":"dtmf","digit":"#"}') == [native.Dtmf("#")]
    assert stream.receive_text('{"type":"mark","name":"r1"}') == [native.Mark("r1")]
    assert stream.receive_text('{"type":"stop"}') == [native.Stop()]
    assert stream.receive_bytes(b"\x00\x00") == [
        ProtocolWarning("after_stop", "audio after stop ignored")
    ]
    assert stream.receive_text('{"type":"mark","name":"r2"}') == [
        ProtocolWarning("after_stop", "mark message after stop ignored")
    ]


IGNORED_CONTROL: list[tuple[dict[str, Any], str, str]] = [
    ({"type": "dtmf", "digit": "55"},
     "invalid_message", 'dtmf: digit must be one key: 0-9, *, #, A-D (got "55") (ignored)'),
    ({"type": "dtmf", "digit": 5},
     "invalid_message", "dtmf: digit must be a string (got 5) (ignored)"),
    ({"type": "dtmf"}, "invalid_message", "dtmf: digit is required (ignored)"),
    ({"type": "mark"}, "invalid_message", "mark: name is required (ignored)"),
    ({"type": "mark", "name": ""},
     "invalid_message", 'mark: name must not be empty (got "") (ignored)'),
    ({"type": "stop", "reason": "bye"}, "invalid_message", f"stop: reason {NOT_A_FIELD} (ignored)"),
    ({"type": "pause"}, "unknown_message", "unknown message type 'pause' ignored"),
    ({"digit": "5"}, "unknown_message", "message without a type ignored"),
]  # fmt: skip


@pytest.mark.parametrize(("message", "kind", "text"), IGNORED_CONTROL)
def test_native_bad_control_messages_are_warnings(
    message: dict[str, Any], kind: str, text: str
) -> None:
    stream = native_started()
    assert stream.receive_text(json.dumps(message)) == [ProtocolWarning(kind, text)]
    assert stream.state is native.StreamState.STARTED


def test_native_audio_of_any_size_comes_out_in_whole_samples() -> None:
    stream = native_started()
    assert stream.receive_bytes(b"\x01\x02\x03") == [native.Audio(b"\x01\x02")]
    assert stream.receive_bytes(b"\x04") == [native.Audio(b"\x03\x04")]
    assert stream.receive_bytes(b"\x05") == []
    assert stream.receive_bytes(b"") == []
    assert stream.receive_bytes(b"\x06\x07") == [native.Audio(b"\x05\x06")]
    ulaw = native_started(audio={"encoding": "mulaw", "sample_rate": 8000})
    assert ulaw.receive_bytes(b"\x01\x02\x03") == [native.Audio(b"\x01\x02\x03")]
    assert ulaw.receive_bytes(bytes(8000)) == [native.Audio(bytes(8000))]


def test_native_server_events() -> None:
    assert native.started_event("call-1") == '{"type":"started","call_id":"call-1"}'
    assert native.started_event("call-1", agent="booking") == (
        '{"type":"started","call_id":"call-1","agent":"booking"}'
    )
    assert native.transcript_event("table for two", final=False) == (
        '{"type":"transcript","final":false,"text":"table for two"}'
    )
    assert native.agent_text_event("r1", "Hello, café!") == (
        '{"type":"agent_text","reply_id":"r1","text":"Hello, café!"}'
    )
    assert native.mark_event("r1:3") == '{"type":"mark","name":"r1:3"}'
    assert native.clear_event() == '{"type":"clear"}'
    assert native.state_event({"party_size": {"old": None, "new": 2}}, source="intent") == (
        '{"type":"state","changes":{"party_size":{"old":null,"new":2}},"source":"intent"}'
    )
    assert native.turn_metrics_event({"turn": 1, "response_ms": 640.5}) == (
        '{"type":"turn_metrics","metrics":{"turn":1,"response_ms":640.5}}'
    )
    assert native.error_event("invalid_message", "mark: name is required") == (
        '{"type":"error","code":"invalid_message","message":"mark: name is required"}'
    )
    assert native.end_event("caller_hung_up") == '{"type":"end","reason":"caller_hung_up"}'


# -- the test callers against tiny servers ----------------------------------------------------


class FakeServer:
    """Hands each accepted connection to the test, which then plays the server itself."""

    def __init__(self) -> None:
        self.connections: asyncio.Queue[ServerConnection] = asyncio.Queue()

    async def handler(self, ws: ServerConnection) -> None:
        await self.connections.put(ws)
        await ws.wait_closed()


@asynccontextmanager
async def fake_server() -> AsyncIterator[tuple[FakeServer, str]]:
    fake = FakeServer()
    async with serve(fake.handler, "127.0.0.1", 0, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield fake, f"ws://127.0.0.1:{port}"


async def next_twilio_event(ws: ServerConnection, stream: TwilioStream) -> twilio.TwilioEvent:
    while True:
        message = await ws.recv()
        assert isinstance(message, str)
        events = stream.receive(message)
        if events:
            return events[0]


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65_535, 65_536])
def test_callers_write_frames_websockets_reads_back(size: int) -> None:
    # The test callers frame their messages themselves (a load generator's hot path); every
    # length encoding must come out as `websockets` reads a client's frame.
    payload = (bytes(range(256)) * (size // 256 + 1))[:size]
    reader = StreamReader()
    reader.feed_data(client_frame(0x82, payload) + client_frame(0x81, b"{}"))
    reader.feed_eof()
    frames = []
    for _ in range(2):
        parser = Frame.parse(reader.read_exact, mask=True)
        with pytest.raises(StopIteration) as parsed:
            next(parser)
        frames.append(parsed.value.value)
    assert [(f.opcode, f.fin, f.data) for f in frames] == [
        (Opcode.BINARY, True, payload),
        (Opcode.TEXT, True, b"{}"),
    ]
    assert not reader.buffer  # nothing left over: each frame was exactly as long as it said


async def test_twilio_client_plays_audio_echoes_marks_and_obeys_clear() -> None:
    clock = ManualClock()
    async with fake_server() as (fake, url):
        client = TwilioClient(
            f"{url}/twilio",
            call_sid=CALL,
            stream_sid=STREAM,
            account_sid=ACCOUNT,
            custom_parameters={"agent": "booking", "caller_name": "Jane"},
            pace=False,
            clock=clock,
        )
        await client.connect()
        ws = await fake.connections.get()
        stream = TwilioStream()
        assert await next_twilio_event(ws, stream) == Connected("Call", "1.0.0")
        start = await next_twilio_event(ws, stream)
        assert isinstance(start, Start)
        assert (start.call_id, start.agent, start.agent_args) == (
            CALL,
            "booking",
            {"caller_name": "Jane"},
        )

        for _ in range(10):
            await ws.send(stream.media_message(ULAW))
        await ws.send(stream.mark_message("first"))
        for _ in range(10):
            await ws.send(stream.media_message(ULAW))
        await ws.send(stream.mark_message("second"))
        await client.wait_until(lambda: client.pending_marks == ["first", "second"], "marks")
        assert client.received_ms == 400 and client.played_ms() == 0 and not client.marks_echoed

        clock.advance(0.2)  # the first 200 ms have played
        first = await client.wait_for_mark("first")
        assert (first.echoed_at, first.cleared) == (0.2, False)
        assert await next_twilio_event(ws, stream) == twilio.Mark(2, "first")

        clock.advance(0.05)  # 50 ms into the second 200 ms, the server interrupts
        await ws.send(stream.clear_message())
        clear = await client.wait_clear()
        assert (clear.at, clear.dropped_bytes, clear.marks_returned) == (0.25, 1200, ("second",))
        second = await client.wait_for_mark("second")
        assert (second.echoed_at, second.cleared) == (0.25, True)
        assert await next_twilio_event(ws, stream) == twilio.Mark(3, "second")
        assert client.audio_played() == ULAW * 12 + ULAW[:80]
        clock.advance(1.0)
        assert client.played_ms() == 250  # what the clear dropped never plays

        # After the clear, new audio plays from now; a mark with nothing queued returns at once.
        await ws.send(stream.media_message(ULAW))
        await ws.send(stream.mark_message("third"))
        await client.wait_until(lambda: client.pending_marks == ["third"], "third")
        clock.advance(0.02)
        assert (await client.wait_for_mark("third")).echoed_at == 1.27
        await ws.send(stream.mark_message("idle"))
        assert (await client.wait_for_mark("idle")).echoed_at == 1.27
        assert [frame.received_at for frame in client.frames[-1:]] == [1.25]

        await client.stop()
        assert await next_twilio_event(ws, stream) == twilio.Mark(4, "third")
        assert await next_twilio_event(ws, stream) == twilio.Mark(5, "idle")
        assert await next_twilio_event(ws, stream) == Stop(6, ACCOUNT, CALL)
        assert client.errors == [] and client.closed


async def test_twilio_client_sends_the_callers_audio_as_twilio_does() -> None:
    async with fake_server() as (fake, url):
        client = TwilioClient(
            url, call_sid=CALL, stream_sid=STREAM, account_sid=ACCOUNT, pace=False
        )
        async with client:
            ws = await fake.connections.get()
            stream = TwilioStream()
            await next_twilio_event(ws, stream)
            await next_twilio_event(ws, stream)
            await client.send_audio(b"\x01" * 400)
            frames = [await next_twilio_event(ws, stream) for _ in range(3)]
            assert frames == [
                Media(2, 1, 0, "inbound", b"\x01" * 160),
                Media(3, 2, 20, "inbound", b"\x01" * 160),
                Media(4, 3, 40, "inbound", b"\x01" * 80 + b"\xff" * 80),  # filled with silence
            ]
            await client.send_dtmf("7")
            assert await next_twilio_event(ws, stream) == Dtmf(5, "7", "inbound_track")
        assert await next_twilio_event(ws, stream) == Stop(6, ACCOUNT, CALL)


async def test_twilio_client_paces_audio_on_its_clock() -> None:
    clock = ManualClock(100.0)
    async with fake_server() as (fake, url):
        client = TwilioClient(url, stream_sid=STREAM, clock=clock, continuous=False)
        async with client:
            ws = await fake.connections.get()
            stream = TwilioStream()
            await next_twilio_event(ws, stream)
            await next_twilio_event(ws, stream)
            sending = asyncio.create_task(client.send_audio(ULAW * 3))
            assert isinstance(await next_twilio_event(ws, stream), Media)
            clock.advance(0.02)
            assert isinstance(await next_twilio_event(ws, stream), Media)
            clock.advance(0.02)
            assert isinstance(await next_twilio_event(ws, stream), Media)
            await sending
            assert client.sent_at == pytest.approx([100.0, 100.02, 100.04])


async def test_twilio_client_keeps_the_line_open_with_silence() -> None:
    clock = ManualClock()
    async with fake_server() as (fake, url):
        async with TwilioClient(url, stream_sid=STREAM, clock=clock) as client:
            ws = await fake.connections.get()
            stream = TwilioStream()
            await next_twilio_event(ws, stream)
            await next_twilio_event(ws, stream)
            silence = await next_twilio_event(ws, stream)
            assert isinstance(silence, Media) and silence.payload == b"\xff" * 160
            sending = asyncio.create_task(client.send_audio(ULAW))
            clock.advance(0.02)
            spoken = await next_twilio_event(ws, stream)
            assert isinstance(spoken, Media) and spoken.payload == ULAW
            await sending
            clock.advance(0.02)
            after = await next_twilio_event(ws, stream)
            assert isinstance(after, Media) and after.payload == b"\xff" * 160
            assert (after.chunk, after.timestamp_ms) == (3, 40)


async def test_twilio_client_waits_for_silence_after_the_agent_speaks() -> None:
    clock = ManualClock()
    async with fake_server() as (fake, url):
        async with TwilioClient(url, stream_sid=STREAM, pace=False, clock=clock) as client:
            ws = await fake.connections.get()
            stream = TwilioStream()
            await next_twilio_event(ws, stream)
            await next_twilio_event(ws, stream)
            waiting = asyncio.create_task(client.wait_silence_after_audio(300))
            for _ in range(5):
                await ws.send(stream.media_message(ULAW))
            await client.wait_audio(100)
            clock.advance(0.4)
            assert await waiting == pytest.approx(0.1)  # playback ended 100 ms in


async def test_callers_report_the_servers_close() -> None:
    async with fake_server() as (fake, url):
        async with TwilioClient(url, stream_sid=STREAM, pace=False) as client:
            ws = await fake.connections.get()
            await ws.close(1008, "media.payload of 9000 bytes exceeds 1600")
            assert await client.wait_closed() == (1008, "media.payload of 9000 bytes exceeds 1600")
            with pytest.raises(ConnectionError, match="closed while waiting for mark 'x'"):
                await client.wait_for_mark("x")


async def test_twilio_client_flags_what_twilio_would_reject() -> None:
    async with fake_server() as (fake, url):
        async with TwilioClient(url, stream_sid=STREAM, pace=False) as client:
            ws = await fake.connections.get()
            await ws.send(b"\x00")
            await ws.send(twilio.media_message("MZwrong", ULAW))
            await ws.send(
                json.dumps({"event": "media", "streamSid": STREAM, "media": {"payload": "!"}})
            )
            await ws.send(twilio.clear_message(STREAM))
            await client.wait_clear()
            assert client.errors == [
                "binary frame of 1 bytes (Twilio takes JSON text)",
                "media for streamSid 'MZwrong'",
                "media without a valid base64 payload",
            ]


async def test_native_client_over_the_native_protocol() -> None:
    clock = ManualClock()
    fmt = AudioFormat("pcm16", 16000)
    frame = b"\x01\x00" * 320  # 20 ms
    async with fake_server() as (fake, url):
        client = NativeClient(
            f"{url}/ws", agent="booking", args={"party_size": 2}, audio=fmt, pace=False, clock=clock
        )
        connecting = asyncio.create_task(client.connect())
        ws = await fake.connections.get()
        stream = NativeStream()
        start = await ws.recv()
        assert isinstance(start, str)
        assert stream.receive_text(start) == [native.Start("booking", {"party_size": 2}, fmt)]
        await ws.send(native.started_event("call-7", agent="booking"))
        await connecting
        assert client.call_id == "call-7"

        await ws.send(native.transcript_event("hello", final=True))
        for _ in range(10):
            await ws.send(frame)
        await ws.send(native.mark_event("a"))
        await ws.send(native.agent_text_event("r1", "Hi there."))
        for _ in range(10):
            await ws.send(frame)
        await ws.send(native.mark_event("b"))
        await client.wait_until(lambda: client.pending_marks == ["a", "b"], "marks")
        clock.advance(0.2)
        await client.wait_for_mark("a")
        echo = await ws.recv()
        assert isinstance(echo, str) and stream.receive_text(echo) == [native.Mark("a")]
        await ws.send(native.clear_event())
        assert (await client.wait_clear()).marks_returned == ("b",)
        echo = await ws.recv()
        assert isinstance(echo, str) and stream.receive_text(echo) == [native.Mark("b")]
        assert client.played_ms() == 200

        await client.send_audio(b"\x02\x00" * 500)
        sent = [await ws.recv() for _ in range(2)]
        assert [e for m in sent if isinstance(m, bytes) for e in stream.receive_bytes(m)] == [
            native.Audio(b"\x02\x00" * 320),
            native.Audio(b"\x02\x00" * 180 + b"\x00\x00" * 140),
        ]
        await client.send_dtmf("5")
        dtmf_text = await ws.recv()
        assert isinstance(dtmf_text, str) and stream.receive_text(dtmf_text) == [native.Dtmf("5")]
        await client.stop()
        stop_text = await ws.recv()
        assert isinstance(stop_text, str) and stream.receive_text(stop_text) == [native.Stop()]
        assert [e["type"] for e in client.events] == [
            "started",
            "transcript",
            "mark",
            "agent_text",
            "mark",
            "clear",
        ]
        assert (await client.wait_event("agent_text"))["text"] == "Hi there."
        assert client.errors == []


async def test_native_client_reports_a_refused_start() -> None:
    async with fake_server() as (fake, url):
        client = NativeClient(url, audio=AudioFormat("pcm16", 48000), pace=False)
        connecting = asyncio.create_task(client.connect())
        ws = await fake.connections.get()
        await ws.recv()
        await ws.send(native.error_event("unknown_agent", "no agent named 'x'"))
        with pytest.raises(ConnectionError, match=r"expected a started event, got .*unknown_agent"):
            await connecting
        await ws.close()


async def test_twilio_client_plays_in_real_time_by_default() -> None:
    async with fake_server() as (fake, url):
        async with TwilioClient(url, stream_sid=STREAM, continuous=False) as client:
            ws = await fake.connections.get()
            for _ in range(5):
                await ws.send(twilio.media_message(STREAM, ULAW))
            await ws.send(twilio.mark_message(STREAM, "end"))
            echoed = await client.wait_for_mark("end")
            # 100 ms of audio takes 100 ms to play, however fast it arrived.
            assert echoed.echoed_at - client.frames[0].received_at >= 0.1 - 1e-3
            assert client.played_ms() == 100


async def test_sending_after_the_server_hung_up_fails() -> None:
    async with fake_server() as (fake, url):
        async with TwilioClient(url, stream_sid=STREAM, pace=False) as client:
            ws = await fake.connections.get()
            await ws.close()
            await client.wait_closed()
            with pytest.raises(ConnectionError, match="the call has ended"):
                await client.send_audio(ULAW)

"""The Vonage, Exotel and jambonz wire codecs: documented messages parsed, builders compared
with the documented shapes, outbound audio framing, and malformed input refused by field.

Where the messages come from:

* Vonage: the WebSockets guide, https://developer.vonage.com/en/voice/voice-api/concepts/websockets
  (its Markdown source in Nexmo/nexmo-developer), and for clear / notify the AsyncAPI transcript
  of the current page (api-evangelist/vonage asyncapi/vonage-asyncapi.yml, 2026.05).
* Exotel: https://developer.exotel.com/docs/agentstream/websocket-protocol (strings) and
  https://developer.exotel.com/docs/agentstream/stream-voicebot-applet (integers, encoding
  "raw"), and the `"encoding": "base64", "bit_rate": "128kbps"` start many clients are tested
  with (from the earlier support article).
* jambonz: https://docs.jambonz.org/docs/webhooks/listen/ and what jambonz-feature-server
  lib/tasks/listen.js (v0.9.8) and freeswitch-modules mod_audio_fork (1.2.33) send.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voice_agent.transports import exotel, exotel_chunks, jambonz, vonage
from voice_agent.transports.errors import (
    MESSAGE_TOO_BIG,
    POLICY_VIOLATION,
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ProtocolError,
    ProtocolWarning,
)

FAST = settings(max_examples=100, deadline=None)


_PATTERN = bytes(range(1, 256)) * 1200  # no zero byte: padding (silence) stands out


def pcm(size: int, seed: int = 1) -> bytes:
    """Non-silent 16-bit audio of `size` bytes, so padding (zeros) is told apart from it."""
    start = seed % 255
    return _PATTERN[start : start + size]


def refused(call: Any, *args: Any, code: int = PROTOCOL_ERROR) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        call(*args)
    assert caught.value.code == code, caught.value.reason
    return caught.value


# -- Vonage --------------------------------------------------------------------------------------

# The guide's own example, whitespace included.
VONAGE_CONNECTED = """{
    "event":"websocket:connected",
    "content-type":"audio/l16;rate=16000",
    "language": "en-GB",
    "caller-id": "447700900123"
}"""
VONAGE_DTMF = '{"event":"websocket:dtmf","digit":"5","duration":260}'


def vonage_stream(connected: str = VONAGE_CONNECTED) -> vonage.VonageStream:
    stream = vonage.VonageStream()
    stream.receive_text(connected)
    return stream


def test_vonage_connected_from_the_guide() -> None:
    stream = vonage.VonageStream()
    (event,) = stream.receive_text(VONAGE_CONNECTED)
    assert event == vonage.Connected(
        "audio/l16;rate=16000", 16000, {"language": "en-GB", "caller-id": "447700900123"}
    )
    assert event.frame_bytes == 640 and event.carrier.sample_rate == 16000
    assert event.agent is None and event.call_id is None
    assert event.agent_args == {"language": "en-GB", "caller-id": "447700900123"}


def test_vonage_agent_and_call_from_the_ncco_headers() -> None:
    text = json.dumps(
        {
            "event": "websocket:connected",
            "content-type": "audio/L16;rate=8000",  # the case Vonage's own gist uses
            "agent": "concierge",
            "uuid": "aaaaaaaa-bbbb-cccc-dddd-0123456789ab",
            "lang": "en",
            "age": 40,
            "system_roles": [183493, 22],
        }
    )
    (event,) = vonage.VonageStream().receive_text(text)
    assert isinstance(event, vonage.Connected)
    assert (event.sample_rate, event.frame_bytes) == (8000, 320)
    assert event.agent == "concierge"
    assert event.call_id == "aaaaaaaa-bbbb-cccc-dddd-0123456789ab"
    assert event.agent_args == {"lang": "en", "age": "40", "system_roles": "[183493,22]"}


@pytest.mark.parametrize(
    ("content_type", "rate"),
    [
        ("audio/l16;rate=8000", 8000),
        ("audio/l16; rate=16000", 16000),
        ("audio/l16;rate=24000", 24000),
    ],
)
def test_vonage_content_types(content_type: str, rate: int) -> None:
    assert vonage.content_type_rate(content_type) == rate
    assert vonage.frame_bytes(rate) == rate // 25


def test_vonage_refuses_a_bad_first_message() -> None:
    stream = vonage.VonageStream()
    error = refused(stream.receive_bytes, bytes(640))
    assert error.kind == "out_of_order"
    error = refused(stream.receive_text, VONAGE_DTMF)
    assert "websocket:dtmf before websocket:connected" in error.reason
    error = refused(stream.receive_text, '{"event":"websocket:connected"}')
    assert "content-type is missing" in error.reason
    error = refused(
        stream.receive_text,
        '{"event":"websocket:connected","content-type":"audio/l16;rate=44100"}',
        code=UNSUPPORTED_DATA,
    )
    assert "content-type" in error.reason
    stream.receive_text(VONAGE_CONNECTED)
    assert "second" in refused(stream.receive_text, VONAGE_CONNECTED).reason


def test_vonage_audio_frames() -> None:
    stream = vonage_stream()
    frame = pcm(640)
    assert stream.receive_bytes(frame) == [vonage.Audio(frame)]
    assert stream.audio_payload(frame) is frame
    assert stream.audio_payload(b"\x00") is None
    (warning,) = stream.receive_bytes(b"")
    assert isinstance(warning, ProtocolWarning)
    assert "whole 16-bit" in refused(stream.receive_bytes, bytes(641), code=UNSUPPORTED_DATA).reason
    refused(stream.receive_bytes, bytes(stream.max_binary_bytes + 2), code=POLICY_VIOLATION)


def test_vonage_dtmf_notify_and_cleared() -> None:
    stream = vonage_stream()
    assert stream.receive_text(VONAGE_DTMF) == [vonage.Dtmf("5", 260)]
    nested = '{"event":"websocket:dtmf","dtmf":{"digit":"#","duration":"100"}}'
    assert stream.receive_text(nested) == [vonage.Dtmf("#", 100)]
    (event,) = stream.receive_text('{"event":"websocket:notify","payload":{"name":"m3"}}')
    assert event == vonage.Notify({"name": "m3"}) and event.name == "m3"
    custom = '{"event":"websocket:notify","payload":{"customKey":"customValue"}}'
    (event,) = stream.receive_text(custom)
    assert isinstance(event, vonage.Notify) and event.name is None
    assert stream.receive_text('{"event":"websocket:cleared"}') == [vonage.Cleared()]
    (warning,) = stream.receive_text('{"event":"websocket:media:update"}')
    assert isinstance(warning, ProtocolWarning) and warning.kind == "unknown_event"
    (warning,) = stream.receive_text('{"event":"websocket:dtmf","digit":"X"}')
    assert isinstance(warning, ProtocolWarning) and warning.kind == "invalid_dtmf"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"event":"websocket:dtmf","duration":260}', "digit is missing"),
        ('{"event":"websocket:dtmf","dtmf":{"digit":5}}', "dtmf.digit"),
        ('{"event":"websocket:dtmf","digit":"5","duration":"long"}', "duration"),
        ('{"event":"websocket:notify"}', "payload is missing"),
        ('{"event":"websocket:notify","payload":"m1"}', "payload is not an object"),
        ('{"action":"clear"}', '"event"'),
        ("[1, 2]", "JSON object"),
        ("{not json", "valid JSON"),
    ],
)
def test_vonage_malformed_messages_name_the_field(text: str, field: str) -> None:
    error = refused(vonage_stream().receive_text, text)
    assert field in error.reason and error.kind == "malformed_message"


def test_vonage_message_too_big() -> None:
    text = json.dumps({"event": "websocket:notify", "payload": {"x": "y" * 20_000}})
    refused(vonage_stream().receive_text, text, code=MESSAGE_TOO_BIG)


def test_vonage_builders_match_the_documented_shapes() -> None:
    assert vonage.clear_message() == '{"action":"clear"}'
    assert vonage.mark_message("m1") == '{"action":"notify","payload":{"name":"m1"}}'
    notify = vonage.notify_message({"customKey": "customValue"})
    assert json.loads(notify) == {"action": "notify", "payload": {"customKey": "customValue"}}


def test_vonage_frames_of_any_length() -> None:
    audio = pcm(1000)
    out = vonage.frames(audio, 8000)
    assert [len(f) for f in out] == [320, 320, 320, 320]
    assert b"".join(out) == audio + bytes(280)
    assert vonage.frames(b"", 16000) == []
    assert [len(f) for f in vonage.frames(pcm(1280), 16000)] == [640, 640]


def test_vonage_stream_frames_marks_and_clears() -> None:
    stream = vonage_stream()
    assert stream.audio_messages(pcm(600)) == []
    assert stream.pending_bytes == 600
    (frame,) = stream.audio_messages(pcm(100))
    assert len(frame) == 640 and stream.pending_bytes == 60
    padded, notify = stream.mark_messages("m1")
    assert isinstance(padded, bytes) and len(padded) == 640 and padded.endswith(bytes(580))
    assert notify == '{"action":"notify","payload":{"name":"m1"}}'
    assert stream.mark_messages("m2") == [vonage.mark_message("m2")]  # nothing to pad
    stream.audio_messages(pcm(100))
    assert stream.clear_messages() == ['{"action":"clear"}'] and stream.pending_bytes == 0
    assert stream.flush_audio() == []
    with pytest.raises(RuntimeError):
        vonage.VonageStream().audio_messages(pcm(640))


@FAST
@given(
    rate=st.sampled_from(vonage.SAMPLE_RATES),
    pieces=st.lists(st.integers(0, 3000), max_size=8),
)
def test_vonage_outbound_is_whole_frames_of_the_audio(rate: int, pieces: list[int]) -> None:
    text = json.dumps({"event": "websocket:connected", "content-type": f"audio/l16;rate={rate}"})
    stream = vonage_stream(text)
    audio = b"".join(pcm(size, seed) for seed, size in enumerate(pieces))
    out: list[bytes] = []
    offset = 0
    for size in pieces:
        out += stream.audio_messages(audio[offset : offset + size])
        offset += size
    out += stream.flush_audio()
    frame = vonage.frame_bytes(rate)
    assert all(len(f) == frame for f in out)
    sent = b"".join(out)
    assert sent.startswith(audio) and not sent[len(audio) :].strip(b"\x00")
    assert len(sent) - len(audio) < frame
    assert out == vonage.frames(audio, rate)


# -- Exotel --------------------------------------------------------------------------------------

SID = "MZxxxxxxxxxxxxxxxxxxxxxxxx"
CALL_SID = "CAxxxxxxxxxxxxxxxxxxxxxxxx"
ACCOUNT_SID = "ACxxxxxxxxxxxxxxxxxxxxxxxx"
EXOTEL_AUDIO = pcm(1600)  # 100 ms of 8 kHz audio, what Exotel sends a message
EXOTEL_B64 = base64.b64encode(EXOTEL_AUDIO).decode()

# developer.exotel.com/docs/agentstream/websocket-protocol: numbers as strings.
EXOTEL_START: dict[str, Any] = {
    "event": "start",
    "sequence_number": "1",
    "stream_sid": SID,
    "start": {
        "stream_sid": SID,
        "call_sid": CALL_SID,
        "account_sid": ACCOUNT_SID,
        "from": "+919876543210",
        "to": "+918047491899",
        "custom_parameters": {"key1": "value1"},
        "media_format": {"encoding": "audio/x-raw", "sample_rate": "8000", "bit_rate": "16"},
    },
}
EXOTEL_MEDIA: dict[str, Any] = {
    "event": "media",
    "sequence_number": "3",
    "stream_sid": SID,
    "media": {"chunk": "2", "timestamp": "200", "payload": EXOTEL_B64},
}


def exotel_stream(start: dict[str, Any] = EXOTEL_START, **options: Any) -> exotel.ExotelStream:
    stream = exotel.ExotelStream(**options)
    stream.receive('{ "event": "connected" }')
    stream.receive(json.dumps(start))
    return stream


def test_exotel_documented_stream() -> None:
    stream = exotel.ExotelStream()
    assert stream.receive('{ "event": "connected" }') == [exotel.Connected()]
    (start,) = stream.receive(json.dumps(EXOTEL_START))
    assert start == exotel.Start(
        sequence=1,
        stream_sid=SID,
        call_sid=CALL_SID,
        account_sid=ACCOUNT_SID,
        from_="+919876543210",
        to="+918047491899",
        media_format=exotel.MediaFormat("audio/x-raw", 8000, "16"),
        custom_parameters={"key1": "value1"},
    )
    assert isinstance(start, exotel.Start)
    assert start.call_id == CALL_SID and start.carrier.sample_rate == 8000
    # sequence 3 after 1: one message (2) missing, said but not fatal.
    gap, media = stream.receive(json.dumps(EXOTEL_MEDIA))
    assert isinstance(gap, ProtocolWarning) and gap.kind == "sequence_gap"
    assert media == exotel.Media(3, 2, 200, EXOTEL_AUDIO)
    dtmf = {
        "event": "dtmf",
        "sequence_number": "4",
        "stream_sid": SID,
        "dtmf": {"digit": "5", "duration": "100"},
    }
    assert stream.receive(json.dumps(dtmf)) == [exotel.Dtmf(4, "5", 100)]
    mark = {
        "event": "mark",
        "sequence_number": "5",
        "stream_sid": SID,
        "mark": {"name": "my-label"},
    }
    assert stream.receive(json.dumps(mark)) == [exotel.Mark(5, "my-label")]
    stop = {
        "event": "stop",
        "sequence_number": "6",
        "stream_sid": SID,
        "stop": {"call_sid": CALL_SID, "account_sid": ACCOUNT_SID, "reason": "callended"},
    }
    (event,) = stream.receive(json.dumps(stop))
    assert event == exotel.Stop(6, CALL_SID, ACCOUNT_SID, "callended") and event.caller_hung_up
    (late,) = stream.receive(json.dumps(EXOTEL_MEDIA))
    assert isinstance(late, ProtocolWarning) and late.kind == "after_stop"


def test_exotel_integer_numbers_and_other_media_formats() -> None:
    # developer.exotel.com/docs/agentstream/stream-voicebot-applet: numbers as integers.
    start = {
        "event": "start",
        "sequence_number": 1,
        "stream_sid": SID,
        "start": {
            "stream_sid": SID,
            "call_sid": CALL_SID,
            "account_sid": ACCOUNT_SID,
            "from": "+919876543210",
            "to": "+911234567890",
            "custom_parameters": {"agent": "concierge", "lang": "hi", "sample-rate": "8000"},
            "media_format": {"encoding": "raw", "sample_rate": "8000", "bit_rate": "128"},
        },
    }
    stream = exotel_stream(start)
    assert stream.start is not None
    assert stream.start.agent == "concierge" and stream.start.agent_args == {"lang": "hi"}
    media = {
        "event": "media",
        "sequence_number": 2,
        "stream_sid": SID,
        "media": {"chunk": 2, "timestamp": "10", "payload": EXOTEL_B64},
    }
    assert stream.receive(json.dumps(media)) == [exotel.Media(2, 2, 10, EXOTEL_AUDIO)]
    # The earlier support article's start, as many clients test with it.
    older = json.loads(json.dumps(EXOTEL_START))
    older["start"]["media_format"] = {
        "encoding": "base64",
        "sample_rate": 8000,
        "bit_rate": "128kbps",
    }
    assert exotel_stream(older).start is not None


def test_exotel_16k_start_chunks_in_20ms_frames() -> None:
    start = json.loads(json.dumps(EXOTEL_START))
    start["start"]["media_format"]["sample_rate"] = "16000"
    stream = exotel_stream(start)
    assert stream.start is not None and stream.start.sample_rate == 16000
    assert exotel_chunks.chunk_limits(16000) == exotel_chunks.ChunkLimits(640, 3200, 99_840)
    assert exotel_chunks.chunk_limits(24000) == exotel_chunks.ChunkLimits(960, 3840, 99_840)
    assert stream.chunk_bytes == 3200
    assert stream.max_payload_bytes == 32_000


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        (lambda m: m["start"].pop("call_sid"), "start.call_sid is missing", PROTOCOL_ERROR),
        (lambda m: m["start"].update(call_sid=7), "start.call_sid", PROTOCOL_ERROR),
        (lambda m: m.pop("start"), "start is missing", PROTOCOL_ERROR),
        (
            lambda m: (m["start"].pop("stream_sid"), m.pop("stream_sid")),
            "start.stream_sid",
            PROTOCOL_ERROR,
        ),
        (lambda m: m.update(sequence_number="one"), "sequence_number", PROTOCOL_ERROR),
        (lambda m: m["start"].update(custom_parameters=[]), "custom_parameters", PROTOCOL_ERROR),
        (
            lambda m: m["start"]["media_format"].update(encoding="audio/x-mulaw"),
            "encoding",
            UNSUPPORTED_DATA,
        ),
        (
            lambda m: m["start"]["media_format"].update(sample_rate="44100"),
            "sample_rate 44100",
            UNSUPPORTED_DATA,
        ),
    ],
)
def test_exotel_malformed_start_names_the_field(change: Any, field: str, code: int) -> None:
    start = json.loads(json.dumps(EXOTEL_START))
    change(start)
    error = refused(exotel.ExotelStream().receive, json.dumps(start), code=code)
    assert field in error.reason


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        (lambda m: m["media"].pop("payload"), "media.payload is missing", PROTOCOL_ERROR),
        (lambda m: m["media"].update(payload="not base64!"), "media.payload", PROTOCOL_ERROR),
        (lambda m: m["media"].update(payload="AAEC"), "whole 16-bit", UNSUPPORTED_DATA),
        (lambda m: m["media"].update(chunk="two"), "media.chunk", PROTOCOL_ERROR),
        (lambda m: m.update(stream_sid="MZother"), "stream_sid", PROTOCOL_ERROR),
        (lambda m: m.pop("media"), "media is missing", PROTOCOL_ERROR),
        (
            lambda m: m["media"].update(payload=base64.b64encode(bytes(16_002)).decode()),
            "exceeds",
            POLICY_VIOLATION,
        ),
    ],
)
def test_exotel_malformed_media_names_the_field(change: Any, field: str, code: int) -> None:
    media = json.loads(json.dumps(EXOTEL_MEDIA))
    change(media)
    error = refused(exotel_stream().receive, json.dumps(media), code=code)
    assert field in error.reason


def test_exotel_order_and_frames() -> None:
    stream = exotel.ExotelStream()
    assert refused(stream.receive, json.dumps(EXOTEL_MEDIA)).kind == "out_of_order"
    mark = '{"event":"mark","mark":{"name":"x"}}'
    assert "mark message before start" in refused(stream.receive, mark).reason
    refused(stream.receive_bytes, b"\x00\x01", code=UNSUPPORTED_DATA)
    started = exotel_stream()
    assert "second start" in refused(started.receive, json.dumps(EXOTEL_START)).reason
    assert "mark.name" in refused(started.receive, '{"event":"mark","mark":{}}').reason
    bad_dtmf = '{"event":"dtmf","dtmf":{"duration":"100"}}'
    assert "dtmf.digit" in refused(started.receive, bad_dtmf).reason
    (warning,) = started.receive('{"event":"silence"}')
    assert isinstance(warning, ProtocolWarning) and warning.kind == "unknown_event"
    # A Beta page's DTMF shape; no sequence number to check.
    assert started.receive('{"event":"dtmf","digit":"9"}') == [exotel.Dtmf(None, "9", None)]
    # The caller hung up before the stream started.
    early = exotel.ExotelStream()
    (stop,) = early.receive('{"event":"stop","stop":{"reason":"callended"}}')
    assert stop == exotel.Stop(None, "", "", "callended")


def test_exotel_builders_match_the_documented_shapes() -> None:
    media = exotel.media_message(SID, EXOTEL_AUDIO[:3200] + bytes(1600))
    assert json.loads(media) == {
        "event": "media",
        "stream_sid": SID,
        "media": {"payload": base64.b64encode(EXOTEL_AUDIO[:3200] + bytes(1600)).decode()},
    }
    assert exotel.mark_message(SID, "turn-3-end") == (
        '{"event":"mark","stream_sid":"MZxxxxxxxxxxxxxxxxxxxxxxxx","mark":{"name":"turn-3-end"}}'
    )
    assert (
        exotel.clear_message(SID) == '{"event":"clear","stream_sid":"MZxxxxxxxxxxxxxxxxxxxxxxxx"}'
    )


@pytest.mark.parametrize(
    ("size", "sizes"),
    [
        (0, []),
        (1, [3200]),
        (3200, [3200]),
        (3201, [3520]),  # the remainder joins the chunk before it: 20 ms of silence, not 200
        (6400, [3200, 3200]),
        (6500, [3200, 3520]),
        (250_000, [3200] * 77 + [3840]),
    ],
)
def test_exotel_media_chunks(size: int, sizes: list[int]) -> None:
    audio = pcm(size)
    chunks = exotel_chunks.media_chunks(audio)
    assert [len(c) for c in chunks] == sizes
    assert b"".join(chunks) == audio + bytes(sum(sizes) - size)


def test_exotel_media_chunks_large_and_invalid_sizes() -> None:
    audio = pcm(250_000)
    chunks = exotel_chunks.media_chunks(audio, chunk_bytes=99_840)
    assert [len(c) for c in chunks] == [99_840, 99_840, 50_560]
    # A remainder too big to join the chunk before it takes audio from it instead.
    chunks = exotel_chunks.media_chunks(pcm(99_840 + 10), chunk_bytes=99_840)
    assert [len(c) for c in chunks] == [96_960, 3200]
    assert b"".join(chunks) == pcm(99_840 + 10) + bytes(310)
    with pytest.raises(ValueError):
        exotel_chunks.media_chunks(audio, chunk_bytes=4096)  # not a multiple of 320
    with pytest.raises(ValueError):
        exotel_chunks.media_chunks(audio, chunk_bytes=102_400)  # over 100 000
    with pytest.raises(ValueError):
        exotel_chunks.media_chunks(audio, chunk_bytes=2880)  # under 3200
    with pytest.raises(ValueError):
        exotel_chunks.media_chunks(audio, sample_rate=44100)


@FAST
@given(
    rate=st.sampled_from(exotel.SAMPLE_RATES),
    size=st.integers(0, 120_000),
    frames=st.integers(1, 160),
)
def test_exotel_chunks_are_always_what_exotel_takes(rate: int, size: int, frames: int) -> None:
    limits = exotel_chunks.chunk_limits(rate)
    chunk = min(limits.max_bytes, max(limits.min_bytes, frames * limits.multiple))
    audio = pcm(size)
    chunks = exotel_chunks.media_chunks(audio, sample_rate=rate, chunk_bytes=chunk)
    for piece in chunks:
        assert len(piece) % 320 == 0 and len(piece) % (rate // 25) == 0
        assert 3200 <= len(piece) <= 100_000
    sent = b"".join(chunks)
    assert sent.startswith(audio) and not sent[size:].strip(b"\x00")
    padding = len(sent) - size
    assert padding < limits.min_bytes if len(chunks) == 1 else padding < limits.multiple


def test_exotel_stream_outbound_chunks_marks_and_clears() -> None:
    stream = exotel_stream()
    assert stream.media_messages(pcm(3000)) == []
    (first,) = stream.media_messages(pcm(1000))
    assert len(base64.b64decode(json.loads(first)["media"]["payload"])) == 3200
    assert stream.pending_bytes == 800
    padded, mark = stream.mark_messages("m1")
    audio = base64.b64decode(json.loads(padded)["media"]["payload"])
    assert len(audio) == 3200 and audio.endswith(bytes(2400))
    assert mark == exotel.mark_message(SID, "m1")
    stream.media_messages(pcm(10))
    assert stream.clear_messages() == [exotel.clear_message(SID)] and stream.pending_bytes == 0
    bigger = exotel_stream(chunk_bytes=6400)
    assert bigger.chunk_bytes == 6400
    assert len(bigger.media_messages(pcm(12_800))) == 2
    assert exotel_stream(chunk_bytes=4000).chunk_bytes == 4160  # up to a multiple of 320


# -- jambonz -------------------------------------------------------------------------------------

# What listen.js sends first: {sampleRate, mixType}, the call's attributes, the verb's metadata.
JAMBONZ_START: dict[str, Any] = {
    "sampleRate": 16000,
    "mixType": "mono",
    "callSid": "d2f0b1f4-4a5e-4c4e-9d67-6f0b5b3f2a11",
    "direction": "inbound",
    "from": "+15083084809",
    "to": "+15083728299",
    "callId": "4d0a3b9e-8d3e-123b-63f1-0242ac110003",
    "sipStatus": 200,
    "sipReason": "OK",
    "callStatus": "in-progress",
    "callerId": "+15083084809",
    "accountSid": "9351f46a-678c-43f5-b8a6-d4eb58d131af",
    "traceId": "8f2ab5c6a4f1e0b3f2d1c0b9a8e7d6c5",
    "applicationSid": "e7fef3f9-2b3a-4bd3-9f0f-0f3b6c2d1e4a",
    "fsSipAddress": "10.0.0.12:5060",
    "agent": "concierge",
    "args": {"lang": "en", "retries": 2},
}


def jambonz_stream(start: dict[str, Any] = JAMBONZ_START, **options: Any) -> jambonz.JambonzStream:
    stream = jambonz.JambonzStream(**options)
    stream.receive_text(json.dumps(start))
    return stream


def test_jambonz_first_frame_and_audio() -> None:
    stream = jambonz.JambonzStream()
    (start,) = stream.receive_text(json.dumps(JAMBONZ_START))
    assert isinstance(start, jambonz.Start)
    assert (start.call_id, start.sample_rate, start.mix_type) == (
        JAMBONZ_START["callSid"],
        16000,
        "mono",
    )
    assert (start.direction, start.from_, start.to) == ("inbound", "+15083084809", "+15083728299")
    assert start.account_sid == JAMBONZ_START["accountSid"]
    assert start.agent == "concierge" and start.agent_args == {"lang": "en", "retries": "2"}
    assert start.carrier.sample_rate == 16000
    assert jambonz.SUBPROTOCOLS == ("audio.jambonz.org", "audio.drachtio.org")
    frame = pcm(640)
    assert stream.receive_bytes(frame) == [jambonz.Audio(frame)]
    assert stream.audio_payload(frame) is frame
    # mod_audio_fork's graceful shutdown: an empty binary frame, then the close.
    assert stream.receive_bytes(b"") == [jambonz.Stop()]
    (late,) = stream.receive_bytes(frame)
    assert isinstance(late, ProtocolWarning) and late.kind == "after_stop"


def test_jambonz_events_from_the_docs() -> None:
    stream = jambonz_stream()
    dtmf = '{\n  "event": "dtmf",\n  "dtmf": "2",\n  "duration": "1600"\n}'
    assert stream.receive_text(dtmf) == [jambonz.Dtmf("2", 1600)]
    playout = '{"type": "mark", "data": {"name":"my-mark-1", "event": "playout"}}'
    (mark,) = stream.receive_text(playout)
    assert mark == jambonz.Mark("my-mark-1", "playout") and not mark.cleared
    cleared = '{"type": "mark", "data": {"name":"m2", "event": "cleared"}}'
    (mark,) = stream.receive_text(cleared)
    assert isinstance(mark, jambonz.Mark) and mark.cleared
    assert stream.receive_text('{"type":"playDone","data":{"id":"greeting"}}') == [
        jambonz.PlayDone("greeting")
    ]
    assert stream.receive_text('{"type":"playDone"}') == [jambonz.PlayDone(None)]
    (warning,) = stream.receive_text('{"type":"transcription","data":{}}')
    assert isinstance(warning, ProtocolWarning) and warning.kind == "unknown_type"
    (warning,) = stream.receive_text('{"event":"dtmf","dtmf":"E"}')
    assert isinstance(warning, ProtocolWarning) and warning.kind == "invalid_dtmf"


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        (lambda m: m.pop("callSid"), "callSid is missing", PROTOCOL_ERROR),
        (lambda m: m.update(callSid=""), "callSid", PROTOCOL_ERROR),
        (lambda m: m.pop("sampleRate"), "sampleRate is missing", PROTOCOL_ERROR),
        (lambda m: m.update(sampleRate="fast"), "sampleRate is not an integer", PROTOCOL_ERROR),
        (lambda m: m.update(sampleRate=44100), "sampleRate 44100", UNSUPPORTED_DATA),
        (lambda m: m.update(mixType="quad"), "mixType", PROTOCOL_ERROR),
        (lambda m: m.update(mixType="stereo"), "mixType stereo", UNSUPPORTED_DATA),
    ],
)
def test_jambonz_malformed_first_frame_names_the_field(change: Any, field: str, code: int) -> None:
    start = dict(JAMBONZ_START)
    change(start)
    error = refused(jambonz.JambonzStream().receive_text, json.dumps(start), code=code)
    assert field in error.reason


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"type":"mark"}', "mark data is missing"),
        ('{"type":"mark","data":{"event":"playout"}}', "data.name"),
        ('{"type":"mark","data":{"name":"m1","event":"later"}}', "data.event"),
        ('{"event":"dtmf","duration":"1600"}', "dtmf is missing"),
        ('{"event":"dtmf","dtmf":"1","duration":"soon"}', "duration"),
        ('{"type":5}', '"type"'),
        ('{"callSid":"again"}', '"type" nor an "event"'),
    ],
)
def test_jambonz_malformed_events_name_the_field(text: str, field: str) -> None:
    assert field in refused(jambonz_stream().receive_text, text).reason


def test_jambonz_order_and_binary_limits() -> None:
    stream = jambonz.JambonzStream()
    assert refused(stream.receive_bytes, bytes(320)).kind == "out_of_order"
    started = jambonz_stream(dict(JAMBONZ_START, sampleRate="8000"))  # a string, as verbs allow
    assert started.start is not None and started.start.sample_rate == 8000
    refused(started.receive_bytes, bytes(321), code=UNSUPPORTED_DATA)
    refused(started.receive_bytes, bytes(started.max_binary_bytes + 2), code=POLICY_VIOLATION)


def test_jambonz_builders_match_the_documented_shapes() -> None:
    assert json.loads(jambonz.kill_audio_message()) == {"type": "killAudio"}
    assert json.loads(jambonz.disconnect_message()) == {"type": "disconnect"}
    assert json.loads(jambonz.clear_marks_message()) == {"type": "clearMarks"}
    assert json.loads(jambonz.mark_message("my-mark-1")) == {
        "type": "mark",
        "data": {"name": "my-mark-1"},
    }
    with pytest.raises(ValueError):
        jambonz.mark_message('say "hi"')  # jambonz would echo it as broken JSON
    audio = pcm(320)
    play = json.loads(jambonz.play_audio_message(audio, 16000, id="greeting", queue_play=True))
    assert play == {
        "type": "playAudio",
        "data": {
            "audioContent": base64.b64encode(audio).decode(),
            "audioContentType": "raw",
            "sampleRate": 16000,
            "id": "greeting",
            "queuePlay": True,
        },
    }
    with pytest.raises(ValueError):
        jambonz.play_audio_message(audio, 44100)


def test_jambonz_outbound_fills_the_prebuffer() -> None:
    stream = jambonz_stream(dict(JAMBONZ_START, sampleRate=8000))
    # The first message must reach mod_audio_fork's first pre-buffer: 1280 samples at 8 kHz.
    assert stream.audio_messages(pcm(2000)) == []
    (first,) = stream.audio_messages(pcm(1000))
    assert len(first) == 3000
    # Later ones 640 samples.
    assert stream.audio_messages(pcm(1000)) == []
    (second,) = stream.audio_messages(pcm(400))
    assert len(second) == 1400
    stream.audio_messages(pcm(100))
    padded, mark = stream.mark_messages("m1")
    assert isinstance(padded, bytes) and len(padded) == 1280 and padded.endswith(bytes(1180))
    assert mark == '{"type":"mark","data":{"name":"m1"}}'
    assert stream.marks_outstanding == 1
    stream.receive_text('{"type":"mark","data":{"name":"m1","event":"playout"}}')
    assert stream.marks_outstanding == 0
    stream.audio_messages(pcm(100))
    assert stream.clear_messages() == ['{"type":"killAudio"}'] and stream.pending_bytes == 0
    stream.mark_messages("m2")
    assert stream.clear_marks_messages() == ['{"type":"clearMarks"}']
    assert stream.marks_outstanding == 0
    assert stream.disconnect_message() == '{"type":"disconnect"}'


def test_jambonz_outbound_at_a_wideband_playback_rate() -> None:
    # 16 kHz back to what may be an 8 kHz call: mod_audio_fork's pre-buffer doubles.
    stream = jambonz_stream()
    assert stream.playback_rate == 16000
    (first,) = stream.audio_messages(pcm(6000))
    assert len(first) == 6000 and len(first) >= 2 * 1280 * 2
    (big,) = stream.audio_messages(pcm(33_000))
    assert len(big) == 33_000  # over a second, but what is left could not make a message
    out = stream.audio_messages(pcm(70_000))
    assert [len(m) for m in out] == [32_000, 32_000, 6000] and stream.pending_bytes == 0
    assert stream.audio_messages(pcm(2000)) == [] and stream.pending_bytes == 2000
    with pytest.raises(ValueError):
        jambonz.JambonzStream(playback_rate=11025)
    with pytest.raises(RuntimeError):
        jambonz.JambonzStream().audio_messages(pcm(10))


@FAST
@given(
    rate=st.sampled_from(jambonz.PLAYBACK_RATES),
    pieces=st.lists(st.integers(0, 9000), max_size=8),
    marks=st.sets(st.integers(0, 7)),
)
def test_jambonz_outbound_messages_never_wait_in_the_prebuffer(
    rate: int, pieces: list[int], marks: set[int]
) -> None:
    stream = jambonz_stream(dict(JAMBONZ_START, sampleRate=8000), playback_rate=rate)
    factor = max(1, rate // 8000)
    threshold = 2 * jambonz.PREBUFFER_FIRST_SAMPLES * factor
    audio = b"".join(pcm(2 * (size // 2), seed) for seed, size in enumerate(pieces))
    sent: list[bytes] = []
    offset = 0
    for index, size in enumerate(pieces):
        size -= size % 2
        messages: list[Any] = stream.audio_messages(audio[offset : offset + size])
        offset += size
        if index in marks:
            messages += stream.mark_messages(f"m{index}")
        for message in messages:
            if isinstance(message, bytes):
                assert len(message) >= threshold and len(message) % (2 * factor) == 0
                threshold = 2 * jambonz.PREBUFFER_SAMPLES * factor
                sent.append(message)
            else:
                # Nothing is held back when a mark goes out: it follows all the audio.
                assert stream.pending_bytes == 0
    sent += stream.flush_audio()
    # pcm() has no zero bytes: all that was added is silence, and nothing was lost.
    assert b"".join(sent).replace(b"\x00", b"") == audio


# -- all three: no input escapes as anything but ProtocolError ------------------------------------

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70_000) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=10,
)
KEYS = st.sampled_from(
    "event type start media payload digit dtmf data name stop content-type callSid sampleRate"
    " mixType stream_sid sequence_number".split()
)
VALUES = (
    st.sampled_from(
        "start media mark dtmf stop connected websocket:connected websocket:dtmf"
        " websocket:notify audio/l16;rate=8000 playout AAA=".split()
    )
    | JSONISH
)


@settings(max_examples=80, deadline=None)
@given(messages=st.lists(st.dictionaries(KEYS, VALUES, max_size=6), min_size=1, max_size=4))
def test_garbage_raises_only_protocol_errors(messages: list[dict[str, Any]]) -> None:
    for make in (vonage.VonageStream, exotel.ExotelStream, jambonz.JambonzStream):
        stream: Any = make()
        try:
            for message in messages:
                events = (
                    stream.receive_text(json.dumps(message))
                    if hasattr(stream, "receive_text")
                    else stream.receive(json.dumps(message))
                )
                assert isinstance(events, list)
        except ProtocolError as error:
            assert error.code in (PROTOCOL_ERROR, UNSUPPORTED_DATA, POLICY_VIOLATION)
            assert error.reason

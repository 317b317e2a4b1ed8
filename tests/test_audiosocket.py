"""Asterisk AudioSocket: the frame reader on its own, then calls over real TCP on localhost.

The caller here is a test client written in this file from the published protocol
(https://docs.asterisk.org/Configuration/Channel-Drivers/AudioSocket/): a 3-byte header (kind,
16-bit big-endian length), the UUID first, then 20 ms slin frames in real time, silence
included, as an Asterisk channel sends them. It is not Asterisk and shares no code with the
server's reader, so the two check each other. The calls reach the default agent of
config/agents.yaml (pocketsphinx's domain model, as in test_voice_e2e.py) plus a `closer` agent
that ends the call on a key press; assertions read the call record the server keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.configs import GREETING, QUICK_VOICE, default_config_with, serving
from tests.support.configs import ended_call as record
from voice_agent.audio.resample import resample
from voice_agent.audio.wav import read_wav
from voice_agent.core.sentences import SentenceSplitter
from voice_agent.errors import ConfigError
from voice_agent.gateways.audiosocket import AudioSocketServer
from voice_agent.server.app import VoiceServer
from voice_agent.transports import audiosocket as wire
from voice_agent.transports.errors import ProtocolError, ProtocolWarning

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
OPENING_HOURS = "We're open every day from noon to eleven pm."
CLOSER_UUID = "c105e000-0000-4000-8000-00000000c105"
T = TypeVar("T")


def slin(name: str, rate: int = 8000) -> bytes:
    """A fixture as signed linear 16-bit at `rate` (the WAVs are 16 kHz)."""
    pcm, source_rate = read_wav(AUDIO / f"{name}.wav")
    return pcm if source_rate == rate else resample(pcm, source_rate, rate)


def messages(call: dict[str, Any], role: str) -> list[str | None]:
    return [m.get("content") for m in call["context"]["messages"] if m["role"] == role]


def audit(call: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [event for event in call["audit"] if event["type"] == kind]


# ---- the test client -------------------------------------------------------------------------

# From the protocol page: the kinds this client sends and understands.
HANGUP, UUID_KIND, DTMF, SLIN8, SLIN16, ERROR = 0x00, 0x01, 0x03, 0x10, 0x12, 0xFF
RATE_KIND = {8000: SLIN8, 16000: SLIN16}


def frame(kind: int, payload: bytes = b"") -> bytes:
    return bytes([kind]) + len(payload).to_bytes(2, "big") + payload


@dataclass(frozen=True)
class Received:
    at: float  # the client's loop clock, seconds
    kind: int
    payload: bytes


class AsteriskLikeCaller:
    """Asterisk's end of an AudioSocket connection, from the spec (not Asterisk).

    Sends the UUID (unless `send_uuid` is off), then one 20 ms frame of `rate` slin every
    20 ms on a deadline clock: the caller's queued audio, else silence (`stream_audio` off:
    nothing at all). Records every message the server sends with its arrival time.
    """

    def __init__(
        self,
        port: int,
        call_uuid: str | None = None,
        *,
        rate: int = 8000,
        send_uuid: bool = True,
        stream_audio: bool = True,
        timeout: float = 60.0,
    ) -> None:
        self.port = port
        self.call_uuid = call_uuid or str(uuid.uuid4())
        self.rate = rate
        self.kind = RATE_KIND[rate]
        self.frame_bytes = rate * 2 // 50
        self.send_uuid = send_uuid
        self.stream_audio = stream_audio
        self.timeout = timeout
        self.received: list[Received] = []
        self.closed = False
        self._changed = asyncio.Event()
        self._queue = bytearray()
        self._queued = 0
        self._sent = 0
        self._done: list[tuple[int, asyncio.Future[None]]] = []
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> AsteriskLikeCaller:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        if self.send_uuid:
            self.write(frame(UUID_KIND, uuid.UUID(self.call_uuid).bytes))
        self._tasks.append(asyncio.ensure_future(self._receive_loop()))
        if self.stream_audio:
            self._tasks.append(asyncio.ensure_future(self._send_loop()))
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- sending -------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        assert self._writer is not None
        if not self._writer.is_closing():
            self._writer.write(data)

    async def send_audio(self, pcm: bytes) -> None:
        """Queue the caller's audio; returns once the last of it has been sent, in real time."""
        self._queue += pcm
        self._queued += len(pcm)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._done.append((self._queued, done))
        async with asyncio.timeout(self.timeout):
            await done

    async def send_silence(self, ms: int) -> None:
        await self.send_audio(bytes(self.rate * 2 * ms // 1000))

    def send_dtmf(self, digit: str) -> None:
        self.write(frame(DTMF, digit.encode()))

    async def hang_up(self) -> None:
        """Hang-up message, then the socket closes."""
        self.write(frame(HANGUP))
        await self.close()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()

    async def _send_loop(self) -> None:
        # A real-time source: frame n goes at start + n * 20 ms, whatever the wake-ups.
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        silence = bytes(self.frame_bytes)
        while not self.closed:
            chunk = bytes(self._queue[: self.frame_bytes])
            del self._queue[: self.frame_bytes]
            self._sent += len(chunk)
            self.write(frame(self.kind, chunk + silence[len(chunk) :]))
            while self._done and self._done[0][0] <= self._sent:
                self._done.pop(0)[1].set_result(None)
            next_at += 0.02
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    # -- receiving -----------------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        assert self._reader is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                header = await self._reader.readexactly(3)
                payload = await self._reader.readexactly(int.from_bytes(header[1:], "big"))
                self.received.append(Received(loop.time(), header[0], payload))
                self._notify()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed = True
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def audio(self) -> list[Received]:
        return [m for m in self.received if m.kind in RATE_KIND.values()]

    @property
    def hangups(self) -> list[Received]:
        return [m for m in self.received if m.kind == HANGUP]

    async def wait_until(self, check: Callable[[], T | None], what: str) -> T:
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    changed = self._changed
                    result = check()
                    if result is not None and result is not False:
                        return result
                    if self.closed:
                        raise ConnectionError(f"closed while waiting for {what}")
                    await changed.wait()
        except TimeoutError:
            raise TimeoutError(f"timed out waiting for {what}") from None

    async def wait_frames(self, count: int) -> int:
        return await self.wait_until(
            lambda: len(self.audio) if len(self.audio) >= count else None, f"{count} frames"
        )

    async def wait_silence(self, ms: float) -> int:
        """Wait until audio has come and then none for `ms`; returns the frames so far."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    changed = self._changed
                    audio = self.audio
                    if audio:
                        quiet_s = loop.time() - audio[-1].at
                        if quiet_s >= ms / 1000:
                            return len(audio)
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(ms / 1000 - quiet_s):
                                await changed.wait()
                    elif self.closed:
                        raise ConnectionError("closed before any audio")
                    else:
                        await changed.wait()
        except TimeoutError:
            raise TimeoutError(f"timed out waiting for {ms} ms of silence") from None

    async def wait_closed(self) -> None:
        async with asyncio.timeout(self.timeout):
            while not self.closed:
                await self._changed.wait()


# ---- the reader on its own -------------------------------------------------------------------

CALL = "40325ec2-5efd-4bd3-805f-53576e581d13"


def a_call(*messages: bytes) -> bytes:
    return frame(UUID_KIND, uuid.UUID(CALL).bytes) + b"".join(messages)


def fails(data: bytes, kind: str, *words: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        wire.AudioSocketReader().feed(data)
    assert caught.value.kind == kind, caught.value.reason
    for word in words:
        assert word in caught.value.reason
    return caught.value


def test_several_messages_in_one_read_come_out_in_order() -> None:
    tone = bytes(range(256)) + bytes(64)
    data = a_call(frame(SLIN8, tone), frame(DTMF, b"#"), frame(SLIN8, tone), frame(HANGUP))
    events = wire.AudioSocketReader().feed(data)
    assert events == [
        wire.Uuid(CALL),
        wire.Audio(tone, 8000),
        wire.Dtmf("#"),
        wire.Audio(tone, 8000),
        wire.Hangup(),
    ]


def test_a_message_split_across_reads_is_held_until_whole() -> None:
    data = a_call(frame(SLIN8, bytes(320)), frame(DTMF, b"7"))
    reader = wire.AudioSocketReader()
    events: list[Any] = []
    for i in range(len(data)):  # one byte per read: every split point at once
        events += reader.feed(data[i : i + 1])
        assert reader.buffered_bytes <= reader.max_buffered_bytes
    assert events == [wire.Uuid(CALL), wire.Audio(bytes(320), 8000), wire.Dtmf("7")]
    assert reader.buffered_bytes == 0


def test_uuid_comes_out_as_canonical_text() -> None:
    raw = uuid.UUID("{40325EC2-5EFD-4BD3-805F-53576E581D13}").bytes
    assert wire.AudioSocketReader().feed(frame(UUID_KIND, raw)) == [wire.Uuid(CALL)]
    assert wire.uuid_message(CALL) == frame(UUID_KIND, raw)


def test_higher_rate_kinds_give_their_rate() -> None:
    rates = {0x11: 12000, 0x12: 16000, 0x13: 24000, 0x14: 32000, 0x15: 44100, 0x16: 48000}
    rates |= {0x17: 96000, 0x18: 192000, 0x10: 8000}
    for kind, rate in rates.items():
        pcm = bytes(rate * 2 // 50)  # 20 ms
        (_, audio) = wire.AudioSocketReader().feed(a_call(frame(kind, pcm)))
        assert audio == wire.Audio(pcm, rate) and audio.kind == kind


def test_hangup_and_error_may_come_first_and_errors_say_their_code() -> None:
    assert wire.AudioSocketReader().feed(frame(HANGUP)) == [wire.Hangup()]
    (error,) = wire.AudioSocketReader().feed(frame(ERROR, b"\x02"))
    assert error == wire.Error(2) and "frame forwarding error" in error.description
    assert "without a code" in wire.Error(None).description


def test_nothing_is_read_after_a_hangup() -> None:
    reader = wire.AudioSocketReader()
    assert reader.feed(a_call(frame(HANGUP), b"\x42garbage")) == [wire.Uuid(CALL), wire.Hangup()]
    assert reader.feed(b"\x42\x42\x42") == []


def test_odd_dtmf_is_a_warning_and_empty_audio_nothing() -> None:
    events = wire.AudioSocketReader().feed(a_call(frame(DTMF, b"x"), frame(SLIN8)))
    assert events[0] == wire.Uuid(CALL)
    assert len(events) == 2 and isinstance(events[1], ProtocolWarning)
    assert events[1].kind == "invalid_dtmf"


def test_malformed_streams_raise_protocol_errors_that_say_what_is_wrong() -> None:
    fails(a_call(frame(0x42, b"abc")), "unknown_kind", "0x42")
    fails(frame(SLIN8, bytes(320)), "out_of_order", "before the UUID")
    fails(frame(DTMF, b"1"), "out_of_order", "before the UUID")
    fails(frame(UUID_KIND, bytes(15)), "bad_uuid", "15 bytes")
    fails(a_call(frame(UUID_KIND, bytes(16))), "out_of_order", "second UUID")
    fails(a_call(frame(DTMF, b"12")), "bad_dtmf")
    fails(a_call(frame(SLIN8, bytes(321))), "bad_audio", "16-bit")
    fails(a_call(frame(SLIN8, bytes(320)), frame(SLIN16, bytes(640))), "rate_changed")
    fails(frame(ERROR, bytes(100)), "payload_too_large")
    # Too long is refused on the header alone: the 60,000 bytes are never waited for.
    error = fails(a_call(b"\x10\xea\x60"), "payload_too_large", "60000", "1600")
    assert "100 ms" in error.reason


def test_a_failed_reader_stays_failed() -> None:
    reader = wire.AudioSocketReader()
    with pytest.raises(ProtocolError):
        reader.feed(frame(SLIN8, bytes(2)))
    with pytest.raises(ProtocolError):
        reader.feed(a_call())


def test_encoders() -> None:
    assert wire.hangup_message() == b"\x00\x00\x00"
    assert wire.audio_message(b"\x01\x02") == b"\x10\x00\x02\x01\x02"
    assert wire.audio_message(bytes(640), 0x12)[:3] == b"\x12\x02\x80"
    assert wire.dtmf_message("#") == b"\x03\x00\x01#"
    for bad in (b"", b"\x01"):
        with pytest.raises(ValueError):
            wire.audio_message(bad)
    with pytest.raises(ValueError):
        wire.audio_message(bytes(2), kind=DTMF)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=4096), st.booleans())
def test_random_bytes_raise_only_protocol_errors(data: bytes, after_uuid: bool) -> None:
    reader = wire.AudioSocketReader()
    if after_uuid:
        reader.feed(a_call())
    try:
        reader.feed(data)
    except ProtocolError:
        pass
    assert reader.buffered_bytes <= reader.max_buffered_bytes


_MESSAGES = st.one_of(
    st.integers(0, 5).map(lambda n: frame(SLIN8, bytes(range(64)) * n)),
    st.sampled_from("0123456789*#ABCD").map(lambda d: frame(DTMF, d.encode())),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_MESSAGES, max_size=20), st.lists(st.integers(1, 400), max_size=40))
def test_any_split_of_a_valid_stream_reads_the_same(
    messages_: list[bytes], cuts: list[int]
) -> None:
    data = a_call(*messages_)
    whole = wire.AudioSocketReader().feed(data)
    reader, pieces, offset = wire.AudioSocketReader(), [], 0
    for size in cuts:
        pieces.append(data[offset : offset + size])
        offset += size
    pieces.append(data[offset:])
    split: list[Any] = []
    for piece in pieces:
        split += reader.feed(piece)
    assert split == whole and len(whole) == 1 + sum(1 for m in messages_ if m[1:3] != b"\0\0")


# ---- calls -----------------------------------------------------------------------------------

# The calls share one server (its engines take seconds to load), so one event loop.
on_module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """The default agent with pocketsphinx's domain model, and `closer`: a flow that says
    goodbye and ends the call on any key."""
    path = default_config_with(tmp_path_factory.mktemp("audiosocket"), voice=QUICK_VOICE)
    data = yaml.safe_load(path.read_text())
    data["agents"]["closer"] = {
        "brain": "flow",
        "description": "Ends the call on any key (AudioSocket tests).",
        "intents": data["agents"]["booking"]["intents"],
        "flow": {
            "start_page": "welcome",
            "pages": {"welcome": {"message": "Press any key to leave."}},
            "events": {"dtmf": {"say": "Goodbye!", "end_call": True}},
        },
    }
    # The server's own listener, as `audiosocket:` in a config starts it.
    data["audiosocket"] = {"listen": "127.0.0.1:0", "routes": {CLOSER_UUID: {"agent": "closer"}}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    async for voice_server in serving(path):
        yield voice_server


async def listening(server: VoiceServer, **options: Any) -> AudioSocketServer:
    audiosocket = AudioSocketServer(
        "127.0.0.1:0",
        start_call=server.start_call,
        admit=server.refuse_call,
        routes={CLOSER_UUID: ("closer", {})},
        **options,
    )
    await audiosocket.start()
    return audiosocket


@pytest_asyncio.fixture(loop_scope="module")
async def audiosocket(server: VoiceServer) -> AudioSocketServer:
    """The listener the server started from its config."""
    assert server.audiosocket is not None and server.audiosocket.port
    return server.audiosocket


async def speech_ms(server: VoiceServer, text: str) -> float:
    """How long the default agent's TTS speaks `text`, sentence by sentence as the pipeline."""
    tts = server.engines(server.registry.agents["booking"]).tts
    splitter = SentenceSplitter()
    total = 0
    for sentence in [*splitter.push(text), *splitter.flush()]:
        async for chunk in tts.synthesize(sentence):
            total += len(chunk.pcm)
    return total / (tts.sample_rate * 2) * 1000


def call_id_of(server: VoiceServer, call_uuid: str) -> str:
    """The call id of the live call that has `call_uuid` in its args."""
    found = [
        call_id
        for call_id, pipeline in server.pipelines.items()
        if pipeline.session.state.get("uuid") == call_uuid
    ]
    assert len(found) == 1, found
    return found[0]


@on_module_loop
async def test_a_call_hears_the_greeting_paced_and_hangs_up(
    server: VoiceServer, audiosocket: AudioSocketServer
) -> None:
    async with AsteriskLikeCaller(audiosocket.port) as caller:
        frames = await caller.wait_silence(800)
        greeting = caller.audio
        await caller.hang_up()
    call = await record(server, caller.call_uuid)  # the UUID is the call id
    assert call["transport"] == "audiosocket" and call["agent"] == "booking"
    assert call["state"]["uuid"] == caller.call_uuid
    assert messages(call, "assistant") == [GREETING]  # committed: its marks were heard
    assert call["end_reason"] == "caller hung up"
    assert {(m.kind, len(m.payload)) for m in greeting} == {(SLIN8, 320)}
    expected = await speech_ms(server, GREETING) / 20
    assert 0.85 * expected <= frames <= 1.15 * expected + 10, (frames, expected)
    # Paced: 20 ms of audio per 20 ms, never ahead (a busy machine can only make it slower).
    span_s = greeting[-1].at - greeting[0].at
    assert span_s >= 0.8 * frames * 0.02, (span_s, frames)


@on_module_loop
async def test_the_callers_line_is_transcribed_and_closing_the_socket_hangs_up(
    server: VoiceServer, audiosocket: AudioSocketServer
) -> None:
    async with AsteriskLikeCaller(audiosocket.port) as caller:
        heard = await caller.wait_silence(700)
        await caller.send_audio(slin("joe_book1"))
        await caller.wait_frames(heard + 1)  # the answer
        await caller.wait_silence(700)
        await caller.close()  # no hang-up message: the socket closing says it
    call = await record(server, caller.call_uuid)
    users = messages(call, "user")
    assert users[0] is not None and "book a table for two tomorrow at seven" in users[0]
    assert messages(call, "assistant")[-1] == "What name should I put the booking under?"
    assert call["end_reason"] == "caller hung up"


@on_module_loop
async def test_a_16_khz_call_is_answered_at_16_khz(
    server: VoiceServer, audiosocket: AudioSocketServer
) -> None:
    async with AsteriskLikeCaller(audiosocket.port, rate=16000) as caller:
        heard = await caller.wait_silence(700)
        await caller.send_audio(slin("joe_book1", 16000))
        await caller.wait_frames(heard + 1)
        await caller.wait_silence(700)
        await caller.hang_up()
    assert {(m.kind, len(m.payload)) for m in caller.audio} == {(SLIN16, 640)}
    call = await record(server, caller.call_uuid)
    users = messages(call, "user")
    assert users[0] is not None and "book a table for two tomorrow at seven" in users[0]


@on_module_loop
async def test_dtmf_reaches_the_event_trigger(
    server: VoiceServer, audiosocket: AudioSocketServer
) -> None:
    async with AsteriskLikeCaller(audiosocket.port) as caller:
        heard = await caller.wait_silence(700)
        caller.send_dtmf("0")
        await caller.wait_frames(heard + 1)
        await caller.wait_silence(700)
        await caller.hang_up()
    call = await record(server, caller.call_uuid)
    triggers = audit(call, "trigger")
    assert triggers and triggers[0]["function"] == "on_keypad"
    assert messages(call, "assistant")[-1] == OPENING_HOURS


@on_module_loop
async def test_barge_in_commits_only_the_heard_prefix(
    server: VoiceServer, audiosocket: AudioSocketServer
) -> None:
    async with AsteriskLikeCaller(audiosocket.port) as caller:
        await caller.wait_frames(1)
        await caller.send_silence(2500)
        await caller.send_audio(slin("joe_book1"))  # over the greeting
        cut = len(caller.audio)
        await caller.wait_frames(cut + 1)  # the answer, after the greeting stopped
        await caller.wait_silence(700)
        await caller.hang_up()
    call = await record(server, caller.call_uuid)
    committed = messages(call, "assistant")[0]
    assert committed is not None
    heard, generated = committed.split(), GREETING.split()
    assert 0 < len(heard) < len(generated)
    assert [w.strip(",.!?") for w in heard] == [w.strip(",.!?") for w in generated[: len(heard)]]
    assert audit(call, "barge_in")
    assert cut * 20 < 0.85 * await speech_ms(server, GREETING)  # the rest was never sent


@on_module_loop
async def test_the_agent_ending_the_call_sends_a_hangup_and_closes(
    server: VoiceServer, audiosocket: AudioSocketServer
) -> None:
    async with AsteriskLikeCaller(audiosocket.port, CLOSER_UUID) as caller:
        heard = await caller.wait_silence(700)
        call_id = call_id_of(server, CLOSER_UUID)
        caller.send_dtmf("9")
        await caller.wait_closed()
    assert len(caller.audio) > heard  # "Goodbye!" was sent before the hang-up
    assert [m.kind for m in caller.received[-1:]] == [HANGUP]
    assert len(caller.hangups) == 1
    # A routed UUID picks the agent; being the same in every such call, it is no call id.
    assert call_id != CLOSER_UUID
    call = await record(server, call_id)
    assert call["agent"] == "closer" and call["state"]["uuid"] == CLOSER_UUID
    assert messages(call, "assistant") == ["Press any key to leave.", "Goodbye!"]
    assert call["end_reason"] == "agent ended the call"


@on_module_loop
async def test_bad_connections_end_alone_while_a_call_goes_on(server: VoiceServer) -> None:
    listener = await listening(server, uuid_timeout_s=0.5)
    try:
        async with AsteriskLikeCaller(listener.port) as good:
            heard = await good.wait_silence(700)
            # A call under way that then sends garbage.
            broken = AsteriskLikeCaller(listener.port, timeout=10)
            await broken.__aenter__()
            await broken.wait_frames(1)
            broken.write(frame(0x42, b"?"))
            attempts = {
                "too long": frame(UUID_KIND, uuid.uuid4().bytes) + b"\x10\xea\x60",
                "audio first": frame(SLIN8, bytes(320)),
                "silent": b"",
                "half a header": b"\x01\x00",
            }
            bad = [
                AsteriskLikeCaller(listener.port, send_uuid=False, stream_audio=False, timeout=10)
                for _ in attempts
            ]
            for caller, data in zip(bad, attempts.values(), strict=True):
                await caller.__aenter__()
                caller.write(data)
            for caller in bad:
                await caller.wait_closed()
                assert [m.kind for m in caller.received] == [HANGUP]
            await broken.wait_closed()
            assert broken.received[-1].kind == HANGUP
            # The good call was not disturbed: it still answers.
            good.send_dtmf("0")
            await good.wait_frames(heard + 1)
            await good.wait_silence(700)
            await good.hang_up()
        for caller in [*bad, broken]:
            await caller.close()
        ended = await record(server, broken.call_uuid)
        assert ended["end_reason"].startswith("protocol error: unknown message kind 0x42")
        call = await record(server, good.call_uuid)
        assert messages(call, "assistant") == [GREETING, OPENING_HOURS]
        assert call["end_reason"] == "caller hung up"
    finally:
        await listener.stop()


@on_module_loop
async def test_no_audio_after_the_uuid_starts_the_call_at_8_khz(server: VoiceServer) -> None:
    listener = await listening(server, first_audio_wait_s=0.2)
    try:
        async with AsteriskLikeCaller(listener.port, stream_audio=False) as caller:
            await caller.wait_frames(5)
            await caller.hang_up()
        assert {(m.kind, len(m.payload)) for m in caller.audio} == {(SLIN8, 320)}
        assert (await record(server, caller.call_uuid))["end_reason"] == "caller hung up"
    finally:
        await listener.stop()


@on_module_loop
async def test_a_uuid_already_in_a_live_call_gets_a_new_call_id(
    server: VoiceServer, audiosocket: AudioSocketServer
) -> None:
    shared = str(uuid.uuid4())
    async with (
        AsteriskLikeCaller(audiosocket.port, shared) as first,
        AsteriskLikeCaller(audiosocket.port, shared) as second,
    ):
        await first.wait_frames(1)
        await second.wait_frames(1)
        ids = {i for i, p in server.pipelines.items() if p.session.state.get("uuid") == shared}
        await first.hang_up()
        await second.hang_up()
    assert len(ids) == 2 and shared in ids


@on_module_loop
async def test_a_route_to_an_unknown_agent_hangs_up(server: VoiceServer) -> None:
    nowhere = str(uuid.uuid4())
    listener = AudioSocketServer(
        "127.0.0.1:0",
        start_call=server.start_call,
        admit=server.refuse_call,
        routes={nowhere: ("nobody", {})},
    )
    await listener.start()
    try:
        async with AsteriskLikeCaller(listener.port, nowhere, timeout=10) as caller:
            await caller.wait_closed()
        assert [m.kind for m in caller.received] == [HANGUP]
    finally:
        await listener.stop()


@on_module_loop
async def test_stopping_the_listener_hangs_up_its_calls(server: VoiceServer) -> None:
    listener = await listening(server)
    async with AsteriskLikeCaller(listener.port) as caller:
        await caller.wait_frames(1)
        await listener.stop()
        await caller.wait_closed()
    assert caller.received[-1].kind == HANGUP
    call = await record(server, caller.call_uuid)
    assert call["end_reason"] == "server shutting down"
    assert listener.connections == 0 and listener.live_calls == 0


@on_module_loop
async def test_a_refused_call_gets_a_hangup() -> None:
    asked: list[str] = []

    async def start_call(**_: Any) -> Any:
        raise AssertionError("a refused call must not start")

    def admit(where: str) -> str | None:
        asked.append(where)
        return "too many calls"

    listener = AudioSocketServer("127.0.0.1:0", start_call=start_call, admit=admit)
    await listener.start()
    try:
        async with AsteriskLikeCaller(listener.port, timeout=10) as caller:
            await caller.wait_closed()
        assert [m.kind for m in caller.received] == [HANGUP]
        assert asked == ["audiosocket"]
    finally:
        await listener.stop()


@on_module_loop
async def test_bad_settings_are_config_errors() -> None:
    async def start_call(**_: Any) -> Any:
        raise AssertionError

    with pytest.raises(ConfigError, match="HOST:PORT"):
        AudioSocketServer("nowhere", start_call=start_call, admit=lambda _: None)
    with pytest.raises(ConfigError, match="not a UUID"):
        AudioSocketServer(
            "127.0.0.1:0",
            start_call=start_call,
            admit=lambda _: None,
            routes={"sales": ("booking", {})},
        )
    # Any spelling of a UUID routes: keys are made canonical.
    listener = AudioSocketServer(
        "127.0.0.1:0",
        start_call=start_call,
        admit=lambda _: None,
        routes={CLOSER_UUID.upper().replace("-", ""): ("closer", {"x": 1})},
    )
    assert listener.routes == {CLOSER_UUID: ("closer", {"x": 1})}
    assert json.dumps(listener.routes)  # plain data, for the config's dump

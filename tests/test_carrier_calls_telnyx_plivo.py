"""/telnyx and /plivo end to end: a test client plays each carrier's media stream against a real
VoiceServer over WebSockets on localhost.

The client is neither Telnyx nor Plivo. It is written from their published protocols, as the
module docstrings of voice_agent.transports.telnyx and voice_agent.transports.plivo describe
them (with the pages they follow), and builds its messages as the codec unit tests
(tests/test_carrier_telnyx_plivo.py) copy them from those pages. Like the carrier it connects
as the WebSocket client, sends the start first (Telnyx: `connected`, then `start`), streams the
caller's audio as one base64 `media` message per 20 ms, queues the audio it is sent and plays
it out at real time on its own clock, answers a mark (Telnyx `mark`, Plivo `checkpoint` ->
`playedStream`) once all audio queued before it has played, and drops its queue on a clear
(Telnyx `clear`, which returns the marks it dropped; Plivo `clearAudio` -> `clearedAudio`, the
dropped checkpoints never come back). Telnyx may swap neighbouring media frames ("Media frame
order is not guaranteed"), and the client does so in one call. Telnyx hangs up with `stop`;
Plivo has no stop event, the WebSocket's clean close is the hang-up. The assertions read what
the caller heard and the call record the server keeps.

Every wait is for something the client or the server reports, with a timeout; the caller's
audio and the playout clock are the only things that sleep, as a carrier's media clock does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import pytest_asyncio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.support.configs import (
    GREETING,
    QUICK_VOICE,
    default_config_with,
    ended_call,
    serving,
    words_played,
)
from tests.support.waiting import PredicateWaits, Waiter
from voice_agent.audio.resample import resample
from voice_agent.audio.wav import read_wav
from voice_agent.gateways.carrier_call import MAX_NOTES
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
HOURS = "We're open every day from noon to eleven pm."
ASK_NAME = "What name should I put the booking under?"
TIMEOUT_S = 20.0
FRAME_MS = 20  # both carriers stream the caller's audio in 20 ms frames

# The calls share the module's server, and so its event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")


# -- the carriers, as their protocols describe them ----------------------------------------------


@dataclass(frozen=True)
class Format:
    encoding: str  # this server's name: "mulaw", "alaw" or "pcm16" (little-endian)
    rate: int

    @property
    def width(self) -> int:
        return 2 if self.encoding == "pcm16" else 1

    @property
    def frame(self) -> int:
        return self.rate * self.width * FRAME_MS // 1000

    @property
    def bytes_per_ms(self) -> float:
        return self.rate * self.width / 1000

    @property
    def silence(self) -> bytes:
        return {"mulaw": b"\xff", "alaw": b"\xd5", "pcm16": b"\x00"}[self.encoding]


@dataclass
class Clear:
    played_bytes: int  # what the caller had heard when the clear came
    dropped_marks: list[str]


def telnyx_call_id() -> str:
    # Shaped like the documented `v3:...` call_control_id: URL-safe base64, "-" and "_" too.
    return "v3:" + base64.urlsafe_b64encode(os.urandom(39)).decode()


class FakeCarrier(PredicateWaits):
    """One carrier media stream dialled to the server (see the module docstring)."""

    path: ClassVar[str]
    transport: ClassVar[str]
    encodings: ClassVar[dict[str, str]]  # this server's encoding -> the carrier's name for it

    def __init__(
        self,
        base_url: str,
        *,
        call_id: str,
        fmt: Format = Format("mulaw", 8000),
        params: dict[str, str] | None = None,
        query: str = "",
        timeout: float = TIMEOUT_S,
    ) -> None:
        self.url = f"{base_url}{self.path}{query}"
        self.call_id = call_id
        self.fmt = fmt
        self.params = params or {}
        self.timeout = timeout
        self.stream_id = str(uuid.uuid4())
        self.ws: ClientConnection | None = None
        self.queue: deque[tuple[str, Any]] = deque()  # ("audio", bytearray) / ("mark", name)
        self.received_bytes = 0
        self.media_sizes: list[int] = []  # each media message's audio, in bytes
        self.played_bytes = 0
        self.marks_sent: list[str] = []  # the marks the server asked for, in order
        self.marks_reported: list[str] = []
        self.clears: list[Clear] = []
        self.unexpected: list[str] = []  # what the carrier would not take
        self.log: list[tuple[str, str]] = []  # ("media", "") / ("mark", name) / ("clear", "")
        self.closed = False
        self.close_code: int | None = None
        self.close_reason = ""
        self.hung_up = False
        self._outgoing = bytearray()
        self._queued_total = 0
        self._sent_total = 0
        self._sent_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._waiters: list[Waiter] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._audio_task: asyncio.Task[None] | None = None
        self._chunk = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> FakeCarrier:
        self.ws = await connect(self.url, compression=None, open_timeout=self.timeout)
        for message in self.start_messages():
            await self.ws.send(message)
        self._audio_task = asyncio.ensure_future(self._caller_audio())
        self._tasks = [
            asyncio.ensure_future(self._receive()),
            asyncio.ensure_future(self._playout()),
            self._audio_task,
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.hang_up()

    async def hang_up(self) -> None:
        raise NotImplementedError

    async def _stop_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _stop_caller_audio(self) -> None:
        # A carrier streams nothing after its hang-up: the caller's audio stops first.
        self.hung_up = True
        if self._audio_task is not None:
            self._audio_task.cancel()
            await asyncio.gather(self._audio_task, return_exceptions=True)

    # -- what the carrier sends: the subclasses' messages ------------------------------------

    def start_messages(self) -> list[str]:
        raise NotImplementedError

    def media_message(self, chunk: int, audio: bytes) -> str:
        raise NotImplementedError

    def dtmf_message(self, digit: str) -> str:
        raise NotImplementedError

    def on_text(self, message: dict[str, Any], text: str) -> list[str]:
        """A message from the server: queue or clear; returns what the carrier answers."""
        raise NotImplementedError

    def mark_played_message(self, name: str) -> str:
        raise NotImplementedError

    async def send_text(self, text: str) -> None:
        assert self.ws is not None
        await self.ws.send(text)

    async def send_dtmf(self, digit: str) -> None:
        await self.send_text(self.dtmf_message(digit))

    async def send_media(self, chunk: int, audio: bytes) -> None:
        await self.send_text(self.media_message(chunk, audio))

    async def say(self, audio: bytes) -> None:
        """The caller speaks: `audio` goes out in 20 ms media messages among the silence a
        phone line streams; returns once all of it is on the wire."""
        frame = self.fmt.frame
        audio += self.fmt.silence * (-len(audio) % frame)
        self._outgoing += audio
        self._queued_total += len(audio)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sent_waiters.append((self._queued_total, done))
        await asyncio.wait_for(done, self.timeout + len(audio) / self.fmt.bytes_per_ms / 1000)

    async def say_silence(self, ms: int) -> None:
        await self.say(self.fmt.silence * int(ms * self.fmt.bytes_per_ms))

    async def _caller_audio(self) -> None:
        assert self.ws is not None
        loop = asyncio.get_running_loop()
        tick = loop.time()
        frame = self.fmt.frame
        silence = self.fmt.silence * frame
        while not self.closed and not self.hung_up:
            tick += FRAME_MS / 1000
            await asyncio.sleep(max(0.0, tick - loop.time()))
            speech = bytes(self._outgoing[:frame])
            del self._outgoing[:frame]
            self._chunk += 1
            try:
                await self.send_media(self._chunk, speech or silence)
            except ConnectionClosed:
                return
            self._sent_total += len(speech)
            while self._sent_waiters and self._sent_waiters[0][0] <= self._sent_total:
                self._sent_waiters.pop(0)[1].set_result(None)

    # -- what the server sends ---------------------------------------------------------------

    async def _receive(self) -> None:
        assert self.ws is not None
        try:
            async for message in self.ws:
                if isinstance(message, bytes):
                    self.unexpected.append(f"binary frame of {len(message)} bytes")
                    continue
                try:
                    body = json.loads(message)
                except ValueError:
                    self.unexpected.append(message[:200])
                    continue
                if not isinstance(body, dict):
                    self.unexpected.append(message[:200])
                    continue
                for answer in self.on_text(body, message):
                    await self.ws.send(answer)
                self._notify()
        except ConnectionClosed:
            pass
        finally:
            self.closed = True
            self.close_code = self.ws.close_code
            self.close_reason = self.ws.close_reason or ""
            self._notify()

    def queue_audio(self, audio: bytes) -> None:
        self.log.append(("media", ""))
        self.received_bytes += len(audio)
        self.media_sizes.append(len(audio))
        self.queue.append(("audio", bytearray(audio)))

    def queue_mark(self, name: str) -> None:
        self.log.append(("mark", name))
        self.marks_sent.append(name)
        self.queue.append(("mark", name))

    def drop_queue(self) -> list[str]:
        """A clear: the queued audio goes unplayed; returns the marks that were queued in it."""
        self.log.append(("clear", ""))
        dropped = [item for kind, item in self.queue if kind == "mark"]
        self.clears.append(Clear(self.played_bytes, dropped))
        self.queue.clear()
        return dropped

    async def _playout(self) -> None:
        """The carrier's media clock: each tick reports the marks at the head of the queue (all
        audio before them has played), then plays one 20 ms frame."""
        assert self.ws is not None
        loop = asyncio.get_running_loop()
        tick = loop.time()
        frame = self.fmt.frame
        while not self.closed:
            tick += FRAME_MS / 1000
            await asyncio.sleep(max(0.0, tick - loop.time()))
            while self.queue and self.queue[0][0] == "mark":
                name = self.queue.popleft()[1]
                self.marks_reported.append(name)
                try:
                    await self.ws.send(self.mark_played_message(name))
                except ConnectionClosed:
                    return
            played = 0
            while self.queue and self.queue[0][0] == "audio" and played < frame:
                audio: bytearray = self.queue[0][1]
                take = min(frame - played, len(audio))
                del audio[:take]
                played += take
                if not audio:
                    self.queue.popleft()
            self.played_bytes += played
            self._notify()

    # -- waiting -----------------------------------------------------------------------------

    async def wait_media(self, more_than: int = 0) -> None:
        await self.wait_until(
            f"media beyond {more_than} bytes", lambda: self.received_bytes > more_than
        )

    async def wait_closed(self) -> None:
        await self.wait_until("the socket to close", lambda: self.closed)

    @property
    def summary(self) -> str:
        return (
            f"received {self.received_bytes} B, played {self.played_bytes} B, "
            f"log {self.log[-8:]}, unexpected {self.unexpected[:3]}, closed {self.closed} "
            f"({self.close_code} {self.close_reason!r})"
        )


class FakeTelnyx(FakeCarrier):
    """Telnyx Media Streaming, bidirectional in RTP mode, the call's bidirectional codec set to
    the start's media_format (as the codec's connect snippets do)."""

    path = "/telnyx"
    transport = "telnyx"
    encodings: ClassVar[dict[str, str]] = {"mulaw": "PCMU", "alaw": "PCMA", "pcm16": "L16"}

    def __init__(self, base_url: str, *, swap_every: int = 0, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.sequence = 0
        # "Media frame order is not guaranteed": with swap_every, every swap_every-th chunk
        # goes out after the one that follows it, as Telnyx's dispatch swaps neighbours.
        self.swap_every = swap_every
        self.swapped = 0
        self._held: str | None = None

    def _next(self) -> str:
        self.sequence += 1
        return str(self.sequence)  # Telnyx sends its numbers as strings

    def start_messages(self) -> list[str]:
        start = {
            "event": "start",
            "sequence_number": self._next(),
            "start": {
                "user_id": "3E6F995F-85F7-4705-9741-53B116D28237",
                "call_control_id": self.call_id,
                "call_session_id": str(uuid.uuid4()),
                "from": "+13122010094",
                "to": "+13122123456",
                "tags": [],
                "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d",
                "custom_parameters": self.params,
                "media_format": {
                    "encoding": self.encodings[self.fmt.encoding],
                    "sample_rate": self.fmt.rate,
                    "channels": 1,
                },
            },
            "stream_id": self.stream_id,
        }
        return [json.dumps({"event": "connected", "version": "1.0.0"}), json.dumps(start)]

    def media_message(self, chunk: int, audio: bytes) -> str:
        return json.dumps(
            {
                "event": "media",
                "sequence_number": self._next(),
                "media": {
                    "track": "inbound",
                    "chunk": str(chunk),
                    "timestamp": str(FRAME_MS * (chunk - 1)),
                    "payload": base64.b64encode(audio).decode(),
                },
                "stream_id": self.stream_id,
            }
        )

    async def send_media(self, chunk: int, audio: bytes) -> None:
        message = self.media_message(chunk, audio)
        if self._held is not None:
            held, self._held = self._held, None
            await self.send_text(message)
            await self.send_text(held)
            self.swapped += 1
        elif self.swap_every and chunk % self.swap_every == 0:
            self._held = message
        else:
            await self.send_text(message)

    def dtmf_message(self, digit: str) -> str:
        return json.dumps(
            {
                "event": "dtmf",
                "stream_id": self.stream_id,
                "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
                "sequence_number": self._next(),
                "dtmf": {"digit": digit},
            }
        )

    def mark_played_message(self, name: str) -> str:
        return json.dumps(
            {
                "event": "mark",
                "stream_id": self.stream_id,
                "sequence_number": self._next(),
                "mark": {"name": name},
            }
        )

    def stop_message(self) -> str:
        return json.dumps(
            {
                "event": "stop",
                "sequence_number": self._next(),
                "stop": {
                    "user_id": "3E6F995F-85F7-4705-9741-53B116D28237",
                    "call_control_id": self.call_id,
                },
                "stream_id": self.stream_id,
            }
        )

    def on_text(self, message: dict[str, Any], text: str) -> list[str]:
        event = message.get("event")
        if event == "media" and set(message) == {"event", "media"}:
            media = message["media"]
            payload = media.get("payload") if isinstance(media, dict) else None
            if isinstance(payload, str) and set(media) == {"payload"}:
                self.queue_audio(base64.b64decode(payload, validate=True))
                return []
        elif event == "mark" and set(message) == {"event", "mark"}:
            mark = message["mark"]
            if isinstance(mark, dict) and isinstance(mark.get("name"), str):
                self.queue_mark(mark["name"])
                return []
        elif event == "clear" and set(message) == {"event"}:
            # What becomes of marks queued behind a clear: the Telnyx codec's docstring says
            # "Stop what is playing and drop the queue; Telnyx then returns every queued mark"
            # (and its Mark: "finished playing (or a `clear` dropped) the audio"), so this
            # reports them at once, as Twilio does. The server must not count them as heard.
            dropped = self.drop_queue()
            self.marks_reported.extend(dropped)
            return [self.mark_played_message(name) for name in dropped]
        self.unexpected.append(text[:200])
        return []

    async def hang_up(self) -> None:
        """The caller hangs up: Telnyx sends `stop`. The socket is left for the server to
        close, which shows the stop (not a close) ended the call."""
        if self.ws is not None and not self.closed:
            await self._stop_caller_audio()
            try:
                await self.send_text(self.stop_message())
            except ConnectionClosed:
                pass
        await self.wait_closed()
        await self._stop_tasks()


class FakePlivo(FakeCarrier):
    """Plivo Audio Streams, bidirectional; `extraHeaders` from the XML come back in the start's
    `extra_headers`, and again on every media message."""

    path = "/plivo"
    transport = "plivo"
    encodings: ClassVar[dict[str, str]] = {"mulaw": "audio/x-mulaw", "pcm16": "audio/x-l16"}

    def __init__(self, base_url: str, *, extra_headers: str = "", **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.extra_headers = extra_headers
        self.sequence = 0

    def _next(self) -> int:
        self.sequence += 1
        return self.sequence  # Plivo sends its numbers as numbers

    def start_messages(self) -> list[str]:
        start = {
            "event": "start",
            "sequenceNumber": self._next(),
            "start": {
                "callId": self.call_id,
                "streamId": self.stream_id,
                "accountId": "MAXXXXXXXXXXXXXXXXXX",
                "tracks": ["inbound"],
                "mediaFormat": {
                    "encoding": self.encodings[self.fmt.encoding],
                    "sampleRate": self.fmt.rate,
                },
            },
            "extra_headers": self.extra_headers,
        }
        return [json.dumps(start)]

    def media_message(self, chunk: int, audio: bytes) -> str:
        return json.dumps(
            {
                "event": "media",
                "sequenceNumber": self._next(),
                "streamId": self.stream_id,
                "media": {
                    "track": "inbound",
                    "timestamp": str(int(time.time() * 1000)),  # Unix milliseconds
                    "chunk": chunk,
                    "payload": base64.b64encode(audio).decode(),
                },
                "extra_headers": self.extra_headers,
            }
        )

    def dtmf_message(self, digit: str) -> str:
        return json.dumps(
            {
                "event": "dtmf",
                "sequenceNumber": self._next(),
                "streamId": self.stream_id,
                "dtmf": {"digit": digit, "track": "inbound"},
            }
        )

    def mark_played_message(self, name: str) -> str:
        return json.dumps(
            {
                "event": "playedStream",
                "sequenceNumber": self._next(),
                "streamId": self.stream_id,
                "name": name,
            }
        )

    def on_text(self, message: dict[str, Any], text: str) -> list[str]:
        event = message.get("event")
        if event == "playAudio" and set(message) == {"event", "media"}:
            media = message["media"]
            if (
                isinstance(media, dict)
                and media.get("contentType") == self.encodings[self.fmt.encoding]
                and media.get("sampleRate") == self.fmt.rate
                and isinstance(media.get("payload"), str)
            ):
                self.queue_audio(base64.b64decode(media["payload"], validate=True))
                return []
        elif event == "checkpoint" and message.get("streamId") == self.stream_id:
            if isinstance(message.get("name"), str):
                self.queue_mark(message["name"])
                return []
        elif event == "clearAudio" and message.get("streamId") == self.stream_id:
            # "playedStream will only be emitted if the preceding events were played
            # successfully": the checkpoints a clear drops never come back.
            self.drop_queue()
            cleared = {"sequenceNumber": 0, "event": "clearedAudio", "streamId": self.stream_id}
            return [json.dumps(cleared)]
        self.unexpected.append(text[:200])
        return []

    async def hang_up(self) -> None:
        """The caller hangs up: Plivo has no stop event, the socket closes cleanly."""
        if self.ws is not None and not self.closed:
            await self._stop_caller_audio()
            await self.ws.close(1000)
        await self.wait_closed()
        await self._stop_tasks()


CARRIERS: dict[str, type[FakeCarrier]] = {"telnyx": FakeTelnyx, "plivo": FakePlivo}


# -- fixtures ------------------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """The default agent hearing with pocketsphinx's domain model, speaking at 1.6 times."""
    config = default_config_with(tmp_path_factory.mktemp("carriers"), voice=QUICK_VOICE)
    async for voice_server in serving(config):
        yield voice_server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def base_url(server: VoiceServer) -> str:
    return f"ws://127.0.0.1:{server.port}"


# -- helpers -------------------------------------------------------------------------------------


def caller_audio(name: str, fmt: Format) -> bytes:
    """A fixture line in `fmt`: the .ulaw file as it is, else the wav as pcm16 at fmt.rate."""
    if fmt == Format("mulaw", 8000):
        return (AUDIO / f"{name}.ulaw").read_bytes()
    assert fmt.encoding == "pcm16", fmt
    pcm, rate = read_wav(AUDIO / f"{name}.wav")
    return pcm if rate == fmt.rate else resample(pcm, rate, fmt.rate)


def messages(call: dict[str, Any], role: str) -> list[str | None]:
    return [m.get("content") for m in call["context"]["messages"] if m["role"] == role]


def audit(call: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [event for event in call["audit"] if event["type"] == kind]


def live_committed(server: VoiceServer, call_id: str) -> list[str | None]:
    """What the live call has committed of the agent's replies so far (its audit says)."""
    pipeline = server.pipelines.get(call_id)
    if pipeline is None:
        return []
    return [e.data["committed"] for e in pipeline.session.audit.of_type("agent_utterance")]


def words(text: str) -> list[str]:
    return [word.strip(",.!?") for word in text.split()]


def new_call(kind: str, base_url: str, **kwargs: Any) -> FakeCarrier:
    call_id = telnyx_call_id() if kind == "telnyx" else str(uuid.uuid4())
    return CARRIERS[kind](base_url, call_id=call_id, **kwargs)


def assert_outbound_in_spec(caller: FakeCarrier) -> None:
    """What the carrier would take: only its own messages, media in whole 20 ms frames (Telnyx:
    RTP payloads of 20 ms to 30 s), and every mark after media of its own."""
    assert not caller.unexpected, caller.unexpected[:3]
    assert caller.media_sizes, "no media"
    frame = caller.fmt.frame
    assert all(size % frame == 0 for size in caller.media_sizes), caller.media_sizes
    longest_ms = max(caller.media_sizes) / caller.fmt.bytes_per_ms
    assert FRAME_MS <= min(caller.media_sizes) / caller.fmt.bytes_per_ms and longest_ms <= 30_000
    media_since_mark = False
    for kind, name in caller.log:
        if kind == "media":
            media_since_mark = True
        elif kind == "mark":
            assert media_since_mark, f"mark {name} follows no media"
            media_since_mark = False


async def get_call(server: VoiceServer, call_id: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.get(f"http://127.0.0.1:{server.port}/calls/{call_id}")


# -- calls ---------------------------------------------------------------------------------------

# Telnyx's agent and an arg come from the start's custom_parameters, Plivo's from extra_headers;
# the URL's query adds an arg for both, and its token is never one.
CONVERSATIONS = [
    pytest.param(
        "telnyx",
        Format("mulaw", 8000),
        {
            "params": {"agent": "booking", "customer": "12345"},
            "query": "?party=2&token=x",
            "swap_every": 9,
        },
        {"customer": "12345", "party": "2"},
        id="telnyx-pcmu",
    ),
    pytest.param(
        "plivo",
        Format("pcm16", 16000),
        {"extra_headers": "agent=booking;party=2", "query": "?customer=12345&token=x"},
        {"customer": "12345", "party": "2"},
        id="plivo-l16-16k",
    ),
]


async def test_barge_in_commits_the_heard_prefix_and_the_conversation_goes_on(
    server: VoiceServer, base_url: str
) -> None:
    """Both carriers' calls at once: the server carries many, and the suite has a time budget;
    a failure names its carrier."""
    await asyncio.gather(
        *(conversation(server, base_url, *case.values) for case in CONVERSATIONS)  # type: ignore[arg-type]
    )


async def conversation(
    server: VoiceServer,
    base_url: str,
    kind: str,
    fmt: Format,
    setup: dict[str, Any],
    args: dict[str, str],
) -> None:
    caller = new_call(kind, base_url, fmt=fmt, **setup)
    async with caller:
        call_id = caller.call_id
        await caller.wait_media()
        # The caller talks over the greeting, about two seconds into it.
        await caller.say_silence(2000)
        await caller.say(caller_audio("joe_book1", fmt))
        await caller.wait_until("a clear", lambda: bool(caller.clears))
        clear = caller.clears[0]
        heard_before = caller.received_bytes
        await caller.wait_media(heard_before)  # the answer to what the caller said
        await caller.wait_until(
            "the answer to be committed", lambda: ASK_NAME in live_committed(server, call_id)
        )
        assert_outbound_in_spec(caller)
        if isinstance(caller, FakePlivo):
            # The checkpoints the clear dropped never came back.
            assert not set(clear.dropped_marks) & set(caller.marks_reported)
        else:
            # Telnyx returned them at once, and the chunks it swapped were swapped.
            assert isinstance(caller, FakeTelnyx) and caller.swapped > 0
            assert set(clear.dropped_marks) <= set(caller.marks_reported)
    call = await ended_call(server, call_id)
    assert call["transport"] == caller.transport and call["agent"] == "booking"
    assert audit(call, "barge_in")
    committed = messages(call, "assistant")[0]
    assert committed is not None
    heard, generated = words(committed), words(GREETING)
    assert 0 < len(heard) < len(generated) and heard == generated[: len(heard)], committed
    played_ms = clear.played_bytes / fmt.bytes_per_ms
    expected = await words_played(server, GREETING, played_ms)
    assert abs(len(heard) - expected) <= 1, (committed, played_ms, expected)
    assert messages(call, "assistant")[1] == ASK_NAME
    assert any("book a table for two" in (line or "").lower() for line in messages(call, "user"))
    assert {key: call["state"].get(key) for key in args} == args
    assert "token" not in call["state"] and "agent" not in call["state"]
    assert call["end_reason"] == "caller hung up"
    notes = [note["kind"] for note in audit(call, "carrier_note")]
    # Plivo's clearedAudio is noted; Telnyx's swapped neighbours were put back in order
    # without a word (nothing was lost or late).
    assert notes == (["cleared"] * len(caller.clears) if kind == "plivo" else []), notes


async def test_dtmf_reaches_the_trigger_and_hang_up_keeps_what_was_heard(
    server: VoiceServer, base_url: str
) -> None:
    """Telnyx (A-law) and Plivo (mu-law) at once, as above."""
    await asyncio.gather(
        keypad_call(server, base_url, "telnyx", Format("alaw", 8000)),
        keypad_call(server, base_url, "plivo", Format("mulaw", 8000)),
    )


async def keypad_call(server: VoiceServer, base_url: str, kind: str, fmt: Format) -> None:
    # The agent named only by the URL's query this time.
    caller = new_call(kind, base_url, fmt=fmt, query="?agent=booking")
    async with caller:
        call_id = caller.call_id
        await caller.wait_until(
            "the greeting to be committed", lambda: GREETING in live_committed(server, call_id)
        )
        # Committed once its last mark came back, that is once all of it had played.
        assert caller.marks_sent and caller.marks_reported == caller.marks_sent
        assert caller.played_bytes == caller.received_bytes
        heard = caller.received_bytes
        await caller.send_dtmf("0")
        await caller.wait_media(heard)
        await caller.wait_until(
            "the hours to be committed", lambda: HOURS in live_committed(server, call_id)
        )
        assert_outbound_in_spec(caller)
        await caller.hang_up()
    # Telnyx: the server closed the socket after the stop; Plivo: the caller's close took.
    assert caller.close_code == 1000
    call = await ended_call(server, call_id)
    triggers = audit(call, "trigger")
    assert triggers and triggers[0]["function"] == "on_keypad"
    assert messages(call, "assistant") == [GREETING, HOURS]
    assert call["transport"] == caller.transport and call["agent"] == "booking"
    assert call["end_reason"] == "caller hung up"


def telnyx_bad_media(caller: FakeCarrier) -> str:
    message = json.loads(caller.media_message(10_000, caller.fmt.silence * caller.fmt.frame))
    message["media"]["payload"] = "not base64!"
    return json.dumps(message)


def plivo_played_without_name(caller: FakeCarrier) -> str:
    assert isinstance(caller, FakePlivo)
    return json.dumps({"event": "playedStream", "sequenceNumber": 7, "streamId": caller.stream_id})


@pytest.mark.parametrize(
    ("kind", "bad", "code", "problem"),
    [
        pytest.param(
            "telnyx", telnyx_bad_media, 1002, "media.payload is not valid base64", id="telnyx"
        ),
        pytest.param("plivo", plivo_played_without_name, 1002, "name is missing", id="plivo"),
    ],
)
async def test_a_message_out_of_spec_ends_only_its_call(
    server: VoiceServer,
    base_url: str,
    kind: str,
    bad: Callable[[FakeCarrier], str],
    code: int,
    problem: str,
) -> None:
    broken = new_call(kind, base_url)
    async with broken:
        await broken.wait_media()
        await broken.send_text(bad(broken))
        await broken.wait_closed()
    assert (broken.close_code, broken.close_reason) == (code, problem)
    call = await ended_call(server, broken.call_id)
    assert call["end_reason"] == f"protocol error: {problem}"
    # The server goes on: the next call is answered and ends as a hang-up.
    async with new_call(kind, base_url) as good:
        await good.wait_media()
    call = await ended_call(server, good.call_id)
    assert call["transport"] == good.transport and call["end_reason"] == "caller hung up"


@pytest.mark.parametrize(
    ("kind", "setup"),
    [
        pytest.param("telnyx", {"params": {"agent": "nope"}}, id="telnyx-custom-parameter"),
        pytest.param("plivo", {"query": "?agent=nope"}, id="plivo-query"),
    ],
)
async def test_an_unknown_agent_is_refused_with_policy_violation(
    server: VoiceServer, base_url: str, kind: str, setup: dict[str, Any]
) -> None:
    caller = new_call(kind, base_url, **setup)
    async with caller:
        await caller.wait_closed()
    assert caller.close_code == 1008
    assert "no agent named 'nope'" in caller.close_reason
    assert caller.received_bytes == 0
    # No call ever started: there is no record of it.
    assert caller.call_id not in server.pipelines
    assert (await get_call(server, caller.call_id)).status_code == 404


# -- a carrier that says too much, an agent name too long for a close frame --------------------


async def test_a_chatty_carrier_fills_the_audit_with_at_most_max_notes(
    server: VoiceServer, base_url: str
) -> None:
    caller = new_call("telnyx", base_url)
    async with caller:
        await caller.wait_media()
        # "Telnyx adds event types over time": each unknown one is a note, the call goes on.
        for _ in range(MAX_NOTES + 10):
            await caller.send_text(json.dumps({"event": "media_stats", "stream_id": "s"}))
        assert caller.ws is not None
        # A ping's pong comes back after the server has handled everything sent before it.
        await asyncio.wait_for(await caller.ws.ping(), TIMEOUT_S)
        assert not caller.closed
    call = await ended_call(server, caller.call_id)
    assert call["end_reason"] == "caller hung up"
    notes = audit(call, "carrier_note")
    assert notes and notes[0]["kind"] == "unknown_event"
    assert len(notes) == MAX_NOTES


async def test_an_unknown_agent_named_in_any_script_is_still_refused_with_1008(
    server: VoiceServer, base_url: str
) -> None:
    # Custom parameters are free text; the name lands in the close reason after the file name.
    caller = new_call("telnyx", base_url, params={"agent": "é" * 200})
    async with caller:
        await caller.wait_closed()
    assert caller.close_code == 1008, (caller.close_code, caller.close_reason)

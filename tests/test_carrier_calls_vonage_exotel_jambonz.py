"""/vonage, /exotel and /jambonz end to end: test clients play each carrier against a real
VoiceServer over WebSockets on localhost.

The clients are not the carriers. Each is written from the carrier's published protocol, as
the codecs in voice_agent.transports (vonage, exotel, jambonz) cite it in their docstrings:

* Vonage connects, sends `websocket:connected` with the content type and the NCCO endpoint's
  headers, then 20 ms BINARY frames of 16-bit PCM; it buffers the audio it is sent and plays it
  in order, answers a `notify` with `websocket:notify` once the audio before it has played,
  drops its buffer on `clear` (answering `websocket:cleared`; the notifies it held are not
  answered) and hangs up by closing the socket.
* Exotel sends `connected` and `start`, then base64 `media` of 8 kHz 16-bit PCM, about 100 ms a
  message (its documents; not 20 ms), numbered by `sequence_number`; it echoes a `mark` once
  the audio before it has played, and on `clear` drops the chunks not yet started (the one
  playing plays to its end); the caller hanging up is `stop` with reason `callended`.
* jambonz asks for the `audio.jambonz.org` subprotocol, sends the call's attributes with the
  listen verb's metadata merged in, then BINARY L16; it reports a mark `playout` when it has
  played and `cleared` when `killAudio` dropped it, ends the verb on `disconnect`, and signals
  the end of the stream with an empty binary frame, then the close. mod_audio_fork 1.2.33 can
  lose every mark report after a `killAudio` (see voice_agent.transports.jambonz): one test
  has the client do just that.

Every client plays what it is sent at real time on its own 20 ms clock, and a mark is reported
only when all the audio before it has played. Every wait is for something the client or the
server reports, with a timeout; the clocks are the only things that sleep.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import pytest_asyncio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from tests.support.configs import (
    GREETING,
    QUICK_VOICE,
    default_config_with,
    ended_call,
    serving,
    words_played,
)
from tests.support.waiting import PredicateWaits, Waiter
from voice_agent.audio.g711 import ulaw_decode
from voice_agent.audio.resample import resample
from voice_agent.gateways import carrier_call
from voice_agent.server.app import VoiceServer
from voice_agent.transports import exotel_chunks, jambonz, vonage

# The calls share the module's server, and so its event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")

AUDIO = Path(__file__).parent / "fixtures" / "audio"
HOURS = "We're open every day from noon to eleven pm."
ANSWER = "What name should I put the booking under?"  # the agent's reply to joe_book1
TIMEOUT_S = 20.0
FRAME_MS = 20  # every client's playout tick
BARGE_IN_AFTER_MS = 1500  # the caller starts talking this far into the greeting

Message = bytes | str


# -- what every client does: a playout clock, paced caller audio, waits -------------------------


class FakeCarrier(PredicateWaits):
    """One call from a carrier's media server to the VoiceServer; subclasses speak the wire."""

    path: ClassVar[str]
    transport: ClassVar[str]
    rate: ClassVar[int]
    caller_ms: ClassVar[int] = 20  # audio per caller message

    def __init__(self, base_url: str, *, query: str = "", timeout: float = TIMEOUT_S) -> None:
        self.url = f"{base_url}{self.path}{query}"
        self.subprotocols: list[Subprotocol] | None = None  # what the client asks for
        self.call_id = f"{self.transport}-{uuid.uuid4()}"
        self.timeout = timeout
        self.ws: ClientConnection | None = None
        self.bytes_per_ms = self.rate * 2 / 1000
        # What the server sent, in order: ("audio", pcm) and ("mark", name) not yet played.
        self.queue: deque[tuple[str, Any]] = deque()
        self.playing = bytearray()  # the rest of the audio message now playing
        self.received_bytes = 0
        self.audio_sizes: list[int] = []  # each outbound audio message's PCM size
        self.max_queued_ms = 0.0
        self.played_bytes = 0
        self.marks_sent: list[str] = []
        self.marks_reported: list[str] = []
        self.clears: list[int] = []  # played_bytes when each clear came
        self.unexpected: list[str] = []  # messages the carrier would not understand
        self.hung_up = False  # the caller's side stopped streaming
        self.closed = False
        self.close_code: int | None = None
        self.close_reason = ""
        self._outgoing = bytearray()
        self._queued_total = 0
        self._sent_total = 0
        self._sent_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._waiters: list[Waiter] = []
        self._tasks: list[asyncio.Task[None]] = []

    # -- the wire: per carrier -------------------------------------------------------------

    def opening(self) -> list[str]:
        raise NotImplementedError

    def caller_message(self, pcm: bytes) -> Message:
        raise NotImplementedError

    def dtmf_message(self, digit: str) -> str:
        raise NotImplementedError

    def mark_report(self, name: str) -> str | None:
        raise NotImplementedError

    async def handle(self, message: Message) -> None:
        raise NotImplementedError

    async def hang_up(self) -> None:
        """The caller hangs up, the carrier's way."""
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> FakeCarrier:
        self.ws = await connect(
            self.url,
            subprotocols=self.subprotocols,
            compression=None,
            open_timeout=self.timeout,
        )
        for text in self.opening():
            await self.ws.send(text)
        self._tasks = [
            asyncio.ensure_future(self._receive()),
            asyncio.ensure_future(self._playout()),
            asyncio.ensure_future(self._caller_audio()),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.closed and not self.hung_up:
            await self.hang_up()
        if not self.closed and self.ws is not None:
            await self.ws.close(1000)
        await self.wait_until("the socket to close", lambda: self.closed)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def send(self, message: Message) -> None:
        assert self.ws is not None
        await self.ws.send(message)

    async def send_dtmf(self, digit: str) -> None:
        await self.send(self.dtmf_message(digit))

    # -- the caller's audio, in real time --------------------------------------------------------

    async def say(self, pcm: bytes) -> None:
        """The caller speaks: `pcm` goes out among the line's silence, `caller_ms` a message;
        returns once all of it is on the wire."""
        size = int(self.bytes_per_ms * self.caller_ms)
        pcm += bytes(-len(pcm) % size)
        self._outgoing += pcm
        self._queued_total += len(pcm)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sent_waiters.append((self._queued_total, done))
        await asyncio.wait_for(done, self.timeout + len(pcm) / self.bytes_per_ms / 1000)

    async def say_silence(self, ms: int) -> None:
        await self.say(bytes(int(ms * self.bytes_per_ms) // 2 * 2))

    async def _caller_audio(self) -> None:
        loop = asyncio.get_running_loop()
        size = int(self.bytes_per_ms * self.caller_ms)
        tick = loop.time()
        while not self.closed and not self.hung_up:
            tick += self.caller_ms / 1000
            await asyncio.sleep(max(0.0, tick - loop.time()))
            if self.hung_up:
                return
            speech = bytes(self._outgoing[:size])
            del self._outgoing[:size]
            try:
                await self.send(self.caller_message(speech or bytes(size)))
            except ConnectionClosed:
                return
            self._sent_total += len(speech)
            while self._sent_waiters and self._sent_waiters[0][0] <= self._sent_total:
                self._sent_waiters.pop(0)[1].set_result(None)

    # -- what the server sends -------------------------------------------------------------------

    def queue_audio(self, pcm: bytes) -> None:
        self.received_bytes += len(pcm)
        self.audio_sizes.append(len(pcm))
        self.queue.append(("audio", pcm))
        queued = len(self.playing) + sum(len(d) for k, d in self.queue if k == "audio")
        self.max_queued_ms = max(self.max_queued_ms, queued / self.bytes_per_ms)

    def queue_mark(self, name: str) -> None:
        self.marks_sent.append(name)
        self.queue.append(("mark", name))

    def drop_queued(self, *, keep_playing: bool) -> list[str]:
        """A clear: the queued audio goes unplayed (and, unless `keep_playing`, the rest of the
        message playing now); returns the marks dropped with it."""
        self.clears.append(self.played_bytes)
        dropped = [name for kind, name in self.queue if kind == "mark"]
        self.queue.clear()
        if not keep_playing:
            self.playing.clear()
        return dropped

    async def report_mark(self, name: str) -> None:
        self.marks_reported.append(name)
        report = self.mark_report(name)
        if report is not None:
            try:
                await self.send(report)
            except ConnectionClosed:
                pass

    async def _receive(self) -> None:
        assert self.ws is not None
        try:
            async for message in self.ws:
                await self.handle(message)
                self._notify()
        except ConnectionClosed:
            pass
        finally:
            self.closed = True
            self.close_code = self.ws.close_code
            self.close_reason = self.ws.close_reason or ""
            self._notify()

    async def _playout(self) -> None:
        """The carrier's playout: `FRAME_MS` of audio per tick, in the order sent; a mark is
        reported when the audio before it has all played."""
        loop = asyncio.get_running_loop()
        frame = int(self.bytes_per_ms * FRAME_MS)
        tick = loop.time()
        while not self.closed:
            tick += FRAME_MS / 1000
            await asyncio.sleep(max(0.0, tick - loop.time()))
            need = frame
            while need:
                if not self.playing:
                    if not self.queue:
                        break
                    kind, item = self.queue.popleft()
                    if kind == "mark":
                        await self.report_mark(item)
                        continue
                    self.playing += item
                piece = min(need, len(self.playing))
                del self.playing[:piece]
                need -= piece
                self.played_bytes += piece
            # A mark right after the audio this tick plays: reported with it (at most a tick early).
            while not self.playing and self.queue and self.queue[0][0] == "mark":
                await self.report_mark(self.queue.popleft()[1])
            self._notify()

    # -- waiting ---------------------------------------------------------------------------------

    async def wait_media(self, more_than: int = 0) -> None:
        await self.wait_until(
            f"audio beyond {more_than} bytes", lambda: self.received_bytes > more_than
        )

    async def wait_all_played(self) -> None:
        await self.wait_until(
            "all audio and marks to play", lambda: not self.queue and not self.playing
        )

    @property
    def summary(self) -> str:
        return (
            f"{self.transport}: received {self.received_bytes} B, played {self.played_bytes} B, "
            f"marks sent {self.marks_sent[-4:]} reported {self.marks_reported[-4:]}, "
            f"clears {self.clears}, unexpected {self.unexpected[:3]}, closed {self.closed} "
            f"({self.close_code} {self.close_reason!r})"
        )

    def assert_framing(self) -> None:
        """The carrier's rules for the audio it is sent."""
        raise NotImplementedError


# -- Vonage ----------------------------------------------------------------------------------------


class FakeVonage(FakeCarrier):
    """Vonage's Voice API WebSocket endpoint of an NCCO `connect`, at 16 kHz."""

    path = "/vonage"
    transport = "vonage"
    rate = 16000

    def __init__(self, base_url: str, *, query: str = "", **headers: str) -> None:
        super().__init__(base_url, query=query)
        # The NCCO's `headers`: the call's uuid (copied from the answer webhook), the agent,
        # and the rest as args.
        self.headers = {"uuid": self.call_id, **headers}
        self.payloads: dict[str, dict[str, Any]] = {}

    def opening(self) -> list[str]:
        content_type = f"audio/l16;rate={self.rate}"
        # The headers come flattened to the top level, next to the event and content type.
        connected = {"event": "websocket:connected", "content-type": content_type}
        return [json.dumps({**connected, **self.headers})]

    def caller_message(self, pcm: bytes) -> Message:
        return pcm

    def dtmf_message(self, digit: str) -> str:
        return json.dumps({"event": "websocket:dtmf", "digit": digit, "duration": 260})

    def mark_report(self, name: str) -> str | None:
        return json.dumps({"event": "websocket:notify", "payload": self.payloads.pop(name)})

    async def handle(self, message: Message) -> None:
        if isinstance(message, bytes):
            self.queue_audio(message)
            return
        command = json.loads(message)
        action = command.get("action")
        if action == "notify":
            payload = command["payload"]
            self.payloads[payload["name"]] = payload
            self.queue_mark(payload["name"])
        elif action == "clear":
            # The notifies queued with the dropped audio are not answered.
            for name in self.drop_queued(keep_playing=False):
                self.payloads.pop(name, None)
            await self.send('{"event":"websocket:cleared"}')
        else:
            self.unexpected.append(message[:80])

    async def hang_up(self) -> None:
        # No stop message: the caller hanging up closes the socket.
        self.hung_up = True
        if not self.closed and self.ws is not None:
            await self.ws.close(1000)

    def assert_framing(self) -> None:
        frame = vonage.frame_bytes(self.rate)
        assert self.audio_sizes and set(self.audio_sizes) == {frame}, set(self.audio_sizes)
        assert self.max_queued_ms <= vonage.MAX_BUFFERED_MS
        assert not self.unexpected


# -- Exotel ----------------------------------------------------------------------------------------


class FakeExotel(FakeCarrier):
    """Exotel's Voicebot applet (bidirectional), at its default 8 kHz."""

    path = "/exotel"
    transport = "exotel"
    rate = 8000
    caller_ms = 100  # "about 100 ms a message"

    def __init__(self, base_url: str, *, query: str = "", **custom: str) -> None:
        super().__init__(base_url, query=query)
        self.custom = custom  # the applet URL's custom parameters
        self.stream_sid = uuid.uuid4().hex
        self.account_sid = "exotel-test-account"
        self._sequence = 0
        self._chunk = 0

    def _next(self) -> str:
        # One page has numbers as strings, the other as integers: strings here.
        self._sequence += 1
        return str(self._sequence)

    def opening(self) -> list[str]:
        start = {
            "event": "start",
            "sequence_number": self._next(),
            "stream_sid": self.stream_sid,
            "start": {
                "stream_sid": self.stream_sid,
                "call_sid": self.call_id,
                "account_sid": self.account_sid,
                "from": "+919876543210",
                "to": "+918047491899",
                "custom_parameters": self.custom,
                "media_format": {
                    "encoding": "base64",
                    "sample_rate": "8000",
                    "bit_rate": "128kbps",
                },
            },
        }
        return ['{"event":"connected"}', json.dumps(start)]

    def caller_message(self, pcm: bytes) -> Message:
        self._chunk += 1
        media = {
            "chunk": str(self._chunk),
            "timestamp": str((self._chunk - 1) * self.caller_ms),
            "payload": base64.b64encode(pcm).decode(),
        }
        sid = self.stream_sid
        return json.dumps(
            {"event": "media", "sequence_number": self._next(), "stream_sid": sid, "media": media}
        )

    def dtmf_message(self, digit: str) -> str:
        return json.dumps(
            {
                "event": "dtmf",
                "sequence_number": self._next(),
                "stream_sid": self.stream_sid,
                "dtmf": {"digit": digit, "duration": "100"},
            }
        )

    def mark_report(self, name: str) -> str | None:
        return json.dumps(
            {
                "event": "mark",
                "sequence_number": self._next(),
                "stream_sid": self.stream_sid,
                "mark": {"name": name},
            }
        )

    async def handle(self, message: Message) -> None:
        if isinstance(message, bytes):
            self.unexpected.append(f"binary frame of {len(message)} bytes")
            return
        command = json.loads(message)
        if command.get("stream_sid") != self.stream_sid:
            self.unexpected.append(message[:80])
        event = command.get("event")
        if event == "media":
            self.queue_audio(base64.b64decode(command["media"]["payload"], validate=True))
        elif event == "mark":
            self.queue_mark(command["mark"]["name"])
        elif event == "clear":
            # The chunk that has started plays to its end; the marks dropped are not echoed.
            self.drop_queued(keep_playing=True)
        else:
            self.unexpected.append(message[:80])

    async def hang_up(self) -> None:
        """`stop` with reason `callended`; the server then closes the socket."""
        self.hung_up = True
        stop = {
            "event": "stop",
            "sequence_number": self._next(),
            "stream_sid": self.stream_sid,
            "stop": {
                "call_sid": self.call_id,
                "account_sid": self.account_sid,
                "reason": "callended",
            },
        }
        await self.send(json.dumps(stop))
        await self.wait_until("the server to close after stop", lambda: self.closed)

    def assert_framing(self) -> None:
        limits = exotel_chunks.chunk_limits(self.rate)
        assert (limits.multiple, limits.min_bytes) == (320, 3200)
        assert self.audio_sizes, "no media"
        bad = [size for size in self.audio_sizes if not limits.valid(size)]
        assert not bad, bad
        assert max(self.audio_sizes) <= exotel_chunks.MAX_CHUNK_BYTES
        assert not self.unexpected


class FakeExotel16k(FakeExotel):
    """The applet URL asked for `sample-rate=16000`."""

    rate = 16000


# -- jambonz ---------------------------------------------------------------------------------------


class FakeJambonz(FakeCarrier):
    """jambonz's listen verb, streaming bidirectional audio at 16 kHz (the codec's snippet)."""

    path = "/jambonz"
    transport = "jambonz"
    rate = 16000

    def __init__(
        self,
        base_url: str,
        *,
        query: str = "",
        agent: str = "booking",
        args: dict[str, str] | None = None,
        lose_marks_after_kill: bool = False,
        subprotocols: tuple[str, ...] | None = (jambonz.SUBPROTOCOL,),
    ) -> None:
        super().__init__(base_url, query=query)
        # jambonz always asks for its subprotocol; other offers show what the server does.
        self.subprotocols = None if subprotocols is None else [Subprotocol(p) for p in subprotocols]
        self.metadata: dict[str, Any] = {"agent": agent, "args": args or {}}
        # mod_audio_fork 1.2.33: after killAudio the next marks' markers are matched to the
        # cleared names and never reported.
        self.lose_marks_after_kill = lose_marks_after_kill
        self.losing_marks = False
        self.marks_lost: list[str] = []
        self.marks_cleared: list[str] = []
        self.disconnected = False

    def opening(self) -> list[str]:
        # listen.js: Object.assign({sampleRate, mixType}, callInfo, metadata).
        attributes = {
            "sampleRate": self.rate,
            "mixType": "mono",
            "callSid": self.call_id,
            "direction": "inbound",
            "from": "+15083084809",
            "to": "+15083728299",
            "callId": f"{uuid.uuid4()}@127.0.0.1",
            "callStatus": "in-progress",
            "accountSid": str(uuid.uuid4()),
            "applicationSid": str(uuid.uuid4()),
            **self.metadata,
        }
        return [json.dumps(attributes)]

    def caller_message(self, pcm: bytes) -> Message:
        return pcm

    def dtmf_message(self, digit: str) -> str:
        return json.dumps({"event": "dtmf", "dtmf": digit, "duration": "1600"})

    def mark_report(self, name: str) -> str | None:
        if self.losing_marks:
            self.marks_lost.append(name)
            return None
        return json.dumps({"type": "mark", "data": {"name": name, "event": "playout"}})

    async def handle(self, message: Message) -> None:
        if isinstance(message, bytes):
            self.queue_audio(message)
            return
        command = json.loads(message)
        kind = command.get("type")
        if kind == "mark":
            self.queue_mark(command["data"]["name"])
        elif kind == "killAudio":
            for name in self.drop_queued(keep_playing=False):
                self.marks_cleared.append(name)
                await self.send(
                    json.dumps({"type": "mark", "data": {"name": name, "event": "cleared"}})
                )
            self.losing_marks = self.lose_marks_after_kill
        elif kind == "disconnect":
            # The listen verb ends: the end-of-stream frame, then the close.
            self.disconnected = True
            await self.hang_up()
        else:
            self.unexpected.append(message[:80])

    async def hang_up(self) -> None:
        """mod_audio_fork's graceful shutdown: an empty binary frame, then the close."""
        self.hung_up = True
        if not self.closed and self.ws is not None:
            try:
                await self.ws.send(b"")
            except ConnectionClosed:
                return
            await self.ws.close(1000)

    def assert_framing(self) -> None:
        # Every message fills mod_audio_fork's pre-buffer (the first its larger first one), so
        # none of it waits there past its mark; the codec assumes an 8 kHz call.
        factor = max(1, self.rate // jambonz.ASSUMED_CALL_RATE)
        first = 2 * jambonz.PREBUFFER_FIRST_SAMPLES * factor
        later = 2 * jambonz.PREBUFFER_SAMPLES * factor
        assert self.audio_sizes, "no audio"
        assert self.audio_sizes[0] >= first, self.audio_sizes[:3]
        assert min(self.audio_sizes) >= later, sorted(self.audio_sizes)[:3]
        assert all(size % 2 == 0 for size in self.audio_sizes)
        assert not self.unexpected


CARRIERS = ["vonage", "exotel", "jambonz"]


def make_caller(carrier: str, base_url: str, **options: Any) -> FakeCarrier:
    """A call with the agent and an arg from the carrier's own set-up, and an arg and a token
    in the stream URL's query."""
    query = "?caller=5551234&token=not-an-arg"
    if carrier == "vonage":
        return FakeVonage(base_url, query=query, agent="booking", party="2", **options)
    if carrier == "exotel":
        return FakeExotel(base_url, query=query, agent="booking", party="2", **options)
    return FakeJambonz(base_url, query=query, args={"party": "2"}, **options)


# -- fixtures and helpers --------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """The default agent hearing with pocketsphinx's domain model, speaking quickly."""
    config = default_config_with(tmp_path_factory.mktemp("carriers"), voice=QUICK_VOICE)
    async for voice_server in serving(config):
        yield voice_server


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def base_url(server: VoiceServer) -> str:
    return f"ws://127.0.0.1:{server.port}"


def caller_audio(name: str, rate: int) -> bytes:
    """A fixture line (8 kHz mu-law) as 16-bit PCM at `rate`."""
    pcm = ulaw_decode((AUDIO / f"{name}.ulaw").read_bytes())
    return pcm if rate == 8000 else resample(pcm, 8000, rate)


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


def assert_args_reached_the_call(call: dict[str, Any], transport: str) -> None:
    assert call["transport"] == transport and call["agent"] == "booking"
    state = call["state"]
    assert state.get("party") == "2", state  # from the carrier's own set-up
    assert state.get("caller") == "5551234", state  # from the URL's query
    assert "token" not in state


# -- calls -----------------------------------------------------------------------------------------


async def test_barge_in_commits_the_heard_prefix_then_the_answer(
    server: VoiceServer, base_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The three carriers' calls at once (the server carries many; the suite has a time
    budget); a failure names its carrier. None of them needs the playout clock."""
    await asyncio.gather(*(barge_in(server, base_url, carrier, caplog) for carrier in CARRIERS))


async def test_barge_in_on_jambonz_that_loses_marks_is_committed_by_the_clock(
    server: VoiceServer, base_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    await barge_in(server, base_url, "jambonz-1.2.33", caplog)


async def barge_in(
    server: VoiceServer, base_url: str, carrier: str, caplog: pytest.LogCaptureFixture
) -> None:
    # jambonz-1.2.33 is mod_audio_fork 1.2.33: after the killAudio it reports no mark again, so
    # only the server's own playout estimate (carrier_call._MarkClock) can commit the answer.
    losing = carrier == "jambonz-1.2.33"
    transport = carrier.split("-")[0]
    caplog.set_level(logging.INFO, logger="voice_agent.server")
    caller = make_caller(transport, base_url, **({"lose_marks_after_kill": True} if losing else {}))
    call_id = caller.call_id
    async with caller:
        await caller.wait_media()
        await caller.say_silence(BARGE_IN_AFTER_MS)
        await caller.say(caller_audio("joe_book1", caller.rate))
        await caller.wait_until("a clear", lambda: bool(caller.clears))
        await caller.wait_until(
            "the answer to be committed", lambda: ANSWER in live_committed(server, call_id)
        )
        caller.assert_framing()
    call = await ended_call(server, call_id)
    assert call["end_reason"] == "caller hung up", carrier
    assert_args_reached_the_call(call, transport)
    assert audit(call, "barge_in"), carrier
    # The greeting as far as the caller heard it when the clear came, word for word.
    said = messages(call, "assistant")
    assert said[0] is not None
    heard, generated = words(said[0]), words(GREETING)
    assert 0 < len(heard) < len(generated) and heard == generated[: len(heard)], said[0]
    played_ms = caller.clears[0] / caller.bytes_per_ms
    assert abs(len(heard) - await words_played(server, GREETING, played_ms)) <= 1
    assert said[1] == ANSWER
    clock = [r.getMessage() for r in caplog.records if "taken as played by the clock" in r.msg]
    if isinstance(caller, FakeJambonz):
        assert caller.marks_cleared, "killAudio dropped no mark"
        if losing:
            assert caller.marks_lost, "no mark was sent after the killAudio"
            assert any(name in line for line in clock for name in caller.marks_lost), clock
            return
    # Every mark of the answer came back played, and the estimate never had to stand in.
    assert caller.marks_reported[-1] == caller.marks_sent[-1] and not clock, clock


async def keypad_then_hang_up(server: VoiceServer, base_url: str, carrier: str) -> None:
    caller = make_caller(carrier, base_url)
    async with caller:
        call_id = caller.call_id
        await caller.wait_until(
            "the greeting to be committed", lambda: GREETING in live_committed(server, call_id)
        )
        # Committed because the caller heard all of it, as the marks said.
        assert caller.marks_sent and caller.marks_reported == caller.marks_sent
        await caller.wait_all_played()
        assert caller.played_bytes == caller.received_bytes and not caller.clears
        await caller.send_dtmf("0")
        await caller.wait_until(
            "the hours to be committed", lambda: HOURS in live_committed(server, call_id)
        )
        await caller.hang_up()
        await caller.wait_until("the socket to close", lambda: caller.closed)
        caller.assert_framing()
    call = await ended_call(server, call_id)
    assert call["transport"] == carrier
    assert call["end_reason"] == "caller hung up", carrier
    triggers = audit(call, "trigger")
    assert triggers and triggers[0]["function"] == "on_keypad", carrier
    assert messages(call, "assistant") == [GREETING, HOURS], carrier


async def test_keypad_then_the_caller_hangs_up_on_each_carrier(
    server: VoiceServer, base_url: str
) -> None:
    # The three calls at once, to keep the suite in its time budget: nothing here depends on
    # timing; a failure names its carrier (and cancels the other calls).
    async with asyncio.TaskGroup() as calls:
        for carrier in CARRIERS:
            calls.create_task(keypad_then_hang_up(server, base_url, carrier))


# A message each codec takes as fatal mid-call, the close code it names, and its reason.
BAD_INPUT: dict[str, tuple[Callable[[FakeCarrier], Message], int, str]] = {
    # Odd-sized audio: not whole 16-bit samples.
    "vonage": (lambda c: bytes(641), 1003, "binary frame of 641 bytes is not whole 16-bit"),
    # Media whose payload is not base64.
    "exotel": (
        lambda c: json.dumps(
            {
                "event": "media",
                "stream_sid": getattr(c, "stream_sid", ""),
                "media": {"chunk": "99", "timestamp": "9900", "payload": "not base64!"},
            }
        ),
        1002,
        "media.payload is not valid base64",
    ),
    # A mark report that is neither playout nor cleared.
    "jambonz": (
        lambda c: '{"type":"mark","data":{"name":"m1","event":"later"}}',
        1002,
        "mark data.event",
    ),
}


@pytest.mark.parametrize("carrier", CARRIERS)
async def test_bad_message_mid_call_closes_with_the_codecs_code(
    server: VoiceServer, base_url: str, carrier: str
) -> None:
    build, code, reason = BAD_INPUT[carrier]
    async with make_caller(carrier, base_url) as bad:
        await bad.wait_media()
        await bad.send(build(bad))
        await bad.wait_until("the server to close", lambda: bad.closed)
    assert bad.close_code == code and reason in bad.close_reason, bad.summary
    call = await ended_call(server, bad.call_id)
    assert call["end_reason"].startswith(f"protocol error: {reason}"), call["end_reason"]
    # The next call is served as usual: it gets the greeting, and its hang-up is a hang-up.
    async with make_caller(carrier, base_url) as good:
        await good.wait_media()
    call = await ended_call(server, good.call_id)
    assert call["transport"] == carrier and call["end_reason"] == "caller hung up"


@pytest.mark.parametrize(
    ("offered", "answered"),
    [
        ((jambonz.SUBPROTOCOL,), jambonz.SUBPROTOCOL),
        (("audio.drachtio.org",), "audio.drachtio.org"),  # mod_audio_fork's own default
        (None, None),
        (("audio.example.org",), None),
    ],
    ids=["jambonz", "drachtio", "none", "another"],
)
async def test_jambonz_subprotocol(
    server: VoiceServer, base_url: str, offered: tuple[str, ...] | None, answered: str | None
) -> None:
    """The server answers with the jambonz subprotocol the client asked for; asked for none or
    for another, it answers with none (carriers.select_subprotocol) and still serves the call
    (websockets' client accepts a handshake without one), which real jambonz never sees."""
    caller = FakeJambonz(base_url, subprotocols=offered)
    async with caller:
        assert caller.ws is not None and caller.ws.subprotocol == answered
        await caller.wait_media()
    call = await ended_call(server, caller.call_id)
    assert call["transport"] == "jambonz" and call["end_reason"] == "caller hung up"


async def test_a_flood_of_carrier_notes_is_capped_in_the_audit(
    server: VoiceServer, base_url: str
) -> None:
    # A Vonage gone wrong: empty binary frames, each a harmless warning the audit keeps only
    # the first MAX_NOTES of.
    async with FakeVonage(base_url) as caller:
        await caller.wait_media()
        for _ in range(carrier_call.MAX_NOTES + 10):
            await caller.send(b"")
        assert caller.ws is not None
        # The pong comes back after the server has read everything sent before the ping.
        await asyncio.wait_for(await caller.ws.ping(), TIMEOUT_S)
    call = await ended_call(server, caller.call_id)
    notes = audit(call, "carrier_note")
    assert notes and all(note["kind"] == "empty_payload" for note in notes)
    assert len(notes) <= carrier_call.MAX_NOTES


async def test_exotel_sample_rate_parameter_is_not_an_arg(
    server: VoiceServer, base_url: str
) -> None:
    # A 16 kHz Exotel stream is asked for with `sample-rate=16000` on the applet URL, which is
    # the URL Exotel opens; the codec's docstring says it is never an agent arg.
    query = "?sample-rate=16000&caller=5551234"
    async with FakeExotel16k(base_url, query=query, agent="booking", caller="5551234") as caller:
        await caller.wait_media()
    call = await ended_call(server, caller.call_id)
    assert call["state"].get("caller") == "5551234"
    assert "sample-rate" not in call["state"], call["state"]

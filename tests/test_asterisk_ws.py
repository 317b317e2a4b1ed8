"""/asterisk end to end: a test client plays Asterisk's chan_websocket against a real VoiceServer.

The client is not Asterisk. It is written from Asterisk's published behaviour: the "WebSocket"
channel driver page of docs.asterisk.org (asterisk/documentation,
docs/Configuration/Channel-Drivers/WebSocket.md) and what channels/chan_websocket.c does in
20.16.0, 20.17.0 and 20.18.0 (the three `Release`s below). Like Asterisk it connects as the
WebSocket client, sends MEDIA_START first (plain text or JSON), streams the caller's audio in
20 ms BINARY frames, queues the media it gets whole frames at a time (a message's partial
frame is dropped), plays one frame per 20 ms tick of its own clock, answers a MARK_MEDIA when
the mark reaches the head of its queue (from 20.18.0 on; earlier releases only log it),
empties its queue on FLUSH_MEDIA (marks included, unreported), and closes the socket with 1000
on HANGUP and when the caller hangs up. The assertions read the call record the server keeps.

Every wait is for an event the client or the server reports, with a timeout; the playout
clock is the only thing that sleeps, as Asterisk's channel timer does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_asyncio
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from tests.support.configs import (
    GREETING,
    QUICK_VOICE,
    default_config_with,
    ended_call,
    serving,
    words_played,
)
from tests.support.waiting import PredicateWaits, Waiter
from voice_agent.audio.g711 import alaw_encode
from voice_agent.audio.resample import resample
from voice_agent.audio.wav import read_wav
from voice_agent.gateways.asterisk_ws import (
    PROBE_ID,
    AsteriskOutbound,
    agent_and_args,
    asterisk_endpoint,
)
from voice_agent.gateways.media_socket import MediaConnection
from voice_agent.server.app import VoiceServer
from voice_agent.transports import asterisk_commands as commands
from voice_agent.transports import asterisk_ws as codec
from voice_agent.transports.errors import ProtocolError, ProtocolWarning

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
HOURS = "We're open every day from noon to eleven pm."
GOODBYE = "Thanks for calling Bella Vista. Goodbye!"
TIMEOUT_S = 30.0

# The calls share the module's server, and so its event loop.
on_module_loop = pytest.mark.asyncio(loop_scope="module")


# -- Asterisk, as its documentation and chan_websocket.c describe it ------------------------------

PTIME_MS = 20
XOFF_LEVEL, XON_LEVEL, QUEUE_MAX = 900, 800, 1000  # chan_websocket.c QUEUE_LENGTH_*
MAX_COMMAND_BYTES = 128  # chan_websocket.c MAX_TEXT_MESSAGE_LEN: longer TEXT is dropped


@dataclass(frozen=True)
class Release:
    name: str
    channel_id: bool  # MEDIA_START, DTMF_END and STATUS carry channel_id (20.17.0 on)
    marks: bool  # MARK_MEDIA, MEDIA_MARK_PROCESSED, ERROR and JSON (20.18.0 on)


R20_16 = Release("20.16.0", channel_id=False, marks=False)
R20_17 = Release("20.17.0", channel_id=True, marks=False)
R20_18 = Release("20.18.0", channel_id=True, marks=True)


@dataclass(frozen=True)
class Format:
    rate: int
    width: int
    silence: int  # the byte of digital silence (pcm16: both bytes zero)

    @property
    def frame(self) -> int:
        return self.rate * self.width * PTIME_MS // 1000

    @property
    def bytes_per_ms(self) -> float:
        return self.rate * self.width / 1000


FORMATS = {
    "ulaw": Format(8000, 1, 0xFF),
    "alaw": Format(8000, 1, 0xD5),
    "slin": Format(8000, 2, 0),
    "slin16": Format(16000, 2, 0),
}

_channels = itertools.count(1)


def new_channel_id() -> str:
    return f"{int(time.time())}.{next(_channels)}"  # Asterisk's uniqueid: epoch.sequence


@dataclass
class Flush:
    played_bytes: int  # what the caller had heard when FLUSH_MEDIA came
    dropped_marks: list[str]


@dataclass
class FakeAsterisk(PredicateWaits):
    """One chan_websocket channel dialled to the server (see the module docstring)."""

    url: str
    release: Release = R20_18
    form: str = "json"
    fmt: str = "ulaw"
    variables: dict[str, str] = field(default_factory=dict)
    # Asterisk drops the marks a FLUSH_MEDIA empties from its queue; True reports them at once
    # instead, as Twilio's `clear` does, to show the server copes with either.
    report_flushed_marks: bool = False
    timeout: float = TIMEOUT_S

    def __post_init__(self) -> None:
        assert self.form == "plain-text" or self.release.marks, "JSON came with 20.18.0"
        self.media = FORMATS[self.fmt]
        self.channel_id = new_channel_id()
        self.channel = f"WebSocket/voice_agent/0x{next(_channels):012x}"
        self.ws: ClientConnection | None = None
        self.log: list[
            tuple[Any, ...]
        ] = []  # ("media", size), ("command", name, arg), ("sent", text)
        self.commands: list[tuple[str, str | None]] = []
        self.queue: deque[tuple[str, Any]] = deque()  # ("media", frame) / ("mark", id)
        self.queued_frames = 0
        self.queue_full = False
        self.received_bytes = 0
        self.media_sizes: list[int] = []
        self.played_bytes = 0
        self.last_played_at: float | None = None
        self.marks_processed: list[str] = []
        self.flushes: list[Flush] = []
        self.unknown: list[str] = []  # commands this release does not know: Asterisk logs them
        self.too_long: list[str] = []
        self.closed = False
        self.close_code: int | None = None
        self.close_reason = ""
        self._outgoing = bytearray()
        self._sent_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._waiters: list[Waiter] = []
        self._sent_total = 0
        self._queued_total = 0
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> FakeAsterisk:
        # res_http_websocket's client offers no extension (and fails on one it is sent).
        self.ws = await connect(self.url, compression=None, open_timeout=self.timeout)
        await self.ws.send(self.media_start())
        self._tasks = [
            asyncio.ensure_future(self._receive()),
            asyncio.ensure_future(self._playout()),
            asyncio.ensure_future(self._caller_audio()),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.hang_up()

    async def hang_up(self) -> None:
        """The caller hangs up: chan_websocket closes the socket with 1000."""
        if self.ws is not None and not self.closed:
            await self.ws.close(1000)
        await self.wait_until("the socket to close", lambda: self.closed)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- what Asterisk sends -----------------------------------------------------------------

    def media_start(self) -> str:
        fields: dict[str, Any] = {
            "connection_id": "voice_agent",
            "channel": self.channel,
            "channel_id": self.channel_id,
            "format": self.fmt,
            "optimal_frame_size": self.media.frame,
            "ptime": PTIME_MS,
        }
        if self.form == "json":
            variables = {
                "DIALEDPEERNUMBER": "voice_agent/c(ulaw)",
                "MEDIA_WEBSOCKET_CONNECTION_ID": "voice_agent",
                "MEDIA_WEBSOCKET_OPTIMAL_FRAME_SIZE": str(self.media.frame),
                **self.variables,
            }
            return json.dumps({"event": "MEDIA_START", **fields, "channel_variables": variables})
        if not self.release.channel_id:
            del fields["channel_id"]
        return "MEDIA_START " + " ".join(f"{key}:{value}" for key, value in fields.items())

    def event(self, name: str, *, bare: str | None = None, **fields: Any) -> str:
        if self.form == "json":
            body: dict[str, Any] = {"event": name, "channel_id": self.channel_id}
            if bare is not None:
                body["correlation_id"] = bare
            return json.dumps({**body, **fields})
        # chan_websocket's printf formats: DTMF_END digit:5 channel_id:..., STATUS channel_id:...
        if self.release.channel_id and name == "DTMF_END":
            fields = {**fields, "channel_id": self.channel_id}
        elif self.release.channel_id and name in ("STATUS", "ERROR"):
            fields = {"channel_id": self.channel_id, **fields}
        text = name + (f" {bare}" if bare else "")
        for key, value in fields.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            text += f" {key}:{value}"
        return text

    async def send_text(self, text: str) -> None:
        assert self.ws is not None
        self.log.append(("sent", text))
        await self.ws.send(text)

    async def send_dtmf(self, digit: str) -> None:
        await self.send_text(self.event("DTMF_END", digit=digit))

    async def send_xoff(self) -> None:
        await self.send_text(self.event("MEDIA_XOFF"))

    async def send_xon(self) -> None:
        await self.send_text(self.event("MEDIA_XON"))

    async def say(self, audio: bytes) -> None:
        """The caller speaks: `audio` (in the channel's format) goes out in 20 ms frames among
        the silence a phone line streams; returns once all of it is on the wire."""
        frame = self.media.frame
        audio += bytes([self.media.silence]) * (-len(audio) % frame)
        self._outgoing += audio
        self._queued_total += len(audio)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sent_waiters.append((self._queued_total, done))
        await asyncio.wait_for(done, self.timeout + len(audio) / self.media.bytes_per_ms / 1000)

    async def say_silence(self, ms: int) -> None:
        await self.say(bytes([self.media.silence]) * int(ms * self.media.bytes_per_ms))

    async def _caller_audio(self) -> None:
        assert self.ws is not None
        loop = asyncio.get_running_loop()
        tick = loop.time()
        silence = bytes([self.media.silence]) * self.media.frame
        while not self.closed:
            tick += PTIME_MS / 1000
            await asyncio.sleep(max(0.0, tick - loop.time()))
            chunk = bytes(self._outgoing[: self.media.frame]) or silence
            del self._outgoing[: self.media.frame]
            try:
                await self.ws.send(chunk)
            except ConnectionClosed:
                return
            if chunk is not silence:
                self._sent_total += len(chunk)
            while self._sent_waiters and self._sent_waiters[0][0] <= self._sent_total:
                self._sent_waiters.pop(0)[1].set_result(None)

    # -- what the server sends ---------------------------------------------------------------

    async def _receive(self) -> None:
        assert self.ws is not None
        try:
            async for message in self.ws:
                if isinstance(message, bytes):
                    self._media(message)
                else:
                    await self._command(message)
                self._notify()
        except ConnectionClosed:
            pass
        finally:
            self.closed = True
            self.close_code = self.ws.close_code
            self.close_reason = self.ws.close_reason or ""
            self._notify()

    def _media(self, data: bytes) -> None:
        self.log.append(("media", len(data)))
        self.received_bytes += len(data)
        self.media_sizes.append(len(data))
        if self.queued_frames >= QUEUE_MAX:
            return  # chan_websocket ignores a message while its queue is full
        frame = self.media.frame
        for at in range(0, len(data) - frame + 1, frame):  # a partial frame is dropped
            self.queue.append(("media", data[at : at + frame]))
            self.queued_frames += 1
            if not self.queue_full and self.queued_frames >= XOFF_LEVEL:
                self.queue_full = True
                self._tasks.append(asyncio.ensure_future(self.send_xoff()))

    async def _command(self, text: str) -> None:
        if len(text.encode()) > MAX_COMMAND_BYTES:
            self.too_long.append(text)
            return
        name: str | None
        arg: str | None
        if self.form == "json":
            try:
                body = json.loads(text)
                name, arg = body.get("command"), body.get("correlation_id")
            except (ValueError, AttributeError):
                await self.send_text(self.event("ERROR", error_text="Unable to parse JSON command"))
                return
        else:
            name, _, rest = text.strip().partition(" ")
            arg = rest or None
        self.log.append(("command", name, arg))
        self.commands.append((str(name), arg))
        if name == "HANGUP":
            # The channel hangs up; webchan_hangup closes the socket with 1000.
            assert self.ws is not None
            self._tasks.append(asyncio.ensure_future(self.ws.close(1000)))
        elif name == "MARK_MEDIA" and self.release.marks:
            self.queue.append(("mark", arg or ""))
        elif name == "FLUSH_MEDIA":
            dropped = [item for kind, item in self.queue if kind == "mark"]
            self.flushes.append(Flush(self.played_bytes, dropped))
            self.queue.clear()
            self.queued_frames = 0
            if self.report_flushed_marks:
                for mark in dropped:
                    await self._mark_processed(mark)
        elif name == "GET_STATUS":
            await self.send_text(
                self.event(
                    "STATUS",
                    queue_length=self.queued_frames,
                    xon_level=XON_LEVEL,
                    xoff_level=XOFF_LEVEL,
                    queue_full=self.queue_full,
                    bulk_media=False,
                    media_paused=False,
                )
            )
        elif name != "ANSWER":
            self.unknown.append(str(name))

    async def _mark_processed(self, mark: str) -> None:
        self.marks_processed.append(mark)
        await self.send_text(self.event("MEDIA_MARK_PROCESSED", bare=mark))

    async def _playout(self) -> None:
        """chan_websocket's channel timer: each tick sends the marks at the head of the queue,
        then plays one frame."""
        loop = asyncio.get_running_loop()
        tick = loop.time()
        while not self.closed:
            tick += PTIME_MS / 1000
            await asyncio.sleep(max(0.0, tick - loop.time()))
            if self.queue_full and self.queued_frames < XON_LEVEL:
                self.queue_full = False
                await self.send_xon()
            while self.queue and self.queue[0][0] == "mark":
                await self._mark_processed(self.queue.popleft()[1])
            if self.queue:
                _, frame = self.queue.popleft()
                self.queued_frames -= 1
                self.played_bytes += len(frame)
                self.last_played_at = loop.time()
            self._notify()

    # -- waiting -----------------------------------------------------------------------------

    async def wait_media(self, more_than: int = 0) -> None:
        await self.wait_until(
            f"media beyond {more_than} bytes", lambda: self.received_bytes > more_than
        )

    async def wait_quiet(self, ms: float) -> None:
        """Until something has played, the queue is empty and `ms` have passed since."""

        def quiet() -> bool:
            if self.last_played_at is None or any(k == "media" for k, _ in self.queue):
                return False
            return asyncio.get_running_loop().time() - self.last_played_at >= ms / 1000

        await self.wait_until(f"{ms:g} ms of quiet after media", quiet)

    async def wait_command(self, name: str, count: int = 1) -> None:
        await self.wait_until(f"{name} #{count}", lambda: self.count(name) >= count)

    def count(self, name: str) -> int:
        return sum(1 for command, _ in self.commands if command == name)

    def marks_sent(self) -> list[str]:
        return [str(arg) for name, arg in self.commands if name == "MARK_MEDIA"]

    @property
    def played_ms(self) -> float:
        return self.played_bytes / self.media.bytes_per_ms

    @property
    def summary(self) -> str:
        return (
            f"received {self.received_bytes} B, played {self.played_bytes} B, "
            f"commands {self.commands[-8:]}, closed {self.closed} "
            f"({self.close_code} {self.close_reason!r})"
        )


# -- fixtures ------------------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    """The default agent hearing with pocketsphinx's domain model, as tests/test_voice_e2e.py."""
    config = default_config_with(tmp_path_factory.mktemp("asterisk"), voice=QUICK_VOICE)
    async for voice_server in serving(config):
        yield voice_server


async def _hold_messages(connection: ServerConnection, request: Request) -> Response | None:
    # What app.py's process_request does for its call paths: Asterisk sends MEDIA_START at once.
    cast(MediaConnection, connection).hold_messages(codec.WEBSOCKET_MAX_SIZE)
    return None


async def _serve(
    server: VoiceServer, admit: Callable[[str], str | None] | None = None
) -> tuple[Server, str]:
    async def handler(ws: ServerConnection) -> None:
        await asterisk_endpoint(ws, server.start_call, admit)

    ws_server = await serve(
        handler,
        "127.0.0.1",
        0,
        process_request=_hold_messages,
        create_connection=MediaConnection,
        compression=None,
        max_size=codec.WEBSOCKET_MAX_SIZE,
    )
    port = next(iter(ws_server.sockets)).getsockname()[1]
    return ws_server, f"ws://127.0.0.1:{port}/asterisk"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def url(server: VoiceServer) -> str:
    """The server's own /asterisk path."""
    return f"ws://127.0.0.1:{server.port}/asterisk"


# -- helpers -------------------------------------------------------------------------------------


def caller_audio(name: str, fmt: str) -> bytes:
    """A fixture line in `fmt`: the .ulaw file as it is, else the 16 kHz wav converted."""
    if fmt == "ulaw":
        return (AUDIO / f"{name}.ulaw").read_bytes()
    pcm, rate = read_wav(AUDIO / f"{name}.wav")
    target = FORMATS[fmt].rate
    if rate != target:
        pcm = resample(pcm, rate, target)
    return alaw_encode(pcm) if fmt == "alaw" else pcm


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


def call_id_for(server: VoiceServer, caller: FakeAsterisk) -> str:
    """The id of the live call `caller` made (its channel name is unique)."""
    for call_id, pipeline in server.pipelines.items():
        out = pipeline.out
        if isinstance(out, AsteriskOutbound) and out.start.channel == caller.channel:
            return call_id
    raise AssertionError(f"no live call for {caller.channel}")


def outbound(server: VoiceServer, call_id: str) -> AsteriskOutbound:
    out = server.pipelines[call_id].out
    assert isinstance(out, AsteriskOutbound)
    return out


def words(text: str) -> list[str]:
    return [word.strip(",.!?") for word in text.split()]


def assert_marks_follow_whole_frames(caller: FakeAsterisk) -> None:
    """Every media message is whole frames, and every mark follows media of its own."""
    assert caller.media_sizes, "no media"
    assert all(size % caller.media.frame == 0 for size in caller.media_sizes), caller.media_sizes
    media_since_mark = False
    for entry in caller.log:
        if entry[0] == "media":
            media_since_mark = True
        elif entry[0] == "command" and entry[1] == "MARK_MEDIA" and entry[2] != PROBE_ID:
            assert media_since_mark, f"mark {entry[2]} follows no media"
            media_since_mark = False
    assert not caller.too_long


# -- the codec -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "MEDIA_START connection_id:c1 channel:WebSocket/c1/0x5140001a0040 "
            "format:ulaw optimal_frame_size:160 ptime:20",
            codec.MediaStart(
                "plain-text", "c1", "WebSocket/c1/0x5140001a0040", None, "ulaw", 160, 20
            ),
        ),
        (
            '{"event":"MEDIA_START","connection_id":"c1","channel":"WebSocket/c1/0x1",'
            '"channel_id":"1761245643.1","format":"slin16","optimal_frame_size":640,"ptime":20,'
            '"channel_variables":{"__VOICE_AGENT":"booking","_VOICE_AGENT_ARG_party":"2"}}',
            codec.MediaStart(
                "json",
                "c1",
                "WebSocket/c1/0x1",
                "1761245643.1",
                "slin16",
                640,
                20,
                {"__VOICE_AGENT": "booking", "_VOICE_AGENT_ARG_party": "2"},
            ),
        ),
        ("DTMF_END digit:5", codec.DtmfEnd("5")),
        ("DTMF_END digit:# channel_id:17.2", codec.DtmfEnd("#", "17.2")),
        ('{"event":"DTMF_END","channel_id":"17.2","digit":"*"}', codec.DtmfEnd("*", "17.2")),
        ("MEDIA_XOFF", codec.MediaXoff()),
        ('{"event":"MEDIA_XON","channel_id":"17.2"}', codec.MediaXon("17.2")),
        ("MEDIA_MARK_PROCESSED m7", codec.MarkProcessed("m7")),
        (
            '{"event":"MEDIA_MARK_PROCESSED","channel_id":"17.2","correlation_id":"m7"}',
            codec.MarkProcessed("m7", "17.2"),
        ),
        ("MEDIA_BUFFERING_COMPLETED b1", codec.BufferingCompleted("b1")),
        ("QUEUE_DRAINED", codec.QueueDrained()),
        (
            "STATUS channel_id:17.2 queue_length:43 xon_level:800 xoff_level:900 "
            "queue_full:false bulk_media:true media_paused:false",
            codec.Status(43, 800, 900, False, True, False, "17.2"),
        ),
        (
            '{"event":"STATUS","channel_id":"17.2","queue_length":3,"xon_level":800,'
            '"xoff_level":900,"queue_full":true,"bulk_media":false,"media_paused":false}',
            codec.Status(3, 800, 900, True, False, False, "17.2"),
        ),
        (
            "ERROR channel_id:17.2 error_text:MARK_MEDIA not supported in passthrough mode",
            codec.Error("MARK_MEDIA not supported in passthrough mode", "17.2"),
        ),
        (
            "SOMETHING_NEW a:b",
            ProtocolWarning("unknown_event", "unknown event 'SOMETHING_NEW' ignored"),
        ),
    ],
)
def test_parse_control_reads_both_forms(text: str, expected: object) -> None:
    assert codec.parse_control(text) == expected


def test_media_start_names_the_agent_and_the_carrier() -> None:
    start = codec.parse_control(
        '{"event":"MEDIA_START","channel_id":"1.1","format":"alaw","optimal_frame_size":160,'
        '"ptime":20,"channel_variables":{"__VOICE_AGENT":"booking","VOICE_AGENT_ARG_x":"1"}}'
    )
    assert isinstance(start, codec.MediaStart)
    assert (start.agent, start.agent_args, start.marks_supported) == ("booking", {"x": "1"}, True)
    assert (start.carrier.encoding, start.carrier.sample_rate) == ("alaw", 8000)
    old = codec.parse_control(
        "MEDIA_START connection_id:c channel:c format:slin optimal_frame_size:320"
    )
    assert isinstance(old, codec.MediaStart) and old.ptime == 20 and old.marks_supported is False


@pytest.mark.parametrize(
    ("text", "code", "reason"),
    [
        ("{not json", 1002, "not valid JSON"),
        ('["MEDIA_START"]', 1002, "not an object"),
        ('{"channel_id":"1"}', 1002, 'no "event"'),
        ("MEDIA_START format:opus optimal_frame_size:0", 1003, "'opus' is not supported"),
        ("MEDIA_START format:ulaw", 1002, "MEDIA_START has no optimal_frame_size"),
        ("MEDIA_START format:ulaw optimal_frame_size:320 ptime:20", 1003, "does not fit ulaw"),
        ("MEDIA_START format:ulaw optimal_frame_size:x", 1002, "not a whole number"),
        ("DTMF_END", 1002, "DTMF_END has no digit"),
        ("x" * (codec.MAX_CONTROL_CHARS + 1), 1009, "exceeds the 65536 limit"),
    ],
)
def test_parse_control_explains_what_is_wrong(text: str, code: int, reason: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        codec.parse_control(text)
    assert raised.value.code == code and reason in raised.value.reason


def test_commands_in_the_connections_form() -> None:
    assert commands.mark_media("plain-text", "m1") == "MARK_MEDIA m1"
    assert commands.mark_media("json", "m1") == '{"command":"MARK_MEDIA","correlation_id":"m1"}'
    assert commands.flush_media("json") == '{"command":"FLUSH_MEDIA"}'
    assert commands.hangup("plain-text") == "HANGUP"
    assert commands.stop_media_buffering("plain-text") == "STOP_MEDIA_BUFFERING"
    with pytest.raises(ValueError, match="correlation id"):
        commands.mark_media("plain-text", "two words")
    with pytest.raises(ValueError, match="correlation id"):
        commands.mark_media("json", "m" * (commands.MAX_CORRELATION_ID + 1))
    stream = codec.AsteriskStream()
    with pytest.raises(ProtocolError, match="before MEDIA_START"):
        stream.receive_text("MEDIA_XOFF")
    stream.receive_text("MEDIA_START format:slin16 optimal_frame_size:640 ptime:20")
    assert stream.mark_message("m2") == "MARK_MEDIA m2"
    assert stream.receive_bytes(b"\x00" * 641) == [b"\x00" * 640]  # whole samples only
    with pytest.raises(ProtocolError, match="exceeds 32000"):
        stream.receive_bytes(b"\x00" * 32002)
    with pytest.raises(ProtocolError, match="second MEDIA_START"):
        stream.receive_text("MEDIA_START format:slin16 optimal_frame_size:640 ptime:20")


# -- the outbound side, on a stub socket ----------------------------------------------------------


class StubSocket:
    """What AsteriskOutbound uses of a MediaConnection: the messages written, the close."""

    remote_address = ("127.0.0.1", 5038)

    def __init__(self) -> None:
        self.sent: list[str | bytes] = []
        self.closed: tuple[int, str] | None = None

    def write(self, message: str | bytes) -> bool:
        self.sent.append(message)
        return True

    def buffered_bytes(self) -> int:
        return 0

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)


JSON_START = (
    '{"event":"MEDIA_START","connection_id":"c","channel":"WebSocket/c/0x1",'
    '"channel_id":"1.1","format":"ulaw","optimal_frame_size":160,"ptime":20}'
)


class Heard(list[str]):
    """The marks an outbound reported played, and an event for the next one."""

    def __init__(self) -> None:
        super().__init__()
        self.event = asyncio.Event()

    def __call__(self, name: str) -> None:
        self.append(name)
        self.event.set()


def stub_outbound(start: str = JSON_START) -> tuple[AsteriskOutbound, StubSocket, Heard]:
    stream = codec.AsteriskStream()
    stream.receive_text(start)
    ws, heard = StubSocket(), Heard()
    return AsteriskOutbound(cast(MediaConnection, ws), stream, heard), ws, heard


async def test_outbound_sends_whole_frames_marks_flushes_and_holds() -> None:
    out, ws, heard = stub_outbound()
    out.answer()
    out.audio(b"\x01" * 250)  # one frame goes; 90 bytes wait for the rest of their chunk
    out.mark("m1")  # ... which is filled up with silence to a frame, then marked
    assert ws.sent == [
        '{"command":"ANSWER"}',
        b"\x01" * 160,
        b"\x01" * 90 + b"\xff" * 70,
        '{"command":"MARK_MEDIA","correlation_id":"m1"}',
    ]
    out.audio(b"\x02" * 160)
    out.mark("m2")
    out.mark_processed("m1")
    assert heard == ["m1"]
    out.clear()
    assert ws.sent[-1] == '{"command":"FLUSH_MEDIA"}'
    out.mark_processed("m2")  # reported after the flush (Asterisk drops it): nobody waits
    assert heard == ["m1"]
    out.media_xoff()
    sent = len(ws.sent)
    out.audio(b"\x03" * 320)
    out.mark("m3")
    assert len(ws.sent) == sent and out.held_bytes == 320
    out.media_xon()
    assert ws.sent[sent:] == [b"\x03" * 320, '{"command":"MARK_MEDIA","correlation_id":"m3"}']
    out.mark_processed("m3")
    assert heard == ["m1", "m3"] and out.held_bytes == 0
    out.close(1000, "agent ended the call")
    await out.aclose()
    assert ws.sent[-1] == '{"command":"HANGUP"}'
    assert ws.closed == (1000, "agent ended the call")
    out.audio(b"\x04" * 160)
    assert ws.sent[-1] == '{"command":"HANGUP"}'


async def test_outbound_splits_media_below_asterisks_message_limit() -> None:
    out, ws, _ = stub_outbound()
    out.audio(b"\x05" * 160 * 60)  # 1.2 s
    sizes = [len(m) for m in ws.sent if isinstance(m, bytes)]
    assert sizes == [4000, 4000, 1600] and max(sizes) <= commands.MAX_MEDIA_MESSAGE_BYTES


async def test_outbound_estimates_playout_without_marks() -> None:
    # 20.16.0's MEDIA_START: no channel_id, so certainly no MARK_MEDIA.
    out, ws, heard = stub_outbound(
        "MEDIA_START connection_id:c channel:c format:ulaw optimal_frame_size:160 ptime:20"
    )
    out.answer()
    out.audio(b"\x06" * 320)
    out.mark("m1")
    await asyncio.wait_for(heard.event.wait(), 5)
    assert heard == ["m1"] and out.mode.value == "clock"
    assert not any(isinstance(m, str) and m.startswith("MARK_MEDIA") for m in ws.sent)


async def test_outbound_probes_plain_text_for_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = (
        "MEDIA_START connection_id:c channel:c channel_id:1.2 format:ulaw optimal_frame_size:160"
    )
    out, ws, _ = stub_outbound(plain)
    out.answer()
    assert ws.sent == ["ANSWER", f"MARK_MEDIA {PROBE_ID}"] and out.mode.value == "probing"
    out.mark_processed(PROBE_ID)
    assert out.mode.value == "asterisk"
    # Unanswered, the probe gives way to the estimate.
    monkeypatch.setattr("voice_agent.gateways.asterisk_ws.PROBE_TIMEOUT_S", 0.01)
    out, ws, heard = stub_outbound(plain)
    out.answer()
    out.audio(b"\x07" * 160)
    out.mark("m1")
    await asyncio.wait_for(heard.event.wait(), 5)
    assert heard == ["m1"] and out.mode.value == "clock"


async def test_outbound_gives_up_on_an_endless_xoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("voice_agent.gateways.asterisk_ws.MAX_HELD_MS", 100)
    out, ws, _ = stub_outbound()
    out.media_xoff()
    out.audio(b"\x08" * 160 * 6)  # 120 ms
    await out.aclose()
    assert ws.sent[-1] == '{"command":"HANGUP"}' and ws.closed is not None
    assert ws.closed[0] == 1008 and out.overflowed and "MEDIA_XOFF" in out.overflowed


def test_agent_and_args_from_the_url_then_channel_variables() -> None:
    start = codec.parse_control(
        '{"event":"MEDIA_START","format":"ulaw","optimal_frame_size":160,"ptime":20,'
        '"channel_variables":{"__VOICE_AGENT_ARG_party":"4"}}'
    )
    assert isinstance(start, codec.MediaStart)
    # v(...) parameters follow the configured uri's: the later value wins.
    path = "/asterisk?agent=concierge&party=2&x=1&token=secret&agent=booking"
    assert agent_and_args(path, start) == ("booking", {"party": "4", "x": "1"})


# -- calls ---------------------------------------------------------------------------------------


@on_module_loop
@pytest.mark.parametrize(("form", "fmt"), [("json", "ulaw"), ("plain-text", "slin16")])
async def test_greeting_is_marked_and_committed_once_played(
    server: VoiceServer, url: str, form: str, fmt: str
) -> None:
    caller = FakeAsterisk(
        f"{url}?agent=booking&caller=5551234&token=not-an-arg",
        form=form,
        fmt=fmt,
        variables={"__VOICE_AGENT_ARG_party": "2"},
    )
    async with caller:
        call_id = caller.channel_id
        await caller.wait_media()
        assert caller.commands[0] == ("ANSWER", None)
        # Committed once the last mark has played: the session says so while the call is on.
        await caller.wait_until(
            "the greeting to be committed", lambda: GREETING in live_committed(server, call_id)
        )
        marks = [mark for mark in caller.marks_sent() if mark != PROBE_ID]
        assert marks and caller.marks_processed[-len(marks) :] == marks
        assert caller.played_bytes == caller.received_bytes  # all of it was heard first
        assert_marks_follow_whole_frames(caller)
        assert outbound(server, call_id).mode.value == "asterisk"
    call = await ended_call(server, call_id)
    assert call["transport"] == "asterisk" and call["agent"] == "booking"
    assert messages(call, "assistant") == [GREETING]
    assert call["state"]["caller"] == "5551234" and "token" not in call["state"]
    assert call["state"].get("party") == ("2" if form == "json" else None)
    assert call["end_reason"] == "caller hung up"


@on_module_loop
@pytest.mark.parametrize(
    ("form", "fmt", "report_flushed_marks"),
    [("plain-text", "slin16", False), ("json", "ulaw", True)],
)
async def test_barge_in_flushes_and_commits_the_heard_prefix(
    server: VoiceServer, url: str, form: str, fmt: str, report_flushed_marks: bool
) -> None:
    caller = FakeAsterisk(url, form=form, fmt=fmt, report_flushed_marks=report_flushed_marks)
    async with caller:
        call_id = caller.channel_id
        await caller.wait_media()
        await caller.say_silence(2500)
        await caller.say(caller_audio("joe_book1", fmt))
        await caller.wait_command("FLUSH_MEDIA")
        flush = caller.flushes[0]
        heard_before = caller.received_bytes
        await caller.wait_media(heard_before)  # the answer to what the caller said
        await caller.wait_quiet(500)
        assert_marks_follow_whole_frames(caller)
    call = await ended_call(server, call_id)
    assert audit(call, "barge_in")
    # What the caller had heard when the flush came, whether the marks it dropped stayed
    # unreported (Asterisk) or came back at once (the second case, as Twilio's do).
    committed = messages(call, "assistant")[0]
    assert committed is not None
    heard, generated = words(committed), words(GREETING)
    assert 0 < len(heard) < len(generated) and heard == generated[: len(heard)]
    played_ms = flush.played_bytes / caller.media.bytes_per_ms
    assert abs(len(heard) - await words_played(server, GREETING, played_ms)) <= 1
    assert messages(call, "assistant")[1] == "What name should I put the booking under?"


@on_module_loop
async def test_dtmf_reaches_the_event_trigger(server: VoiceServer, url: str) -> None:
    async with FakeAsterisk(url, form="plain-text", fmt="alaw") as caller:
        await caller.wait_quiet(300)
        heard = caller.received_bytes
        await caller.send_dtmf("0")
        await caller.wait_media(heard)
        await caller.wait_quiet(300)
    call = await ended_call(server, caller.channel_id)
    triggers = audit(call, "trigger")
    assert triggers and triggers[0]["function"] == "on_keypad"
    assert messages(call, "assistant")[-1] == HOURS


@on_module_loop
async def test_media_xoff_holds_media_until_media_xon(server: VoiceServer, url: str) -> None:
    async with FakeAsterisk(url, form="json", fmt="slin") as caller:
        call_id = caller.channel_id
        await caller.wait_media()
        await caller.send_xoff()
        assert caller.ws is not None
        # A ping's pong comes back after the server has handled everything sent before it.
        await asyncio.wait_for(await caller.ws.ping(), TIMEOUT_S)
        out = outbound(server, call_id)
        assert out.xoff
        sent = out.media_bytes_sent
        await caller.send_dtmf("0")  # a reply the server must now hold back
        await caller.wait_until("the server to hold media", lambda: out.held_bytes > 0)
        await caller.wait_until("all media sent to arrive", lambda: caller.received_bytes >= sent)
        assert out.media_bytes_sent == sent and caller.received_bytes == sent
        await caller.send_xon()
        await caller.wait_media(sent)
        await caller.wait_until(
            "the keypad answer to be committed", lambda: HOURS in live_committed(server, call_id)
        )
        assert out.held_bytes == 0 and not out.xoff
        assert_marks_follow_whole_frames(caller)
    call = await ended_call(server, call_id)
    assert messages(call, "assistant") == [GREETING, HOURS]


@on_module_loop
async def test_caller_hang_up_commits_what_the_marks_say_was_heard(
    server: VoiceServer, url: str
) -> None:
    async with FakeAsterisk(url, form="json") as caller:
        await caller.wait_until("the first mark to play", lambda: bool(caller.marks_processed))
        await caller.hang_up()
    call = await ended_call(server, caller.channel_id)
    assert call["end_reason"] == "caller hung up"
    committed = messages(call, "assistant")[0]
    assert committed is not None and committed.startswith("Hello, thanks for calling")
    heard, generated = words(committed), words(GREETING)
    assert len(heard) < len(generated) and heard == generated[: len(heard)]


@on_module_loop
async def test_agent_ends_the_call_with_hangup_on_a_release_without_marks(
    server: VoiceServer, url: str
) -> None:
    # 20.16.0: plain text without channel_id, no MARK_MEDIA: the server estimates playout.
    async with FakeAsterisk(url, release=R20_16, form="plain-text") as caller:
        await caller.wait_quiet(300)
        call_id = call_id_for(server, caller)
        assert outbound(server, call_id).mode.value == "clock"
        await caller.say(caller_audio("joe_change4", "ulaw"))  # "no that's everything"
        await caller.wait_command("HANGUP")
        await caller.wait_until("the socket to close", lambda: caller.closed)
        assert caller.close_code == 1000
        assert caller.marks_sent() == [] and caller.unknown == []
        # The HANGUP came after all of the goodbye's media.
        assert caller.log[-1][:2] == ("command", "HANGUP")
    call = await ended_call(server, call_id)
    assert call["end_reason"] == "agent ended the call"
    assert messages(call, "assistant") == [GREETING, GOODBYE]


@on_module_loop
async def test_release_that_ignores_mark_media_gets_the_playout_estimate(
    server: VoiceServer, url: str
) -> None:
    # 20.17.0 plain text looks like 20.18.0's: the probe mark goes unanswered.
    async with FakeAsterisk(url, release=R20_17, form="plain-text") as caller:
        call_id = caller.channel_id
        await caller.wait_until(
            "the greeting to be committed", lambda: GREETING in live_committed(server, call_id)
        )
        assert caller.marks_sent()[0] == PROBE_ID and caller.marks_processed == []
        assert outbound(server, call_id).mode.value == "clock"
    call = await ended_call(server, call_id)
    assert messages(call, "assistant") == [GREETING]


@on_module_loop
async def test_bad_control_messages_close_only_their_connection(
    server: VoiceServer, url: str
) -> None:
    async with FakeAsterisk(url, form="json") as good:
        await good.wait_media()
        bad_starts = [
            ("{not json", 1002, "not valid JSON"),
            (
                "MEDIA_START connection_id:c channel:c format:opus optimal_frame_size:0",
                1003,
                "opus",
            ),
            ("MEDIA_START connection_id:c channel:c format:ulaw", 1002, "no optimal_frame_size"),
            ("DTMF_END digit:1", 1002, "before MEDIA_START"),
            ("x" * 70_000, 1009, "exceeds"),
        ]
        for text, code, reason in bad_starts:
            async with connect(url, compression=None, max_size=None) as ws:
                await ws.send(text)
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), TIMEOUT_S)
                assert ws.close_code == code, text[:40]
                assert reason in (ws.close_reason or ""), (text[:40], ws.close_reason)
        # Mid-call: HANGUP, then the socket closes with the reason.
        async with FakeAsterisk(url, form="json") as broken:
            await broken.wait_media()
            await broken.send_text("{not json")
            await broken.wait_command("HANGUP")
            await broken.wait_until("the socket to close", lambda: broken.closed)
        broken_call = await ended_call(server, broken.channel_id)
        assert broken_call["end_reason"].startswith("protocol error: control message is not")
        # The first call never noticed.
        await good.wait_until(
            "the greeting to be committed",
            lambda: GREETING in live_committed(server, good.channel_id),
        )
        assert not good.closed
    call = await ended_call(server, good.channel_id)
    assert messages(call, "assistant") == [GREETING]
    assert call["end_reason"] == "caller hung up"


@on_module_loop
async def test_refused_call_gets_hangup_and_try_again_later(server: VoiceServer) -> None:
    asked: list[str] = []

    def admit(where: str) -> str | None:
        asked.append(where)
        return "too many calls"

    ws_server, address = await _serve(server, admit)
    try:
        caller = FakeAsterisk(address, form="plain-text")
        async with caller:
            await caller.wait_until("the socket to close", lambda: caller.closed)
        assert caller.commands == [("HANGUP", None)]
        assert (caller.close_code, caller.close_reason) == (1013, "too many calls")
        assert asked == ["/asterisk"]
        assert caller.channel_id not in server.pipelines
    finally:
        ws_server.close()
        await ws_server.wait_closed()

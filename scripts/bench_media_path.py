#!/usr/bin/env python3
"""Media-path CPU benchmark: microseconds of CPU per 20 ms frame per call, three ways.

    .venv/bin/python scripts/bench_media_path.py --calls 100
    .venv/bin/python scripts/bench_media_path.py --only in-process

1. in-process: the media path's own code, no sockets. Inbound: `TwilioStream.receive` of
   Twilio media messages, then `CallPipeline.audio` (G.711 decode, framing, VAD, call core) on
   a real call of the default agent whose greeting has played. Outbound: one 20 ms agent frame
   encoded to mu-law and wrapped by `TwilioStream.media_message`. CPU time of this process
   (`time.process_time_ns`), median of `--repeats` runs of `--frames` frames.
2. whole server: `voice-agent serve` with `--calls` Twilio callers streaming silence in real
   time once every greeting has played; the server process's user + system CPU from /proc
   over `--seconds`. The agents' no-input timeout is raised (see `patient_config`) so that no
   reprompt speech falls in the window.
3. floor: the same callers against a WebSocket server that only `json.loads` each message
   (same `websockets` settings, uvloop). Whole server minus floor is what the server adds to
   the cost of receiving one `websockets` message per frame.

`--only socket`: the media socket alone, in-process. `--calls` connections opened over
loopback, then each fed Twilio media frames straight into `MediaConnection.data_received`, one
frame per read as the kernel hands them over, round-robin, into a call that drops them; beside
it, `websockets`' own sans-I/O parser on the same frames.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import IO, Any

import yaml
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
sys.path.insert(0, str(ROOT))

from voice_agent.agents.registry import AgentRegistry  # noqa: E402
from voice_agent.audio.codec import CarrierFormat  # noqa: E402
from voice_agent.audio.resample import StreamResampler  # noqa: E402
from voice_agent.callers import TwilioClient  # noqa: E402
from voice_agent.engines.stt import SttStream, Transcript  # noqa: E402
from voice_agent.gateways.media_socket import MediaConnection, Message  # noqa: E402
from voice_agent.pipeline.driver import STT_RATE, CallPipeline  # noqa: E402
from voice_agent.server.app import VoiceServer  # noqa: E402
from voice_agent.transports import native, twilio  # noqa: E402

CONFIG = ROOT / "config" / "agents.yaml"
SPEECH = ROOT / "tests" / "fixtures" / "audio" / "joe_book1.ulaw"
FRAME_S = 0.02
FRAME_BYTES = twilio.FRAME_BYTES  # 160 bytes: 20 ms of 8 kHz mu-law
MULAW_SILENCE = b"\xff" * FRAME_BYTES
CARRIER = CarrierFormat("mulaw", twilio.SAMPLE_RATE)
MAX_SIZE = max(twilio.WEBSOCKET_MAX_SIZE, native.WEBSOCKET_MAX_SIZE)  # as VoiceServer.start
READY = "floor server ready"
NO_INPUT_S = 3600  # the served agents' no-input timeout: see patient_config


# ---- in-process ------------------------------------------------------------------------------


class TwilioMessages:
    """The text messages Twilio sends on a Media Stream, numbered as Twilio numbers them."""

    def __init__(self, call_sid: str) -> None:
        self.stream_sid = "MZ" + "0" * 31 + "1"
        self.call_sid = call_sid
        self.account_sid = "AC" + "0" * 31 + "1"
        self._sequence = 0
        self._chunk = 0

    def _envelope(self, event: str, **body: Any) -> str:
        self._sequence += 1
        message = {"event": event, "sequenceNumber": str(self._sequence), **body}
        message["streamSid"] = self.stream_sid
        return json.dumps(message, separators=(",", ":"))

    def connected(self) -> str:
        return json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})

    def start(self) -> str:
        start = {
            "accountSid": self.account_sid,
            "streamSid": self.stream_sid,
            "callSid": self.call_sid,
            "tracks": ["inbound"],
            "customParameters": {},
            "mediaFormat": {"encoding": twilio.ENCODING, "sampleRate": 8000, "channels": 1},
        }
        return self._envelope("start", start=start)

    def media(self, ulaw: bytes) -> str:
        self._chunk += 1
        media = {
            "track": "inbound",
            "chunk": str(self._chunk),
            "timestamp": str((self._chunk - 1) * 20),
            "payload": base64.b64encode(ulaw).decode(),
        }
        return self._envelope("media", media=media)


class DiscardOutbound:
    """The pipeline's transport with nothing behind it; keeps the mark names to echo them."""

    def __init__(self) -> None:
        self.marks: list[str] = []

    def audio(self, data: bytes) -> None:
        pass

    def mark(self, name: str) -> None:
        self.marks.append(name)

    def clear(self) -> None:
        pass

    def event(self, payload: dict[str, Any]) -> None:
        pass

    def close(self, code: int, reason: str) -> None:
        pass


class NullSttStream:
    """Takes the 16 kHz audio the pipeline feeds STT and drops it, counting the bytes."""

    def __init__(self, fed: list[int]) -> None:
        self._fed = fed

    def push(self, pcm: bytes) -> None:
        self._fed[0] += len(pcm)

    def partial(self) -> str:
        return ""

    def pause(self) -> None:
        pass

    async def speculation(self) -> str | None:
        return None

    async def finish(self) -> Transcript:
        return Transcript("")

    def cancel(self) -> None:
        pass


class NullStt:
    sample_rate = STT_RATE

    def __init__(self) -> None:
        self.fed = [0]  # bytes of 16 kHz PCM16 pushed, over all streams

    def start(self, sample_rate: int = STT_RATE) -> SttStream:
        return NullSttStream(self.fed)

    async def aclose(self) -> None:
        pass


@dataclass
class Call:
    stream: twilio.TwilioStream
    messages: TwilioMessages
    pipeline: CallPipeline
    outbound: DiscardOutbound


async def open_call(server: VoiceServer, name: str) -> Call:
    """A call of the default agent, set up as /twilio does, once its greeting has played."""
    stream, messages, outbound = twilio.TwilioStream(), TwilioMessages(name), DiscardOutbound()
    stream.receive(messages.connected())
    (start,) = stream.receive(messages.start())
    assert isinstance(start, twilio.Start)
    pipeline = await server.start_call(
        transport="twilio",
        agent=start.agent,
        args=start.agent_args,
        call_id=start.call_id,
        carrier=CARRIER,
        out=outbound,
    )
    await pipeline.start()
    # The greeting is synthesised sentence by sentence, each sent with a mark; echo the marks
    # (the caller heard it all) until no new one has come for a while.
    echoed, quiet_since = 0, time.monotonic()
    while pipeline.core.agent_busy or not outbound.marks or time.monotonic() - quiet_since < 0.3:
        if len(outbound.marks) > echoed:
            for name in outbound.marks[echoed:]:
                pipeline.mark(name)
            echoed, quiet_since = len(outbound.marks), time.monotonic()
        await asyncio.sleep(0.01)
    assert not pipeline.core.playback.playing, "the greeting is still playing"
    return Call(stream, messages, pipeline, outbound)


def feed(call: Call, texts: list[str]) -> None:
    """What the /twilio driver (gateways/carrier_call.py) does with each message, minus the
    socket."""
    stream, pipeline = call.stream, call.pipeline
    for text in texts:
        for event in stream.receive(text):
            if isinstance(event, twilio.Media):
                pipeline.audio(event.payload)


def timed(run: Callable[[], object]) -> tuple[int, int]:
    """(CPU ns, wall ns) of one run. CPU is the whole process's, every thread included."""
    cpu, wall = time.process_time_ns(), time.perf_counter_ns()
    run()
    return time.process_time_ns() - cpu, time.perf_counter_ns() - wall


@dataclass(frozen=True)
class Figure:
    cpu_us: float  # median over the repeats, per frame
    wall_us: float

    def __str__(self) -> str:
        return f"{self.cpu_us:6.1f} us  (wall {self.wall_us:.1f})"

    def __add__(self, other: Figure) -> Figure:
        return Figure(self.cpu_us + other.cpu_us, self.wall_us + other.wall_us)

    def __sub__(self, other: Figure) -> Figure:
        return Figure(self.cpu_us - other.cpu_us, self.wall_us - other.wall_us)


def per_frame(samples: list[tuple[int, int]], frames: int) -> Figure:
    return Figure(
        statistics.median(cpu for cpu, _ in samples) / frames / 1000,
        statistics.median(wall for _, wall in samples) / frames / 1000,
    )


def cycle(frames: list[bytes], count: int) -> list[bytes]:
    return [frames[i % len(frames)] for i in range(count)]


def inbound(call: Call, payloads: list[bytes], repeats: int) -> Figure:
    samples = []
    for _ in range(repeats):
        texts = [call.messages.media(p) for p in payloads]  # built outside the timed part
        samples.append(timed(partial(feed, call, texts)))
    return per_frame(samples, len(payloads))


def outbound(call: Call, pcm_frames: list[bytes], repeats: int) -> Figure:
    stream, encode = call.stream, CARRIER.encode

    def run() -> None:
        for pcm in pcm_frames:
            stream.media_message(encode(pcm))

    return per_frame([timed(run) for _ in range(repeats)], len(pcm_frames))


def resampling(pcm_frames: list[bytes], repeats: int) -> Figure:
    """8 -> 16 kHz of 20 ms frames, as the pipeline does for what it feeds STT."""

    def run() -> None:
        resampler = StreamResampler(twilio.SAMPLE_RATE, STT_RATE)
        for pcm in pcm_frames:
            resampler.process(pcm)

    return per_frame([timed(run) for _ in range(repeats)], len(pcm_frames))


async def in_process(frames: int, repeats: int) -> None:
    speech = SPEECH.read_bytes()
    speech_frames = [
        speech[i : i + FRAME_BYTES] for i in range(0, len(speech) - FRAME_BYTES + 1, FRAME_BYTES)
    ]
    registry = AgentRegistry.from_file(CONFIG)
    server = VoiceServer(registry, port=0)  # never started: only its calls and engines are used
    try:
        # One call per input, so neither sees the other's turn state. Nothing yields to the
        # event loop while frames are fed, so no timer (the no-input reprompt) fires meanwhile.
        quiet = await open_call(server, "CAbenchsilence")
        silence_in = inbound(quiet, [MULAW_SILENCE] * frames, repeats)
        agent_pcm = cycle([CARRIER.decode(f) for f in speech_frames], frames)
        out = outbound(quiet, agent_pcm, repeats)

        # Speech opens STT streams; a no-op STT keeps the recogniser out of the figure. The
        # pipeline still resamples every frame it hands STT to 16 kHz: measured on its own
        # below and subtracted for the figure without STT feeding.
        talker = await open_call(server, "CAbenchspeech")
        null_stt = NullStt()
        talker.pipeline.engines = replace(talker.pipeline.engines, stt=null_stt)
        speech_in = inbound(talker, cycle(speech_frames, frames), repeats)
        fed_frames = null_stt.fed[0] / (STT_RATE * 2 * FRAME_S) / repeats
        fed_share = fed_frames / frames
        resample = resampling(agent_pcm, repeats)
        feeding = Figure(resample.cpu_us * fed_share, resample.wall_us * fed_share)
        for call in (quiet, talker):
            await call.pipeline.hang_up("benchmark done")
    finally:
        await registry.aclose()

    print(
        f"in-process, per 20 ms frame, CPU time (median of {repeats} x {frames} frames; "
        "wall-clock in brackets):"
    )
    print("  inbound = TwilioStream.receive + CallPipeline.audio (decode, framing, VAD, core)")
    print("  outbound = mu-law encode of 20 ms of PCM16 + TwilioStream.media_message")
    print(f"  silence  inbound                               {silence_in}")
    print(f"           outbound                              {out}")
    print(f"           sum                                   {silence_in + out}")
    print(
        f"  speech   inbound, STT a no-op                  {speech_in}"
        f"  ({fed_share:.0%} of frames fed to STT)"
    )
    print(f"           of which 8 -> 16 kHz for STT          {feeding}")
    print(f"           inbound without STT feeding           {speech_in - feeding}")
    print(f"           sum without STT feeding               {speech_in - feeding + out}")
    print("  (speech input: tests/fixtures/audio/joe_book1.ulaw in 160-byte frames, looped;")
    print("   STT's own work, pocketsphinx decoding, is in none of these figures)")


# ---- in-process: the media socket ------------------------------------------------------------


def _dropped(message: Message) -> None:
    pass


async def socket_reading(frames: int, repeats: int, calls: int) -> None:
    opened: list[MediaConnection] = []
    all_open = asyncio.Event()

    def hold(connection: ServerConnection, request: Request) -> Response | None:
        assert isinstance(connection, MediaConnection)
        connection.hold_messages(MAX_SIZE)
        return None

    async def handler(ws: ServerConnection) -> None:
        assert isinstance(ws, MediaConnection)
        ws.deliver_to(_dropped)
        opened.append(ws)
        if len(opened) == calls:
            all_open.set()
        await ws.wait_closed()

    messages = TwilioMessages("CAbenchsocket")
    wire = [  # a pool of distinct frames (their own mask keys), reused
        Frame(Opcode.TEXT, messages.media(MULAW_SILENCE).encode()).serialize(mask=True)
        for _ in range(2000)
    ]

    def media_socket() -> None:
        order = [(opened[i % calls].data_received, wire[i % len(wire)]) for i in range(frames)]
        cpu = time.process_time_ns()  # the order of reads is built outside the timed part
        for receive, data in order:
            receive(data)
        timings.append(time.process_time_ns() - cpu)

    def websockets_parser() -> None:
        parsers = [ServerProtocol(max_size=MAX_SIZE, state=State.OPEN) for _ in range(calls)]
        order = [(parsers[i % calls], wire[i % len(wire)]) for i in range(frames)]
        cpu = time.process_time_ns()
        for parser, data in order:
            parser.receive_data(data)
            parser.events_received()
        timings.append(time.process_time_ns() - cpu)

    async with serve(
        handler,
        "127.0.0.1",
        0,
        process_request=hold,
        create_connection=MediaConnection,
        max_size=MAX_SIZE,
        compression=None,
        ping_interval=None,
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        url = f"ws://127.0.0.1:{port}/twilio"
        clients = [await connect(url, ping_interval=None) for _ in range(calls)]
        await asyncio.wait_for(all_open.wait(), 30)
        timings: list[int] = []
        for _ in range(repeats):
            media_socket()
        ours = statistics.median(timings) / frames / 1000
        timings.clear()
        for _ in range(repeats):
            websockets_parser()
        theirs = statistics.median(timings) / frames / 1000
        for client in clients:
            await client.close()
    size = len(wire[0])
    print(f"the media socket in-process, {calls} connections, {size}-byte Twilio media frames")
    print(f"(CPU time, median of {repeats} x {frames} frames):")
    print(f"  MediaConnection.data_received, one frame a read     {ours:6.2f} us")
    print(f"  websockets' sans-I/O parser on the same frames      {theirs:6.2f} us")


# ---- over sockets ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def drain(pipe: IO[bytes]) -> None:
    for _ in pipe:  # keep the child's log from filling the pipe and blocking it
        pass


def launch(argv: list[str], ready: bytes) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    try:
        for line in process.stdout:
            if ready in line:
                break
        else:
            raise RuntimeError(f"{argv[0]} exited before it was ready")
    except BaseException:
        stop(process)
        raise
    threading.Thread(target=drain, args=(process.stdout,), daemon=True).start()
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


@dataclass(frozen=True)
class Load:
    us_per_frame: float
    cpu_share: float  # of one core
    pace: float  # frames the callers sent / frames real time asks for
    seconds: float
    spoke: int  # callers that got audio during the window (a reprompt): should be 0


async def measure(url: str, pid: int, calls: int, seconds: float, *, greeting: bool) -> Load:
    loop = asyncio.get_running_loop()
    stamp = time.time()
    callers = [
        TwilioClient(f"{url}/twilio", call_sid=f"CAmedia{i}x{stamp}", timeout=120)
        for i in range(calls)
    ]
    try:
        await asyncio.gather(*(c.connect() for c in callers))
        if greeting:
            await asyncio.gather(*(c.wait_silence_after_audio(300) for c in callers))
        else:
            await asyncio.sleep(1)  # past the handshakes
        before, started = cpu_seconds(pid), loop.time()
        await asyncio.sleep(seconds)
        used, ended = cpu_seconds(pid) - before, loop.time()
    finally:
        await asyncio.gather(*(c.stop() for c in callers), return_exceptions=True)
    elapsed = ended - started
    sent = sum(1 for c in callers for at in c.sent_at if started <= at < ended)
    spoke = sum(1 for c in callers if any(started <= f.received_at < ended for f in c.frames))
    return Load(
        used / sent * 1e6 if sent else float("nan"),
        used / elapsed,
        sent / (calls * elapsed / FRAME_S),
        elapsed,
        spoke,
    )


def describe(load: Load) -> str:
    text = (
        f"{load.us_per_frame:6.1f} us per frame per call  ({load.cpu_share:.0%} of a core, "
        f"{load.seconds:.1f} s, callers at {load.pace:.0%} of real-time pace)"
    )
    if load.spoke:
        text += f"  WARNING: {load.spoke} callers got agent audio during the window"
    return text


def patient_config(folder: Path) -> Path:
    """config/agents.yaml with every agent's no-input timeout at NO_INPUT_S, written to `folder`.

    With the agent's own 8 s, the window would have to end 8 s after the first caller's
    greeting played, or the no-input reprompt (speech to synthesise and send, not the silent
    media path) would be in it. With 100 calls on 2 cores the greetings finish up to 6 s apart,
    which leaves no window; the timeout is a timer only, nothing in the per-frame path.
    """
    data = yaml.safe_load(CONFIG.read_text())
    for agent in data["agents"].values():
        agent["no_input_timeout_s"] = NO_INPUT_S
        for key in ("functions", "intents"):  # relative to the config file's folder
            if key in agent:
                agent[key] = str(CONFIG.parent / agent[key])
    path = folder / "agents.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


async def over_sockets(calls: int, seconds: float, only: str) -> None:
    server_load = floor_load = None
    if only in ("all", "server"):
        port = free_port()
        with tempfile.TemporaryDirectory() as folder:
            process = launch(
                [
                    str(ROOT / ".venv" / "bin" / "voice-agent"),
                    "serve",
                    "--config",
                    str(patient_config(Path(folder))),
                    "--port",
                    str(port),
                ],
                b"serving agent",
            )
            try:
                server_load = await measure(
                    f"ws://127.0.0.1:{port}", process.pid, calls, seconds, greeting=True
                )
            finally:
                stop(process)
        print(f"whole server, voice-agent serve, {calls} calls streaming silence:")
        print(f"  {describe(server_load)}")
    if only in ("all", "floor"):
        port = free_port()
        process = launch(
            [sys.executable, str(SCRIPT), "--floor-server", str(port)],
            READY.encode(),
        )
        try:
            floor_load = await measure(
                f"ws://127.0.0.1:{port}", process.pid, calls, seconds, greeting=False
            )
        finally:
            stop(process)
        print(f"floor, a websockets server that only json.loads each message, {calls} calls:")
        print(f"  {describe(floor_load)}")
    if server_load is not None and floor_load is not None:
        added = server_load.us_per_frame - floor_load.us_per_frame
        print(f"whole server minus floor: {added:6.1f} us per frame per call")


# ---- the floor server ------------------------------------------------------------------------


async def floor_server(port: int) -> None:
    """A WebSocket server set up as VoiceServer's, that parses each message and does no more."""

    async def handler(ws: ServerConnection) -> None:
        async for message in ws:
            json.loads(message)

    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    async with serve(handler, "127.0.0.1", port, max_size=MAX_SIZE, compression=None):
        print(READY, flush=True)
        await stopped.wait()


# ---- main ------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> None:
    if args.only in ("all", "in-process"):
        await in_process(args.frames, args.repeats)
    if args.only in ("all", "socket"):
        await socket_reading(args.frames * 5, args.repeats, args.calls)
    if args.only in ("all", "server", "floor"):
        await over_sockets(args.calls, args.seconds, args.only)


def run(coro: Any) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)  # as `voice-agent serve` runs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only", choices=("all", "in-process", "socket", "server", "floor"), default="all"
    )
    parser.add_argument("--frames", type=int, default=20_000, help="in-process frames per run")
    parser.add_argument("--repeats", type=int, default=7, help="in-process runs (median)")
    parser.add_argument("--calls", type=int, default=100, help="callers for server and floor")
    parser.add_argument(
        "--seconds",
        type=float,
        default=5,
        help="CPU window, once every greeting has played (server) or 1 s after connecting (floor)",
    )
    parser.add_argument("--floor-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.floor_server is not None:
        run(floor_server(arguments.floor_server))
    else:
        run(main(arguments))

#!/usr/bin/env python3
"""Load test: N concurrent Twilio-like callers hold real conversations with the voice server.

    .venv/bin/python scripts/loadtest.py --calls 20,50,100 --mode hosted   # starts what it needs
    .venv/bin/python scripts/loadtest.py --calls 5 --mode embedded
    .venv/bin/python scripts/loadtest.py --url ws://127.0.0.1:8765 --calls 10   # a running server

Each caller is `voice_agent.callers.TwilioClient` (`NativeClient` with `--transport ws`): 20 ms
frames in real time, the agent's audio played out on a clock, marks echoed once played, the
queue flushed on `clear`. It plays the booking, change and cancel conversations of the audio
fixtures (voice joe), a new call after each, until `--duration` is over; with think times and
pauses (some with a cough), and in a share of calls a barge-in, a backchannel while the agent
speaks, or a silence long enough for the agent's no-input prompt. Calls start spread over
`--ramp`; with a list (`--calls 10,50,100`) the levels run one after the other. One unmeasured
call warms the server up first (`--no-warm-up` skips it).

Measured per level:
- per turn, caller speech end -> first agent audio received (client side), and the server's
  own breakdown from GET /calls/{id} (`turns`): STT, agent, TTS, send;
- per barge-in, caller speech start -> `clear` received (min_interruption_ms is part of it),
  and how much agent audio the caller still heard over its own speech after the clear;
- late frames: agent audio that arrived more than 40 ms after the audio before it, in the same
  utterance, had finished playing (the caller heard a gap);
- failed, dropped and refused calls, unanswered turns;
- every second from /proc: CPU (100% = one core), time spent waiting for a CPU, RSS and open
  files of the server's process tree, the stand-in and this script, and the machine's CPU; the
  server's event-loop lag (/healthz), this script's own and how late it sent its frames. The
  load generator shares the machine: when it falls behind, the level's numbers say so.

`--mode hosted` (the script starts the server): STT and TTS go through their `openai` providers
to scripts/standin_engines.py, started here too, which answers with the fixtures' transcripts
and speech-like audio after fixed delays: the latency beyond those delays is the server's own.
The default agent is a flow and needs no LLM; with `--agent concierge` the LLM goes to the
stand-in too. `--mode embedded`: the config's own engines (pocketsphinx, eSpeak NG). With
`--url` the running server's config decides; /proc figures then need it on this machine (its
pid comes from /healthz, or `--server-pid`).

Results: a JSON file and a PNG plot (latency percentiles and CPU against concurrent calls;
needs matplotlib) in loadtest-results/, or where `--out` says.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import itertools
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np
import yaml
from websockets.exceptions import ConnectionClosed, InvalidHandshake

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from voice_agent.audio.wav import read_wav  # noqa: E402
from voice_agent.callers import NativeClient, ReceivedAudio, TwilioClient  # noqa: E402
from voice_agent.config import load_config  # noqa: E402

T = TypeVar("T")

AUDIO = ROOT / "tests" / "fixtures" / "audio"
RESULTS = ROOT / "loadtest-results"
DEFAULT_CONFIG = ROOT / "config" / "agents.yaml"
VOICE = "joe"  # the fixture voice the embedded STT recognises best
# Half the calls book: change and cancel then find a booking to work on.
CONVERSATION_CYCLE = ("book", "change", "book", "cancel")
LATE_FRAME_S = 0.040
TRY_AGAIN_LATER = 1013  # the server's admission control refusing a call
SPEECH_DBFS = -45.0  # where a fixture's speech starts and ends, for its lead and tail
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


# ---- statistics --------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile, as scripts/bench_latency.py reports them."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float | int | None]:
    def r(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {
        "n": len(values),
        "p50": r(percentile(values, 50)),
        "p90": r(percentile(values, 90)),
        "p95": r(percentile(values, 95)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values)) if values else None,
        "mean": r(sum(values) / len(values)) if values else None,
    }


def _fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


# ---- /proc -------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, RSS bytes) of one process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return int(fields[1]), cpu, int(fields[21]) * PAGE_SIZE


def _run_queue_wait(pid: int) -> float:
    """Seconds the process's threads have waited for a CPU while runnable (schedstat): on a
    shared machine, what tells a starved server from a blocked one."""
    total = 0.0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[1])
    return total / 1e9


def process_tree(root: int) -> list[int]:
    """`root` and its descendants: the server's STT workers count as the server."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        if Path(f"/proc/{pid}").exists():
            tree.append(pid)
            todo.extend(children.get(pid, []))
    return tree


class ProcWatch:
    """CPU share between two samples, RSS and open files of a process and its descendants."""

    def __init__(self, pid: int, *, tree: bool = True) -> None:
        self.pid = pid
        self.tree = tree
        self._last: tuple[float, float, float] | None = None

    def sample(self) -> dict[str, float | int | None] | None:
        pids = process_tree(self.pid) if self.tree else [self.pid]
        cpu, rss, fds, waited = 0.0, 0, 0, 0.0
        for pid in pids:
            stat = _stat(pid)
            if stat is None:
                continue
            cpu += stat[1]
            rss += stat[2]
            waited += _run_queue_wait(pid)
            with contextlib.suppress(OSError):
                fds += len(os.listdir(f"/proc/{pid}/fd"))
        if not pids:
            return None
        now = time.monotonic()
        share = wait_share = None
        if self._last is not None and now > self._last[0]:
            elapsed = now - self._last[0]
            # A worker that exited takes its CPU time with it: never report a negative share.
            share = max(0.0, (cpu - self._last[1]) / elapsed * 100)
            wait_share = max(0.0, (waited - self._last[2]) / elapsed * 100)
        self._last = (now, cpu, waited)
        return {
            "cpu_pct": share,
            "cpu_wait_pct": wait_share,
            "rss_mb": rss / 2**20,
            "fds": fds,
            "processes": len(pids),
        }


class MachineWatch:
    """The whole machine's busy CPU, in the same unit (100% = one core)."""

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None

    def sample(self) -> float | None:
        try:
            values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except OSError:
            return None
        idle = values[3] + values[4]  # idle + iowait
        total = sum(values[:8])  # guest time is already in user
        share = None
        if self._last is not None and total > self._last[1]:
            busy = (total - self._last[1]) - (idle - self._last[0])
            share = busy / (total - self._last[1]) * 100 * (os.cpu_count() or 1)
        self._last = (idle, total)
        return share


# ---- fixtures and plans ------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One fixture as the caller sends it, with where its speech starts and ends."""

    name: str
    audio: bytes
    seconds: float
    lead_s: float  # silence before the speech
    trail_s: float  # silence after it


def _speech_bounds(pcm16k: bytes) -> tuple[float, float]:
    samples = np.frombuffer(pcm16k, dtype="<i2").astype(np.float64) / 32768.0
    frames = len(samples) // 160  # 10 ms
    power = (samples[: frames * 160].reshape(frames, 160) ** 2).mean(axis=1)
    loud = np.nonzero(10 * np.log10(power + 1e-12) > SPEECH_DBFS)[0]
    if not len(loud):
        return 0.0, 0.0
    return loud[0] * 0.01, (frames - loud[-1] - 1) * 0.01


def load_lines(transport: str) -> dict[str, Line]:
    """Every fixture of VOICE plus the cough, in the transport's audio format."""
    manifest = json.loads((AUDIO / "manifest.json").read_text())
    lines = {}
    for item in manifest["files"]:
        if item["voice"] != VOICE and item["name"] != "cough":
            continue
        pcm, _ = read_wav(AUDIO / item["wav"])
        lead, trail = _speech_bounds(pcm)
        # Twilio: the 8 kHz mu-law file as it is; native /ws: 16 kHz PCM16, the protocol's default.
        audio = (AUDIO / item["ulaw"]).read_bytes() if transport == "twilio" else pcm
        lines[item["name"]] = Line(item["name"], audio, item["seconds"], lead, trail)
    return lines


def conversations() -> dict[str, list[str]]:
    manifest = json.loads((AUDIO / "manifest.json").read_text())
    return {kind: list(steps) for kind, steps in manifest["conversations"][VOICE].items()}


def _spread(number: int, share: float, phase: float) -> bool:
    """True for `share` of consecutive numbers, evenly spread: a small run gets its share too."""
    return math.floor((number + 1) * share + phase) > math.floor(number * share + phase)


@dataclass
class Plan:
    """What one call does besides saying its lines: decided up front, reproducible by --seed."""

    kind: str
    steps: list[str]
    barge_in_at: int | None = None  # this step's line interrupts the reply before it
    backchannel_at: int | None = None  # a backchannel during the reply before this step
    long_silence_at: int | None = None  # silence past the no-input timeout before this step
    pauses: set[int] = field(default_factory=set)
    coughs: set[int] = field(default_factory=set)


def make_plan(number: int, args: argparse.Namespace, lines: dict[str, Line]) -> Plan:
    rng = random.Random(args.seed * 1_000_003 + number)
    kind = CONVERSATION_CYCLE[number % len(CONVERSATION_CYCLE)]
    steps = conversations()[kind]
    spoken = [i for i, step in enumerate(steps) if not step.startswith("/")]
    # A barge-in needs a line long enough to still be speaking when the clear comes.
    long_lines = [i for i in spoken if lines[steps[i]].seconds >= 1.4]
    plan = Plan(kind, steps)
    taken: set[int] = set()

    def pick(candidates: list[int]) -> int | None:
        free = [i for i in candidates if i not in taken]
        if not free:
            return None
        choice = rng.choice(free)
        taken.add(choice)
        return choice

    # Different phases, so that at small shares the behaviours fall on different calls.
    if _spread(number, args.barge_in_share, 0.5):
        # Callers cut into the long greeting most of all: half the barge-ins go there.
        first = spoken[0]
        if first in long_lines and rng.random() < 0.5:
            plan.barge_in_at = pick([first])
        else:
            plan.barge_in_at = pick(long_lines)
    if _spread(number, args.backchannel_share, 0.25):
        plan.backchannel_at = pick(spoken)
    if _spread(number, args.long_silence_share, 0.75):
        plan.long_silence_at = pick(spoken)
    for index in spoken:
        if index not in taken and rng.random() < args.pause_share:
            plan.pauses.add(index)
            if rng.random() < 0.3:
                plan.coughs.add(index)
    return plan


# ---- one call ----------------------------------------------------------------------------


@dataclass
class Turn:
    kind: str  # "line", or "barge_in" when the line interrupted the agent
    line: str
    t: float  # seconds into the level when the caller's speech ended
    live: int  # calls connected then
    latency_ms: float | None = None  # caller speech end -> first agent audio received
    clear_ms: float | None = None  # barge-in: caller speech start -> clear received
    first_unit_ms: float | None = None  # the reply's audio before its first mark
    talk_over_ms: float | None = None  # barge-in: agent audio played after the clear while
    # the caller was still speaking
    reply_at: float | None = field(default=None, repr=False)


@dataclass
class CallResult:
    number: int
    kind: str
    call_id: str | None = None
    outcome: str = "failed"  # completed, ended_by_agent, hung_up_at_end, refused, dropped, failed
    error: str | None = None
    close_code: int | None = None
    greeting_ms: float | None = None  # connected -> first audio of the greeting
    turns: list[Turn] = field(default_factory=list)
    dtmf_ms: list[float] = field(default_factory=list)
    unanswered: int = 0
    barge_ins_skipped: int = 0  # the reply was over before the planned barge-in point
    missed_clears: int = 0  # barged in, no clear came
    backchannels: int = 0
    backchannel_clears: int = 0  # ... that made the server clear the agent's audio
    backchannel_resumed: int = 0  # ... after which the agent went on
    reprompts: int = 0  # the agent's no-input prompt after a long silence
    coughs: int = 0
    cough_replies: int = 0  # the agent said something after a cough
    frames: int = 0
    late_frames: int = 0
    late_gaps: list[tuple[float, float]] = field(default_factory=list)  # (level time, ms)
    send_lateness_p99_ms: float | None = None  # how far this script's frames fell behind
    send_lateness_max_ms: float | None = None
    protocol_errors: list[str] = field(default_factory=list)
    server_turns: list[dict[str, Any]] = field(default_factory=list)
    server_barge_ins_ms: list[float] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)
    server_false_interruptions: int = 0


class LevelOver(Exception):
    """The level's duration is over: the caller hangs up where it is."""


class NoGreeting(Exception):
    pass


def audio_gaps(
    frames: list[ReceivedAudio], cuts: list[float], threshold: float = LATE_FRAME_S
) -> list[tuple[float, float]]:
    """Playback gaps over `threshold` inside utterances: (when the late frame came, seconds).

    A frame is late when it arrives after the audio before it finished playing: the caller's
    playout ran dry. Whether the server sends in real time (each frame due as the last one
    ends) or in bursts, that is the gap a caller hears. `cuts` (a caller action or a clear
    between two frames) start a new utterance: the silence before a reply is no gap.
    """
    gaps = []
    cut_index = 0
    for previous, frame in itertools.pairwise(frames):
        while cut_index < len(cuts) and cuts[cut_index] <= previous.received_at:
            cut_index += 1
        if cut_index < len(cuts) and cuts[cut_index] <= frame.received_at:
            continue
        if previous.cut_at is not None:
            continue
        gap = frame.received_at - previous.play_end
        if gap > threshold:
            gaps.append((frame.received_at, gap))
    return gaps


class _TimedMarks:
    """Keeps when each of the server's marks arrived, echoed yet or not (a reply's first unit
    of audio ends at its mark)."""

    mark_times: list[float]

    def _add_mark(self, name: str, now: float) -> None:
        self.mark_times.append(now)
        super()._add_mark(name, now)  # type: ignore[misc]


class LoadTwilioClient(_TimedMarks, TwilioClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mark_times = []


class LoadNativeClient(_TimedMarks, NativeClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mark_times = []


def new_client(run: Run, number: int) -> LoadTwilioClient | LoadNativeClient:
    # Safety net only: every wait of the callers has its own, shorter bound.
    timeout = 60.0
    if run.args.transport == "twilio":
        sid = f"{run.run_id}{number:010d}"
        params = {"agent": run.args.agent} if run.args.agent else {}
        return LoadTwilioClient(
            run.ws_url("/twilio"),
            call_sid=f"CA{sid}",
            stream_sid=f"MZ{sid}",
            custom_parameters=params,
            timeout=timeout,
        )
    return LoadNativeClient(run.ws_url("/ws"), agent=run.args.agent, timeout=timeout)


class SimulatedCall:
    def __init__(self, level: Level, plan: Plan, number: int) -> None:
        self.level = level
        self.run_ctx = level.run
        self.args = level.run.args
        self.plan = plan
        self.rng = random.Random(self.args.seed * 7919 + number)
        self.result = CallResult(number, plan.kind)
        self.boundaries: list[float] = []  # caller actions: each starts a new agent utterance
        self._scan = 0  # frames before this index are older than any reply still awaited
        self._reply_frame: ReceivedAudio | None = None  # first frame of the latest reply
        self.client = new_client(level.run, number)

    def now(self) -> float:
        return self.client.clock.now()

    # -- waiting, bounded by the level's end -------------------------------------------------

    async def _stoppable(self, awaitable: Awaitable[T]) -> T:
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.level.stopped.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise LevelOver
        return task.result()

    def _check_stop(self) -> None:
        if self.level.stopped.is_set():
            raise LevelOver

    async def _sleep(self, seconds: float) -> None:
        await self._stoppable(asyncio.sleep(max(0.0, seconds)))

    async def _quiet(self, ms: float) -> None:
        """Until the agent's audio has played and `ms` of silence followed."""
        await self._stoppable(self.client.wait_silence_after_audio(ms))

    async def _reply(
        self, after: float, within: float | None = None, *, stoppable: bool = True
    ) -> ReceivedAudio | None:
        """The first frame of agent audio received after `after`; None if none comes in time.

        Not `stoppable`: a turn already spoken is measured even if the level ends meanwhile.
        """
        frames = self.client.frames

        def found() -> ReceivedAudio | None:
            while self._scan < len(frames) and frames[self._scan].received_at <= after:
                self._scan += 1
            return frames[self._scan] if self._scan < len(frames) else None

        try:
            async with asyncio.timeout(within or self.args.reply_timeout):
                waiting = self.client.wait_until(found, "the agent's reply")
                return await (self._stoppable(waiting) if stoppable else waiting)
        except TimeoutError:
            return None

    def _think_ms(self) -> float:
        return self.rng.uniform(400, 1200)

    # -- the call --------------------------------------------------------------------------

    async def run(self) -> CallResult:
        result = self.result
        client = self.client
        connected = False
        try:
            try:
                await client.connect()
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                result.outcome = "refused" if code == TRY_AGAIN_LATER else "failed"
                result.close_code = code
                result.error = f"connect: {exc}"
                return result
            except (OSError, TimeoutError, InvalidHandshake, ConnectionError) as exc:
                result.error = f"connect: {type(exc).__name__}: {exc}"
                return result
            connected = True
            self.level.live += 1
            result.call_id = client.call_sid if isinstance(client, TwilioClient) else client.call_id
            await self._greeting()
            for index, step in enumerate(self.plan.steps):
                await self._step(index, step)
            await self._end_of_script()
            result.outcome = "completed"
        except LevelOver:
            result.outcome = "hung_up_at_end"
        except NoGreeting as exc:
            result.outcome = self._closed_outcome() if client.closed else "failed"
            result.error = str(exc)
        except (ConnectionError, ConnectionClosed) as exc:
            result.outcome = self._closed_outcome()
            if result.outcome != "ended_by_agent":
                result.error = f"{type(exc).__name__}: {exc}"[:300]
        except Exception as exc:
            result.outcome = "failed"
            result.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            if connected:
                self.level.live -= 1
                with contextlib.suppress(Exception):
                    await client.stop()
                result.close_code = client.close_code
                self._analyse()
        if result.call_id is not None:
            await self._fetch_server_record()
        return result

    def _closed_outcome(self) -> str:
        code = self.client.close_code
        if code == TRY_AGAIN_LATER:
            return "refused"
        if code == 1000:  # the agent ended the call (its goodbye), before the script did
            return "ended_by_agent"
        return "dropped"

    async def _greeting(self) -> None:
        connected_at = self.now()
        frame = await self._reply(connected_at, max(self.args.reply_timeout, 10.0))
        if frame is None:
            raise NoGreeting("no greeting from the agent")
        self.result.greeting_ms = (frame.received_at - connected_at) * 1000
        self._reply_frame = frame

    async def _step(self, index: int, step: str) -> None:
        if step.startswith("/dtmf"):
            await self._quiet(self._think_ms())
            self._check_stop()
            self.boundaries.append(self.now())
            sent = self.now()
            await self.client.send_dtmf(step.split()[1])
            frame = await self._reply(sent)
            if frame is None:
                self.result.unanswered += 1
            else:
                self.result.dtmf_ms.append((frame.received_at - sent) * 1000)
                self._reply_frame = frame
            return
        line = self.run_ctx.lines[step]
        if index == self.plan.backchannel_at:
            await self._backchannel()
        barge = False
        if index == self.plan.barge_in_at:
            barge = await self._mid_reply()
            if not barge:
                self.result.barge_ins_skipped += 1
        if not barge:
            if index == self.plan.long_silence_at:
                await self._long_silence()
            elif index in self.plan.pauses:
                await self._pause(cough=index in self.plan.coughs)
            else:
                await self._quiet(self._think_ms())
        self._check_stop()
        await self._say(line, barge=barge)

    async def _say(self, line: Line, *, barge: bool) -> None:
        client = self.client
        started = self.now()
        self.boundaries.append(started)
        clears_before = len(client.clears)
        await client.send_audio(line.audio)
        # send_audio returns as the last frame goes out: in real time, the line's last sample.
        finished = self.now()
        # What the agent sent while the caller spoke is one utterance, the answer another.
        self.boundaries.append(finished)
        speech_end = finished - line.trail_s
        speech_start = started + line.lead_s
        turn = Turn(
            "barge_in" if barge else "line",
            line.name,
            self.level.elapsed(),
            self.level.live,
        )
        after = speech_end
        if barge:
            clear = None
            if len(client.clears) > clears_before:
                clear = client.clears[clears_before]
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.args.reply_timeout):
                        clear = await client.wait_clear(clears_before + 1)
            if clear is None:
                self.result.missed_clears += 1
            else:
                turn.clear_ms = (clear.at - speech_start) * 1000
                # Audio sent before the clear is the interrupted reply, not the answer.
                after = max(after, clear.at)
                # Agent audio played after the clear while the caller still spoke: the server
                # resumed the interrupted reply over the caller.
                turn.talk_over_ms = 1000 * sum(
                    max(0.0, min(f.play_end, f.cut_at or f.play_end, finished) - f.play_start)
                    for f in client.frames
                    if f.received_at > clear.at and f.play_start < finished
                )
        frame = await self._reply(after, stoppable=False)
        self.result.turns.append(turn)
        if frame is None:
            self.result.unanswered += 1
            return
        turn.latency_ms = (frame.received_at - speech_end) * 1000
        turn.reply_at = frame.received_at
        self.level.live_latencies.append(turn.latency_ms)
        self._reply_frame = frame

    async def _mid_reply(self) -> bool:
        """Wait until some way into the agent's current reply; False if it is already over."""
        frame = self._reply_frame
        if frame is None:
            return False
        await self._sleep(frame.play_start + self.rng.uniform(0.6, 1.5) - self.now())
        return self.client.playback_end - self.now() >= 0.4

    async def _backchannel(self) -> None:
        if not await self._mid_reply():
            return
        client = self.client
        line = self.run_ctx.lines[self.rng.choice(self.run_ctx.backchannels)]
        self.boundaries.append(self.now())
        clears_before = len(client.clears)
        await client.send_audio(line.audio)
        self.boundaries.append(self.now())
        self.result.backchannels += 1
        # The server may stop the agent and resume once STT says it was a backchannel; wait
        # long enough to see both before the next line.
        await self._quiet(2000)
        if len(client.clears) > clears_before:
            self.result.backchannel_clears += 1
            cleared_at = client.clears[clears_before].at
            if any(f.received_at > cleared_at for f in client.frames[-50:]):
                self.result.backchannel_resumed += 1
            # A new utterance starts after the clear; no gap is counted across it.
            self.boundaries.append(cleared_at)

    async def _long_silence(self) -> None:
        await self._quiet(self._think_ms())
        self._check_stop()
        began = self.now()
        self.boundaries.append(began)
        frame = await self._reply(began, self.run_ctx.no_input_s + 5.0)
        if frame is not None:
            self.result.reprompts += 1
            self._reply_frame = frame
            await self._quiet(self._think_ms())

    async def _pause(self, *, cough: bool) -> None:
        pause_s = self.rng.uniform(2.0, 5.0)
        if not cough:
            await self._quiet(pause_s * 1000)
            return
        await self._quiet(pause_s * 500)
        self._check_stop()
        coughed = self.now()
        self.boundaries.append(coughed)
        await self.client.send_audio(self.run_ctx.lines["cough"].audio)
        self.result.coughs += 1
        await self._sleep(pause_s / 2)
        await self._quiet(300)
        if self.client.frames and self.client.frames[-1].received_at > coughed:
            self.result.cough_replies += 1

    async def _end_of_script(self) -> None:
        """After the last line the agent says goodbye and hangs up; wait for it a while."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(20.0):
                await self._stoppable(self.client.wait_closed())

    # -- after the call ----------------------------------------------------------------------

    def _analyse(self) -> None:
        client, result = self.client, self.result
        frames = client.frames
        result.frames = len(frames)
        cuts = sorted([*self.boundaries, *(clear.at for clear in client.clears)])
        gaps = audio_gaps(frames, cuts)
        result.late_frames = len(gaps)
        result.late_gaps = [
            (round(at - self.level.t0, 2), round(gap * 1000, 1)) for at, gap in gaps
        ]
        result.protocol_errors = list(client.errors[:5])
        marks = client.mark_times
        for turn in result.turns:
            if turn.reply_at is None:
                continue
            # The first unit the server sent (today: the first sentence) ends at its mark.
            mark_at = next((m for m in marks if m >= turn.reply_at), None)
            if mark_at is not None:
                size = sum(len(f.data) for f in frames if turn.reply_at <= f.received_at <= mark_at)
                turn.first_unit_ms = size * 1000 / client.bytes_per_second
        sent = np.asarray(client.sent_at)
        if len(sent) > 1:
            # Frames are due every 20 ms from the first: how late this script sent them.
            lateness = (sent - (sent[0] + np.arange(len(sent)) * 0.02)) * 1000
            result.send_lateness_p99_ms = round(float(np.percentile(lateness, 99)), 1)
            result.send_lateness_max_ms = round(float(lateness.max()), 1)

    async def _fetch_server_record(self) -> None:
        record: dict[str, Any] | None = None
        for _ in range(15):
            try:
                response = await self.run_ctx.http.get(f"/calls/{self.result.call_id}")
            except httpx.HTTPError:
                return
            if response.status_code != 200:
                return
            record = response.json()
            if record.get("ended_at"):
                break
            await asyncio.sleep(0.2)
        if record is None:
            return
        self.result.server_turns = list(record.get("turns") or [])
        for event in record.get("audit") or []:
            kind = event.get("type")
            if kind == "barge_in" and event.get("latency_ms") is not None:
                self.result.server_barge_ins_ms.append(float(event["latency_ms"]))
            elif kind == "error":
                self.result.server_errors.append(
                    f"{event.get('where')}: {event.get('message')}"[:200]
                )
            elif kind == "false_interruption":
                self.result.server_false_interruptions += 1


# ---- a level of concurrency --------------------------------------------------------------


class Level:
    def __init__(self, run: Run, calls: int) -> None:
        self.run = run
        self.calls = calls
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.stopped = asyncio.Event()
        self.live = 0
        self.results: list[CallResult] = []
        self.samples: list[dict[str, Any]] = []
        self.live_latencies: list[float] = []  # as turns happen, for the progress line
        self._loadgen_lag_ms = 0.0

    def elapsed(self) -> float:
        return self.loop.time() - self.t0

    def count(self, outcome: str) -> int:
        return sum(1 for result in self.results if result.outcome == outcome)

    async def caller(self, slot: int) -> None:
        """One line of callers: a call, a short gap, the next call, until the level ends."""
        await asyncio.sleep(self.run.args.ramp * slot / self.calls)
        rng = random.Random(self.run.args.seed * 31 + slot)
        while not self.stopped.is_set():
            number = self.run.next_number()
            plan = make_plan(number, self.run.args, self.run.lines)
            result = await SimulatedCall(self, plan, number).run()
            self.results.append(result)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(rng.uniform(0.5, 2.0)):
                    await self.stopped.wait()

    async def loop_lag_probe(self) -> None:
        """This script's own event-loop lag: late callers measure late."""
        while True:
            before = self.loop.time()
            await asyncio.sleep(0.05)
            lag = (self.loop.time() - before - 0.05) * 1000
            self._loadgen_lag_ms = max(self._loadgen_lag_ms, lag)

    async def sampler(self) -> None:
        run = self.run
        while True:
            await asyncio.sleep(run.args.sample_interval)
            sample: dict[str, Any] = {
                "t": round(self.elapsed(), 2),
                "live_calls": self.live,
                "loadgen_loop_lag_ms": round(self._loadgen_lag_ms, 1),
            }
            self._loadgen_lag_ms = 0.0
            health = await run.health()
            sample["server_loop_lag_ms"] = health.get("loop_lag_ms")
            sample["server_live_calls"] = health.get("live_calls")
            sample["server_refused_calls"] = health.get("refused_calls")
            for name, watch in run.watches().items():
                values = await asyncio.to_thread(watch.sample)
                if values is not None:
                    for key, value in values.items():
                        if key != "processes" or name == "server":
                            sample[f"{name}_{key}"] = (
                                round(value, 1) if isinstance(value, float) else value
                            )
            machine = run.machine.sample()
            sample["machine_cpu_pct"] = None if machine is None else round(machine, 1)
            self.samples.append(sample)
            run.progress(self, sample)

    async def execute(self) -> dict[str, Any]:
        args = self.run.args
        helpers = [
            asyncio.ensure_future(self.loop_lag_probe()),
            asyncio.ensure_future(self.sampler()),
        ]
        callers = [asyncio.ensure_future(self.caller(slot)) for slot in range(self.calls)]
        try:
            await asyncio.sleep(args.duration)
            self.stopped.set()
            # Callers end their current step (a reply awaited at most --reply-timeout).
            _, pending = await asyncio.wait(callers, timeout=args.reply_timeout + 20)
            for task in pending:
                task.cancel()
            await asyncio.gather(*callers, return_exceptions=True)
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            self.run.progress_done()
        return self.summarise()

    # -- the level's numbers ---------------------------------------------------------------

    def summarise(self) -> dict[str, Any]:
        run, args = self.run, self.run.args
        turns = [turn for result in self.results for turn in result.turns]
        answered = [turn for turn in turns if turn.latency_ms is not None]
        latencies = [turn.latency_ms for turn in answered if turn.latency_ms is not None]
        added = [value for turn in answered if (value := run.server_added_ms(turn)) is not None]
        server_turns = [t for result in self.results for t in result.server_turns]

        def stage(end: str, start: str) -> list[float]:
            return [
                t[end] - t[start]
                for t in server_turns
                if t.get(end) is not None and t.get(start) is not None
            ]

        frames = sum(result.frames for result in self.results)
        late = sum(result.late_frames for result in self.results)
        gaps = [gap for result in self.results for _, gap in result.late_gaps]
        # CPU and memory while all calls were up: after the ramp, before the end.
        steady = [s for s in self.samples if args.ramp <= s["t"] <= args.duration] or self.samples

        def series(key: str) -> dict[str, float | int | None]:
            values = [float(s[key]) for s in steady if s.get(key) is not None]
            return {
                "mean": round(sum(values) / len(values), 1) if values else None,
                "max": round(max(values), 1) if values else None,
                "n": len(values),
            }

        lateness = [r.send_lateness_p99_ms for r in self.results if r.send_lateness_p99_ms]
        worst_lateness = [r.send_lateness_max_ms for r in self.results if r.send_lateness_max_ms]
        errors = [
            f"call {r.number} ({r.kind}, {r.outcome}): {r.error}"
            for r in self.results
            if r.error and r.outcome in ("failed", "dropped", "refused")
        ]
        server_errors = [e for r in self.results for e in r.server_errors]
        return {
            "calls": self.calls,
            "duration_s": args.duration,
            "ramp_s": args.ramp,
            "calls_started": len(self.results),
            "outcomes": {
                outcome: self.count(outcome)
                for outcome in (
                    "completed",
                    "ended_by_agent",
                    "hung_up_at_end",
                    "refused",
                    "dropped",
                    "failed",
                )
            },
            "failed_calls": self.count("failed"),
            "dropped_calls": self.count("dropped"),
            "refused_calls": self.count("refused"),
            "errors": errors[:20],
            "protocol_errors": [e for r in self.results for e in r.protocol_errors][:20],
            "turn_count": len(turns),
            "reply_timeout_s": args.reply_timeout,
            "unanswered_turns": sum(r.unanswered for r in self.results),
            "latency_ms": summary(latencies),
            # Unanswered turns counted at the reply timeout: a lower bound once many time out.
            "latency_ms_unanswered_as_timeout": summary(
                latencies + [args.reply_timeout * 1000.0] * (len(turns) - len(answered))
            ),
            "server_added_ms": summary(added),
            "greeting_ms": summary([r.greeting_ms for r in self.results if r.greeting_ms]),
            "dtmf_ms": summary([v for r in self.results for v in r.dtmf_ms]),
            "barge_in_clear_ms": summary([t.clear_ms for t in turns if t.clear_ms is not None]),
            "barge_ins": {
                "done": sum(1 for t in turns if t.kind == "barge_in"),
                "agent_talked_over_caller": sum(1 for t in turns if t.talk_over_ms),
                "talk_over_ms": summary([t.talk_over_ms for t in turns if t.talk_over_ms]),
                "skipped_reply_too_short": sum(r.barge_ins_skipped for r in self.results),
                "no_clear": sum(r.missed_clears for r in self.results),
            },
            "backchannels": {
                "said": sum(r.backchannels for r in self.results),
                "cleared": sum(r.backchannel_clears for r in self.results),
                "resumed": sum(r.backchannel_resumed for r in self.results),
            },
            "long_silences": {
                "reprompts": sum(r.reprompts for r in self.results),
            },
            "coughs": {
                "coughed": sum(r.coughs for r in self.results),
                "agent_replied": sum(r.cough_replies for r in self.results),
            },
            "server": {
                "turns": len(server_turns),
                "speech_end_to_first_audio_ms": summary(
                    [
                        t["speech_end_to_first_audio_ms"]
                        for t in server_turns
                        if t.get("speech_end_to_first_audio_ms") is not None
                    ]
                ),
                "end_of_turn_to_first_audio_ms": summary(
                    stage("first_audio_sent_ms", "end_of_turn_ms")
                ),
                "stages_ms": {
                    "stt": summary(stage("stt_final_ms", "end_of_turn_ms")),
                    "turn_start": summary(stage("user_turn_ms", "stt_final_ms")),
                    "agent": summary(stage("first_token_ms", "user_turn_ms")),
                    "tts": summary(stage("first_tts_audio_ms", "first_token_ms")),
                    "send": summary(stage("first_audio_sent_ms", "first_tts_audio_ms")),
                },
                "barge_in_clear_sent_ms": summary(
                    [v for r in self.results for v in r.server_barge_ins_ms]
                ),
                "false_interruptions": sum(r.server_false_interruptions for r in self.results),
                "errors": len(server_errors),
                "error_examples": server_errors[:10],
            },
            "audio": {
                "frames": frames,
                "late_frames": late,
                "late_frame_rate": round(late / frames, 5) if frames else None,
                "late_gap_ms": summary(gaps),
            },
            "resources": {
                key: series(key)
                for key in (
                    "live_calls",
                    "server_cpu_pct",
                    "server_cpu_wait_pct",
                    "server_rss_mb",
                    "server_fds",
                    "server_loop_lag_ms",
                    "standin_cpu_pct",
                    "loadgen_cpu_pct",
                    "loadgen_cpu_wait_pct",
                    "loadgen_rss_mb",
                    "loadgen_loop_lag_ms",
                    "machine_cpu_pct",
                )
            },
            "loadgen_send_lateness_ms": {
                "p99_mean": round(sum(lateness) / len(lateness), 1) if lateness else None,
                "max": max(worst_lateness) if worst_lateness else None,
            },
            "turns": [{k: v for k, v in asdict(turn).items() if k != "reply_at"} for turn in turns],
            "calls_detail": [
                {
                    "number": r.number,
                    "kind": r.kind,
                    "call_id": r.call_id,
                    "outcome": r.outcome,
                    "close_code": r.close_code,
                    "turns": len(r.turns),
                    "late_frames": r.late_frames,
                    "late_gaps": r.late_gaps,
                    "error": r.error,
                }
                for r in self.results
            ],
            "samples": self.samples,
        }


# ---- the run: servers, levels, output ----------------------------------------------------


def _visible(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _absolute(value: str, base: Path) -> str:
    if "://" in value or Path(value).is_absolute():
        return value
    return str((base / value).resolve())


def server_config(
    source: Path, mode: str, standin_url: str | None, data_dir: Path
) -> dict[str, Any]:
    """The config the script's server runs: `source` with its paths made absolute (the copy
    lives elsewhere), call records in `data_dir`, and in hosted mode every engine and LLM
    pointed at the stand-in."""
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    base = source.parent
    for agent in config.get("agents", {}).values():
        for key in ("functions", "intents"):
            if agent.get(key):
                agent[key] = _absolute(agent[key], base)
        for tool in (agent.get("tools") or {}).values():
            if tool.get("openapi"):
                tool["openapi"] = _absolute(tool["openapi"], base)
        if mode == "hosted":
            assert standin_url is not None
            # An agent's own engines would bypass the stand-in.
            agent.pop("stt", None)
            agent.pop("tts", None)
            agent["llm"] = {**(agent.get("llm") or {}), "base_url": standin_url, "api_key": "x"}
    if mode == "hosted":
        voice = config.setdefault("voice", {})
        voice["stt"] = {
            "provider": "openai",
            "base_url": standin_url,
            "api_key": "loadtest",
            "model": "stand-in-stt",
        }
        voice["tts"] = {
            "provider": "openai",
            "base_url": standin_url,
            "api_key": "loadtest",
            "model": "stand-in-tts",
        }
    config.setdefault("server", {})["data_dir"] = str(data_dir)
    return config


def seed_booking(config_dir: Path, data_dir: Path) -> bool:
    """Put the fixtures' caller's booking in place, so change and cancel calls find one from
    the start. Only for configs with the default agent's bookings_db.py; best effort."""
    module_path = config_dir / "functions" / "bookings_db.py"
    if not module_path.exists():
        return False
    spec = importlib.util.spec_from_file_location("loadtest_bookings_db", module_path)
    if spec is None or spec.loader is None:
        return False
    module = importlib.util.module_from_spec(spec)
    previous = os.environ.get("VOICE_AGENT_DATA_DIR")
    os.environ["VOICE_AGENT_DATA_DIR"] = str(data_dir)
    try:
        spec.loader.exec_module(module)
        at = (datetime.now() + timedelta(days=1)).strftime("%Y-%m-%dT19:00")
        module.save(
            {
                "code": "LOADTS",
                "phone": "88005553535",  # "eight eight zero zero five five five three ..."
                "name": "John Smith",
                "party_size": 2,
                "at": at,
                "seating": "indoor",
            }
        )
        return True
    except Exception as exc:
        print(f"loadtest: could not seed a booking ({exc}); change calls may not find one")
        return False
    finally:
        if previous is None:
            os.environ.pop("VOICE_AGENT_DATA_DIR", None)
        else:
            os.environ["VOICE_AGENT_DATA_DIR"] = previous


class Run:
    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args = args
        self.out = out
        self.run_id = f"{int(time.time()) % 10**12:012d}{os.getpid() % 10**10:010d}"
        self.lines = load_lines(args.transport)
        self.backchannels = [name for name in self.lines if "_bc-" in name]
        self.base_url = ""
        self.http = httpx.AsyncClient()
        self.server: subprocess.Popen[bytes] | None = None
        self.standin: subprocess.Popen[bytes] | None = None
        self.server_watch: ProcWatch | None = None
        self.standin_watch: ProcWatch | None = None
        self.standin_url: str | None = None
        self.self_watch = ProcWatch(os.getpid(), tree=False)
        self.machine = MachineWatch()
        self.tmp = Path(tempfile.mkdtemp(prefix="loadtest-"))
        self.mode = args.mode if args.url is None else "external"
        self.eot_ms = 600.0
        self.uses_llm = False
        self.no_input_s = 8.0
        self._numbers = 0
        self._progress_line = False
        self._last_progress = 0.0
        self.server_log = out.with_suffix(".server.log")
        self.standin_log = out.with_suffix(".standin.log")

    def next_number(self) -> int:
        self._numbers += 1
        return self._numbers - 1

    def ws_url(self, path: str) -> str:
        parts = urlsplit(self.base_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        query = f"token={self.args.token}" if self.args.token else ""
        return urlunsplit((scheme, parts.netloc, path, query, ""))

    def watches(self) -> dict[str, ProcWatch]:
        watches = {"loadgen": self.self_watch}
        if self.server_watch is not None:
            watches["server"] = self.server_watch
        if self.standin_watch is not None:
            watches["standin"] = self.standin_watch
        return watches

    async def health(self) -> dict[str, Any]:
        try:
            response = await self.http.get("/healthz", timeout=2.0)
            body: dict[str, Any] = response.json()
            return body
        except (httpx.HTTPError, ValueError):
            return {}

    def server_added_ms(self, turn: Turn) -> float | None:
        """Caller speech end -> first audio, less what the server was configured to wait and
        the stand-in to take: end-of-turn silence, STT delay, the LLM's first-token delay (LLM
        agents), TTS first byte and the streaming of the first unit's audio. Hosted mode only,
        where those are known. What stays in besides the server's own work: VAD noticing the
        end of speech (about 100 ms after the caller's last loud frame) and, for LLM agents,
        the stand-in's 20 ms a word until the first sentence is complete."""
        if self.mode != "hosted" or turn.latency_ms is None:
            return None
        args = self.args
        streaming = 0.0
        if args.tts_speed > 0:
            if turn.first_unit_ms is None:
                return None
            # The stand-in speaks 24 kHz; the caller's copy has the same duration.
            streaming = turn.first_unit_ms / args.tts_speed
        llm = args.llm_delay_ms if self.uses_llm else 0.0
        engines = args.stt_delay_ms + llm + args.tts_delay_ms + streaming
        return turn.latency_ms - self.eot_ms - engines

    # -- processes -------------------------------------------------------------------------

    async def start(self) -> None:
        args = self.args
        if args.url is not None:
            parts = urlsplit(args.url)
            scheme = "https" if parts.scheme in ("wss", "https") else "http"
            self.base_url = urlunsplit((scheme, parts.netloc, "", "", ""))
            self.http = httpx.AsyncClient(base_url=self.base_url, headers=self._auth())
            health = await self.health()
            if not health:
                raise SystemExit(f"loadtest: no server answers {self.base_url}/healthz")
            pid = args.server_pid or health.get("pid")
            local = parts.hostname in ("127.0.0.1", "localhost", "::1")
            if pid and (local or args.server_pid) and _visible(int(pid)):
                self.server_watch = ProcWatch(int(pid))
            else:
                print("loadtest: server process not visible here: no CPU/RSS/fd figures")
            return
        standin_url = await self._start_standin() if args.mode == "hosted" else None
        config_path, data_dir = self._prepare(standin_url)
        port = free_port()
        executable = ROOT / ".venv" / "bin" / "voice-agent"
        command = [str(executable)] if executable.exists() else [sys.executable, "-m"]
        if not executable.exists():
            command.append("voice_agent.cli")
        command += ["serve", "--config", str(config_path), "--port", str(port)]
        command += ["--data-dir", str(data_dir)]
        env = {
            **os.environ,
            "VOICE_AGENT_DATA_DIR": str(data_dir),
            "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1"),
        }
        log = self.server_log.open("wb")
        self.server = subprocess.Popen(  # noqa: ASYNC220 - once, before anything is measured
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        self.base_url = f"http://127.0.0.1:{port}"
        self.http = httpx.AsyncClient(base_url=self.base_url)
        deadline = time.monotonic() + 120
        while not await self.health():
            if self.server.poll() is not None or time.monotonic() > deadline:
                tail = self.server_log.read_text(errors="replace")[-2000:]
                raise SystemExit(f"loadtest: the server did not start:\n{tail}")
            await asyncio.sleep(0.2)
        self.server_watch = ProcWatch(self.server.pid)

    def _prepare(self, standin_url: str | None) -> tuple[Path, Path]:
        """The server's config file and data directory, in the run's temporary directory."""
        args = self.args
        data_dir = self.tmp / "data"
        data_dir.mkdir()
        source = Path(args.config).resolve()
        config = server_config(source, args.mode, standin_url, data_dir)
        config_path = self.tmp / "agents.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        loaded = load_config(config_path)  # fails here, naming the file and key, if invalid
        agent_name = args.agent or loaded.config.default_agent
        agent = loaded.config.agents[agent_name]
        voice = agent.voice(loaded.config.voice)
        self.eot_ms = float(voice.turn.end_of_turn_silence_ms)
        self.no_input_s = agent.no_input_timeout_s
        self.uses_llm = agent.brain == "playbook"
        seed_booking(source.parent, data_dir)
        return config_path, data_dir

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.args.token}"} if self.args.token else {}

    async def _start_standin(self) -> str:
        args = self.args
        if importlib.util.find_spec("aiohttp") is None:
            raise SystemExit(
                "loadtest: --mode hosted runs scripts/standin_engines.py, which needs aiohttp: "
                ".venv/bin/pip install -e '.[dev]'"
            )
        command = [
            sys.executable,
            str(ROOT / "scripts" / "standin_engines.py"),
            "--port",
            "0",
            "--stt-delay-ms",
            str(args.stt_delay_ms),
            "--tts-delay-ms",
            str(args.tts_delay_ms),
            "--tts-speed",
            str(args.tts_speed),
            "--llm-delay-ms",
            str(args.llm_delay_ms),
        ]
        log = self.standin_log.open("wb")
        self.standin = subprocess.Popen(  # noqa: ASYNC220 - once, before anything is measured
            command, stdout=subprocess.PIPE, stderr=log
        )
        assert self.standin.stdout is not None
        try:
            async with asyncio.timeout(60):
                line = await asyncio.to_thread(self.standin.stdout.readline)
        except TimeoutError:
            line = b""
        text = line.decode(errors="replace").strip()
        if not text.startswith("standin listening on "):
            tail = self.standin_log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"loadtest: the stand-in did not start: {text!r}\n{tail}")
        self.standin_watch = ProcWatch(self.standin.pid)
        self.standin_url = text.removeprefix("standin listening on ")
        return self.standin_url

    async def stop(self) -> None:
        for process in (self.server, self.standin):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    await asyncio.to_thread(process.wait, 15)
                except subprocess.TimeoutExpired:
                    process.kill()
        await self.http.aclose()
        shutil.rmtree(self.tmp, ignore_errors=True)

    async def warm_up(self) -> None:
        """One call before anything is measured: a fresh server pays first-use costs (lazy
        imports, its first connections to the engines) on its first call; measured, that stall
        made admission control refuse the run's first calls."""
        client = new_client(self, 10**9)
        line = self.lines["joe_book1"]
        try:
            async with asyncio.timeout(30):
                await client.connect()
                await client.wait_audio(1)
                await client.send_audio(line.audio)  # into the greeting: a barge-in
                spoken = client.clock.now()
                await client.wait_until(
                    lambda: any(f.received_at > spoken for f in client.frames[-20:]), "a reply"
                )
        except (OSError, TimeoutError, ConnectionError, ConnectionClosed) as exc:
            print(f"loadtest: the warm-up call failed ({type(exc).__name__}: {exc})")
        finally:
            with contextlib.suppress(Exception):
                await client.stop()
        await self.settle()

    async def settle(self) -> None:
        """Until the server has no calls left and its loop is calm (at most 30 s)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            health = await self.health()
            if not health.get("live_calls") and (health.get("loop_lag_ms") or 0) < 50:
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(self.args.settle)

    # -- progress --------------------------------------------------------------------------

    def progress(self, level: Level, sample: dict[str, Any]) -> None:
        latencies = level.live_latencies
        p50, p95 = percentile(latencies, 50), percentile(latencies, 95)
        text = (
            f"N={level.calls} {level.elapsed():5.1f}/{self.args.duration:.0f}s "
            f"live {level.live:3d} done {len(level.results):3d} "
            f"fail {level.count('failed') + level.count('dropped')} "
            f"refused {level.count('refused')} | turns {len(latencies):4d} "
            f"latency p50 {_fmt(p50)} p95 {_fmt(p95)} ms | server "
            f"cpu {_fmt(sample.get('server_cpu_pct'), '%')} "
            f"(waited {_fmt(sample.get('server_cpu_wait_pct'), '%')}) "
            f"rss {_fmt(sample.get('server_rss_mb'), 'MB')} fds {_fmt(sample.get('server_fds'))} "
            f"lag {_fmt(sample.get('server_loop_lag_ms'), 'ms')} | loadgen "
            f"cpu {_fmt(sample.get('loadgen_cpu_pct'), '%')} "
            f"lag {_fmt(sample.get('loadgen_loop_lag_ms'), 'ms')} | machine "
            f"{_fmt(sample.get('machine_cpu_pct'), '%')}"
        )
        if sys.stdout.isatty():
            # One line rewritten in place, as wide as the terminal allows.
            width = shutil.get_terminal_size((160, 20)).columns - 1
            sys.stdout.write("\r" + text[:width].ljust(width))
            sys.stdout.flush()
            self._progress_line = True
        elif time.monotonic() - self._last_progress >= self.args.log_interval:
            # Not a terminal (a log, the test suite): a line now and then.
            print(text, flush=True)
            self._last_progress = time.monotonic()

    def progress_done(self) -> None:
        if self._progress_line:
            sys.stdout.write("\n")
            self._progress_line = False


def plot(result: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        print("loadtest: no matplotlib, no plot (.venv/bin/pip install 'matplotlib>=3.8,<4')")
        return False
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    levels = result["levels"]
    figure, (latency_ax, cpu_ax, time_ax) = plt.subplots(1, 3, figsize=(17, 5))
    figure.suptitle(
        f"voice_agent load test: {result['mode']} engines, {result['transport']} callers, "
        f"{result['started_at'][:16]}"
    )

    def points(*path: str) -> tuple[list[int], list[float]]:
        """(calls, value) of every level that has the value at `path` in its summary."""
        xs, ys = [], []
        for level in levels:
            value: Any = level
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                xs.append(level["calls"])
                ys.append(float(value))
        return xs, ys

    for key, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-")):
        xs, ys = points("latency_ms_unanswered_as_timeout", key)
        latency_ax.plot(xs, ys, style, label=f"speech end -> first audio {key}")
    xs, ys = points("barge_in_clear_ms", "p95")
    if ys:
        latency_ax.plot(xs, ys, "x--", label="barge-in -> clear p95")
    xs, ys = points("server_added_ms", "p95")
    if ys:
        latency_ax.plot(xs, ys, "d:", label="server-added p95")
    latency_ax.set_xlabel("concurrent calls")
    latency_ax.set_ylabel("ms, caller side (unanswered turns count as the timeout)")
    latency_ax.set_title("latency")
    latency_ax.set_ylim(bottom=0)
    latency_ax.grid(alpha=0.3)
    latency_ax.legend(fontsize=8)

    for key, label, style in (
        ("server_cpu_pct", "server mean", "o-"),
        ("loadgen_cpu_pct", "load generator mean", "s--"),
        ("standin_cpu_pct", "stand-in mean", "^:"),
        ("machine_cpu_pct", "whole machine mean", "kx-"),
    ):
        xs, ys = points("resources", key, "mean")
        if ys:
            cpu_ax.plot(xs, ys, style, label=label)
    xs, ys = points("resources", "server_cpu_pct", "max")
    if ys:
        cpu_ax.plot(xs, ys, "o:", alpha=0.5, label="server max")
    xs, ys = points("resources", "server_cpu_wait_pct", "mean")
    if ys:
        cpu_ax.plot(xs, ys, "v--", alpha=0.7, label="server waiting for a CPU")
    cores = result["machine"]["cpus"] or 1
    cpu_ax.axhline(cores * 100, color="grey", linewidth=0.8, linestyle="--")
    cpu_ax.set_xlabel("concurrent calls")
    cpu_ax.set_ylabel("CPU % (100 = one core)")
    cpu_ax.set_title(f"CPU ({cores} cores)")
    cpu_ax.set_ylim(bottom=0)
    cpu_ax.grid(alpha=0.3)
    cpu_ax.legend(fontsize=8)

    offset = 0.0
    for level in levels:
        samples = level["samples"]
        ts = [offset + s["t"] for s in samples]
        time_ax.plot(ts, [s.get("server_cpu_pct") for s in samples], "-", color="tab:blue")
        time_ax.plot(ts, [s.get("live_calls") for s in samples], "-", color="tab:green")
        lags = [s.get("server_loop_lag_ms") for s in samples]
        time_ax.plot(ts, lags, "-", color="tab:red")
        offset = (ts[-1] if ts else offset) + 2
    time_ax.plot([], [], "-", color="tab:blue", label="server CPU %")
    time_ax.plot([], [], "-", color="tab:green", label="live calls")
    time_ax.plot([], [], "-", color="tab:red", label="server loop lag ms")
    time_ax.set_xlabel("seconds (levels one after the other)")
    time_ax.set_title("over time")
    time_ax.grid(alpha=0.3)
    time_ax.legend(fontsize=8)

    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def report(level: dict[str, Any]) -> str:
    lat, server = level["latency_ms"], level["server"]
    res = level["resources"]
    lines = [
        f"== {level['calls']} calls: {level['calls_started']} started, outcomes "
        + ", ".join(f"{k} {v}" for k, v in level["outcomes"].items() if v),
        f"  turns {level['turn_count']} (unanswered in {level['reply_timeout_s']:.0f} s: "
        f"{level['unanswered_turns']}); caller speech "
        f"end -> first audio p50 {_fmt(lat['p50'])} p95 {_fmt(lat['p95'])} "
        f"p99 {_fmt(lat['p99'])} max {_fmt(lat['max'])} ms",
        f"  server: speech end -> first audio sent p50 "
        f"{_fmt(server['speech_end_to_first_audio_ms']['p50'])} p95 "
        f"{_fmt(server['speech_end_to_first_audio_ms']['p95'])} ms; stages p50/p95 "
        + ", ".join(
            f"{name} {_fmt(values['p50'])}/{_fmt(values['p95'])}"
            for name, values in server["stages_ms"].items()
        ),
    ]
    if level["server_added_ms"]["n"]:
        added = level["server_added_ms"]
        lines.append(
            f"  server-added (beyond end-of-turn silence and engine delays) p50 "
            f"{_fmt(added['p50'])} p95 {_fmt(added['p95'])} p99 {_fmt(added['p99'])} ms"
        )
    barge = level["barge_in_clear_ms"]
    lines.append(
        f"  barge-ins {level['barge_ins']['done']}: speech start -> clear p50 "
        f"{_fmt(barge['p50'])} p95 {_fmt(barge['p95'])} ms (agent resumed over the caller "
        f"{level['barge_ins']['agent_talked_over_caller']}); backchannels "
        f"{level['backchannels']['said']} (cleared {level['backchannels']['cleared']}, resumed "
        f"{level['backchannels']['resumed']}); reprompts {level['long_silences']['reprompts']}"
    )
    audio = level["audio"]
    lines.append(
        f"  late frames {audio['late_frames']} of {audio['frames']} "
        f"(worst gap {_fmt(audio['late_gap_ms']['max'], ' ms')}); server errors "
        f"{server['errors']}"
    )
    lines.append(
        f"  server CPU mean {_fmt(res['server_cpu_pct']['mean'])}% max "
        f"{_fmt(res['server_cpu_pct']['max'])}% (waiting for a CPU "
        f"{_fmt(res['server_cpu_wait_pct']['mean'])}%), RSS max "
        f"{_fmt(res['server_rss_mb']['max'])} MB, fds max {_fmt(res['server_fds']['max'])}, "
        f"loop lag mean {_fmt(res['server_loop_lag_ms']['mean'])} max "
        f"{_fmt(res['server_loop_lag_ms']['max'])} ms"
    )
    sending = level["loadgen_send_lateness_ms"]
    lines.append(
        f"  load generator CPU {_fmt(res['loadgen_cpu_pct']['mean'])}% (waiting "
        f"{_fmt(res['loadgen_cpu_wait_pct']['mean'])}%), loop lag max "
        f"{_fmt(res['loadgen_loop_lag_ms']['max'])} ms, frames sent late p99 "
        f"{_fmt(sending['p99_mean'])} max {_fmt(sending['max'])} ms | stand-in "
        f"{_fmt(res['standin_cpu_pct']['mean'])}% | whole machine "
        f"{_fmt(res['machine_cpu_pct']['mean'])}%"
    )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    if args.out:
        out = Path(args.out)
    else:
        out = RESULTS / f"loadtest-{args.mode if not args.url else 'external'}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    run = Run(args, out)
    result: dict[str, Any] = {
        "tool": "scripts/loadtest.py",
        "command": " ".join(sys.argv),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": run.mode,
        "transport": args.transport,
        "agent": args.agent,
        "url": args.url,
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_at_start": [round(v, 2) for v in os.getloadavg()],
            "python": sys.version.split()[0],
        },
        "settings": {
            key: getattr(args, key)
            for key in (
                "duration",
                "ramp",
                "reply_timeout",
                "barge_in_share",
                "backchannel_share",
                "long_silence_share",
                "pause_share",
                "seed",
                "stt_delay_ms",
                "tts_delay_ms",
                "tts_speed",
                "llm_delay_ms",
            )
        },
        "levels": [],
    }
    try:
        await run.start()
        result["end_of_turn_silence_ms"] = run.eot_ms
        result["base_url"] = run.base_url
        if args.warm_up:
            await run.warm_up()
        for index, calls in enumerate(args.calls):
            if index:
                await run.settle()
            print(
                f"loadtest: {calls} calls for {args.duration:.0f} s ({run.mode}, "
                f"{args.transport}) against {run.base_url}",
                flush=True,
            )
            level = await Level(run, calls).execute()
            if run.standin is not None:
                level["standin"] = await standin_stats(run)
            result["levels"].append(level)
            print(report(level), flush=True)
    finally:
        result["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        result["machine"]["loadavg_at_end"] = [round(v, 2) for v in os.getloadavg()]
        await run.stop()
        if result["levels"]:
            out.write_text(json.dumps(result, indent=1))
            png = out.with_suffix(".png")
            print(f"loadtest: results in {out}", flush=True)
            if plot(result, png):
                print(f"loadtest: plot in {png}", flush=True)
    failed = sum(level["failed_calls"] + level["dropped_calls"] for level in result["levels"])
    return 1 if failed and args.strict else 0


async def standin_stats(run: Run) -> dict[str, Any] | None:
    url = run.standin_url
    if not url:
        return None
    try:
        async with httpx.AsyncClient() as http:
            response = await http.get(url.removesuffix("/v1") + "/stats", timeout=5)
            body: dict[str, Any] = response.json()
            return body
    except (httpx.HTTPError, ValueError):
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--calls",
        default="10",
        type=lambda text: [int(n) for n in text.split(",") if n.strip()],
        help="concurrent calls; a comma-separated list runs each level in turn",
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per level")
    parser.add_argument("--ramp", type=float, default=10.0, help="seconds to start all calls")
    parser.add_argument("--transport", choices=("twilio", "ws"), default="twilio")
    parser.add_argument("--url", help="ws://HOST:PORT of a running server (default: start one)")
    parser.add_argument("--token", help="API token of a server that requires one")
    parser.add_argument("--server-pid", type=int, help="pid to sample with --url")
    parser.add_argument("--mode", choices=("embedded", "hosted"), default="embedded")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="config the server runs")
    parser.add_argument("--agent", help="agent to call (default: the server's default)")
    parser.add_argument("--out", help="result JSON path (the PNG goes next to it)")
    parser.add_argument("--reply-timeout", type=float, default=6.0, help="seconds per reply")
    parser.add_argument("--barge-in-share", type=float, default=0.2)
    parser.add_argument("--backchannel-share", type=float, default=0.2)
    parser.add_argument(
        "--long-silence-share", type=float, default=0.1, help="calls that hear a no-input prompt"
    )
    parser.add_argument("--pause-share", type=float, default=0.2, help="lines after a pause")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stt-delay-ms", type=float, default=150.0, help="hosted mode")
    parser.add_argument("--tts-delay-ms", type=float, default=150.0, help="hosted mode")
    parser.add_argument(
        "--tts-speed", type=float, default=4.0, help="hosted TTS, times real time (0: unpaced)"
    )
    parser.add_argument("--llm-delay-ms", type=float, default=300.0, help="hosted mode")
    parser.add_argument("--sample-interval", type=float, default=1.0)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between levels")
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="skip the unmeasured first call that warms the server up",
    )
    parser.add_argument(
        "--log-interval", type=float, default=5.0, help="progress lines when not a terminal"
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 if any call failed or was dropped"
    )
    args = parser.parse_args(argv)
    if not args.calls or min(args.calls) < 1:
        parser.error("--calls needs one or more positive numbers")
    return args


def main() -> int:
    args = parse_args()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main_async(args))
    return uvloop.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())

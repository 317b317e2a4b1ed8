#!/usr/bin/env python3
"""WebRTC CPU benchmark: the server's CPU and memory per call over /rtc, Opus both ways.

    .venv/bin/python scripts/bench_webrtc.py                    # 4 calls, one run
    .venv/bin/python scripts/bench_webrtc.py --calls 1 4 8 --runs 2

Each run starts its own `voice-agent serve --port P` (the default agent of config/agents.yaml),
makes one warm-up call, then opens N concurrent calls from aiortc callers in this process
(`tests/support/rtc_caller.py`: ICE, DTLS, SRTP, Opus both ways, the microphone sending silence)
and reads the server's user + system CPU from /proc/PID/stat over two windows:

- speaking: right after every caller has heard the start of the greeting (about 6 s of speech),
  so the server encodes real speech to Opus while it decodes the callers' silent Opus;
- silent: after every greeting has been played, both sides silent: inbound decode, VAD and the
  outbound track's silent frames, which are still Opus encoded and sent every 20 ms.

Reported per window: server CPU in % of one core per call and in microseconds per 20 ms frame per
call (one inbound and one outbound frame), split by thread (run time from
/proc/PID/task/*/schedstat, names from `py-spy dump`): the main thread (event loop, aiortc's RTP
and SRTP, the call pipeline), aiortc's per-call `audio-decoder` threads (Opus decode), the loop's
default executor (`uvloop_N`: aiortc's Opus encode); the server's child processes (STT workers);
and the server's RSS before and with the calls. A window is marked INVALID when the callers got
the agent's audio late (under 47.5 frames/s per call: something could not keep up), when a
greeting ended inside the speaking window, or when the agent spoke again in the silent one.

This process does its own Opus encode and decode for every caller, on the same machine: its CPU
(`os.times`), the machine's busy cores (/proc/stat) and the load average are printed with every
window so that a saturated client, which would starve or delay the server, can be seen.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.rtc_caller import RtcCaller  # noqa: E402

FRAME_S = 0.02
FRAME_BYTES = 640  # 20 ms of the callers' 16 kHz PCM16
TICK_S = 1 / os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1
# The default agent's no-input timeout (AgentConfig.no_input_timeout_s): 8 s after a greeting
# has been played, the agent says "Are you still there?". The silent window has to end before the
# first call's reprompt, or it measures speech again; the script checks it did.
NO_INPUT_S = 8.0
STARTUP_S = 60.0
SATURATED = 0.9  # a process using this much of one core is taken to be saturated
MIN_FPS = 47.5  # agent frames received per second per call below which a window is lagging


# ---- /proc -------------------------------------------------------------------------------------


def stat_cpu(path: Path) -> float:
    """utime + stime, in seconds, of a /proc/.../stat file."""
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread: the scheduler's run time in ns (schedstat), finer than
    the 10 ms ticks of stat."""
    cpu = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            try:
                cpu[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
            except (FileNotFoundError, IndexError, ValueError):
                cpu[int(task.name)] = stat_cpu(task / "stat")
    return cpu


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            for child in (task / "children").read_text().split():
                found.append(int(child))
                found.extend(descendants(int(child)))
    return found


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def system_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def thread_names(pid: int) -> dict[int, str]:
    """Thread id -> Python thread name, from `py-spy dump` (pauses the server for a moment)."""
    try:
        dump = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "py-spy"), "dump", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names = {}
    for match in re.finditer(r'^Thread (\d+) \(\w+\): "([^"]*)"', dump, re.MULTILINE):
        names[int(match[1])] = match[2]
    return names


def thread_group(name: str) -> str:
    """`uvloop_3` -> `uvloop` (the loop's default executor), `stt-pool-read-812` -> ..."""
    return re.sub(r"[-_]\d+$", "", name)


@dataclass
class Snapshot:
    at: float
    server: float
    threads: dict[int, float]
    children: float
    client: float
    system: tuple[int, int]
    received: int  # bytes of agent audio all callers have received

    @classmethod
    def take(cls, pid: int, callers: list[RtcCaller]) -> Snapshot:
        threads = thread_cpu(pid)
        children = 0.0
        for child in descendants(pid):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                children += stat_cpu(Path(f"/proc/{child}/stat"))
        times = os.times()
        return cls(
            at=time.monotonic(),
            server=stat_cpu(Path(f"/proc/{pid}/stat")),
            threads=threads,
            children=children,
            client=times.user + times.system,
            system=system_jiffies(),
            received=sum(len(c.received) for c in callers),
        )


@dataclass
class Window:
    name: str
    calls: int
    seconds: float
    server: float  # CPU seconds over the window
    threads: dict[int, float]  # thread id -> CPU seconds over the window
    children: float
    client: float
    busy_cores: float
    received: int
    load: str
    valid: bool = True
    note: str = ""

    @classmethod
    def between(cls, name: str, calls: int, a: Snapshot, b: Snapshot) -> Window:
        busy = b.system[0] - a.system[0]
        total = b.system[1] - a.system[1]
        return cls(
            name=name,
            calls=calls,
            seconds=b.at - a.at,
            server=b.server - a.server,
            threads={tid: cpu - a.threads.get(tid, 0.0) for tid, cpu in b.threads.items()},
            children=b.children - a.children,
            client=b.client - a.client,
            busy_cores=CORES * busy / total if total else 0.0,
            received=b.received - a.received,
            load=load_average(),
        )

    def per_call_percent(self, cpu: float) -> float:
        return 100 * cpu / self.seconds / self.calls

    def per_frame_us(self, cpu: float) -> float:
        return cpu / (self.calls * self.seconds / FRAME_S) * 1e6

    @property
    def client_core(self) -> float:
        return self.client / self.seconds

    @property
    def others_cores(self) -> float:
        """Cores busy with neither the server, its children nor this client: other work."""
        return max(
            0.0, self.busy_cores - (self.server + self.children + self.client) / self.seconds
        )

    @property
    def frames_per_second(self) -> float:
        """20 ms frames of agent audio each caller received per second: 50 if nothing lagged."""
        return self.received / (FRAME_BYTES * self.calls * self.seconds)

    def by_thread(self, pid: int, names: dict[int, str]) -> dict[str, float]:
        """CPU seconds per thread group; `other`: unnamed threads, threads that ended, and the
        difference between the process's 10 ms ticks and its threads' run times."""
        groups: dict[str, float] = collections.defaultdict(float)
        for tid, cpu in self.threads.items():
            group = "MainThread" if tid == pid else thread_group(names.get(tid, "other"))
            groups[group] += cpu
        groups["other"] += self.server - sum(self.threads.values())
        return dict(sorted(groups.items(), key=lambda item: -item[1]))


@dataclass
class Result:
    calls: int
    run: int
    rss_idle: float
    rss_base: float
    rss_calls: float
    windows: list[Window]
    pid: int
    names: dict[int, str]

    @property
    def rss_per_call(self) -> float:
        return (self.rss_calls - self.rss_base) / self.calls


# ---- the server ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """`voice-agent serve` in a subprocess; its output is drained so that it never blocks."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.lines: collections.deque[str] = collections.deque(maxlen=50)
        self.process = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "voice-agent"), "serve", "--port", str(port)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._ready = threading.Event()
        self._serving = False
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/rtc"

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if "serving agent" in line:
                self._serving = True
                self._ready.set()
        self._ready.set()

    async def ready(self) -> None:
        if not await asyncio.to_thread(self._ready.wait, STARTUP_S):
            raise RuntimeError("the server did not start:\n" + "\n".join(self.lines))
        if not self._serving:
            raise RuntimeError("the server exited:\n" + "\n".join(self.lines))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._reader.join(5)


# ---- the calls ----------------------------------------------------------------------------------


def greeting_played(caller: RtcCaller) -> bool:
    return any(e["type"] == "committed" and e.get("reply_id") == 1 for e in caller.events)


def spoke_again(caller: RtcCaller) -> list[str]:
    """What the agent said after its greeting."""
    return [
        str(e["text"])
        for e in caller.events
        if e["type"] == "agent_text" and e.get("reply_id") != 1
    ]


async def warm_up(url: str) -> None:
    """One call before anything is measured: lazy imports, codec and TTS set-up."""
    caller = RtcCaller(url)
    try:
        await caller.connect()
        await caller.wait_loud(200)
        await caller.hang_up()
    finally:
        await caller.close()


async def greeting_end(caller: RtcCaller) -> float:
    await caller.wait_event(lambda e: e["type"] == "committed" and e.get("reply_id") == 1)
    return time.monotonic()


class Profiler:
    """`py-spy record` of the server over one window, when --py-spy DIR is given."""

    def __init__(self, args: argparse.Namespace, pid: int, name: str) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        if args.py_spy is None:
            return
        out = Path(args.py_spy) / f"{name}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        command = [str(ROOT / ".venv" / "bin" / "py-spy"), "record", "-p", str(pid)]
        command += ["-d", f"{args.seconds:g}", "-f", "raw", "-o", str(out), "--threads"]
        command += ["--nonblocking", *shlex.split(args.py_spy_args)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    async def wait(self) -> None:
        if self.process is not None:
            await asyncio.to_thread(self.process.wait)


async def window(
    name: str, pid: int, calls: list[RtcCaller], run: int, args: argparse.Namespace
) -> Window:
    profiler = Profiler(args, pid, f"N{len(calls)}-run{run}-{name}")
    start = Snapshot.take(pid, calls)
    await asyncio.sleep(args.seconds)
    measured = Window.between(name, len(calls), start, Snapshot.take(pid, calls))
    await profiler.wait()
    if measured.frames_per_second < MIN_FPS:
        # The agent's audio came late: the server or this client could not keep up, so the
        # window does not hold 50 frames per second per call and its CPU is not per frame.
        measured.valid = False
        measured.note = f"lagging: {measured.frames_per_second:.0f} frames/s per call; "
    return measured


async def measure(server: Server, calls: int, run: int, args: argparse.Namespace) -> Result:
    pid = server.pid
    rss_idle = rss_mb(pid)
    await warm_up(server.url)
    await asyncio.sleep(1.0)
    rss_base = rss_mb(pid)
    callers = [RtcCaller(server.url, timeout=60) for _ in range(calls)]
    windows: list[Window] = []
    names: dict[int, str] = {}
    try:
        await asyncio.gather(*(c.connect() for c in callers))
        # Every caller hears the greeting before the speaking window starts (loud_ms scans the
        # whole recording on every frame: it is not called inside a window).
        await asyncio.gather(*(c.wait_loud(args.loud_ms) for c in callers))

        # (a) The agent speaks on every call: Opus encode of speech out, decode of silence in.
        speaking = await window("speaking", pid, callers, run, args)
        if any(greeting_played(c) for c in callers):
            speaking.valid = False
            speaking.note += "a greeting ended inside the window"
        windows.append(speaking)

        # (b) Both sides silent, after every greeting has been played and before the first
        # no-input reprompt (NO_INPUT_S after the first greeting ended).
        ends = await asyncio.gather(*(greeting_end(c) for c in callers))
        await asyncio.sleep(args.settle)
        silent = await window("silent", pid, callers, run, args)
        ended = time.monotonic()
        rss_calls = rss_mb(pid)
        margin = min(ends) + NO_INPUT_S - ended
        said = sorted({text for c in callers for text in spoke_again(c)})
        if said or margin < 0:
            silent.valid = False
            silent.note += f"the agent spoke again: {said}, {margin:.1f} s to the first reprompt"
        else:
            silent.note += f"ended {margin:.1f} s before the first reprompt"
        windows.append(silent)
        names = thread_names(pid)

        await asyncio.gather(*(c.hang_up() for c in callers))
    finally:
        await asyncio.gather(*(c.close() for c in callers), return_exceptions=True)
    return Result(calls, run, rss_idle, rss_base, rss_calls, windows, pid, names)


# ---- output -------------------------------------------------------------------------------------


def describe(result: Result) -> str:
    lines = [
        f"N={result.calls} run {result.run}: server RSS idle {result.rss_idle:.0f} MB, after the "
        f"warm-up call {result.rss_base:.0f} MB, with the calls {result.rss_calls:.0f} MB "
        f"({result.rss_per_call:.1f} MB per call)"
    ]
    for w in result.windows:
        flag = "" if w.valid else "  INVALID"
        client = " (saturated)" if w.client_core >= SATURATED else ""
        threads = ", ".join(
            f"{group} {w.per_frame_us(cpu):.0f}"
            for group, cpu in w.by_thread(result.pid, result.names).items()
            if abs(w.per_frame_us(cpu)) >= 1
        )
        lines += [
            f"  {w.name} window, {w.seconds:.2f} s{flag}: {w.note}",
            f"    server {w.server:.2f} s CPU: {w.per_call_percent(w.server):.2f} % of a core per "
            f"call, {w.per_frame_us(w.server):.0f} us per 20 ms frame per call",
            f"    by thread, us per frame per call: {threads}",
            f"    agent audio received: {w.frames_per_second:.1f} frames/s per call (50 if "
            f"on time); server's child processes {w.children:.2f} s CPU",
            f"    this client {100 * w.client_core:.0f} % of a core{client}; machine "
            f"{w.busy_cores:.2f} of {CORES} cores busy, {w.others_cores:.2f} with other work; "
            f"load average {w.load}",
        ]
    return "\n".join(lines)


def table(results: list[Result]) -> str:
    rows = [
        "| N | run | window | server CPU % of a core per call | us per frame per call "
        "| of which main thread | RSS per call | client CPU | other work |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        for w in r.windows:
            valid = "" if w.valid else " (invalid)"
            main = w.threads.get(r.pid, 0.0)
            rows.append(
                f"| {r.calls} | {r.run} | {w.name}{valid} | {w.per_call_percent(w.server):.2f} "
                f"| {w.per_frame_us(w.server):.0f} | {w.per_frame_us(main):.0f} "
                f"| {r.rss_per_call:.1f} MB | {100 * w.client_core:.0f} % of a core "
                f"| {w.others_cores:.2f} of {CORES} cores |"
            )
    return "\n".join(rows)


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--calls", type=int, nargs="+", default=[4], help="concurrent calls, one or more counts"
    )
    parser.add_argument("--runs", type=int, default=1, help="runs per count, a server each")
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="length of each window (default 3)"
    )
    parser.add_argument(
        "--settle", type=float, default=0.5, help="wait after the last greeting ends (default 0.5)"
    )
    parser.add_argument(
        "--loud-ms",
        type=float,
        default=200,
        help="greeting heard by every caller before the speaking window (default 200)",
    )
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        help="also record each window with `py-spy record --nonblocking` (raw format) into DIR",
    )
    parser.add_argument(
        "--py-spy-args",
        default="--gil",
        help="more py-spy record options (default --gil: only threads holding the GIL; "
        "--native needs py-spy to pause the server, which changes what is measured)",
    )
    args = parser.parse_args()
    if args.settle + args.seconds >= NO_INPUT_S:
        parser.error(f"--settle + --seconds must stay under the {NO_INPUT_S:g} s no-input timeout")

    print(f"{CORES} cores, load average at start {load_average()}")
    results = []
    for calls in args.calls:
        for run in range(1, args.runs + 1):
            server = Server(free_port())
            try:
                await server.ready()
                result = await measure(server, calls, run, args)
            finally:
                server.stop()
            print(describe(result), flush=True)
            results.append(result)
    print()
    print(table(results))


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())  # as the server runs: the callers' own CPU is lower

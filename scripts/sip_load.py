#!/usr/bin/env python3
"""SIP load run: sipp places calls on `serve --sip`, RTP both ways, the server on one core.

    .venv/bin/python scripts/sip_load.py --limit 20 --calls 40            # a quick check
    .venv/bin/python scripts/sip_load.py --limit 200 --calls 400 --rate 10 --duration 60

What runs:
- the server: this file started again as a child process (`--child`, not for use by hand),
  pinned to `--server-cpus` (default core 0) before anything is imported, so its speech
  recognition workers inherit the pin (one worker per core it may use: one). It builds
  `voice_agent.server.app.VoiceServer` as `voice-agent serve --sip 127.0.0.1:PORT` does (uvloop,
  the same logging, gc.freeze() after start), from a copy of config/agents.yaml with
  `voice.stt` set by `--stt` (pocketsphinx, the low-CPU engine, by default), RTP ports
  20000-21999, `server.max_calls` raised above `--limit` (sipp counts a call as over on the
  BYE's 200 while the server may still be closing it) and records in a temporary data folder;
- the callers: sipp (Debian's sip-tester) on the other cores with `-r RATE -l LIMIT -m CALLS`
  and scripts/sipp/sip_load.xml: each call is answered, then plays a capture of a caller's line
  and hangs up after `--duration` seconds. `--caller conversation` (the default): the booking
  conversation of tests/fixtures/audio (voice joe: book a table, name, phone number, "yes
  please"; the caller waits out the greeting first, then leaves the agent time to answer each
  line), quiet between the lines and after them; `--caller silence`: quiet all along, so no
  speech is recognised and what remains is the SIP and media path and the agent's greeting
  and no-input prompts. Either way 20 ms PCMU packets all call long; the server sends its 20 ms
  packet each tick all along (the agent or comfort silence). play_pcap_audio needs root. One
  unmeasured call warms the server up first;
- the callers' RTP ports: sipp sends from raw sockets and binds none there, so this script
  binds and drains them (`RtpSink`): without them every packet of the server's would draw an
  ICMP port unreachable, which doubles the kernel's cost of its sendto. The sink also measures
  the packets as received: |D| (arrival gap less the RTP timestamps' gap, RFC 3550), over all
  packets, an upper bound of the send jitter as it shares its core with sipp;

What it measures:
- calls placed, successful and failed: sipp's statistics (-trace_stat, one row a second) and
  exit status, and the server's own records of the calls (GET /calls): end reason, and each
  call's `rtp` audit entry (packets received, sent, lost, late);
- the concurrent peak: sipp's CurrentCall and the server's live calls (/healthz, each second);
- server CPU: user + system of the server and its recognition workers from /proc, from sipp's
  start until the last call has ended on the server, per call placed and per second of call
  (% of a core per concurrent call); also the mean and max each second, and where the calls
  were at their peak;
- RTP send lateness: the SIP gateway's media clock sends every call its packet on one 20 ms
  tick (voice_agent/gateways/sip.py); with `record_lateness` set it keeps how late each tick ran
  against its deadline (`send_lateness_ms`). The child also times each tick, so the lateness of
  the tick's last packet (tick lateness + the time to send every call's packet) is reported
  too, with the tick's own time on the thread's CPU clock. Percentiles over the whole run and
  over the peak (ticks with at least 95% of the peak's calls), over the ticks that sent; the
  wake-ups that found no frame due (before the deadline on the loop's whole-ms clock) are
  counted apart, since they only re-arm;
- the event loop's lag: the server's own monitor (a wake-up every 0.5 s), every sample kept;
  and every garbage collection, with how long it held the loop;
- the rest of the machine: its busy CPU less the server, sipp, this script and interrupts,
  on all cores and on the server's, the VM's steal time, and the load average: other work on
  the machine shows there, so a disturbed run can be told and rerun. `--nice -10` (the run
  and its sessions' autogroups) keeps other sessions' work from taking the server's turns.

Results: a JSON file in loadtest-results/ (or `--out`), with sipp's statistics CSV, the
server's log and every tick and loop-lag sample (.samples.json; times on CLOCK_MONOTONIC, `t0`
sipp's start) next to it; a summary table printed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadgen.stats import percentile  # the load test's nearest rank, for figures side by side

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
SCENARIO = SCRIPTS / "sipp" / "sip_load.xml"
AUDIO = ROOT / "tests" / "fixtures" / "audio"
RESULTS = ROOT / "loadtest-results"
CLK_TCK = os.sysconf("SC_CLK_TCK")
FRAME_BYTES = 160  # 20 ms of G.711 at 8 kHz
ULAW_SILENCE = b"\xff"
# The caller's lines (seconds after the answer, fixture): the greeting takes about 7 s, and
# each line leaves the agent time to answer before the next. "no thanks" (joe_book5) is left
# out: the agent says goodbye and hangs up, and the call would end before --duration.
CALLER_LINES = ((7.5, "joe_book1"), (15.0, "joe_book2"), (21.0, "joe_book3"), (29.0, "joe_book4"))
PEAK_SHARE = 0.95  # ticks and seconds with at least this share of the peak's calls: "at peak"
STT_CONFIGS: dict[str, dict[str, Any]] = {
    "pocketsphinx": {"provider": "pocketsphinx"},
    "whisper": {"provider": "whisper", "model": "tiny.en"},
}


# ---- the server process -------------------------------------------------------------------


def _child_main(argv: list[str]) -> int:
    """`--child CONFIG SIP_LISTEN REPORT`: the server, until SIGTERM; then REPORT is written."""
    config, listen, report = argv
    try:
        import uvloop
    except ImportError:
        import asyncio

        return asyncio.run(_serve(Path(config), listen, Path(report)))
    return uvloop.run(_serve(Path(config), listen, Path(report)))


async def _serve(config: Path, listen: str, report: Path) -> int:
    import asyncio
    import gc
    import logging

    from voice_agent.agents.registry import AgentRegistry
    from voice_agent.observability import configure_logging
    from voice_agent.server.app import VoiceServer

    class MeasuredServer(VoiceServer):
        """VoiceServer that keeps every loop-lag sample it takes, with when it took it."""

        lags: list[tuple[float, float]]

        def _on_loop_lag(self, lag_s: float) -> None:
            self.lags.append((time.monotonic(), lag_s * 1000))
            super()._on_loop_lag(lag_s)

    configure_logging(level=logging.INFO)
    logging.getLogger("websockets.server").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    registry = AgentRegistry.from_file(config)
    server = MeasuredServer(registry, port=0, sip_listen=listen)
    server.lags = []
    await server.start()
    gateway = server.sip
    assert gateway is not None
    # Each tick of the media clock: when it ran, how late against its deadline, how long
    # sending every call's packet took, and how many calls the gateway had. The gateway itself
    # appends each tick's lateness to send_lateness_ms, in the same order, but on uvloop's loop
    # clock: CLOCK_MONOTONIC in whole milliseconds. This reads the same clock to the microsecond.
    # A wake-up that finds no frame due (it came before the deadline, on the loop's clock)
    # sends nothing and only re-arms: it is counted, and left out of the lateness.
    ticks: list[tuple[float, float | None, float, int, float, bool]] = []
    tick = gateway._tick_media
    clock, cpu_clock = time.perf_counter, time.thread_time

    def timed_tick() -> None:
        pacer = gateway._pacer
        due_ms = pacer.next_deadline_ms if pacer is not None else None
        now, started, cpu = time.monotonic(), clock(), cpu_clock()
        tick()
        took, cpu_took = (clock() - started) * 1000, (cpu_clock() - cpu) * 1000
        late = now * 1000 - due_ms if due_ms is not None else None
        sent = pacer is None or gateway._pacer is not pacer or pacer.next_deadline_ms != due_ms
        ticks.append((now, late, took, len(gateway.calls), cpu_took, sent))

    gateway._tick_media = timed_tick  # type: ignore[method-assign]
    # Every garbage collection: when, which generation, how long it held the loop.
    collections: list[tuple[float, int, float]] = []
    collecting: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collecting[:] = [clock()]
        elif collecting:
            took = (clock() - collecting[0]) * 1000
            collections.append((time.monotonic(), info["generation"], took))

    gc.callbacks.append(on_gc)
    gateway.record_lateness = True
    gc.freeze()  # as `voice-agent serve` does once started
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ready = {"pid": os.getpid(), "http_port": server.port, "sip_port": gateway.port}
    print("ready " + json.dumps(ready), flush=True)
    await stop.wait()
    lateness = list(gateway.send_lateness_ms)
    count = min(len(lateness), len(ticks))
    text = json.dumps(
        {
            # [when, the gateway's lateness, the same to the microsecond, the tick's own
            # time, the calls the gateway had, the tick's own time on the CPU, 1 if it sent]
            "ticks": [
                [
                    round(t, 4),
                    round(late, 3),
                    _round(precise),
                    round(took, 3),
                    calls,
                    round(cpu, 3),
                    int(sent),
                ]
                for late, (t, precise, took, calls, cpu, sent) in zip(
                    lateness[:count], ticks[:count], strict=True
                )
            ],
            "loop_lag_ms": [[round(t, 3), round(lag, 2)] for t, lag in server.lags],
            "gc": [[round(t, 3), gen, round(took, 3)] for t, gen, took in collections],
            "pacer_dropped_frames": getattr(gateway._pacer, "dropped", None),
        }
    )
    await asyncio.to_thread(report.write_text, text)
    await server.shutdown(2)
    await registry.aclose()
    return 0


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# ---- /proc ----------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                text = Path(f"/proc/{entry}/stat").read_text()
                parent = int(text.rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
    return children


def cpu_seconds(pid: int, *, tree: bool = True) -> float:
    """User + system CPU seconds of `pid` and, with `tree`, its descendants (the recognition
    workers count as the server)."""
    pids, total = [pid], 0.0
    family = _children() if tree else {}
    while pids:
        current = pids.pop()
        with contextlib.suppress(OSError, IndexError):
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
            pids.extend(family.get(current, []))
    return total


@dataclass(frozen=True)
class CpuStat:
    """From /proc/stat, seconds since boot: busy time of all cores (user, system, interrupts),
    the part of it spent in interrupts (the loopback's packet delivery runs there, charged to
    no process), the time the VM's host kept its cores from running although they had work
    (steal), and the same busy and steal time of the server's cores alone."""

    busy: float
    irq: float
    steal: float
    server_cores_busy: float
    server_cores_steal: float

    @classmethod
    def read(cls, server_cpus: set[int]) -> CpuStat:
        busy = irq = steal = cores_busy = cores_steal = 0.0
        for line in Path("/proc/stat").read_text().splitlines():
            if not line.startswith("cpu"):
                break
            name, *fields = line.split()
            v = [int(x) for x in fields]
            # user nice system idle iowait irq softirq steal (guest time is in user already)
            line_busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / CLK_TCK
            if name == "cpu":
                busy, irq, steal = line_busy, (v[5] + v[6]) / CLK_TCK, v[7] / CLK_TCK
            elif int(name[3:]) in server_cpus:
                cores_busy += line_busy
                cores_steal += v[7] / CLK_TCK
        return cls(busy, irq, steal, cores_busy, cores_steal)

    def minus(self, other: CpuStat) -> CpuStat:
        return CpuStat(
            self.busy - other.busy,
            self.irq - other.irq,
            self.steal - other.steal,
            self.server_cores_busy - other.server_cores_busy,
            self.server_cores_steal - other.server_cores_steal,
        )


@dataclass(frozen=True)
class Snapshot:
    """CPU seconds at one moment: the server (with its workers), sipp, this script, the
    machine."""

    t: float
    server: float
    server_main: float  # the server process alone, without its recognition workers
    sipp: float
    this_script: float
    stat: CpuStat

    def shares(self, before: Snapshot) -> dict[str, float]:
        """CPU in % of one core between `before` and now. `other` is what else ran on the
        machine: busy time less the server, sipp, this script and interrupts; `other on the
        server's cores` is what took the server's cores besides the server."""
        elapsed = max(1e-6, self.t - before.t)
        stat = self.stat.minus(before.stat)

        def pct(seconds: float) -> float:
            return round(seconds / elapsed * 100, 1)

        ours = (self.server - before.server) + (self.sipp - before.sipp)
        ours += self.this_script - before.this_script
        return {
            "server_cpu_pct": pct(self.server - before.server),
            "server_main_cpu_pct": pct(self.server_main - before.server_main),
            "sipp_cpu_pct": pct(self.sipp - before.sipp),
            "this_script_cpu_pct": pct(self.this_script - before.this_script),
            "machine_cpu_pct": pct(stat.busy),
            "irq_cpu_pct": pct(stat.irq),
            "steal_cpu_pct": pct(stat.steal),
            "steal_on_server_cores_pct": pct(stat.server_cores_steal),
            "other_cpu_pct": pct(max(0.0, stat.busy - stat.irq - ours)),
            "other_on_server_cores_pct": pct(
                max(0.0, stat.server_cores_busy - (self.server - before.server))
            ),
        }


def busiest_others(exclude: set[int], count: int = 5) -> list[str]:
    """The processes outside this run using the most CPU now (ps's lifetime average)."""
    try:
        out = subprocess.run(
            ["ps", "-eo", "pid,pcpu,etimes,args", "--sort=-pcpu", "--no-headers"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    lines = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4 or int(parts[0]) in exclude or float(parts[1]) < 1.0:
            continue
        lines.append(f"pid {parts[0]} {parts[1]}% for {parts[2]} s: {parts[3][:100]}")
        if len(lines) >= count:
            break
    return lines


# ---- statistics ---------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, float | int | None]:
    def r(value: float | None) -> float | None:
        return None if value is None else round(value, 2)

    return {
        "n": len(values),
        "p50": r(percentile(values, 50)),
        "p90": r(percentile(values, 90)),
        "p99": r(percentile(values, 99)),
        "p999": r(percentile(values, 99.9)),
        "max": r(max(values)) if values else None,
        "mean": r(sum(values) / len(values)) if values else None,
    }


def fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


# ---- the caller ---------------------------------------------------------------------------


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def caller_audio(duration_s: float, caller: str) -> bytes:
    """The caller's side of the line, as G.711 mu-law: quiet, the booking conversation's lines
    at CALLER_LINES (`caller` "conversation"; "silence" says nothing), quiet again to a second
    past the hang-up (sipp stops it with the call)."""
    total = int((duration_s + 1) * 8000)
    audio = bytearray(ULAW_SILENCE * total)
    for at_s, name in CALLER_LINES if caller == "conversation" else ():
        start = int(at_s * 8000)
        line = (AUDIO / f"{name}.ulaw").read_bytes()[: max(0, total - start)]
        audio[start : start + len(line)] = line
    return bytes(audio[: total - total % FRAME_BYTES])


def write_scenario(folder: Path, duration_s: float, caller: str) -> Path:
    """scripts/sipp/sip_load.xml with its capture made and filled in, in `folder`."""
    from tests.support.sipp import write_rtp_pcap

    pcap = folder / "caller.pcap"
    write_rtp_pcap(pcap, caller_audio(duration_s, caller), payload_type=0)
    path = folder / "sip_load.xml"
    path.write_text(SCENARIO.read_text().replace("{pcap}", str(pcap)))
    return path


def sipp_command(
    args: argparse.Namespace,
    target: str,
    scenario: Path,
    folder: Path,
    *,
    calls: int,
    rate: float,
    limit: int,
    duration_s: float,
    timeout_s: int,
) -> list[str]:
    sipp = shutil.which("sipp")
    assert sipp is not None
    return [
        sipp, target, "-sf", str(scenario), "-i", "127.0.0.1", "-p", str(free_udp_port()),
        "-mi", "127.0.0.1", "-mp", str(args.media_port), "-r", f"{rate:g}", "-l", str(limit),
        "-m", str(calls), "-d", str(int(duration_s * 1000)), "-nostdin",
        "-trace_stat", "-stf", str(folder / "stats.csv"), "-fd", "1",
        "-trace_screen", "-screen_file", str(folder / "screen.log"),
        "-trace_err", "-error_file", str(folder / "errors.log"),
        "-timeout", f"{timeout_s}s", "-timeout_error",
    ]  # fmt: skip


def read_sipp_stats(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle, delimiter=";"))


def _int(row: dict[str, str], key: str) -> int:
    try:
        return int(float(row.get(key) or 0))
    except ValueError:
        return 0


def prioritise(pid: int, nice: int) -> None:
    """Run `pid` at `nice`, and its session's autogroup too: with the kernel's autogroups on
    (/proc/sys/kernel/sched_autogroup_enabled), a process's nice orders it only against its
    own session's, and sessions share the CPU evenly whatever their processes' nice; the
    autogroup's own nice (/proc/PID/autogroup) orders the sessions."""
    if not nice:
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


class RtpSink:
    """The callers' RTP ports, bound and drained: sipp plays each call's capture from a raw
    socket with the call's port as the source, but binds no socket there, so without these the
    server's packets would each draw an ICMP port unreachable (on loopback, not rate-limited),
    which doubles the kernel's cost of every sendto (measured: ~20 against ~10 us). A thread
    reads them and keeps, per call (port), the packets and RFC 3550 interarrival jitter, and over
    all packets a histogram of |D| (arrival gap less the RTP timestamps' gap): the jitter as
    received here, an upper bound since this reader shares its core with sipp."""

    BIN_MS = 0.1

    def __init__(self, first_port: int, count: int) -> None:
        import selectors

        self.selector = selectors.EpollSelector()
        self.sockets: list[socket.socket] = []
        self.state: dict[int, list[float]] = {}
        self.histogram = [0] * 20_000  # |D| in BIN_MS bins, up to 2 s
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.skipped = 0
        # sipp binds the first itself (its -mp socket, which call 1 is given): from the second.
        for index in range(1, count):
            port = first_port + 4 * index
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                self.skipped += 1
                continue
            sock.setblocking(False)
            self.selector.register(sock, 1, index)
            self.sockets.append(sock)
        self.thread = threading.Thread(target=self._run, name="rtp-sink", daemon=True)
        self.thread.start()

    def reset(self) -> None:
        with self.lock:
            self.state.clear()
            self.histogram = [0] * len(self.histogram)

    def _run(self) -> None:
        import struct

        unpack = struct.Struct(">I").unpack_from
        clock = time.perf_counter
        while not self.closing.is_set():
            for key, _ in self.selector.select(0.2):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                while True:
                    try:
                        data = sock.recv(2048)
                    except BlockingIOError:
                        break
                    except OSError:
                        break
                    now = clock() * 1000
                    if len(data) < 12:
                        continue
                    stamp = unpack(data, 4)[0]
                    with self.lock:
                        # [packets, last arrival ms, last RTP timestamp, jitter, max jitter]
                        entry = self.state.get(key.data)
                        if entry is None:
                            self.state[key.data] = [1, now, stamp, 0.0, 0.0]
                            continue
                        entry[0] += 1
                        gap = (now - entry[1]) - ((stamp - entry[2]) & 0xFFFFFFFF) / 8
                        entry[1], entry[2] = now, stamp
                        d = abs(gap)
                        entry[3] += (d - entry[3]) / 16
                        entry[4] = max(entry[4], entry[3])
                        self.histogram[min(len(self.histogram) - 1, int(d / self.BIN_MS))] += 1

    def close(self) -> dict[str, Any]:
        self.closing.set()
        self.thread.join(5)
        for sock in self.sockets:
            self.selector.unregister(sock)
            sock.close()
        with self.lock:
            calls = list(self.state.values())
            histogram = list(self.histogram)
        total = sum(histogram)

        def at(p: float) -> float | None:
            if not total:
                return None
            rank, seen = p / 100 * total, 0
            for index, count in enumerate(histogram):
                seen += count
                if seen >= rank:
                    return round((index + 1) * self.BIN_MS, 1)
            return None

        top = max((i for i, c in enumerate(histogram) if c), default=None)
        return {
            "ports_bound": len(self.sockets),
            "ports_in_use_elsewhere": self.skipped,
            "calls": len(calls),
            "packets": sum(int(c[0]) for c in calls),
            "interarrival_deviation_ms": {
                "n": total,
                "p50": at(50),
                "p99": at(99),
                "p999": at(99.9),
                "max": None if top is None else round((top + 1) * self.BIN_MS, 1),
            },
            "rfc3550_jitter_ms_per_call_max": summary([c[4] for c in calls]),
        }


# ---- the run ------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args = args
        self.out = out
        self.tmp = Path(tempfile.mkdtemp(prefix="sip-load-"))
        self.server: subprocess.Popen[str] | None = None
        self.ready: dict[str, Any] = {}
        self.server_log = out.with_suffix(".server.log")
        self.report = self.tmp / "server-report.json"
        cpus = set(os.sched_getaffinity(0))
        self.server_cpus = set(args.server_cpus)
        self.client_cpus = cpus - self.server_cpus
        if not self.client_cpus or not self.server_cpus <= cpus:
            raise SystemExit(
                f"sip_load: --server-cpus {sorted(self.server_cpus)} must leave sipp a core "
                f"of {sorted(cpus)}"
            )
        self.http_url = ""
        self.t0 = time.monotonic()  # sipp's start, once it has started

    # -- the server --

    def config(self) -> Path:
        from tests.support.configs import default_config_with

        data = self.tmp / "data"
        return default_config_with(
            self.tmp,
            voice={"stt": STT_CONFIGS[self.args.stt]},
            sip={"rtp_port_min": 20000, "rtp_port_max": 21999},
            server={"data_dir": str(data), "max_calls": self.args.max_calls},
        )

    def start_server(self) -> None:
        listen = f"127.0.0.1:{free_udp_port()}"
        data = self.tmp / "data"
        data.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "VOICE_AGENT_DATA_DIR": str(data),  # the booking functions' database too
            "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, str(Path(__file__).resolve()), "--child"]
        command += [str(self.config()), listen, str(self.report)]
        cpus = self.server_cpus
        self.server = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.server_log.open("w"),
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, cpus),
            start_new_session=True,  # an autogroup of its own: see prioritise
        )
        prioritise(self.server.pid, self.args.nice)
        assert self.server.stdout is not None
        deadline = time.monotonic() + 180
        line = ""
        while not line.startswith("ready "):
            line = self.server.stdout.readline()
            if not line and (self.server.poll() is not None or time.monotonic() > deadline):
                tail = self.server_log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"sip_load: the server did not start:\n{tail}")
        self.ready = json.loads(line.removeprefix("ready "))
        self.http_url = f"http://127.0.0.1:{self.ready['http_port']}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.ready['sip_port']}"

    def health(self) -> dict[str, Any]:
        import httpx

        try:
            body: dict[str, Any] = httpx.get(f"{self.http_url}/healthz", timeout=2.0).json()
            return body
        except (httpx.HTTPError, ValueError):
            return {}

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.health().get("live_calls") == 0:
                return True
            time.sleep(0.2)
        return False

    def stop_server(self) -> dict[str, Any]:
        if self.server is None or self.server.poll() is not None:
            return {}
        self.server.send_signal(signal.SIGTERM)
        try:
            self.server.wait(30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        if not self.report.exists():
            return {}
        report: dict[str, Any] = json.loads(self.report.read_text())
        return report

    def call_records(self, exclude: set[str]) -> list[dict[str, Any]]:
        """Every SIP call the server recorded but those in `exclude`: the full records."""
        import httpx

        records: list[dict[str, Any]] = []
        # The server answers one HTTP request per connection (websockets' process_request):
        # a kept-alive connection may be closed under the next request.
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=self.http_url, timeout=10.0, limits=limits) as http:
            offset: int | None = 0
            ids: list[str] = []
            while offset is not None:
                page = http.get("/calls", params={"limit": 200, "offset": offset}).json()
                ids += [c["call_id"] for c in page["calls"] if c.get("transport") == "sip"]
                offset = page.get("next_offset")
            for call_id in ids:
                if call_id not in exclude:
                    records.append(http.get(f"/calls/{call_id}").json())
        return records

    # -- sipp --

    def sipp(
        self,
        scenario: Path,
        folder: Path,
        *,
        calls: int,
        rate: float,
        limit: int,
        duration_s: float,
    ) -> subprocess.Popen[bytes]:
        folder.mkdir(parents=True, exist_ok=True)
        placing_s = calls / min(rate, limit / max(duration_s, 0.1))
        timeout_s = int(placing_s + duration_s + 120)
        command = sipp_command(
            self.args,
            self.target,
            scenario,
            folder,
            calls=calls,
            rate=rate,
            limit=limit,
            duration_s=duration_s,
            timeout_s=timeout_s,
        )
        cpus = self.client_cpus
        process = subprocess.Popen(
            command,
            cwd=folder,
            stdout=subprocess.DEVNULL,
            stderr=(folder / "stderr.log").open("wb"),
            preexec_fn=lambda: os.sched_setaffinity(0, cpus),
            start_new_session=True,
        )
        prioritise(process.pid, self.args.nice)
        return process

    def warm_up(self, scenario: Path) -> set[str]:
        """One unmeasured call: a fresh server pays its first call's costs on it (lazy
        imports, first decoders, the flow's first booking: a first turn stalled the loop for
        ~110 ms when it was measured), so it lasts until the caller's last line has been
        answered (the first no-input prompt for silent callers)."""
        folder = self.tmp / "warm-up"
        last_line = CALLER_LINES[-1][0] + 7 if self.args.caller == "conversation" else 17.0
        duration_s = min(self.args.duration, last_line)
        process = self.sipp(scenario, folder, calls=1, rate=1, limit=1, duration_s=duration_s)
        process.wait(duration_s + 90)
        if process.returncode != 0:
            errors = (folder / "stderr.log").read_text(errors="replace")[-2000:]
            raise SystemExit(f"sip_load: the warm-up call failed (sipp {process.returncode}):\n"
                             f"{errors}")  # fmt: skip
        self.wait_idle()
        return {c["call_id"] for c in self.call_records(set())}

    def execute(self) -> dict[str, Any]:
        args = self.args
        os.sched_setaffinity(0, self.client_cpus)
        prioritise(os.getpid(), args.nice)  # the server and sipp, started from here, inherit it
        scenario = write_scenario(self.tmp, args.duration, args.caller)
        self.start_server()
        server_pid = int(self.ready["pid"])
        # sipp gives call n the port media_port + 4 (n - 1), modulo 10,000.
        sink = RtpSink(args.media_port, min(args.calls, 2500))
        warm = self.warm_up(scenario) if args.warm_up else set()
        time.sleep(args.settle)
        folder = self.tmp / "run"
        load_before = [round(v, 2) for v in os.getloadavg()]
        others_before = busiest_others(self._ours(server_pid))
        print(
            f"sip_load: {args.calls} calls, {args.rate:g}/s, at most {args.limit} at once, "
            f"{args.duration:g} s each, {args.caller} callers, {args.stt}; server pid "
            f"{server_pid} on CPU {sorted(self.server_cpus)}; load average {load_before}",
            flush=True,
        )
        sink.reset()
        first = self.snapshot(server_pid, None)
        self.t0 = first.t
        process = self.sipp(
            scenario,
            folder,
            calls=args.calls,
            rate=args.rate,
            limit=args.limit,
            duration_s=args.duration,
        )
        timeline: list[dict[str, Any]] = []
        last = first
        next_at = first.t + 1.0
        while process.poll() is None:
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += 1.0
            now = self.snapshot(server_pid, process.pid, last)
            health = self.health()
            timeline.append(
                {
                    "t": round(now.t - self.t0, 1),
                    "live_calls": health.get("live_calls"),
                    "loop_lag_ms": health.get("loop_lag_ms"),
                    **now.shares(last),
                }
            )
            last = now
            if args.progress and len(timeline) % args.progress == 0:
                row = timeline[-1]
                print(
                    f"  {row['t']:5.0f} s: {row['live_calls']} live, server "
                    f"{row['server_cpu_pct']:.0f}%, loop lag {row['loop_lag_ms']} ms, "
                    f"other work {row['other_cpu_pct']:.0f}%",
                    flush=True,
                )
        sipp_end = time.monotonic()
        idle = self.wait_idle()
        end = self.snapshot(server_pid, None, last)
        received = sink.close()
        load_after = [round(v, 2) for v in os.getloadavg()]
        records = self.call_records(warm)
        others_after = busiest_others(self._ours(server_pid))
        report = self.stop_server()
        if report:  # every tick and loop-lag sample, for a closer look
            samples = {**report, "t0": first.t}
            self.out.with_suffix(".samples.json").write_text(json.dumps(samples))
        if (folder / "stats.csv").exists():
            shutil.copy(folder / "stats.csv", self.out.with_suffix(".sipp.csv"))
        return self._result(
            process.returncode,
            folder,
            timeline,
            records,
            report,
            window=(first.t, sipp_end, end.t),
            totals=end.shares(first),
            server_cpu_s=end.server - first.server,
            sipp_cpu_s=end.sipp,
            idle=idle,
            received=received,
            machine={
                "cpus": os.cpu_count(),
                "loadavg_before": load_before,
                "loadavg_after": load_after,
                "busiest_other_processes_before": others_before,
                "busiest_other_processes_after": others_after,
            },
        )

    def _ours(self, server_pid: int) -> set[int]:
        family, ours, todo = _children(), {os.getpid()}, [server_pid, os.getpid()]
        while todo:
            pid = todo.pop()
            ours.add(pid)
            todo.extend(family.get(pid, []))
        return ours

    def snapshot(
        self, server_pid: int, sipp_pid: int | None, last: Snapshot | None = None
    ) -> Snapshot:
        """CPU seconds so far; sipp's stay at their last reading once it has exited."""
        sipp = cpu_seconds(sipp_pid, tree=False) if sipp_pid is not None else 0.0
        return Snapshot(
            time.monotonic(),
            cpu_seconds(server_pid),
            cpu_seconds(server_pid, tree=False),
            max(sipp, last.sipp if last is not None else 0.0),
            cpu_seconds(os.getpid(), tree=False),
            CpuStat.read(self.server_cpus),
        )

    def _result(
        self,
        returncode: int | None,
        folder: Path,
        timeline: list[dict[str, Any]],
        records: list[dict[str, Any]],
        report: dict[str, Any],
        *,
        window: tuple[float, float, float],
        totals: dict[str, float],
        server_cpu_s: float,
        sipp_cpu_s: float,
        idle: bool,
        received: dict[str, Any],
        machine: dict[str, Any],
    ) -> dict[str, Any]:
        args = self.args
        t0, sipp_end, t1 = window
        stats = read_sipp_stats(folder / "stats.csv")
        final = stats[-1] if stats else {}
        placed = _int(final, "TotalCallCreated")
        failure_kinds = {
            key.removesuffix("(C)"): _int(final, key)
            for key in final
            if key.startswith("Failed") and key.endswith("(C)") and _int(final, key)
        }
        sipp_peak = max((_int(row, "CurrentCall") for row in stats), default=0)
        server_peak = max((row["live_calls"] or 0 for row in timeline), default=0)

        # ticks: [when, gateway's lateness, precise lateness, tick's time, calls, tick's CPU,
        # sent]; the wake-ups that sent nothing are counted apart
        woken = [tick for tick in report.get("ticks", []) if t0 <= tick[0] <= t1]
        ticks = [tick for tick in woken if tick[6]]
        tick_peak = max((tick[4] for tick in ticks), default=0)
        at_peak = [tick for tick in ticks if tick_peak and tick[4] >= PEAK_SHARE * tick_peak]
        peak_span = (at_peak[0][0], at_peak[-1][0]) if at_peak else (0.0, -1.0)
        lag_samples = report.get("loop_lag_ms", [])
        lags = [lag for t, lag in lag_samples if t0 <= t <= t1]
        lags_at_peak = [lag for t, lag in lag_samples if peak_span[0] <= t <= peak_span[1]]
        collections = [c for c in report.get("gc", []) if t0 <= c[0] <= t1]

        def precise(rows: list[list[Any]], last_packet: bool = False) -> dict[str, Any]:
            return summary([r[2] + (r[3] if last_packet else 0) for r in rows if r[2] is not None])

        rtp = [_rtp(record) for record in records]
        reasons: dict[str, int] = {}
        for record in records:
            reason = str(record.get("end_reason"))
            reasons[reason] = reasons.get(reason, 0) + 1
        # A call's length on the server's own clock: a packet sent each 20 ms tick.
        call_seconds = sum((r["packets_sent"] or 0) * 0.02 for r in rtp)
        peak_rows = [
            row
            for row in timeline
            if server_peak and (row["live_calls"] or 0) >= PEAK_SHARE * server_peak
        ]

        def mean(key: str, rows: list[dict[str, Any]]) -> float | None:
            values = [row[key] for row in rows if row.get(key) is not None]
            return round(sum(values) / len(values), 1) if values else None

        def most(key: str, rows: list[dict[str, Any]]) -> float | None:
            return max((row[key] for row in rows if row.get(key) is not None), default=None)

        return {
            "tool": "scripts/sip_load.py",
            "command": " ".join(sys.argv),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "settings": {
                "calls": args.calls,
                "rate": args.rate,
                "limit": args.limit,
                "duration_s": args.duration,
                "stt": args.stt,
                "caller": args.caller,
                "server_cpus": sorted(self.server_cpus),
                "nice": args.nice,
                "sipp_cpus": sorted(self.client_cpus),
                "max_calls": args.max_calls,
                "caller_lines": [list(line) for line in CALLER_LINES],
            },
            "machine": {**machine, "python_speed_us": python_speed_us()},
            "sipp": {
                "exit_status": returncode,
                "calls_placed": placed,
                "successful": _int(final, "SuccessfulCall(C)"),
                "failed": _int(final, "FailedCall(C)"),
                "failure_kinds": failure_kinds,
                "concurrent_peak": sipp_peak,
                "retransmissions": _int(final, "Retransmissions(C)"),
                "invite_to_200_ms_mean": _duration_ms(final.get("ResponseTime1(C)")),
                "cpu_s": round(sipp_cpu_s, 2),
                "errors_log": _tail(folder / "errors.log"),
                "stderr": _tail(folder / "stderr.log"),
            },
            "server": {
                "calls_recorded": len(records),
                "end_reasons": reasons,
                "concurrent_peak": server_peak,
                "all_calls_ended": idle,
                "cpu_s": round(server_cpu_s, 2),
                "cpu_s_per_call": round(server_cpu_s / placed, 3) if placed else None,
                "call_seconds": round(call_seconds, 1),
                "cpu_pct_per_concurrent_call": (
                    round(server_cpu_s / call_seconds * 100, 3) if call_seconds else None
                ),
                "cpu_pct_mean": mean("server_cpu_pct", timeline),
                "cpu_pct_max": most("server_cpu_pct", timeline),
                "cpu_pct_mean_at_peak": mean("server_cpu_pct", peak_rows),
                "main_process_cpu_pct_mean_at_peak": mean("server_main_cpu_pct", peak_rows),
                "seconds_at_peak": len(peak_rows),
                "loop_lag_ms": summary(lags),
                "loop_lag_ms_at_peak": summary(lags_at_peak),
                "pacer_dropped_frames": report.get("pacer_dropped_frames"),
                "gc_ms": {
                    f"generation_{gen}": summary([c[2] for c in collections if c[1] == gen])
                    for gen in (0, 1, 2)
                },
            },
            "rtp_send": {
                "ticks": len(ticks),
                # Wake-ups of the media clock that found no frame due and only re-armed.
                "empty_wakeups": len(woken) - len(ticks),
                "ticks_at_peak": len(at_peak),
                "calls_per_tick_peak": tick_peak,
                # The gateway's own figure (send_lateness_ms), on the loop's whole-ms clock.
                "gateway_lateness_ms": summary([tick[1] for tick in ticks]),
                # ... and over every wake-up, as send_lateness_ms holds them.
                "gateway_lateness_ms_every_wakeup": summary([tick[1] for tick in woken]),
                "gateway_lateness_ms_at_peak": summary([tick[1] for tick in at_peak]),
                # The tick's first packet, then its last (after every call's packet is sent).
                "first_packet_lateness_ms": precise(ticks),
                "first_packet_lateness_ms_at_peak": precise(at_peak),
                "last_packet_lateness_ms": precise(ticks, last_packet=True),
                "last_packet_lateness_ms_at_peak": precise(at_peak, last_packet=True),
                "tick_duration_ms_at_peak": summary([tick[3] for tick in at_peak]),
                # The same on the CPU (the thread's clock): the rest of it the tick waited,
                # for the GIL or for the core.
                "tick_cpu_ms_at_peak": summary([tick[5] for tick in at_peak]),
            },
            "rtp_calls": {
                "calls": len(rtp),
                "without_rtp_in": sum(1 for r in rtp if not r["packets_received"]),
                "without_rtp_out": sum(1 for r in rtp if not r["packets_sent"]),
                "packets_received": sum(r["packets_received"] or 0 for r in rtp),
                "packets_sent": sum(r["packets_sent"] or 0 for r in rtp),
                "lost": sum(r["lost"] or 0 for r in rtp),
                "late": sum(r["late"] or 0 for r in rtp),
                "underruns": sum(r["underruns"] or 0 for r in rtp),
                "jitter_ms_max": most("jitter_ms", rtp),
            },
            "conversation": _conversation(records),
            "rtp_received_by_callers": received,
            "load": {
                "duration_s": round(t1 - t0, 1),
                "sipp_s": round(sipp_end - t0, 1),
                **{f"{key}_mean": value for key, value in totals.items()},
                "other_cpu_pct_max": most("other_cpu_pct", timeline),
                "other_on_server_cores_pct_max": most("other_on_server_cores_pct", timeline),
                "steal_cpu_pct_max": most("steal_cpu_pct", timeline),
                "steal_on_server_cores_pct_max": most("steal_on_server_cores_pct", timeline),
            },
            "timeline": timeline,
        }

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
            self.server.wait()
        if not self.args.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            print(f"sip_load: kept {self.tmp}")


def _rtp(record: dict[str, Any]) -> dict[str, Any]:
    entries = [e for e in record.get("audit", []) if e.get("type") == "rtp"]
    entry = entries[-1] if entries else {}
    return {
        "packets_received": entry.get("received"),
        "packets_sent": entry.get("sent"),
        "lost": entry.get("lost"),
        "late": entry.get("late"),
        "underruns": entry.get("underruns"),
        "jitter_ms": entry.get("jitter_ms"),
    }


def _conversation(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the agent made of the callers: their turns, the bookings made (the conversation's
    fourth line confirms one), the errors in the calls' audits and the wait from each turn's
    speech end to the agent's first audio sent (the server's own turn metrics): recognition
    falling behind shows here, as STT timeouts and turns that never come."""
    turns = booked = 0
    waits: list[float] = []
    errors: dict[str, int] = {}
    for record in records:
        for event in record.get("audit") or []:
            if event.get("type") == "error":
                where = str(event.get("where") or event.get("source") or "?")
                errors[where] = errors.get(where, 0) + 1
        messages = (record.get("context") or {}).get("messages") or []
        turns += sum(1 for m in messages if m.get("role") == "user")
        booked += any(
            "booked" in str(m.get("content") or "")
            for m in messages
            if m.get("role") == "assistant"
        )
        for metrics in record.get("turns") or []:
            wait = metrics.get("speech_end_to_first_audio_ms")
            if wait is not None:
                waits.append(float(wait))
    return {
        "user_turns": turns,
        "calls_booked": booked,
        "errors": errors,  # in the calls' audits, by where: "stt" when recognition fell behind
        "speech_end_to_first_audio_ms": summary(waits),
    }


def _duration_ms(text: str | None) -> float | None:
    """sipp's HH:MM:SS:microseconds, in milliseconds."""
    try:
        hours, minutes, seconds, micros = (int(part) for part in (text or "").split(":"))
    except ValueError:
        return None
    return round(((hours * 60 + minutes) * 60 + seconds) * 1000 + micros / 1000, 1)


def _tail(path: Path, chars: int = 1500) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def python_speed_us() -> float:
    """scripts/loadgen/run.py's yardstick: this machine's Python on `sum(range(1000))`, in
    microseconds, so that runs of different hours can be compared."""
    import timeit

    runs = timeit.Timer("sum(range(1000))").repeat(repeat=5, number=2000)
    return round(min(runs) / 2000 * 1e6, 1)


# ---- the report ---------------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    sipp, server, send, rtp, load = (
        result["sipp"],
        result["server"],
        result["rtp_send"],
        result["rtp_calls"],
        result["load"],
    )

    def pcts(summary: dict[str, Any]) -> str:
        return f"{fmt(summary['p50'])} / {fmt(summary['p99'])} / {fmt(summary['max'], ' ms')}"

    failures = f" {sipp['failure_kinds']}" if sipp["failure_kinds"] else ""
    arrival = result["rtp_received_by_callers"]["interarrival_deviation_ms"]
    talk = result["conversation"]
    rows = [
        ("calls placed / successful / failed (sipp)",
         f"{sipp['calls_placed']} / {sipp['successful']} / {sipp['failed']}{failures}"),
        ("calls the server recorded, end reasons", f"{server['calls_recorded']}: "
         + ", ".join(f"{k} {v}" for k, v in server["end_reasons"].items())),
        ("concurrent peak (sipp / server)", f"{sipp['concurrent_peak']} / "
         f"{server['concurrent_peak']} ({server['seconds_at_peak']} s at the peak)"),
        ("server CPU per call",
         f"{fmt(server['cpu_s_per_call'], ' s', 2)} for {result['settings']['duration_s']:g} s "
         f"calls; {fmt(server['cpu_pct_per_concurrent_call'], '%', 2)} of a core per "
         "concurrent call"),
        ("server CPU mean / at the peak / max", f"{fmt(server['cpu_pct_mean'], '%', 0)} / "
         f"{fmt(server['cpu_pct_mean_at_peak'], '%', 0)} / {fmt(server['cpu_pct_max'], '%', 0)}"
         f" (at the peak, the main process "
         f"{fmt(server['main_process_cpu_pct_mean_at_peak'], '%', 0)}, the rest recognition)"),
        ("RTP send lateness at the peak, p50 / p99 / max", ""),
        ("  a tick's first packet", pcts(send["first_packet_lateness_ms_at_peak"])),
        ("  a tick's last packet", pcts(send["last_packet_lateness_ms_at_peak"])),
        ("  the gateway's own (whole ms)", pcts(send["gateway_lateness_ms_at_peak"])),
        ("RTP send lateness, whole run, last packet", pcts(send["last_packet_lateness_ms"])),
        ("media clock: ticks that sent, wake-ups that found nothing due",
         f"{send['ticks']}, {send['empty_wakeups']}"),
        ("RTP as the callers' ports got it: |D| p50 / p99 / max", pcts(arrival)),
        ("event-loop lag p50 / p99 / max", pcts(server["loop_lag_ms"])),
        ("caller turns, calls booked; speech end -> agent audio p50 / p99 / max",
         f"{talk['user_turns']}, {talk['calls_booked']}; "
         + pcts(talk["speech_end_to_first_audio_ms"])
         + (f"; errors {talk['errors']}" if talk["errors"] else "")),
        ("garbage collections (count, longest)", ", ".join(
            f"gen {gen[-1]} {c['n']} {fmt(c['max'], ' ms')}" for gen, c in server["gc_ms"].items()
        )),
        ("RTP in / out, lost, late", f"{rtp['packets_received']} / {rtp['packets_sent']}, "
         f"{rtp['lost']}, {rtp['late']}; calls without RTP in {rtp['without_rtp_in']}, "
         f"out {rtp['without_rtp_out']}"),
        ("sipp CPU; other work mean / max", f"{fmt(load['sipp_cpu_pct_mean'], '%', 0)}; "
         f"{fmt(load['other_cpu_pct_mean'], '%', 0)} / {fmt(load['other_cpu_pct_max'], '%', 0)}"
         f" (on the server's cores {fmt(load['other_on_server_cores_pct_mean'], '%', 0)} / "
         f"{fmt(load['other_on_server_cores_pct_max'], '%', 0)}), interrupts "
         f"{fmt(load['irq_cpu_pct_mean'], '%', 0)}, "
         f"steal {fmt(load['steal_cpu_pct_mean'], '%', 0)} (on the server's cores "
         f"{fmt(load['steal_on_server_cores_pct_mean'], '%', 0)} / "
         f"{fmt(load['steal_on_server_cores_pct_max'], '%', 0)})"),
        ("load average before / after", f"{result['machine']['loadavg_before']} / "
         f"{result['machine']['loadavg_after']}"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=40, help="calls to place in all (sipp -m)")
    parser.add_argument("--rate", type=float, default=5.0, help="new calls a second (sipp -r)")
    parser.add_argument("--limit", type=int, default=20, help="calls at once at most (sipp -l)")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds per call")
    parser.add_argument(
        "--stt",
        choices=sorted(STT_CONFIGS),
        default="pocketsphinx",
        help="voice.stt of the server: pocketsphinx (the low-CPU engine) or whisper tiny.en",
    )
    parser.add_argument(
        "--caller",
        choices=("conversation", "silence"),
        default="conversation",
        help="what the callers say: the booking conversation, or nothing (RTP of silence: the "
        "media path and the agent's prompts without speech recognition)",
    )
    parser.add_argument(
        "--out", default=str(RESULTS), help="results folder, or a .json path for the result"
    )
    parser.add_argument(
        "--server-cpus",
        type=lambda text: {int(n) for n in text.split(",")},
        default=argparse.SUPPRESS,
        help="CPUs of the server, comma-separated (default: 0); sipp and this script get the "
        "others",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="nice value of the run: the server, sipp and this script, and their sessions' "
        "autogroups (negative needs root). On a shared machine -10 keeps other work from "
        "taking their turns; the server's recognition workers run 5 above it",
    )
    parser.add_argument(
        "--max-calls",
        type=int,
        default=argparse.SUPPRESS,
        help="the server's server.max_calls (default: --limit + 50)",
    )
    parser.add_argument("--media-port", type=int, default=40000, help="sipp's first RTP port")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after the warm-up")
    parser.add_argument(
        "--no-warm-up", dest="warm_up", action="store_false", help="skip the unmeasured call"
    )
    parser.add_argument(
        "--progress", type=int, default=10, help="a progress line every N seconds (0: none)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 if a call failed or the server lost one"
    )
    args = parser.parse_args(argv)
    if min(args.calls, args.limit) < 1 or args.rate <= 0 or args.duration <= 0:
        parser.error("--calls, --limit, --rate and --duration must be positive")
    if not hasattr(args, "server_cpus"):
        args.server_cpus = {0}
    if getattr(args, "max_calls", None) is None:
        args.max_calls = args.limit + 50
    return args


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        return _child_main(sys.argv[2:])
    args = parse_args()
    sys.path.insert(0, str(ROOT))
    if shutil.which("sipp") is None:
        raise SystemExit("sip_load: no sipp (apt-get install sip-tester)")
    if os.geteuid() != 0:
        raise SystemExit("sip_load: sipp's play_pcap_audio sends through raw sockets: run as root")
    out = Path(args.out)
    if out.suffix != ".json":
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        out = out / f"sip-load-{args.caller}-{args.stt}-{args.limit}x{args.calls}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    run = Run(args, out)
    try:
        result = run.execute()
    finally:
        run.close()
    out.write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"sip_load: results in {out} (server log {run.server_log.name})", flush=True)
    lost = result["server"]["calls_recorded"] != result["sipp"]["calls_placed"]
    return 1 if args.strict and (result["sipp"]["failed"] or lost) else 0


if __name__ == "__main__":
    sys.exit(main())

"""The run: `Run` starts what the levels call (the stand-in engines, in realtime mode the
Realtime stand-in too, and the server, with a copy of the config pointed at them, a booking
seeded for change and cancel calls) or connects to a
running server, warms it up, settles it between levels and prints progress; `main_async` runs
the levels one after the other and writes the result JSON and plot. `server_config`,
`seed_booking` and `free_port` prepare the server it starts."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import yaml
from websockets.exceptions import ConnectionClosed

from voice_agent.config import load_config

from .callers import Turn, new_client
from .conversations import load_lines
from .levels import Level
from .paths import RESULTS, ROOT
from .report import plot, report
from .sampling import MachineWatch, ProcWatch
from .stats import fmt, percentile

GENERATOR_NICE = 10  # after starting the server and the stand-in, which keep nice 0
REALTIME_AGENT = (
    "concierge"  # config/agents.yaml's playbook, made speech-to-speech in realtime mode
)
STAND_IN_MODES = ("hosted", "realtime")  # modes whose engines are the stand-ins, their delays known


def _visible(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _pinned(cpus: set[int] | None) -> Callable[[], None] | None:
    """For Popen: the child (and what it starts) runs on these CPUs only."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


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
    source: Path,
    mode: str,
    standin_url: str | None,
    data_dir: Path,
    max_calls: int | None = None,
    model_url: str | None = None,
    realtime_agent: str = REALTIME_AGENT,
) -> dict[str, Any]:
    """The config the script's server runs: `source` with its paths made absolute (the copy
    lives elsewhere), call records in `data_dir`, in hosted mode every engine and LLM pointed
    at the stand-in, and `max_calls` (admission control) when given. In realtime mode the same,
    and `realtime_agent` is the default agent, a speech-to-speech one talking to the Realtime
    stand-in at `model_url`: the engines stand-in still does its STT (the server's own turn
    taking needs it) and the TTS of its first message."""
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    base = source.parent
    for agent in config.get("agents", {}).values():
        for key in ("functions", "intents"):
            if agent.get(key):
                agent[key] = _absolute(agent[key], base)
        for tool in (agent.get("tools") or {}).values():
            if tool.get("openapi"):
                tool["openapi"] = _absolute(tool["openapi"], base)
        if mode in STAND_IN_MODES:
            assert standin_url is not None
            # An agent's own engines would bypass the stand-in.
            agent.pop("stt", None)
            agent.pop("tts", None)
            agent["llm"] = {**(agent.get("llm") or {}), "base_url": standin_url, "api_key": "x"}
    if mode == "realtime":
        assert model_url is not None
        agents = config.get("agents", {})
        if realtime_agent not in agents:
            raise SystemExit(f"loadtest: --mode realtime needs an agent {realtime_agent!r}")
        # As tests/test_realtime_calls.py makes its speech-to-speech concierge.
        agents[realtime_agent]["llm"] = {
            "provider": "openai_realtime",
            "base_url": model_url,
            "api_key": "loadtest",
            "voice": "marin",
        }
        config["default_agent"] = realtime_agent
    if mode in STAND_IN_MODES:
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
    server = config.setdefault("server", {})
    server["data_dir"] = str(data_dir)
    if max_calls is not None:
        server["max_calls"] = max_calls
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
        self.model: subprocess.Popen[bytes] | None = None  # the Realtime stand-in
        self.model_watch: ProcWatch | None = None
        self.model_url: str | None = None
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
        self.model_log = out.with_suffix(".model.log")

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
        if self.model_watch is not None:
            watches["model"] = self.model_watch
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
        the stand-in to take: end-of-turn silence, the STT delay beyond it, the LLM's
        first-token delay (LLM agents) and TTS first byte (the server sends a sentence's
        audio as it streams in, so the stand-in's first chunk is the caller's first audio).
        Hosted and realtime modes only, where those are known. What stays in besides the
        server's own work: how far the server's estimate of the end of speech is from the
        caller's last frame above -45 dBFS (0-60 ms on the fixtures) and, for LLM agents, the
        stand-in's 20 ms a word until the first sentence is complete."""
        if self.mode not in STAND_IN_MODES or turn.latency_ms is None:
            return None
        return turn.latency_ms - self.eot_ms - self._engine_ms(self.eot_ms)

    def _engine_ms(self, silence_ms: float) -> float:
        """What the stand-in was configured to take before a turn's first audio, when the
        caller's speech ended `silence_ms` before the turn did. The pipeline sends the STT
        request when the caller pauses (its speculative decoding), so only the part of the
        STT delay beyond that silence is waited for after the turn ends: none, with the
        stand-in's 150 ms and a 600 ms silence. A turn whose speculation was wasted (the caller
        went on after the pause) waits for a second request, which then counts as the
        server's.

        In realtime mode the model voices its reply: its delay to the first item is all the
        stand-in takes after the transcript (the agent's TTS speaks only the first message)."""
        args = self.args
        stt = max(0.0, args.stt_delay_ms - silence_ms)
        if self.mode == "realtime":
            return stt + args.model_delay_ms
        llm = args.llm_delay_ms if self.uses_llm else 0.0
        return stt + llm + args.tts_delay_ms

    def server_added_at_server_ms(self, metrics: dict[str, Any]) -> float | None:
        """The issue's own definition on the server's clock: first agent audio sent, from the
        moment the server took the turn as ended (the caller's speech end plus the end-of-turn
        silence, as the frames arrived), less the stand-in's configured delays.

        Unlike `server_added_ms` it leaves out how late this script sent the caller's frames
        and noticed the agent's: on a machine it shares with the server, most of the
        difference at high load. The frames' own lateness shows in the `end_of_turn` stage
        (speech end -> end of turn beyond the configured silence). Hosted and realtime modes
        only."""
        if self.mode not in STAND_IN_MODES:
            return None
        sent = metrics.get("first_audio_sent_ms")
        turn_end = metrics.get("end_of_turn_ms")
        if sent is None or turn_end is None:
            return None
        speech_end = metrics.get("speech_end_ms", turn_end)
        silence = float(turn_end) - float(speech_end)
        return float(sent) - float(turn_end) - self._engine_ms(silence)

    # -- processes -------------------------------------------------------------------------

    @property
    def client_cpus(self) -> set[int] | None:
        """The CPUs the server was not given, when it was given some."""
        if not self.args.server_cpus:
            return None
        return set(os.sched_getaffinity(0)) - set(self.args.server_cpus) or None

    async def start(self) -> None:
        args = self.args
        if args.server_cpus and args.url is None:
            if self.client_cpus is None:
                raise SystemExit("loadtest: --server-cpus leaves no CPU for the load generator")
            os.sched_setaffinity(0, self.client_cpus)
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
        standin_url = await self._start_standin() if args.mode in STAND_IN_MODES else None
        if args.mode == "realtime":
            self.model_url = await self._start_model()
        config_path, data_dir = self._prepare(standin_url)
        port = free_port()
        executable = ROOT / ".venv" / "bin" / "voice-agent"
        command = [str(executable)] if executable.exists() else [sys.executable, "-m"]
        if not executable.exists():
            command.append("voice_agent.cli")
        command += ["serve", "--config", str(config_path), "--port", str(port)]
        command += ["--data-dir", str(data_dir)]
        if args.workers != 1:
            command += ["--workers", str(args.workers)]
        env = {
            **os.environ,
            "VOICE_AGENT_DATA_DIR": str(data_dir),
            "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1"),
        }
        log = self.server_log.open("wb")
        self.server = subprocess.Popen(  # noqa: ASYNC220 - once, before anything is measured
            command,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_pinned(args.server_cpus),
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
        # The generator yields the CPU to what it measures: with --server-cpus the stand-in
        # shares the generator's cores, and at 200 calls the generator alone nearly fills
        # them, so the stand-in answered late (its wake-ups waited on the generator) and
        # that lateness was counted as the server's. Niced, the stand-in keeps its configured
        # delays; the generator's own lateness is reported as "frames sent late".
        os.nice(GENERATOR_NICE)

    def _prepare(self, standin_url: str | None) -> tuple[Path, Path]:
        """The server's config file and data directory, in the run's temporary directory."""
        args = self.args
        data_dir = self.tmp / "data"
        data_dir.mkdir()
        source = Path(args.config).resolve()
        config = server_config(
            source,
            args.mode,
            standin_url,
            data_dir,
            args.max_calls,
            self.model_url,
            args.agent or REALTIME_AGENT,
        )
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
                f"loadtest: --mode {args.mode} runs scripts/standin_engines.py, which needs "
                "aiohttp: .venv/bin/pip install -e '.[dev]'"
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
        self.standin, self.standin_url = await self._spawn(command, self.standin_log)
        self.standin_watch = ProcWatch(self.standin.pid)
        return self.standin_url

    async def _start_model(self) -> str:
        """scripts/standin_realtime.py: the speech-to-speech model, answering every turn with
        the same sentence after --model-delay-ms."""
        args = self.args
        command = [
            sys.executable,
            str(ROOT / "scripts" / "standin_realtime.py"),
            "--delay-ms",
            str(args.model_delay_ms),
            "--speed",
            str(args.model_speed),
        ]
        if args.model_reply:
            command += ["--reply", args.model_reply]
        self.model, url = await self._spawn(command, self.model_log)
        self.model_watch = ProcWatch(self.model.pid)
        return url

    async def _spawn(
        self, command: list[str], log_path: Path
    ) -> tuple[subprocess.Popen[bytes], str]:
        """A stand-in process on the generator's CPUs, and the URL its first line names."""
        log = log_path.open("wb")
        process = subprocess.Popen(  # noqa: ASYNC220 - once, before anything is measured
            command, stdout=subprocess.PIPE, stderr=log, preexec_fn=_pinned(self.client_cpus)
        )
        assert process.stdout is not None
        try:
            async with asyncio.timeout(60):
                line = await asyncio.to_thread(process.stdout.readline)
        except TimeoutError:
            line = b""
        text = line.decode(errors="replace").strip()
        if not text.startswith("standin listening on "):
            if process.poll() is None:
                process.kill()
            tail = (await asyncio.to_thread(log_path.read_text, errors="replace"))[-2000:]
            name = Path(command[1]).name
            raise SystemExit(f"loadtest: {name} did not start: {text!r}\n{tail}")
        return process, text.removeprefix("standin listening on ")

    async def stop(self) -> None:
        for process in (self.server, self.standin, self.model):
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
            f"latency p50 {fmt(p50)} p95 {fmt(p95)} ms | server "
            f"cpu {fmt(sample.get('server_cpu_pct'), '%')} "
            f"(waited {fmt(sample.get('server_cpu_wait_pct'), '%')}) "
            f"rss {fmt(sample.get('server_rss_mb'), 'MB')} fds {fmt(sample.get('server_fds'))} "
            f"lag {fmt(sample.get('server_loop_lag_ms'), 'ms')} | loadgen "
            f"cpu {fmt(sample.get('loadgen_cpu_pct'), '%')} "
            f"lag {fmt(sample.get('loadgen_loop_lag_ms'), 'ms')} | machine "
            f"{fmt(sample.get('machine_cpu_pct'), '%')}"
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


async def main_async(args: argparse.Namespace) -> int:
    task = asyncio.current_task()
    if task is not None:
        # Killed politely (SIGTERM, as `kill` and CI timeouts do): end as on Ctrl-C, so the
        # server and the stand-in this run started are stopped too, not left running.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
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
            "python_speed_us_at_start": python_speed_us(),
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
                "model_delay_ms",
                "model_speed",
                "model_reply",
            )
        },
        "levels": [],
    }
    print(
        "loadtest: this machine's Python takes "
        f"{result['machine']['python_speed_us_at_start']} us for sum(range(1000))",
        flush=True,
    )
    try:
        await run.start()
        result["end_of_turn_silence_ms"] = run.eot_ms
        result["base_url"] = run.base_url
        result["machine"]["generator_nice"] = os.getpriority(os.PRIO_PROCESS, 0)
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
            level = await measured(Level(run, calls).execute())
            if run.standin is not None:
                level["standin"] = await standin_stats(run)
            result["levels"].append(level)
            print(report(level), flush=True)
    finally:
        result["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        result["machine"]["loadavg_at_end"] = [round(v, 2) for v in os.getloadavg()]
        await run.stop()
        result["machine"]["python_speed_us_at_end"] = python_speed_us()
        if result["levels"]:
            out.write_text(json.dumps(result, indent=1))
            png = out.with_suffix(".png")
            print(f"loadtest: results in {out}", flush=True)
            if plot(result, png):
                print(f"loadtest: plot in {png}", flush=True)
    failed = sum(level["failed_calls"] + level["dropped_calls"] for level in result["levels"])
    return 1 if failed and args.strict else 0


def python_speed_us() -> float:
    """How long this machine's Python takes for `sum(range(1000))`, in microseconds (best of 5
    runs of 2,000; ~0.3 s): a yardstick for comparing runs, since a VM's speed follows its
    host's load (28.7 us one afternoon, 34 an hour later on the same code)."""
    runs = timeit.Timer("sum(range(1000))").repeat(repeat=5, number=2000)
    return round(min(runs) / 2000 * 1e6, 1)


async def measured(level: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """A level with the collector off: a full collection of the generator's objects paused
    its loop for up to 184 ms at 100 calls, so its frames went out late and the replies it
    timed looked late, neither of which is the server's doing. What a level leaves in cycles
    is collected between levels."""
    gc.collect()
    gc.disable()
    try:
        return await level
    finally:
        gc.enable()
        gc.collect()


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

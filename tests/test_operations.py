"""Operating the server as processes: call records that survive `kill -9`, several workers on
one port, and the metrics an operator scrapes. Real `voice-agent serve` processes on localhost."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.configs import QUICK_VOICE, default_config_with
from voice_agent.audio.wav import read_wav
from voice_agent.callers import NativeClient

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Served:
    """`voice-agent serve` as a child process, started and waited for like an operator would."""

    def __init__(self, data_dir: Path, port: int, *extra: str) -> None:
        self.port = port
        env = {**os.environ, "VOICE_AGENT_DATA_DIR": str(data_dir)}
        # The default agents on the transport tests' quick voice: these tests are about the
        # process, its records and its workers, and every call waits out the greeting.
        config = default_config_with(data_dir / "config", voice=QUICK_VOICE)
        command = [sys.executable, "-m", "voice_agent.cli", "serve", "--config", str(config)]
        self.process = subprocess.Popen(
            [*command, "--port", str(port), *extra],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.workers = 1 if "--workers" not in extra else int(extra[extra.index("--workers") + 1])

    def wait_ready(self) -> None:
        assert self.process.stdout is not None
        ready = 0
        for line in self.process.stdout:
            if "serving agent" in line:
                ready += 1
                if ready == self.workers:
                    return
        raise AssertionError(f"the server exited with {self.process.wait()} before serving")

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        self.process.wait(20)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def served(data_dir: Path) -> Iterator[Served]:
    server = Served(data_dir, free_port())
    server.wait_ready()
    yield server
    server.stop()


async def get(url: str) -> Any:
    async with httpx.AsyncClient() as http:
        response = await http.get(url)
        assert response.status_code == 200, response.text
        if response.headers["content-type"].startswith("application/json"):
            return response.json()
        return response.text


async def ended_record(served: Served, call_id: str | None) -> dict[str, Any]:
    """The call's record once the server has ended it (the caller's stop reaches it first)."""
    async with asyncio.timeout(20):
        while True:
            call: dict[str, Any] = await get(f"{served.http}/calls/{call_id}")
            if call["ended_at"]:
                return call
            await asyncio.sleep(0.05)


async def one_turn(port: int) -> NativeClient:
    """A caller that hears the greeting, books a table, hears the answer, and hangs up."""
    caller = NativeClient(f"ws://127.0.0.1:{port}/ws", timeout=60)
    await caller.connect()
    await caller.wait_silence_after_audio(300)
    heard = caller.received_ms
    await caller.send_audio(read_wav(AUDIO / "joe_book1.wav")[0])
    await caller.wait_audio(heard + 1)
    await caller.wait_silence_after_audio(400)
    await caller.stop()
    return caller


async def test_metrics_count_the_call_and_its_turn(served: Served) -> None:
    caller = await one_turn(served.port)
    call = await ended_record(served, caller.call_id)
    assert call["outcome"] == "caller_hung_up"
    text = await get(f"{served.http}/metrics")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples[("voice_agent_calls_started_total", (("transport", "ws"),))] == 1
    ended = ("voice_agent_calls_ended_total", (("outcome", "caller_hung_up"), ("transport", "ws")))
    assert samples[ended] == 1
    turns = [
        value
        for (name, labels), value in samples.items()
        if name == "voice_agent_turn_latency_seconds_count"
        and ("stage", "speech_end_to_first_audio") in labels
    ]
    assert turns == [1]


async def test_calls_are_listed_paged_and_searched(served: Served) -> None:
    first = await one_turn(served.port)
    second = NativeClient(f"ws://127.0.0.1:{served.port}/ws", timeout=60)
    await second.connect()
    await second.wait_silence_after_audio(300)
    await second.stop()
    await ended_record(served, first.call_id)
    await ended_record(served, second.call_id)

    page = await get(f"{served.http}/calls?limit=1")
    assert page["total"] == 2 and len(page["calls"]) == 1 and page["next_offset"] == 1
    assert page["calls"][0]["call_id"] == second.call_id  # newest first
    found = await get(f"{served.http}/calls?text=book%20a%20table")
    assert [c["call_id"] for c in found["calls"]] == [first.call_id]
    async with httpx.AsyncClient() as http:
        bad = await http.get(f"{served.http}/calls?outcome=exploded")
    assert bad.status_code == 400


async def test_kill_9_mid_call_keeps_the_record_and_marks_it_interrupted(data_dir: Path) -> None:
    port = free_port()
    server = Served(data_dir, port)
    server.wait_ready()
    caller = NativeClient(f"ws://127.0.0.1:{port}/ws", timeout=60)
    try:
        await caller.connect()
        await caller.wait_audio(1500)  # the greeting is playing: its call has started
        await asyncio.sleep(1.2)  # everything older than a second must be in the store
        server.stop(signal.SIGKILL)
    finally:
        await caller.abort()

    restarted = Served(data_dir, port)
    restarted.wait_ready()
    try:
        call = await get(f"{restarted.http}/calls/{caller.call_id}")
        listed = await get(f"{restarted.http}/calls?outcome=interrupted")
    finally:
        restarted.stop()
    assert call["outcome"] == "interrupted" and call["ended_at"]
    kinds = [event["type"] for event in call["audit"]]
    assert kinds[:2] == ["call_started", "event"]  # from the first second of the call
    assert "page" in kinds
    assert [c["call_id"] for c in listed["calls"]] == [caller.call_id]


async def test_two_workers_share_the_port_and_the_call_records(data_dir: Path) -> None:
    server = Served(data_dir, free_port(), "--workers", "2")
    server.wait_ready()
    try:
        callers = [NativeClient(f"ws://127.0.0.1:{server.port}/ws") for _ in range(6)]
        for caller in callers:
            await caller.connect()
        await asyncio.gather(*(c.wait_silence_after_audio(300) for c in callers))
        for caller in callers:
            await caller.stop()
        pids = set()
        for _ in range(12):  # connections spread over the workers: ask several times
            health = await get(f"{server.http}/healthz")
            pids.add(health["pid"])
            for caller in callers:
                call = await get(f"{server.http}/calls/{caller.call_id}")
                assert call["agent"] == "booking"
        # Whichever worker a scrape reaches, it counts every worker's calls, each worker's
        # under its own label (a series that took turns between workers would look like
        # counter resets to Prometheus).
        answers = [await calls_started_by_worker(server) for _ in range(6)]
    finally:
        server.stop()
    assert server.process.returncode == 0
    assert len(pids) == 2, "both workers answered"
    # (The kernel may well have put all six calls on one worker: each worker's count is
    # its own, and they add up.)
    assert all(workers == {"0", "1"} for workers, _ in answers), answers
    assert all(sum(started.values()) == 6 for _, started in answers), answers
    assert all(set(started) <= {"0", "1"} for _, started in answers), answers
    assert not list((data_dir / "metrics").rglob("*.prom")), "workers remove their files"


async def answering_pids(server: Served, wanted: Callable[[set[int]], bool]) -> set[int]:
    """The worker pids /healthz has answered from, asked until `wanted` holds of them."""
    pids: set[int] = set()
    async with asyncio.timeout(30):  # a safety net: connections land on workers at random
        while not wanted(pids):
            try:
                pids.add((await get(f"{server.http}/healthz"))["pid"])
            except httpx.TransportError:
                await asyncio.sleep(0.05)  # between a worker's death and the kernel noticing
    return pids


async def test_a_worker_that_dies_is_started_again(data_dir: Path) -> None:
    server = Served(data_dir, free_port(), "--workers", "2")
    server.wait_ready()
    try:
        first = await answering_pids(server, lambda pids: len(pids) == 2)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)  # as the OOM killer would
        # A new worker answers on the port, beside the one that lived on.
        again = await answering_pids(server, lambda pids: len(pids - first) == 1)
        survivor = first - {victim}
        await answering_pids(server, lambda pids: pids >= (again - first) | survivor)
    finally:
        server.stop()
    assert server.process.returncode == 0  # a clean stop, after the restart


def test_a_worker_that_cannot_start_stops_them_all(data_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "agents.yaml"
    broken.write_text("default_agent: nobody\nagents: {}\n")
    server = Served(data_dir, free_port(), "--workers", "2", "--config", str(broken))
    # Exits instead of restarting workers that can only fail again.
    assert server.process.wait(60) != 0


async def calls_started_by_worker(server: Served) -> tuple[set[str], dict[str, float]]:
    """The workers a scrape answers for (their build info) and calls_started per worker label,
    once every worker's latest metrics are in it."""
    async with asyncio.timeout(20):  # a safety net: the workers write every second
        while True:
            workers: set[str] = set()
            started: dict[str, float] = {}
            for family in text_string_to_metric_families(await get(f"{server.http}/metrics")):
                for sample in family.samples:
                    worker = sample.labels.get("worker", "?")
                    if sample.name == "voice_agent_build_info":
                        workers.add(worker)
                    elif sample.name == "voice_agent_calls_started_total":
                        started[worker] = started.get(worker, 0) + sample.value
            if sum(started.values()) >= 6:
                return workers, started
            await asyncio.sleep(0.2)

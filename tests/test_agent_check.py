"""HAProxy's agent check: the weight from admission's numbers, the host's answer from its
workers' reports, the files they share, and the line a server in this process answers."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.configs import QUICK_VOICE, default_config_with, serving
from tests.support.hosts import TOKEN, Host
from voice_agent.callers import TwilioClient
from voice_agent.config import ConfigError, load_config
from voice_agent.server.agent_check import (
    STALE_AFTER_S,
    Load,
    WorkerReport,
    answer,
    read_reports,
    weight_percent,
    write_report,
)
from voice_agent.server.app import VoiceServer


def load(**changes: float | int | bool | None) -> Load:
    values: dict[str, float | int | bool | None] = {
        "live_calls": 0,
        "max_calls": 100,
        "loop_lag_ms": 0.0,
        "max_loop_lag_ms": 150.0,
        "cpu_percent": 0.0,
        "max_cpu_percent": None,
        **changes,
    }
    return Load(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "weight"),
    [
        ({}, 100),
        ({"live_calls": 25}, 75),
        ({"live_calls": 99}, 1),
        ({"live_calls": 100}, 0),  # admission would refuse: out of rotation
        ({"live_calls": 150}, 0),
        ({"loop_lag_ms": 75.0}, 50),  # the tightest limit decides...
        ({"loop_lag_ms": 75.0, "live_calls": 80}, 20),  # ...whichever it is
        ({"loop_lag_ms": 400.0}, 0),
        ({"loop_lag_ms": 400.0, "max_loop_lag_ms": None}, 100),  # a limit switched off
        ({"cpu_percent": 90.0}, 100),  # no CPU limit: CPU does not count
        ({"cpu_percent": 90.0, "max_cpu_percent": 120.0}, 25),
        ({"live_calls": 1, "max_calls": 1000}, 99),  # rounded down
        ({"live_calls": 999, "max_calls": 1000}, 1),  # never 0 while a call would be taken
    ],
)
def test_the_weight_is_the_headroom_of_the_tightest_limit(
    changes: dict[str, float | int | None], weight: int
) -> None:
    assert weight_percent(load(**changes)) == weight


def report(worker: int, weight: int, draining: bool = False) -> WorkerReport:
    return WorkerReport(worker, weight, draining, live_calls=0)


def test_the_host_answers_its_workers_mean_weight_or_drain() -> None:
    assert answer([report(0, 100)]) == "up ready 100%\n"
    assert answer([report(0, 100), report(1, 50)]) == "up ready 75%\n"
    assert answer([report(0, 0), report(1, 0)]) == "up ready 0%\n"
    assert answer([report(0, 0), report(1, 0), report(2, 1)]) == "up ready 1%\n"
    assert answer([report(0, 100), report(1, 100, draining=True)]) == "drain\n"
    assert answer([]) == "drain\n"


def test_workers_share_reports_through_files_and_stale_or_bad_ones_are_left_out(
    tmp_path: Path,
) -> None:
    for worker, weight in ((0, 90), (1, 40), (2, 10)):
        write_report(tmp_path, WorkerReport(worker, weight, False, worker))
    old = time.time() - STALE_AFTER_S - 1
    os.utime(tmp_path / "load-2.json", (old, old))  # a worker that died without cleaning up
    (tmp_path / "load-3.json").write_text("{not json")
    (tmp_path / "worker-1.prom").write_text("# the metrics beside it are not reports")
    others = read_reports(tmp_path, skip=0, now=time.time())
    assert others == [WorkerReport(1, 40, False, 1)]
    assert read_reports(tmp_path / "missing", skip=0, now=time.time()) == []


def test_a_bad_agent_check_address_stops_the_config(tmp_path: Path) -> None:
    config = default_config_with(tmp_path, server={"agent_check_listen": "8767"})
    with pytest.raises(ConfigError, match="agent_check_listen"):
        load_config(config)


# ---- a server in this process --------------------------------------------------------------


@pytest_asyncio.fixture
async def server(tmp_path: Path) -> AsyncIterator[VoiceServer]:
    config = default_config_with(
        tmp_path,
        voice=QUICK_VOICE,
        server={"agent_check_listen": "127.0.0.1:0", "max_calls": 4, "max_loop_lag_ms": None},
    )
    async for voice_server in serving(config):
        yield voice_server


async def agent_line(server: VoiceServer) -> str:
    """What HAProxy reads: connect, read to the end (the server closes)."""
    assert server.agent_check is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", server.agent_check.port)
    async with asyncio.timeout(5):
        line = await reader.read()
    writer.close()
    return line.decode("ascii")


async def test_the_agent_port_answers_the_weight_then_drain(server: VoiceServer) -> None:
    assert await agent_line(server) == "up ready 100%\n"
    caller = TwilioClient(f"ws://127.0.0.1:{server.port}/twilio", timeout=30)
    await caller.connect()
    await caller.wait_audio(100)
    assert await agent_line(server) == "up ready 75%\n"  # one call of max_calls 4
    server.start_drain("SIGTERM")
    assert await agent_line(server) == "drain\n"
    await caller.stop()
    async with asyncio.timeout(10):
        await server.drained.wait()


# ---- `voice-agent serve --workers 2` ----------------------------------------------------------


async def host_line(host: Host) -> str:
    reader, writer = await asyncio.open_connection(host.address, host.agent_port)
    async with asyncio.timeout(5):
        line = await reader.read()
    writer.close()
    return line.decode("ascii")


async def until_line(host: Host, expected: str) -> None:
    """Polled: the workers' reports are rewritten every second."""
    seen = ""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        seen = await host_line(host)
        if seen == expected:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the agent port answered {seen!r}, never {expected!r}")


async def test_with_two_workers_the_agent_port_answers_for_the_whole_host(
    tmp_path: Path,
) -> None:
    host = Host(tmp_path, "host", server={"max_calls": 2}, workers=2)
    try:
        await host.wait_ready()
        await until_line(host, "up ready 100%\n")
        caller = TwilioClient(f"ws://{host.address}:{host.port}/twilio?token={TOKEN}")
        await caller.connect()
        await caller.wait_audio(100)
        # The worker with the call is at 50%, the idle one at 100%: whichever worker the
        # call reached, the host answers their mean (one worker alone would say 50 or 100).
        await until_line(host, "up ready 75%\n")
        host.process.send_signal(signal.SIGTERM)
        # Draining: "drain", for as long as the call lasts, whichever worker holds it.
        await until_line(host, "drain\n")
        assert not caller.closed  # the call goes on, and the host waits for it
        assert await host_line(host) == "drain\n" and host.process.poll() is None
        await caller.stop()
        assert await asyncio.to_thread(host.process.wait, 20) == 0
    finally:
        await asyncio.to_thread(host.stop)  # the loop runs on: a caller left can hang up

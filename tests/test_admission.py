"""Admission control decisions, with the load figures given directly."""

from __future__ import annotations

from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from tests.support.configs import default_config_with
from voice_agent.agents.registry import AgentRegistry
from voice_agent.callers import NativeClient
from voice_agent.server.admission import Admission, CpuSampler, RefusalReport
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).parent.parent


def admission() -> Admission:
    return Admission(max_calls=3, max_loop_lag_ms=100, max_cpu_percent=90)


def test_calls_are_admitted_below_every_limit() -> None:
    assert admission().decide(live_calls=2, loop_lag_ms=20, cpu_percent=50) is None


def test_the_call_beyond_max_calls_is_refused() -> None:
    refusal = admission().decide(live_calls=3, loop_lag_ms=0, cpu_percent=0)
    assert refusal is not None and refusal.reason == "max_calls"
    assert "3 calls" in refusal.message


def test_a_late_event_loop_or_a_busy_cpu_refuses_new_calls() -> None:
    lag = admission().decide(live_calls=0, loop_lag_ms=250, cpu_percent=0)
    cpu = admission().decide(live_calls=0, loop_lag_ms=0, cpu_percent=97)
    assert lag is not None and lag.reason == "loop_lag" and "250 ms" in lag.message
    assert cpu is not None and cpu.reason == "cpu"


def test_limits_can_be_switched_off() -> None:
    relaxed = Admission(max_calls=10, max_loop_lag_ms=None, max_cpu_percent=None)
    assert relaxed.decide(live_calls=9, loop_lag_ms=5000, cpu_percent=400) is None


def test_cpu_is_sampled_over_an_interval() -> None:
    now, cpu = [0.0], [0.0]
    sampler = CpuSampler(clock=lambda: now[0], cpu_time=lambda: cpu[0], interval_s=1.0)
    now[0], cpu[0] = 0.5, 0.4
    assert sampler.sample() == 0.0  # not a whole interval yet
    now[0], cpu[0] = 2.0, 1.5
    assert sampler.sample() == 75.0


async def test_a_call_beyond_max_calls_is_refused_while_the_others_complete(
    tmp_path: Path,
) -> None:
    config = default_config_with(tmp_path, server={"max_calls": 2, "max_loop_lag_ms": None})
    registry = AgentRegistry.from_file(config)
    server = VoiceServer(registry, port=0)
    await server.start()
    url = f"ws://127.0.0.1:{server.port}/ws"
    try:
        first, second = NativeClient(url, timeout=30), NativeClient(url, timeout=30)
        await first.connect()
        await second.connect()
        async with connect(url) as third:
            await third.wait_closed()
        assert third.close_code == 1013
        assert third.close_reason and "limit of 2 calls" in third.close_reason
        assert server.refused_calls == 1
        # The admitted calls go on: each hears its greeting in full.
        for caller in (first, second):
            await caller.wait_silence_after_audio(300)
            assert caller.received_ms > 3000
            await caller.stop()
    finally:
        await server.shutdown(1)
        await registry.aclose()


async def test_one_stall_shows_in_the_worst_lag_but_does_not_refuse(tmp_path: Path) -> None:
    """Admission reads the median of the last three loop-lag samples, so one stall does not
    refuse calls; /healthz also gives the worst of them, so a watcher sees the stall."""
    registry = AgentRegistry.from_file(default_config_with(tmp_path))
    server = VoiceServer(registry, port=0)
    try:
        for lag_s in (0.001, 0.3, 0.002):
            server._on_loop_lag(lag_s)
        assert server.loop_lag_ms == pytest.approx(2.0)
        assert server.loop_lag_max_ms == pytest.approx(300.0)
        for lag_s in (0.001, 0.001, 0.001):
            server._on_loop_lag(lag_s)
        assert server.loop_lag_max_ms == pytest.approx(1.0)
    finally:
        await registry.aclose()


def test_refusals_are_logged_once_per_interval_with_a_count() -> None:
    report = RefusalReport(interval_s=10.0)
    assert report.refused("call refused: full", 100.0) == "call refused: full"
    assert report.refused("call refused: full", 101.0) is None
    assert report.refused("call refused: full", 105.0) is None
    # The next report counts every refusal since the last line, itself included.
    assert report.refused("call refused: full", 112.0) == (
        "call refused: full (3 calls refused in the last 12 s)"
    )
    # A lone refusal after a quiet spell is reported as it is.
    assert report.refused("call refused: busy", 200.0) == "call refused: busy"

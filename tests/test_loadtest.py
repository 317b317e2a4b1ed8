"""scripts/loadtest.py end to end, small: a few calls for a few seconds in each mode, so the load
test keeps working as the server changes. The two runs go side by side to save wall time; their
numbers are not checked, only that everything they measure is there."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "loadtest.py"


def start(out: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *args, "--settle", "0.5", "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen[str], out: Path) -> dict[str, Any]:
    try:
        output, _ = process.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"the load test did not finish:\n{output}") from None
    assert process.returncode == 0, output
    assert out.with_suffix(".png").stat().st_size > 10_000, output
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def check_level(level: dict[str, Any], calls: int) -> None:
    assert level["calls"] == calls
    assert level["failed_calls"] == 0, level["errors"]
    assert level["dropped_calls"] == 0, level["errors"]
    assert level["refused_calls"] == 0, level["errors"]
    assert level["protocol_errors"] == []
    latencies = [t["latency_ms"] for t in level["turns"] if t["latency_ms"] is not None]
    assert latencies, level["turns"]
    # End-of-turn silence alone is 600 ms; an answer takes less than the reply timeout.
    assert all(500 < value < 6000 for value in latencies), latencies
    assert level["latency_ms"]["n"] == len(latencies)
    assert level["server"]["turns"] >= 1
    assert level["server"]["speech_end_to_first_audio_ms"]["p50"] is not None
    assert level["audio"]["frames"] > 0
    for key in ("server_cpu_pct", "server_rss_mb", "server_fds", "loadgen_cpu_pct"):
        assert level["resources"][key]["n"] > 0, key
    assert level["resources"]["server_rss_mb"]["max"] > 10
    assert level["samples"], "no /proc samples"


def test_small_runs_in_both_modes(tmp_path: Path) -> None:
    hosted_out = tmp_path / "hosted.json"
    embedded_out = tmp_path / "embedded.json"
    hosted = start(
        hosted_out,
        *("--mode", "hosted", "--calls", "2", "--duration", "12", "--ramp", "1"),
    )
    # One caller over the native protocol; its barge-in brings a turn early in a short run.
    embedded = start(
        embedded_out,
        *("--mode", "embedded", "--transport", "ws", "--calls", "1", "--duration", "14"),
        *("--ramp", "0", "--barge-in-share", "1"),
    )
    hosted_result = finish(hosted, hosted_out)
    embedded_result = finish(embedded, embedded_out)

    assert hosted_result["mode"] == "hosted" and hosted_result["transport"] == "twilio"
    level = hosted_result["levels"][0]
    check_level(level, 2)
    # The stand-in answered every STT and TTS request, and the server-added latency (beyond
    # the configured delays) could be worked out.
    assert level["standin"]["stt"]["requests"] >= 1
    assert level["standin"]["stt"]["unmatched"] == 0
    assert level["standin"]["tts"]["errors"] == 0
    assert level["server_added_ms"]["n"] >= 1
    # ... on the server's clock too (from its turn metrics), with the turns that gave it.
    assert level["server_added_at_server_ms"]["n"] >= 1
    assert any(
        "first_audio_duration_ms" in turn
        for call in level["calls_detail"]
        for turn in call["server_turns"]
    )
    assert level["resources"]["standin_cpu_pct"]["n"] > 0
    # The machine's speed, to compare runs of other days by.
    machine = hosted_result["machine"]
    assert machine["python_speed_us_at_start"] > 0 and machine["python_speed_us_at_end"] > 0

    assert embedded_result["mode"] == "embedded" and embedded_result["transport"] == "ws"
    check_level(embedded_result["levels"][0], 1)


def test_server_added_leaves_out_exactly_what_the_standin_takes() -> None:
    """The server sends a sentence's audio as it streams in, so the stand-in's share of a
    turn's first audio is its configured delays, less the STT delay spent inside the
    end-of-turn silence (the request goes at the caller's pause); the rest is the server's."""
    scripts = str(ROOT / "scripts")
    sys.path.insert(0, scripts)
    try:
        from loadgen import run as loadgen_run
    finally:
        sys.path.remove(scripts)

    class Args:
        tts_speed = 4.0
        stt_delay_ms = 150.0
        tts_delay_ms = 150.0
        llm_delay_ms = 300.0

    fake = SimpleNamespace(args=Args(), mode="hosted", uses_llm=False)
    run_cls = loadgen_run.Run
    fake._engine_ms = lambda silence: run_cls._engine_ms(fake, silence)
    # The STT request went at the caller's pause, 600 ms before the turn ended: its 150 ms
    # were over by then, so 170 ms after the end of turn is TTS first byte (150) and 20 ms.
    metrics = {"speech_end_ms": 400.0, "end_of_turn_ms": 1000.0, "first_audio_sent_ms": 1170.0}
    assert run_cls.server_added_at_server_ms(fake, metrics) == 20.0
    # A silence shorter than the STT delay leaves the rest of it to wait for.
    short = {"speech_end_ms": 900.0, "end_of_turn_ms": 1000.0, "first_audio_sent_ms": 1220.0}
    assert run_cls.server_added_at_server_ms(fake, short) == 20.0
    fake.uses_llm = True  # an LLM agent also waits for the first token
    assert run_cls.server_added_at_server_ms(fake, {**metrics, "first_audio_sent_ms": 1470.0}) == 20
    assert run_cls.server_added_at_server_ms(fake, {"end_of_turn_ms": 1.0}) is None


def test_a_load_test_stopped_with_sigterm_stops_the_server_it_started(tmp_path: Path) -> None:
    process = start(
        tmp_path / "stopped.json",
        *("--mode", "hosted", "--calls", "1", "--duration", "60", "--no-warm-up"),
    )
    assert process.stdout is not None
    seen = []
    for line in process.stdout:  # ends early only if the load test dies on its own
        seen.append(line)
        if found := re.search(r"against http://127\.0\.0\.1:(\d+)", line):
            break
    assert found, "".join(seen)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=5).close()

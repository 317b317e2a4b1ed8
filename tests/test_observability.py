"""Observability: Prometheus metrics from audit events, JSON logs with call ids and no secret
values in any log line, and the event-loop lag measurement."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from voice_agent import __version__
from voice_agent.observability import logs
from voice_agent.observability.logs import (
    JsonFormatter,
    RedactingFilter,
    TextFormatter,
    bind_call_id,
    call_context,
    configure_logging,
    secrets_from_env,
)
from voice_agent.observability.loop_lag import LagMeter, LoopLagMonitor
from voice_agent.observability.metrics import ServerMetrics, error_source, turn_stages
from voice_agent.observability.worker_metrics import STALE_AFTER_S, SharedMetrics
from voice_agent.runtime.audit import AuditEvent, AuditLog

SECRET = "sk-obs-canary-5d1e9b7a"
QUOTED = 'pa"ss\\wörd-42'  # shows up JSON-escaped in a JSON line

# ---- metrics ---------------------------------------------------------------------------------

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

TURN = {
    "speech_start_ms": 0.0,
    "speech_end_ms": 400.0,
    "end_of_turn_ms": 900.0,
    "stt_final_ms": 930.0,
    "user_turn_ms": 930.0,
    "first_token_ms": 1000.0,
    "first_tts_audio_ms": 1150.0,
    "first_audio_sent_ms": 1151.0,
    "speech_end_to_first_audio_ms": 751.0,
}


def scrape(metrics: ServerMetrics | SharedMetrics) -> Samples:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_turn_stages_follow_one_another() -> None:
    stages = turn_stages(TURN)
    assert stages == pytest.approx(
        {
            "end_of_turn": 0.5,
            "stt": 0.03,
            "first_token": 0.07,
            "first_audio": 0.15,
            "speech_end_to_first_audio": 0.751,
        }
    )


def test_turn_stages_skip_missing_and_negative_milestones() -> None:
    # A turn typed rather than spoken has no speech milestones; a crossed pair is no latency.
    stages = turn_stages({"user_turn_ms": 100, "first_token_ms": 50, "first_audio_sent_ms": 300})
    assert stages == pytest.approx({"first_audio": 0.25})
    assert turn_stages({"speech_end_ms": 100, "first_audio_sent_ms": 700.0}) == pytest.approx(
        {"speech_end_to_first_audio": 0.6}
    )
    assert turn_stages({"speech_end_ms": None, "end_of_turn_ms": "x"}) == {}
    assert turn_stages({"speech_end_ms": 0, "end_of_turn_ms": float("nan")}) == {}


def test_audit_events_become_series() -> None:
    metrics = ServerMetrics(worker=3)
    providers = {"stt": "pocketsphinx", "tts": "piper", "llm": "openai"}
    events: list[AuditEvent | dict[str, Any]] = [
        AuditEvent("turn_metrics", 1.2, dict(TURN)),
        {"type": "turn_metrics", **TURN},  # the dict form (AuditEvent.as_dict)
        AuditEvent("barge_in", 2.0, {"latency_ms": 180.0, "heard": {}, "unheard": ""}),
        AuditEvent("false_interruption", 2.5, {"reason": "backchannel", "resumed": "x"}),
        AuditEvent("user_utterance_dropped", 3.0, {"text": "", "reason": "empty"}),
        AuditEvent("user_utterance_dropped", 3.1, {"text": "mm", "reason": "made-up"}),
        AuditEvent("error", 4.0, {"where": "stt", "message": "boom"}),
        AuditEvent("error", 4.1, {"where": "llm", "message": "rate limited"}),
        AuditEvent("error", 4.2, {"where": "trigger check_hours", "message": "bad"}),
        AuditEvent("error", 4.3, {"where": "concierge.on_turn", "message": "bad"}),
        AuditEvent("tool_call", 5.0, {"name": "book", "result": {}, "error": None}),
        AuditEvent("tool_call", 5.1, {"name": "nope", "error": "unknown action"}),
        AuditEvent("user_utterance", 6.0, {"text": "hello"}),  # no metric: ignored
    ]
    for event in events:
        metrics.observe_audit(event, providers=providers)
    s = scrape(metrics)

    for stage, seconds in turn_stages(TURN).items():
        assert value(s, "voice_agent_turn_latency_seconds_count", stage=stage) == 2
        assert value(s, "voice_agent_turn_latency_seconds_sum", stage=stage) == pytest.approx(
            2 * seconds
        )
    buckets = {
        labels: v
        for (name, labels), v in s.items()
        if name == "voice_agent_turn_latency_seconds_bucket" and ("stage", "end_of_turn") in labels
    }
    assert min(float(dict(k)["le"]) for k in buckets) == 0.05
    assert value(s, "voice_agent_turn_latency_seconds_bucket", stage="stt", le="0.05") == 2
    assert value(s, "voice_agent_turn_latency_seconds_bucket", stage="end_of_turn", le="0.4") == 0

    assert value(s, "voice_agent_barge_ins_total") == 1
    assert value(s, "voice_agent_barge_in_latency_seconds_sum") == pytest.approx(0.18)
    assert value(s, "voice_agent_false_interruptions_total", reason="backchannel") == 1
    assert value(s, "voice_agent_false_interruptions_total", reason="noise") == 0
    assert value(s, "voice_agent_user_utterances_dropped_total", reason="empty") == 1
    assert value(s, "voice_agent_user_utterances_dropped_total", reason="other") == 1
    errors = "voice_agent_engine_errors_total"
    assert value(s, errors, where="stt", provider="pocketsphinx") == 1
    assert value(s, errors, where="llm", provider="openai") == 1
    assert value(s, errors, where="trigger", provider="none") == 1
    assert value(s, errors, where="state_update", provider="none") == 1
    assert value(s, "voice_agent_tool_calls_total", result="ok") == 1
    assert value(s, "voice_agent_tool_calls_total", result="error") == 1
    assert s[("voice_agent_build_info", (("version", __version__), ("worker", "3")))] == 1


def test_calls_admissions_and_loop_lag() -> None:
    metrics = ServerMetrics(process_metrics=False)
    metrics.call_started("twilio")
    metrics.call_started("twilio")
    metrics.call_started("ws")
    metrics.call_ended("twilio", "completed")
    metrics.call_ended("ws", "caller hung up")  # an end reason is filed under its outcome
    metrics.call_ended("ws", "protocol error: bad frame")
    metrics.admission_refused("max_calls")
    metrics.loop_lag(0.003)
    metrics.loop_lag(0.040)
    s = scrape(metrics)
    assert value(s, "voice_agent_live_calls", transport="twilio") == 1
    assert value(s, "voice_agent_live_calls", transport="ws") == 0  # never below zero
    assert value(s, "voice_agent_calls_started_total", transport="twilio") == 2
    ended = "voice_agent_calls_ended_total"
    assert value(s, ended, transport="twilio", outcome="completed") == 1
    assert value(s, ended, transport="ws", outcome="caller_hung_up") == 1
    assert value(s, ended, transport="ws", outcome="error") == 1
    assert value(s, "voice_agent_admissions_refused_total", reason="max_calls") == 1
    assert value(s, "voice_agent_admissions_refused_total", reason="cpu") == 0
    assert value(s, "voice_agent_event_loop_lag_seconds") == pytest.approx(0.04)
    assert value(s, "voice_agent_event_loop_lag_samples_seconds_count") == 2
    assert value(s, "voice_agent_event_loop_lag_samples_seconds_bucket", le="0.005") == 1


def test_servers_in_one_process_keep_their_own_series() -> None:
    first, second = ServerMetrics(), ServerMetrics()
    first.call_started("ws")
    assert value(scrape(first), "voice_agent_calls_started_total", transport="ws") == 1
    assert ("voice_agent_calls_started_total", (("transport", "ws"),)) not in scrape(second)
    assert any(name.startswith("process_") for name, _ in scrape(first))


def test_a_worker_answers_for_every_live_worker_each_under_its_label(tmp_path: Path) -> None:
    workers = [SharedMetrics(ServerMetrics(worker=n), tmp_path, n) for n in range(4)]
    for number, worker in enumerate(workers):
        for _ in range(number + 1):
            worker.metrics.call_started("twilio")
        worker.write()
    # Worker 2 died long ago without removing its file; worker 3's file is not metrics.
    old = time.time() - STALE_AFTER_S - 5
    os.utime(workers[2].path, (old, old))
    workers[3].path.write_text("voice_agent_calls_started_total{transport=twilio 1\n")
    first, second = workers[0], workers[1]
    first.metrics.call_started("twilio")  # since its last write: a scrape sees it at once
    s = scrape(first)
    started = "voice_agent_calls_started_total"
    assert value(s, started, transport="twilio", worker="0") == 2
    assert value(s, started, transport="twilio", worker="1") == 2
    assert {dict(labels).get("worker") for name, labels in s if name == started} == {"0", "1"}
    # Whichever worker answers, the same series: the other's as last written.
    assert value(scrape(second), started, transport="twilio", worker="0") == 1
    assert value(scrape(second), started, transport="twilio", worker="1") == 2


def test_a_listener_on_a_real_audit_log_never_breaks_the_call() -> None:
    metrics = ServerMetrics(process_metrics=False)
    clock = iter(range(100)).__next__
    audit = AuditLog(lambda: float(clock()))
    audit.subscribe(metrics.audit_listener({"tts": "espeak"}))
    audit.add("error", where="tts", message="espeak died")
    audit.add("turn_metrics", speech_end_ms=object(), first_audio_sent_ms="soon")
    audit.add("barge_in", latency_ms=None)
    metrics.observe_audit({"no": "type"})
    metrics.observe_audit(AuditEvent("turn_metrics", 0.0, {"end_of_turn_ms": float("nan")}))
    s = scrape(metrics)
    assert value(s, "voice_agent_engine_errors_total", where="tts", provider="espeak") == 1
    assert value(s, "voice_agent_barge_ins_total") == 1
    assert len(audit.events) == 3


def test_error_sources_have_bounded_labels() -> None:
    assert error_source("stt") == "stt"
    assert error_source("flow booking") == "flow"
    assert error_source("front_desk.on_enter") == "state_update"
    assert error_source(None) == "other"
    assert error_source("x" * 500) == "other"


# ---- logs ------------------------------------------------------------------------------------


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    factory = logging.getLogRecordFactory()
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
    logging.setLogRecordFactory(factory)
    logs.redaction.clear()


def capture(
    json_mode: bool = True, *, secrets: dict[str, str] | None = None
) -> tuple[logging.Logger, io.StringIO]:
    """Our handler on the root logger, forced past the test runner's own handlers."""
    stream = io.StringIO()
    configure_logging(
        json_mode=json_mode,
        level=logging.DEBUG,
        secrets=secrets if secrets is not None else {"api_key": SECRET, "quoted": QUOTED},
        stream=stream,
        force=True,
    )
    return logging.getLogger("voice_agent.test_observability"), stream


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]


def test_json_lines_parse_and_carry_the_call_id(restore_logging: None) -> None:
    log, stream = capture()
    log.info("no call yet")
    with bind_call_id("call-1"):
        log.info("turn %d took %.1f ms", 3, 512.25, extra={"stage": "stt", "n": 2})
    log.warning("explicit", extra={"call_id": "call-2"})
    first, second, third = lines(stream)
    assert set(first) == {"ts", "level", "logger", "message"}
    assert first["ts"].endswith("Z") and first["level"] == "INFO"
    assert first["logger"] == "voice_agent.test_observability"
    assert second["message"] == "turn 3 took 512.2 ms"
    assert second["call_id"] == "call-1"
    assert second["stage"] == "stt" and second["n"] == 2
    assert third["call_id"] == "call-2" and third["level"] == "WARNING"


async def test_tasks_carry_the_call_they_were_started_for(restore_logging: None) -> None:
    log, stream = capture()

    async def work() -> None:
        log.info("from a task")

    with bind_call_id("call-a"):
        inherited = asyncio.ensure_future(work())
    # Work scheduled from another context (an aiortc callback) gets the call's context.
    loop = asyncio.get_running_loop()
    explicit = loop.create_task(work(), context=call_context("call-b"))
    await asyncio.gather(inherited, explicit)
    assert sorted(line["call_id"] for line in lines(stream)) == ["call-a", "call-b"]


class Leaky:
    def __str__(self) -> str:
        return f"Leaky({SECRET})"


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError(SECRET)

    __repr__ = __str__


def log_every_way(log: logging.Logger) -> None:
    log.info("key %s", SECRET)
    log.info("key " + SECRET)
    log.info("halves %s%s", SECRET[:8], SECRET[8:])
    log.info("object %s", Leaky())
    log.info(Leaky())
    log.info("dict %s", {"auth": f"Bearer {SECRET}"})
    log.info("quoted %s", QUOTED)
    log.info("extra", extra={"token": SECRET, "nested": {"h": [SECRET, Leaky()]}, "o": Leaky()})
    log.info("extra key", extra={"data": {SECRET: 1}})
    log.info("%d bad format", SECRET)
    log.info("unprintable %s", Unprintable())
    log.info("unprintable extra", extra={"u": Unprintable()})
    log.info("stack", stack_info=True, extra={"call_id": SECRET})
    try:
        raise ValueError(f"upstream said: invalid key {SECRET}")
    except ValueError:
        log.exception("failed")
    try:
        try:
            raise KeyError(SECRET)
        except KeyError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as exc:
        log.error("chained", exc_info=exc)


@pytest.mark.parametrize("json_mode", [True, False])
def test_no_secret_value_reaches_a_log_line(restore_logging: None, json_mode: bool) -> None:
    log, stream = capture(json_mode)
    log_every_way(log)
    out = stream.getvalue()
    assert SECRET not in out
    assert SECRET[:8] + SECRET[8:] not in out
    assert QUOTED not in out and json.dumps(QUOTED)[1:-1] not in out
    assert "[secret:api_key]" in out and "[secret:quoted]" in out
    assert "upstream said: invalid key [secret:api_key]" in out
    assert "Traceback" in out
    if json_mode:
        records = lines(stream)
        assert len(records) == 15  # every record written, none dropped or raised
        assert records[7]["nested"] == {"h": ["[secret:api_key]", "Leaky([secret:api_key])"]}
        assert "exc" in records[13] and "stack" in records[12]


def test_a_handler_without_the_filter_still_gets_redacted_records(
    restore_logging: None,
) -> None:
    # A handler a library adds itself: the record factory redacted message and exception.
    log, _ = capture()
    plain = io.StringIO()
    handler = logging.StreamHandler(plain)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    try:
        log.warning("key %s", SECRET)
        try:
            raise ValueError(SECRET)
        except ValueError:
            log.exception("boom")
    finally:
        log.removeHandler(handler)
    assert SECRET not in plain.getvalue()
    assert "key [secret:api_key]" in plain.getvalue()


def test_secrets_added_later_and_from_the_environment(
    restore_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-canary-0042")
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-env-canary-77")
    monkeypatch.setenv("MONKEY", "banana-split-1")  # not a credential's name
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # too short to redact everywhere
    log, stream = capture(secrets={})
    logs.add_log_secrets({"later": "loaded-after-start-9"})
    log.info("sk-env-canary-0042 tok-env-canary-77 loaded-after-start-9 banana-split-1 abc")
    message = lines(stream)[0]["message"]
    assert message == (
        "[secret:$OPENAI_API_KEY] [secret:$SOME_SERVICE_TOKEN] [secret:later] banana-split-1 abc"
    )
    assert "$MONKEY" not in secrets_from_env({"MONKEY": "banana-split-1"})


def test_a_rotated_secret_keeps_both_values_redacted(restore_logging: None) -> None:
    log, stream = capture(secrets={"k": "first-value-111"})
    logs.add_log_secrets({"k": "second-value-222"})
    log.info("first-value-111 second-value-222")
    assert lines(stream)[0]["message"] == "[secret:k] [secret:k']"


def test_terminal_gets_the_human_format(
    restore_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    tty = Tty()
    configure_logging(stream=tty, force=True, secrets={})
    with bind_call_id("call-7"):
        logging.getLogger("voice_agent.call").info("hello %s", "there", extra={"ms": 12.5})
    line = tty.getvalue().rstrip("\n")
    assert " INFO  voice_agent.call [call-7] hello there ms=12.5" in line
    assert not line.startswith("{")
    monkeypatch.setenv(logs.FORMAT_ENV, "json")
    assert logs.wants_json(tty)


def test_foreign_handlers_are_kept_unless_forced(restore_logging: None) -> None:
    root = logging.getLogger()
    foreign = logging.NullHandler()
    root.addHandler(foreign)
    assert configure_logging() is None  # like basicConfig: a test runner's handlers stay
    assert foreign in root.handlers
    ours = configure_logging(force=True, stream=io.StringIO())
    again = configure_logging(force=True, stream=io.StringIO())
    assert ours is not None and ours not in root.handlers and again in root.handlers
    assert foreign not in root.handlers


def test_formatters_never_raise_on_odd_records() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%s %s", ("only one",), None)
    record.__dict__["weird"] = Unprintable()
    for formatter in (JsonFormatter(), TextFormatter()):
        assert "could not be formatted" in formatter.format(record)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%s %s", ("only one",), None)
    RedactingFilter().filter(record)
    assert "did not format" in JsonFormatter().format(record)


# ---- event-loop lag --------------------------------------------------------------------------


def test_lag_is_how_late_the_wake_up_ran() -> None:
    meter = LagMeter(0.5, window=3)
    assert meter.arm(10.0) == 0.5
    assert meter.wake(10.5) == 0.0
    meter.arm(11.0)
    assert meter.wake(11.8) == pytest.approx(0.3)
    meter.arm(12.0)
    assert meter.wake(12.49) == 0.0  # a timer firing early is no negative lag
    assert meter.last_s == 0.0 and meter.recent_max_s == pytest.approx(0.3)
    for start in (13.0, 14.0, 15.0):
        meter.arm(start)
        meter.wake(start + 0.5)
    assert meter.recent_max_s == 0.0  # the slow sample left the window
    with pytest.raises(RuntimeError):
        meter.wake(16.0)
    with pytest.raises(ValueError):
        LagMeter(0)


def block_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # as a CPU-bound callback would


async def test_the_monitor_reports_a_blocked_loop() -> None:
    seen: list[float] = []

    def report(lag: float) -> None:
        seen.append(lag)
        if len(seen) == 1:
            raise RuntimeError("a broken consumer")  # must not stop the monitor

    monitor = LoopLagMonitor(report, interval_s=0.01)
    monitor.start()
    monitor.start()  # idempotent
    await asyncio.sleep(0.025)
    asyncio.get_running_loop().call_soon(block_the_loop, 0.06)
    await asyncio.sleep(0.1)
    await monitor.stop()
    assert not monitor.running
    assert len(seen) >= 2
    assert max(seen) >= 0.03
    await monitor.stop()  # stopping twice is fine

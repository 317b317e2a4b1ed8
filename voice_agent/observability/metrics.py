"""Prometheus metrics of one server (worker): calls, turn latency per stage, interruptions,
engine errors, refused admissions and event-loop lag, served as text on GET /metrics.

Each `ServerMetrics` owns its `CollectorRegistry` rather than the global one, so several servers
in one process (the tests) never collide. Everything here is fed per call, per turn or per
audit event, never per audio frame, so the media path pays nothing for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from math import isfinite
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from voice_agent import __version__
from voice_agent.runtime.audit import AuditEvent
from voice_agent.store.outcomes import OUTCOMES, outcome_for

log = logging.getLogger("voice_agent.metrics")

PREFIX = "voice_agent"

# A voice turn is judged in hundreds of milliseconds: fine steps below 1 s, coarse up to 5 s.
LATENCY_BUCKETS_S = (
    0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75,
    1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0,
)  # fmt: skip
# A healthy loop is late by a millisecond or two; 20 ms of lag is one frame of audio.
LOOP_LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# Stages of a turn, each the time between two milestones of the turn metrics the call core
# produces (milliseconds on the call's clock). A milestone given as a tuple takes the first
# key present. The stages follow one another, so a slow turn shows which stage was slow;
# speech_end_to_first_audio is the whole wait the caller hears.
TURN_STAGES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # silence waited before the turn was taken as ended (endpointing)
    ("end_of_turn", ("speech_end_ms",), ("end_of_turn_ms",)),
    # STT finishing the utterance after the end of turn
    ("stt", ("end_of_turn_ms",), ("stt_final_ms",)),
    # the agent (LLM, flow) producing its first text
    ("first_token", ("user_turn_ms", "stt_final_ms"), ("first_token_ms",)),
    # TTS turning that first text into audio
    ("first_audio", ("first_token_ms",), ("first_tts_audio_ms", "first_audio_sent_ms")),
    ("speech_end_to_first_audio", ("speech_end_ms",), ("first_audio_sent_ms",)),
)
STAGES = tuple(stage for stage, _, _ in TURN_STAGES)

# `where` of an error audit event -> a label of bounded cardinality. Triggers and flow pages
# add their names ("trigger check_hours"); fixed state updates add the agent ("concierge.on_turn").
ERROR_SOURCES = frozenset({"stt", "tts", "llm", "agent", "pipeline", "trigger", "flow"})
DROP_REASONS = ("empty", "noise", "backchannel")
REFUSAL_REASONS = ("max_calls", "loop_lag", "cpu")
_MAX_LABEL = 48  # a label longer than this is a bug upstream, not a series worth keeping

AuditLike = AuditEvent | Mapping[str, Any]


def _label(value: object, allowed: tuple[str, ...] | frozenset[str] | None = None) -> str:
    text = str(value) if value is not None else ""
    if allowed is not None and text not in allowed:
        return "other"
    return text[:_MAX_LABEL] or "unknown"


def _ms(metrics: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = metrics.get(key)
        # NaN or infinity would poison a histogram's sum for good.
        if isinstance(value, int | float) and not isinstance(value, bool) and isfinite(value):
            return float(value)
    return None


def turn_stages(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per stage of one turn's metrics; stages whose milestones are missing are left out.

    A negative duration (the milestones of a turn cut short by a barge-in can cross) is left
    out too: it is no latency anyone waited."""
    stages: dict[str, float] = {}
    for stage, start_keys, end_keys in TURN_STAGES:
        start, end = _ms(metrics, start_keys), _ms(metrics, end_keys)
        if stage == "speech_end_to_first_audio":
            # The pipeline computes it from rounded values; take its number when it is there.
            given = _ms(metrics, ("speech_end_to_first_audio_ms",))
            if given is not None:
                start, end = 0.0, given
        if start is None or end is None or end < start:
            continue
        stages[stage] = (end - start) / 1000
    return stages


def error_source(where: object) -> str:
    """The bounded `where` label of an error audit event."""
    text = str(where or "")
    head = text.split(" ", 1)[0]
    if head in ERROR_SOURCES:
        return head
    if "." in text:
        return "state_update"  # "{agent}.{hook}" from the runtime's fixed updates
    return "other"


class ServerMetrics:
    def __init__(self, *, worker: int | str = 0, process_metrics: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        if process_metrics:
            # CPU, memory, open files and GC of this worker: read at scrape time, not before.
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        Info(f"{PREFIX}_build", "Version and worker of this server.", registry=r).info(
            {"version": __version__, "worker": str(worker)}
        )
        self.live_calls = Gauge(
            f"{PREFIX}_live_calls", "Calls in progress on this worker.", ["transport"], registry=r
        )
        self.calls_started = Counter(
            f"{PREFIX}_calls_started", "Calls started.", ["transport"], registry=r
        )
        self.calls_ended = Counter(
            f"{PREFIX}_calls_ended",
            "Calls ended, by transport and outcome.",
            ["transport", "outcome"],
            registry=r,
        )
        self.turn_latency = Histogram(
            f"{PREFIX}_turn_latency_seconds",
            "Latency of each stage of a turn: end_of_turn (silence before the turn ends), stt "
            "(final transcript after the end of turn), first_token (agent's first text after "
            "the transcript), first_audio (first TTS audio after that text), "
            "speech_end_to_first_audio (the whole wait the caller hears).",
            ["stage"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.sip_refused = Counter(
            f"{PREFIX}_sip_refused",
            "SIP requests turned away, by response status (dropped: none sent).",
            ["status"],
            registry=r,
        )
        self.sip_connections = Gauge(
            f"{PREFIX}_sip_connections", "SIP connections (TCP, TLS) open.", registry=r
        )
        self.sip_connections_closed = Counter(
            f"{PREFIX}_sip_connections_closed",
            "SIP connections the server closed for cause: framing (a message it cannot read),"
            " slow (no whole message in time), idle, limit (too many open), not_reading.",
            ["reason"],
            registry=r,
        )
        self.sip_registered = Gauge(
            f"{PREFIX}_sip_registered",
            "1 while the registrar holds this server's binding (sip.registrations), else 0.",
            ["registration"],
            registry=r,
        )
        self.sip_trunk_reachable = Gauge(
            f"{PREFIX}_sip_trunk_reachable",
            "1 while the SIP trunk answers its OPTIONS probe (sip.trunk.options_interval_s).",
            registry=r,
        )
        self.srtp_dropped = Counter(
            f"{PREFIX}_srtp_dropped",
            "SRTP packets of SIP calls dropped: replayed, or unauthentic (forged, corrupted, or"
            " plain RTP on an SRTP call); counted as each call ends.",
            ["reason"],
            registry=r,
        )
        self.sip_caller_jitter = Histogram(
            f"{PREFIX}_sip_caller_jitter_seconds",
            "The interarrival jitter of SIP callers' RTP (RFC 3550 A.8), as each call ends.",
            buckets=(0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2),
            registry=r,
        )
        self.sip_caller_loss = Histogram(
            f"{PREFIX}_sip_caller_loss_ratio",
            "The share of SIP callers' RTP packets that never came, as each call ends.",
            buckets=(0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2),
            registry=r,
        )
        self.sip_round_trip = Histogram(
            f"{PREFIX}_sip_round_trip_seconds",
            "The round trip to SIP callers from their RTCP reports of ours, as each call ends.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.barge_ins = Counter(
            f"{PREFIX}_barge_ins", "Times the caller cut the agent off.", registry=r
        )
        self.barge_in_latency = Histogram(
            f"{PREFIX}_barge_in_latency_seconds",
            "From the caller starting to speak to the agent's audio being cleared.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.false_interruptions = Counter(
            f"{PREFIX}_false_interruptions",
            "Barge-ins that turned out to be noise or a backchannel.",
            ["reason"],
            registry=r,
        )
        self.utterances_dropped = Counter(
            f"{PREFIX}_user_utterances_dropped",
            "Caller speech that did not become a turn.",
            ["reason"],
            registry=r,
        )
        self.engine_errors = Counter(
            f"{PREFIX}_engine_errors",
            "Errors in a call, by where they happened and the engine's provider.",
            ["where", "provider"],
            registry=r,
        )
        self.tool_calls = Counter(
            f"{PREFIX}_tool_calls", "Agent actions run, by result.", ["result"], registry=r
        )
        self.admissions_refused = Counter(
            f"{PREFIX}_admissions_refused",
            "Calls refused by admission control, by reason.",
            ["reason"],
            registry=r,
        )
        self.loop_lag_last = Gauge(
            f"{PREFIX}_event_loop_lag_seconds",
            "How late the last event-loop wake-up ran.",
            registry=r,
        )
        self.loop_lag_samples = Histogram(
            f"{PREFIX}_event_loop_lag_samples_seconds",
            "How late event-loop wake-ups ran.",
            buckets=LOOP_LAG_BUCKETS_S,
            registry=r,
        )
        # Series that exist before their first event, so rate() and alerts see a 0, not nothing.
        for stage in STAGES:
            self.turn_latency.labels(stage)
        for reason in DROP_REASONS:
            self.utterances_dropped.labels(reason)
        for reason in ("noise", "backchannel"):
            self.false_interruptions.labels(reason)
        for reason in REFUSAL_REASONS:
            self.admissions_refused.labels(reason)
        self._live: dict[str, int] = {}
        self._handlers: dict[str, Callable[[Mapping[str, Any], Mapping[str, str]], None]] = {
            "turn_metrics": self._on_turn_metrics,
            "barge_in": self._on_barge_in,
            "false_interruption": self._on_false_interruption,
            "user_utterance_dropped": self._on_dropped,
            "error": self._on_error,
            "tool_call": self._on_tool_call,
        }

    # ---- calls ---------------------------------------------------------------------------

    def call_started(self, transport: str) -> None:
        transport = _label(transport)
        self.calls_started.labels(transport).inc()
        self._live[transport] = self._live.get(transport, 0) + 1
        self.live_calls.labels(transport).set(self._live[transport])

    def call_ended(self, transport: str, outcome: str) -> None:
        """`outcome` is one of the store's OUTCOMES; an end reason is mapped to its outcome."""
        transport = _label(transport)
        outcome = outcome if outcome in OUTCOMES else outcome_for(str(outcome))
        self.calls_ended.labels(transport, outcome).inc()
        # Counted, not decremented blindly: an extra end must not push the gauge below zero.
        self._live[transport] = max(0, self._live.get(transport, 0) - 1)
        self.live_calls.labels(transport).set(self._live[transport])

    def sip_request_refused(self, status: int | None) -> None:
        self.sip_refused.labels(str(status) if status else "dropped").inc()

    def sip_connection_closed(self, reason: str) -> None:
        self.sip_connections_closed.labels(reason).inc()

    def sip_registration(self, name: str, state: str) -> None:
        self.sip_registered.labels(name).set(1 if state == "registered" else 0)

    def sip_media_report(self, report: Mapping[str, Any]) -> None:
        """A SIP call's rtp report as it ends (voice_agent.gateways.sip)."""
        for reason in ("replayed", "unauthentic"):
            count = report.get(f"srtp_{reason}") or 0
            if count:
                self.srtp_dropped.labels(reason).inc(count)
        expected = report.get("stream_expected") or 0
        if expected > 0:
            self.sip_caller_jitter.observe((report.get("jitter_ms") or 0) / 1000)
            lost = max(0, report.get("stream_lost") or 0)
            self.sip_caller_loss.observe(min(1.0, lost / expected))
        round_trip = report.get("round_trip_ms")
        if round_trip is not None:
            self.sip_round_trip.observe(round_trip / 1000)

    def admission_refused(self, reason: str) -> None:
        self.admissions_refused.labels(_label(reason)).inc()

    def loop_lag(self, seconds: float) -> None:
        self.loop_lag_last.set(seconds)
        self.loop_lag_samples.observe(seconds)

    # ---- audit events --------------------------------------------------------------------

    def observe_audit(
        self, event: AuditLike, *, providers: Mapping[str, str] | None = None
    ) -> None:
        """Count one audit event; types without a metric cost one dict lookup.

        `providers` maps an error's source (stt, tts, llm) to that call's engine provider.
        Never raises: it runs inside `AuditLog.add`, and a metric must not break a call."""
        try:
            data: Mapping[str, Any]
            if isinstance(event, AuditEvent):
                kind, data = event.type, event.data
            else:
                kind, data = str(event.get("type", "")), event
            handler = self._handlers.get(kind)
            if handler is not None:
                handler(data, providers or {})
        except Exception:
            log.exception("metrics: could not count an audit event")

    def audit_listener(
        self, providers: Mapping[str, str] | None = None
    ) -> Callable[[AuditEvent], None]:
        """A listener for `AuditLog.subscribe` that knows the call's engine providers."""
        bound = dict(providers or {})

        def listener(event: AuditEvent) -> None:
            self.observe_audit(event, providers=bound)

        return listener

    def _on_turn_metrics(self, data: Mapping[str, Any], _: Mapping[str, str]) -> None:
        for stage, seconds in turn_stages(data).items():
            self.turn_latency.labels(stage).observe(seconds)

    def _on_barge_in(self, data: Mapping[str, Any], _: Mapping[str, str]) -> None:
        self.barge_ins.inc()
        latency = _ms(data, ("latency_ms",))
        if latency is not None and latency >= 0:
            self.barge_in_latency.observe(latency / 1000)

    def _on_false_interruption(self, data: Mapping[str, Any], _: Mapping[str, str]) -> None:
        self.false_interruptions.labels(_label(data.get("reason"), DROP_REASONS)).inc()

    def _on_dropped(self, data: Mapping[str, Any], _: Mapping[str, str]) -> None:
        self.utterances_dropped.labels(_label(data.get("reason"), DROP_REASONS)).inc()

    def _on_error(self, data: Mapping[str, Any], providers: Mapping[str, str]) -> None:
        where = error_source(data.get("where"))
        self.engine_errors.labels(where, _label(providers.get(where, "none"))).inc()

    def _on_tool_call(self, data: Mapping[str, Any], _: Mapping[str, str]) -> None:
        self.tool_calls.labels("error" if data.get("error") else "ok").inc()

    # ---- exposition ----------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The body and Content-Type of a GET /metrics answer."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

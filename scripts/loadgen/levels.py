"""A level of concurrency: `Level` keeps --calls callers going for --duration (each starts a new
call when the last one ends; starts spread over --ramp, and hang-ups too: each line of callers
runs --duration from its own start), samples the server, the stand-in and this script meanwhile,
and sums up the calls' results, the samples and the server's own records into the level's part
of the result JSON."""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .callers import CallResult, SimulatedCall
from .conversations import make_plan
from .stats import summary

if TYPE_CHECKING:
    from .run import Run


class Level:
    def __init__(self, run: Run, calls: int) -> None:
        self.run = run
        self.calls = calls
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
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
        """One line of callers: a call, a short gap, the next call, for --duration from its
        start. Lines end as they started, spread over --ramp: all hanging up in the same few
        milliseconds would make the server end hundreds of calls at once, a storm no real
        population of callers makes, and the turns still awaited would measure it."""
        args = self.run.args
        offset = args.ramp * slot / self.calls
        await asyncio.sleep(offset)
        stopped = asyncio.Event()
        timer = self.loop.call_at(self.t0 + offset + args.duration, stopped.set)
        rng = random.Random(args.seed * 31 + slot)
        try:
            while not stopped.is_set():
                number = self.run.next_number()
                plan = make_plan(number, args, self.run.lines)
                result = await SimulatedCall(self, plan, number, stopped).run()
                self.results.append(result)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(rng.uniform(0.5, 2.0)):
                        await stopped.wait()
        finally:
            timer.cancel()

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
            sample["server_loop_lag_max_ms"] = health.get("loop_lag_max_ms")
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
            # Every line of callers ends --duration after its start; then callers end their
            # current step (a reply awaited at most --reply-timeout).
            await asyncio.sleep(args.duration + args.ramp)
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
        added_at_server = [
            value for t in server_turns if (value := run.server_added_at_server_ms(t)) is not None
        ]

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
            "server_added_at_server_ms": summary(added_at_server),
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
                    # The configured end-of-turn silence, and how late its frames came.
                    "end_of_turn": summary(stage("end_of_turn_ms", "speech_end_ms")),
                    "stt": summary(stage("stt_final_ms", "end_of_turn_ms")),
                    "turn_start": summary(stage("user_turn_ms", "stt_final_ms")),
                    "agent": summary(stage("first_token_ms", "user_turn_ms")),
                    "tts": summary(stage("first_tts_audio_ms", "first_token_ms")),
                    "send": summary(stage("first_audio_sent_ms", "first_tts_audio_ms")),
                    # The turn taken -> the reply's first audio at the server: the agent and
                    # TTS together, or a speech-to-speech model's first audio (its turns have
                    # no first token of their own).
                    "reply_audio": summary(stage("first_tts_audio_ms", "user_turn_ms")),
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
                    "server_loop_lag_max_ms",
                    "standin_cpu_pct",
                    "model_cpu_pct",
                    "model_rss_mb",
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
            "turns": [asdict(turn) for turn in turns],
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
                    # The server's own per-turn metrics, to see which stage a slow turn lost
                    # its time in.
                    "server_turns": r.server_turns,
                }
                for r in self.results
            ],
            "samples": self.samples,
        }

"""One caller turn of the turn-taking set through the real end-of-turn decision on a virtual
clock: the VAD, the call core with the default agent's settings and a detector, and the
evidence the pipeline would gather at each pause (Smart Turn's verdict, Whisper's speculative
transcript), arriving when its measured cost says it would.

What is simulated is only the clock: the frames, the VAD, the core, the model and the
recogniser are the server's own. The answer is taken to start when the turn has ended and its
transcript is there, plus the agent's and the first TTS audio's measured time.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from tests.support.turn_eval import TurnItem
from voice_agent.audio.resample import StreamResampler
from voice_agent.config import VoiceSettings
from voice_agent.core import call as core
from voice_agent.engines.vad import VadConfig, make_vad
from voice_agent.pipeline.core_settings import core_config

FRAME_MS = 20
STT_RATE = 16000
# After the last frame of the item: time enough for the longest wait to run out.
TAIL_MS = 4000

Detector = Literal["silence", "smart", "smart turn alone"]
DETECTORS: tuple[Detector, ...] = ("silence", "smart", "smart turn alone")


@dataclass(frozen=True)
class Evidence:
    """What a pause's evidence is and what it costs: the model's probability and its wall
    time, the words so far and the recogniser's wall time to give them."""

    acoustic: float | None
    acoustic_ms: float
    text: str | None
    text_ms: float


# Gathers one pause's evidence: (item, the pause's time in ms, the 16 kHz PCM STT had by then)
# -> Evidence, the model looking at the item's audio up to that time. Cached by the caller.
Gather = Callable[[TurnItem, float, bytes], Evidence]


@dataclass
class Outcome:
    item: str
    detector: Detector
    ended_ms: float | None  # when the turn first ended (None: never, within TAIL_MS)
    answer_ms: float | None  # when the agent's first audio would go out
    pauses: list[float] = field(default_factory=list)  # when JudgeTurn / PauseStt came

    def latency_ms(self, item: TurnItem) -> float | None:
        """Caller's speech end -> the agent's first audio (finished items)."""
        return None if self.answer_ms is None else self.answer_ms - item.speech_end_ms

    def cut_off(self, item: TurnItem) -> bool:
        """The agent would start speaking into the caller's pause (cut items)."""
        resume = item.pause_end_ms
        return resume is not None and self.answer_ms is not None and self.answer_ms < resume


def voice_settings(detector: Detector, base: VoiceSettings) -> tuple[VoiceSettings, bool]:
    """The agent's settings for `detector`, and whether the text is ignored (Smart Turn alone:
    as Pipecat runs it, a 200 ms stop, the model, a 3 s fallback)."""
    turn = base.turn
    if detector == "silence":
        return base.model_copy(
            update={"turn": turn.model_copy(update={"detector": "silence"})}
        ), False
    if detector == "smart":
        return base.model_copy(
            update={"turn": turn.model_copy(update={"detector": "smart"})}
        ), False
    alone = turn.model_copy(
        update={
            "detector": "smart",
            "min_silence_ms": 200,
            "unsure_silence_ms": 3000,
            "max_silence_ms": 3000,
        }
    )
    return base.model_copy(update={"turn": alone}), True


@dataclass(frozen=True)
class Figures:
    """A detector over a group of items: latencies of the finished ones (inf: never
    answered), and how many of the pauses the agent answered into."""

    latencies: list[float]
    cut: int
    pauses: int

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies) if self.latencies else float("nan")

    @property
    def p95(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[int(0.95 * (len(ordered) - 1))] if ordered else float("nan")


def figures(
    items: list[TurnItem],
    detector: Detector,
    base: VoiceSettings,
    gather: Gather,
    *,
    reply_ms: float,
    final_text_ms: Callable[[TurnItem, bytes], float],
) -> Figures:
    """`run_turn` over `items`, summed up."""
    latencies: list[float] = []
    cut = pauses = 0
    for item in items:
        outcome = run_turn(
            item, detector, base, gather, reply_ms=reply_ms, final_text_ms=final_text_ms
        )
        if item.kind == "finished":
            latency = outcome.latency_ms(item)
            latencies.append(latency if latency is not None else float("inf"))
        else:
            pauses += 1
            cut += outcome.cut_off(item)
    return Figures(latencies, cut, pauses)


def run_turn(
    item: TurnItem,
    detector: Detector,
    base: VoiceSettings,
    gather: Gather,
    *,
    reply_ms: float,
    final_text_ms: Callable[[TurnItem, bytes], float],
) -> Outcome:
    """`reply_ms`: the agent's turn plus its first TTS audio; `final_text_ms(item, stt_pcm)`:
    what decoding the whole utterance costs when no speculative decoding covers it."""
    settings, text_ignored = voice_settings(detector, base)
    vad = make_vad(VadConfig(provider=settings.vad.provider), item.sample_rate)
    config = core_config(settings, 8.0, vad_release_ms=getattr(vad, "release_ms", 0))
    if text_ignored:
        config = replace(config, end_of_turn=replace(config.end_of_turn, enabled=True))
    bytes_per_ms = item.sample_rate * 2 / 1000
    call = core.CallCore(config, bytes_per_ms=bytes_per_ms, sample_bytes=2)
    up = StreamResampler(item.sample_rate, STT_RATE) if item.sample_rate != STT_RATE else None
    stt_pcm = bytearray()
    frame_bytes = int(bytes_per_ms * FRAME_MS)
    audio = item.audio + b"\x00" * int(bytes_per_ms * TAIL_MS)
    pending: list[tuple[float, int, Evidence]] = []  # (arrival, pause id, evidence)
    outcome = Outcome(item.name, detector, None, None)
    speculated: tuple[int, float] | None = None  # (STT bytes covered, when the text is there)
    now = 0.0
    for start in range(0, len(audio) - frame_bytes + 1, frame_bytes):
        frame = audio[start : start + frame_bytes]
        now += FRAME_MS
        for arrival, pause_id, evidence in [p for p in pending if p[0] <= now]:
            pending.remove((arrival, pause_id, evidence))
            text = None if text_ignored else evidence.text
            actions = call.turn_judged(pause_id, evidence.acoustic, text, arrival)
            if _ended(
                actions, outcome, arrival, speculated, stt_pcm, item, final_text_ms, reply_ms
            ):
                return outcome
        actions = call.audio_frame(frame, vad.is_speech(frame), "", now)
        for action in actions:
            if isinstance(action, core.StartStt):
                stt_pcm.clear()
                up = StreamResampler(item.sample_rate, STT_RATE) if up is not None else None
            elif isinstance(action, core.FeedStt):
                stt_pcm += up.process(action.frame) if up is not None else action.frame
            elif isinstance(action, core.PauseStt):
                outcome.pauses.append(now)
                evidence = gather(item, now, bytes(stt_pcm))
                speculated = (len(stt_pcm), now + evidence.text_ms)
            elif isinstance(action, core.JudgeTurn):
                evidence = gather(item, now, bytes(stt_pcm))
                arrival = now + max(evidence.acoustic_ms, 0.0 if text_ignored else evidence.text_ms)
                pending.append((arrival, action.pause_id, evidence))
        if _ended(actions, outcome, now, speculated, stt_pcm, item, final_text_ms, reply_ms):
            return outcome
    return outcome


def _ended(
    actions: list[core.Action],
    outcome: Outcome,
    now: float,
    speculated: tuple[int, float] | None,
    stt_pcm: bytearray,
    item: TurnItem,
    final_text_ms: Callable[[TurnItem, bytes], float],
    reply_ms: float,
) -> bool:
    if not any(isinstance(a, core.FinishStt) for a in actions):
        return False
    outcome.ended_ms = now
    if speculated is not None and speculated[0] == len(stt_pcm):
        text_at = max(now, speculated[1])  # the pause's decoding is the final transcript
    else:
        text_at = now + final_text_ms(item, bytes(stt_pcm))
    outcome.answer_ms = text_at + reply_ms
    return True

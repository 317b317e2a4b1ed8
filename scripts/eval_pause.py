#!/usr/bin/env python3
"""Pause, not stop (docs/protocol.md): what the caller hears when they speak over the agent,
measured on speech the rule was not built from (docs/performance.md, "Pause, not stop").

    .venv/bin/python scripts/eval_pause.py                 # the report split
    .venv/bin/python scripts/eval_pause.py --split tune

Every line of the evaluation set (the backchannel fixtures, real recordings of speech_eval,
the other fixture lines; both paths: 8 kHz mu-law and 16 kHz) is said over the agent, 1 s into
a long sentence, and goes through the default agent's VAD and call core on a virtual clock. At
each pause the evidence the pipeline would gather (Smart Turn's probability, Whisper tiny.en's
speculative transcript) arrives after its measured CPU time on this machine (one thread each,
as the server runs them), and the transcript reaches the core when the turn has ended and it
is decoded. Only the clock is simulated: VAD, core, model and recogniser are the server's own.

Reported: for backchannels, the gap from the end of the caller's speech (the turn detector's
estimate, which discounts the VAD's hang-over) to the agent's audio going on, and what the
transcript then made of them; for other speech, how often it let the agent go on before its
transcript came and how long the agent talked on until the words stopped it; and, over all
lines that paused the agent, the caller's speech start -> `clear`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import speech_eval  # noqa: E402
from voice_agent.audio.g711 import ulaw_decode, ulaw_encode  # noqa: E402
from voice_agent.audio.resample import StreamResampler, resample  # noqa: E402
from voice_agent.audio.wav import read_wav  # noqa: E402
from voice_agent.config import VoiceSettings, load_config  # noqa: E402
from voice_agent.core import call as core  # noqa: E402
from voice_agent.core.playback import Word  # noqa: E402
from voice_agent.engines.vad import VadConfig, make_vad  # noqa: E402
from voice_agent.pipeline.core_settings import core_config  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "audio"
FRAME_MS = 20
STT_RATE = 16000
CALLER_STARTS_MS = 1000  # into the agent's sentence
TAIL_MS = 4000  # after the line: time for every wait to run out
AGENT_WORDS = 60  # the agent's sentence: long enough to still be playing at the end
AGENT_MS_PER_WORD = 300.0


@dataclass(frozen=True)
class Line:
    name: str
    group: str  # backchannel | real | fixture
    split: speech_eval.Split
    path: speech_eval.Route
    rate: int
    pcm: bytes


def lines() -> Iterator[Line]:
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    for entry in manifest["files"]:
        if entry["kind"] in ("silence", "noise"):
            continue
        group = "backchannel" if entry["kind"].startswith("backchannel") else "fixture"
        name, split = entry["name"], speech_eval.split_of(entry["name"])
        phone = ulaw_decode((FIXTURES / entry["ulaw"]).read_bytes())
        browser, rate = read_wav(FIXTURES / entry["wav"])
        yield Line(name, group, split, "phone", 8000, phone)
        yield Line(name, group, split, "browser", rate, browser)
    for utterance in speech_eval.real_speech():
        pcm, rate = utterance.pcm()
        narrow = pcm if rate == 8000 else resample(pcm, rate, 8000)
        wide = pcm if rate == STT_RATE else resample(pcm, rate, STT_RATE)
        phone = ulaw_decode(ulaw_encode(narrow))
        yield Line(utterance.name, "real", utterance.split, "phone", 8000, phone)
        yield Line(utterance.name, "real", utterance.split, "browser", STT_RATE, wide)


class Engines:
    """Smart Turn and Whisper tiny.en, each answer cached by the audio it was given."""

    def __init__(self) -> None:
        from voice_agent.engines.stt.whisper import (
            WhisperDecoder,
            WhisperOptions,
            bundled_model_path,
        )
        from voice_agent.engines.turn import load_turn_model

        self._model = load_turn_model("smart-turn-v3.2")
        self._decoder = WhisperDecoder(WhisperOptions(model_path=str(bundled_model_path())))
        self._texts: dict[bytes, tuple[str, float]] = {}

    def transcribe(self, pcm: bytes) -> tuple[str, float]:
        """The text and the CPU milliseconds it took."""
        found = self._texts.get(pcm)
        if found is None:
            started = time.process_time()
            text = self._decoder.transcribe(pcm).text
            found = self._texts[pcm] = (text, (time.process_time() - started) * 1000)
        return found

    def end_probability(self, pcm: bytes) -> tuple[float, float]:
        started = time.process_time()
        probability = self._model.end_probability(pcm[-8 * STT_RATE * 2 :])
        return float(probability), (time.process_time() - started) * 1000


@dataclass
class Outcome:
    line: Line
    clear_ms: float | None = None  # caller speech start -> clear
    speech_end_ms: float | None = None  # when the speech that paused the agent ended
    resumed_ms: float | None = None  # the agent's audio going on (any reason)
    resumed_early: bool = False  # at the caller's pause, before the transcript
    stopped_ms: float | None = None  # the agent stopped again after going on early
    text: str | None = None
    verdict: str = ""  # turn | backchannel | empty | none
    audits: list[str] = field(default_factory=list)


def agent_speaks(call: core.CallCore, bytes_per_ms: float) -> None:
    text = " ".join(f"word{i}" for i in range(AGENT_WORDS)) + "."
    actions = call.agent_text(1, text, 0.0) + call.agent_reply_end(1, 0.0)
    for synth in [a for a in actions if isinstance(a, core.Synthesize)]:
        words = synth.text.split()
        timed = tuple(
            Word(w, i * AGENT_MS_PER_WORD, (i + 1) * AGENT_MS_PER_WORD) for i, w in enumerate(words)
        )
        duration = len(words) * AGENT_MS_PER_WORD
        audio = b"\xff" * int(duration * bytes_per_ms)
        call.tts_audio(1, synth.text, audio, duration, 0.0, words=timed)


def run_line(line: Line, voice: VoiceSettings, engines: Engines) -> Outcome:
    vad = make_vad(VadConfig(provider=voice.vad.provider), line.rate)
    config = core_config(voice, 60.0, vad_release_ms=getattr(vad, "release_ms", 0))
    phone = line.path == "phone"
    # The agent's audio in the carrier's format: mu-law on the phone, PCM16 in the browser.
    agent_bytes_per_ms, sample_bytes = (8.0, 1) if phone else (32.0, 2)
    call = core.CallCore(config, bytes_per_ms=agent_bytes_per_ms, sample_bytes=sample_bytes)
    agent_speaks(call, agent_bytes_per_ms)
    frame_bytes = line.rate * 2 * FRAME_MS // 1000
    lead = b"\x00" * (line.rate * 2 * CALLER_STARTS_MS // 1000)
    audio = lead + line.pcm + b"\x00" * (line.rate * 2 * TAIL_MS // 1000)
    up = StreamResampler(line.rate, STT_RATE) if line.rate != STT_RATE else None
    stt_pcm = bytearray()
    outcome = Outcome(line)
    pending: list[tuple[float, list[core.Action] | None, Any]] = []  # (when, -, what to do)
    speculated: tuple[int, float] | None = None  # (STT bytes covered, when its text is there)
    cleared = False

    def apply(actions: list[core.Action], now: float) -> None:
        nonlocal cleared, speculated, stt_pcm, up
        for action in actions:
            if isinstance(action, core.SendClear):
                if outcome.resumed_early and outcome.stopped_ms is None:
                    outcome.stopped_ms = now
                cleared = True
            elif isinstance(action, core.SendAudio) and cleared:
                if outcome.resumed_ms is None:
                    outcome.resumed_ms = now
                cleared = False
            elif isinstance(action, core.Audit):
                outcome.audits.append(action.type)
                data = action.data
                if action.type == "barge_in" and outcome.clear_ms is None:
                    outcome.clear_ms = float(data["latency_ms"])
                elif action.type == "false_interruption" and data.get("reason") == "brief":
                    outcome.resumed_early = True
                    outcome.speech_end_ms = call.turns.speech_end_ms
                elif action.type == "user_utterance_dropped":
                    outcome.verdict = outcome.verdict or str(data.get("reason"))
            elif isinstance(action, core.StartUserTurn):
                outcome.verdict = outcome.verdict or "turn"
            elif isinstance(action, core.StartStt):
                stt_pcm = bytearray()
                up = StreamResampler(line.rate, STT_RATE) if line.rate != STT_RATE else None
            elif isinstance(action, core.FeedStt):
                stt_pcm += up.process(action.frame) if up is not None else action.frame
            elif isinstance(action, core.PauseStt):
                _, text_ms = engines.transcribe(bytes(stt_pcm))
                speculated = (len(stt_pcm), now + text_ms)
            elif isinstance(action, core.JudgeTurn):
                text, text_ms = engines.transcribe(bytes(stt_pcm))
                probability, acoustic_ms = engines.end_probability(bytes(stt_pcm))
                arrival = now + max(text_ms, acoustic_ms)
                pending.append((arrival, None, ("judge", action.pause_id, probability, text)))
            elif isinstance(action, core.FinishStt):
                text, text_ms = engines.transcribe(bytes(stt_pcm))
                if speculated is not None and speculated[0] == len(stt_pcm):
                    at = max(now, speculated[1])
                else:
                    at = now + text_ms
                pending.append((at, None, ("final", text)))

    now = 0.0
    for start in range(0, len(audio) - frame_bytes + 1, frame_bytes):
        frame = audio[start : start + frame_bytes]
        now += FRAME_MS
        for item in sorted((p for p in pending if p[0] <= now), key=lambda p: p[0]):
            pending.remove(item)
            at, _, what = item
            if what[0] == "judge":
                apply(call.turn_judged(what[1], what[2], what[3], at), at)
            else:
                outcome.text = what[1]
                apply(call.stt_final(what[1], at), at)
        apply(call.audio_frame(frame, vad.is_speech(frame), "", now), now)
        apply(call.tick(now), now)
    outcome.verdict = outcome.verdict or "none"
    return outcome


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    return (
        f"p50 {statistics.median(ordered):.0f}, p95 {p95:.0f}, max {ordered[-1]:.0f} ms"
        f" ({len(ordered)})"
    )


def _p99(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return (
        f"p50 {statistics.median(ordered):.0f}, p99 {ordered[int(0.99 * (len(ordered) - 1))]:.0f},"
        f" max {ordered[-1]:.0f} ms ({len(ordered)})"
    )


def report(outcomes: list[Outcome], path: str) -> list[str]:
    rows: list[str] = []
    mine = [o for o in outcomes if o.line.path == path]
    backchannels = [o for o in mine if o.line.group == "backchannel" and o.clear_ms is not None]
    early = [o for o in backchannels if o.resumed_early]
    gaps = [o.resumed_ms - o.speech_end_ms for o in early if o.resumed_ms and o.speech_end_ms]
    late = [o for o in backchannels if not o.resumed_early]
    dropped = sum(o.verdict == "backchannel" for o in backchannels)
    turns = [f"{o.line.name} {o.text!r}" for o in backchannels if o.verdict == "turn"]
    rows.append(
        f"| {path} | backchannels that paused the agent | {len(backchannels)} |"
        f" went on at the pause: {len(early)}; speech end -> audio on: {_ms(gaps)};"
        f" waited for the transcript (longer than backchannel_max_ms):"
        f" {', '.join(o.line.name for o in late) or 'none'};"
        f" transcript: dropped {dropped}, read as words and taken as a turn {len(turns)}"
        f" ({', '.join(turns)}) |"
    )
    for group in ("real", "fixture"):
        others = [o for o in mine if o.line.group == group and o.clear_ms is not None]
        early = [o for o in others if o.resumed_early]
        stopped = [o for o in early if o.stopped_ms is not None and o.resumed_ms is not None]
        talk = [o.stopped_ms - o.resumed_ms for o in stopped]  # type: ignore[operator]
        never = [o for o in early if o.stopped_ms is None]
        kinds = ", ".join(f"{o.line.name} ({o.verdict}: {o.text!r})" for o in never) or "none"
        rows.append(
            f"| {path} | other speech ({group}) that paused the agent | {len(others)} |"
            f" went on at the pause: {len(early)} ({100 * len(early) / max(1, len(others)):.0f}%);"
            f" stopped by the transcript after {_ms(talk)}; never stopped: {kinds} |"
        )
    clears = [o.clear_ms for o in mine if o.clear_ms is not None]
    rows.append(f"| {path} | every line: speech start -> clear | {len(clears)} | {_p99(clears)} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="report", choices=("report", "tune"))
    parser.add_argument("--path", default="phone,browser", help="phone, browser or both")
    args = parser.parse_args()
    voice = load_config(ROOT / "config" / "agents.yaml").config.voice
    engines = Engines()
    paths = args.path.split(",")
    chosen = [line for line in lines() if line.split == args.split and line.path in paths]
    outcomes = [run_line(line, voice, engines) for line in chosen]
    print("| path | lines | count | outcome |")
    print("| --- | --- | --- | --- |")
    for path in paths:
        print("\n".join(report(outcomes, path)))


if __name__ == "__main__":
    main()

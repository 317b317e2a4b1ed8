"""Turn-taking on the held-out set: the whole end-of-turn decision for each detector, on real
recorded speech and, apart, the three fixture voices (docs/performance.md, "Turn-taking").

For every item of tests/support/turn_eval.py (a finished utterance, or one cut mid-phrase with
a 0.7-1.5 s pause) the frames go through the VAD and the call core on a virtual clock
(tests/support/turn_sim.py), with the evidence at each pause from the real Smart Turn and
Whisper tiny.en arriving after their measured cost. Reported per path and detector:
caller's speech end -> the agent's first audio on finished turns (p50, p95), and how often the
agent would start speaking into a pause. Twice: with Whisper's text as it comes, and with
the text at the pause (a streaming recogniser), which shows what the recogniser costs.

    .venv/bin/python scripts/eval_turn_taking.py                 # the report split
    .venv/bin/python scripts/eval_turn_taking.py --split tune    # for choosing settings
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.speech_eval import Route, Split  # noqa: E402
from tests.support.turn_eval import TurnItem, iter_turn_items  # noqa: E402
from tests.support.turn_evidence import EvidenceCache, evidence_file  # noqa: E402
from tests.support.turn_sim import DETECTORS, Detector, Evidence, Gather, figures  # noqa: E402
from voice_agent.config import VoiceSettings, load_config  # noqa: E402

# The agent's turn and its first TTS audio after the transcript: the default agent (a flow,
# eSpeak NG) in the turn metrics of the end-to-end tests, stt_final -> first_audio_sent.
REPLY_MS = 10.0


HEADER = [
    "| path | speech (finished + cut) | text | detector | finished: p50 | p95 | cut off |",
    "| --- | --- | --- | --- | --- | --- | --- |",
]


def table(split: Split, path: Route, voice: VoiceSettings, cache: EvidenceCache) -> list[str]:
    lines = []
    items = list(iter_turn_items(split=split, path=path))

    def text_at_the_pause(item: TurnItem, now_ms: float, stt: bytes) -> Evidence:
        return replace(cache.gather(item, now_ms, stt), text_ms=0.0)

    for real in (True, False):
        group = [i for i in items if i.real == real]
        for text, gather in (("as it comes", cache.gather), ("at the pause", text_at_the_pause)):
            for detector in DETECTORS:
                lines.append(row(path, real, text, detector, group, voice, gather, cache))
    return lines


def row(
    path: Route,
    real: bool,
    text: str,
    detector: Detector,
    group: list[TurnItem],
    voice: VoiceSettings,
    gather: Gather,
    cache: EvidenceCache,
) -> str:
    fast = text == "at the pause"
    result = figures(
        group,
        detector,
        voice,
        gather,
        reply_ms=REPLY_MS,
        final_text_ms=(lambda i, p: 0.0) if fast else cache.final_text_ms,
    )
    cut, pauses, p50, p95 = result.cut, result.pauses, result.p50, result.p95
    speech = "real" if real else "fixture voices"
    share = f"{cut}/{pauses} ({100 * cut / pauses:.0f}%)" if pauses else "-"
    return (
        f"| {path} | {speech} ({len(result.latencies)} + {pauses}) | {text} | {detector} |"
        f" {p50:.0f} ms | {p95:.0f} ms | {share} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="report", choices=("report", "tune"))
    parser.add_argument("--path", default="phone,browser", help="phone, browser or both")
    args = parser.parse_args()
    voice = load_config(ROOT / "config" / "agents.yaml").config.voice
    print("\n".join(HEADER), flush=True)
    split: Split = args.split
    path: Route
    for path in args.path.split(","):
        cache = EvidenceCache(evidence_file(path))
        for line in table(split, path, voice, cache):
            print(line, flush=True)
        if cache.computed:
            cache.save()
            print(f"({cache.computed} pieces of evidence computed, kept in {cache.path})")


if __name__ == "__main__":
    main()

"""The acoustic end-of-turn model on the turn-taking set (tests/support/turn_eval.py): for each
item, Smart Turn's probability N ms into the silence (a cut item: into its mid-phrase pause; a
finished one: after its last word), over both paths. Thresholds are chosen on the tune split
only; the tables are the report split's, real speech by source and the fixture voices apart.

    PYTHONPATH=. .venv/bin/python scripts/eval_turns.py
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tests.support import turn_eval
from tests.support.speech_eval import Route, Split
from voice_agent.engines.turn import load_turn_model

AFTER_MS = (100, 200, 300, 500)
PATHS: tuple[Route, ...] = ("browser", "phone")
MAX_CUT_OFF = 0.05  # the tuned threshold: the lowest that cuts off at most 5% of tune's pauses
PIPECAT_THRESHOLD = 0.5  # Pipecat's own: "complete" above 0.5


@dataclass(frozen=True)
class Score:
    item: turn_eval.TurnItem
    after_ms: int
    probability: float

    @property
    def group(self) -> str:
        return "real" if self.item.real else "fixture voices"


def score(model_name: str, threads: int) -> list[Score]:
    model = load_turn_model(model_name)
    items = [item for path in PATHS for item in turn_eval.iter_turn_items(path=path)]
    jobs = [(item, ms) for item in items for ms in AFTER_MS]

    def one(job: tuple[turn_eval.TurnItem, int]) -> Score:
        item, ms = job
        return Score(item, ms, model.end_probability(item.pcm16k(item.decision_ms + ms)))

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, jobs))


def rates(scores: list[Score], threshold: float) -> tuple[int, float, int, float]:
    """Finished items detected (probability >= threshold), and cut items cut off (the same)."""
    finished = [s for s in scores if s.item.kind == "finished"]
    cut = [s for s in scores if s.item.kind == "cut"]
    detected = sum(s.probability >= threshold for s in finished) / max(1, len(finished))
    cut_off = sum(s.probability >= threshold for s in cut) / max(1, len(cut))
    return len(finished), detected, len(cut), cut_off


def tuned_threshold(scores: list[Score]) -> float:
    """On tune's real speech: the lowest threshold that cuts off at most MAX_CUT_OFF of the
    mid-phrase pauses (so the most finished turns are taken)."""
    cut = sorted((s.probability for s in scores if s.item.kind == "cut"), reverse=True)
    allowed = int(MAX_CUT_OFF * len(cut))
    return cut[allowed] + 1e-6 if allowed < len(cut) else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smart-turn-v3.2")
    parser.add_argument("--threads", type=int, default=2, help="inferences side by side")
    args = parser.parse_args()
    missing = turn_eval.missing_packages()
    if missing:
        raise SystemExit(
            f"missing Debian packages: {', '.join(missing)} (scripts/test installs them)"
        )
    scores = score(args.model, args.threads)
    by: dict[tuple[Route, int, Split], list[Score]] = defaultdict(list)
    for s in scores:
        by[(s.item.path, s.after_ms, s.item.split)].append(s)

    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for s in scores:
        if s.after_ms == AFTER_MS[0]:
            counts[(s.item.split, s.item.path, s.item.kind)] += 1
    print("items:", ", ".join(f"{k[0]}/{k[1]}/{k[2]} {n}" for k, n in sorted(counts.items())))
    speakers = {s.item.speaker for s in scores if s.item.real}
    print(f"real speakers: {len(speakers)} ({', '.join(sorted(speakers))})")

    tuned = {
        (path, ms): tuned_threshold([s for s in by[(path, ms, "tune")] if s.item.real])
        for path in PATHS
        for ms in AFTER_MS
    }
    for title, pick in (
        ("thresholds chosen on tune", lambda path, ms: tuned[(path, ms)]),
        ("Pipecat's threshold, 0.5", lambda path, ms: PIPECAT_THRESHOLD),
    ):
        print(f"\nreport split, {title}")
        print(
            "| path | silence | threshold | real: finished turns taken | real: mid-phrase "
            "pauses cut off | fixture voices: finished taken | fixture voices: cut off |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for path in PATHS:
            for ms in AFTER_MS:
                threshold = pick(path, ms)
                cells = []
                for real in (True, False):
                    n_f, detected, n_c, cut_off = rates(
                        [s for s in by[(path, ms, "report")] if s.item.real is real], threshold
                    )
                    cells += [f"{detected:.0%} of {n_f}", f"{cut_off:.0%} of {n_c}"]
                print(f"| {path} | {ms} ms | {threshold:.3f} | " + " | ".join(cells) + " |")
    for ms in (200,):
        print(f"\nreport split by source, {ms} ms, thresholds chosen on tune")
        print("| path | source | speakers | finished turns taken | mid-phrase pauses cut off |")
        print("| --- | --- | --- | --- | --- |")
        for path in PATHS:
            report = by[(path, ms, "report")]
            for source in sorted({s.item.source for s in report}):
                mine = [s for s in report if s.item.source == source]
                n_f, detected, n_c, cut_off = rates(mine, tuned[(path, ms)])
                voices = len({s.item.speaker for s in mine})
                taken, off = f"{detected:.0%} of {n_f}", f"{cut_off:.0%} of {n_c}"
                print(f"| {path} | {source} | {voices} | {taken} | {off} |")
    print()
    print("tune split, real speech (where the thresholds come from):")
    for path in PATHS:
        for ms in AFTER_MS:
            tune = [s for s in by[(path, ms, "tune")] if s.item.real]
            threshold = tuned[(path, ms)]
            n_f, detected, n_c, cut_off = rates(tune, threshold)
            print(
                f"  {path} {ms} ms: threshold {threshold:.3f}: finished {detected:.0%} of {n_f}, "
                f"cut off {cut_off:.0%} of {n_c}"
            )


if __name__ == "__main__":
    main()

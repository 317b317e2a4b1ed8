"""Intent matching on the held-out evaluation set (tests/support/intent_eval.py): the lexical
matcher and the matcher by meaning, over the lines as written and as Whisper heard them spoken
by the three fixture voices (docs/performance.md, "Intents by meaning").

    .venv/bin/python scripts/eval_intents.py                  # the report split
    .venv/bin/python scripts/eval_intents.py --split tune     # and the grid settings are chosen on
    .venv/bin/python scripts/eval_intents.py --wrong          # each line matched wrongly
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.intent_eval import (  # noqa: E402
    HEADER,
    NOW,
    VOICES,
    Line,
    Split,
    figures,
    heard,
    load_lines,
)
from voice_agent.agents.registry import AgentRegistry  # noqa: E402
from voice_agent.brains.flows.flow import FlowBrain  # noqa: E402
from voice_agent.brains.flows.intents import IntentMatcher  # noqa: E402
from voice_agent.brains.flows.semantic import SemanticMatcher  # noqa: E402
from voice_agent.engines.embedding import SentenceEncoder, load_encoder  # noqa: E402


class Remembering:
    """An encoder that encodes each text once: the grid asks for the same lines many times."""

    def __init__(self, encoder: SentenceEncoder) -> None:
        self.name = encoder.name
        self.dimensions = encoder.dimensions
        self._encoder = encoder
        self._seen: dict[str, np.ndarray] = {}

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in texts if t not in self._seen]
        if missing:
            for text, vector in zip(missing, self._encoder.encode(missing), strict=True):
                self._seen[text] = vector
        return np.stack([self._seen[t] for t in texts])


def best(matcher: IntentMatcher | SemanticMatcher, text: str, threshold: float) -> str | None:
    scores = matcher.scores(text, now=NOW)
    name, score = max(scores.items(), key=lambda item: item[1])
    return name if score >= threshold else None


def grid(lexical: IntentMatcher, encoder: SentenceEncoder, lines: list[Line]) -> None:
    print("| weight | top | threshold | accuracy | unmatched | wrongly ending |")
    for weight in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
        for top in (1, 2, 3):
            matcher = SemanticMatcher(lexical, encoder, threshold=0.0, weight=weight, top=top)
            scored = {line.text: matcher.scores(line.text, now=NOW) for line in lines}
            for threshold in np.arange(0.35, 0.71, 0.025):

                def pick(
                    text: str,
                    at: float = float(threshold),
                    seen: dict[str, dict[str, float]] = scored,
                ) -> str | None:
                    name, score = max(seen[text].items(), key=lambda item: item[1])
                    return name if score >= at else None

                result = figures(lines, pick)
                print(
                    f"| {weight} | {top} | {threshold:.3f} | {result.accuracy:.3f} "
                    f"| {result.unmatched_share:.3f} | {len(result.wrongly_ending)} |"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=("tune", "report"), default="report")
    parser.add_argument("--grid", action="store_true", help="weights and thresholds (tune)")
    parser.add_argument("--wrong", action="store_true", help="print each line matched wrongly")
    args = parser.parse_args()
    split: Split = args.split
    registry = AgentRegistry.from_file(ROOT / "config" / "agents.yaml")
    flow = registry.agents["booking"].brain
    assert isinstance(flow, FlowBrain)  # the default agent is a flow
    lexical = IntentMatcher(flow.matcher.intents, flow.matcher.entities, threshold=0.6)
    encoder = Remembering(load_encoder("all-MiniLM-L6-v2"))
    written = load_lines(split)
    if args.grid:
        grid(lexical, encoder, written)
        return
    semantic = SemanticMatcher(lexical, encoder, threshold=0.5)
    print("\n".join(HEADER))
    for texts, lines in [("written", written)] + [(v, heard(written, v)) for v in VOICES]:
        matchers: list[tuple[str, IntentMatcher | SemanticMatcher]] = [
            ("lexical", lexical),
            ("by meaning", semantic),
        ]
        for label, matcher in matchers:

            def pick(text: str, m: IntentMatcher | SemanticMatcher = matcher) -> str | None:
                return best(m, text, m.threshold)

            result = figures(lines, pick)
            print(result.row(f"{label}, {texts}"))
            if args.wrong:
                for text, meant, got in result.wrong:
                    print(f"    {meant} -> {got}: {text}")


if __name__ == "__main__":
    main()

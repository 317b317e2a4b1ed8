"""The intent evaluation set (tests/fixtures/intents/eval.yaml) and its figures.

The set was written apart from the default agent's training phrases: what callers say to a
restaurant, with an intent or none (out of domain). A third of its lines are for choosing the
matcher's settings (`tune`), the rest only for reporting (`report`), by a hash of the text.
tests/fixtures/intents/transcripts.json holds what Whisper tiny.en wrote for each line spoken
by the three fixture voices over the phone path (scripts/transcribe_intent_eval.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
EVAL = ROOT / "tests" / "fixtures" / "intents" / "eval.yaml"
TRANSCRIPTS = ROOT / "tests" / "fixtures" / "intents" / "transcripts.json"
VOICES = ("joe", "espeak", "espeakf")
# Intents whose match can end the call: goodbye always, deny on "anything else?". A line
# that does not mean one of them must never match it.
ENDING = frozenset({"goodbye", "deny"})
# The moment the lines are matched at (a Saturday noon): only relative dates depend on it.
NOW = datetime(2026, 12, 5, 12, 0)

Split = Literal["tune", "report"]


@dataclass(frozen=True)
class Line:
    text: str  # as written, or as Whisper heard it spoken (`heard`)
    intent: str | None
    party_size: int | None
    split: Split
    written: str  # the line as written: its split and its name in the transcripts


def split_of(text: str) -> Split:
    """A third of the lines are for tuning, by a hash nobody chose."""
    return "tune" if hashlib.sha256(text.encode()).digest()[0] % 3 == 0 else "report"


def load_lines(split: Split | None = None) -> list[Line]:
    lines = []
    for item in yaml.safe_load(EVAL.read_text())["lines"]:
        text = item["text"]
        line = Line(text, item["intent"], item.get("party_size"), split_of(text), text)
        if split is None or line.split == split:
            lines.append(line)
    return lines


def heard(lines: Iterable[Line], voice: str) -> list[Line]:
    """The lines as Whisper wrote them, spoken by `voice`; lines not transcribed are left out."""
    transcripts = json.loads(TRANSCRIPTS.read_text())["voices"].get(voice, {})
    return [
        Line(transcripts[line.written], line.intent, line.party_size, line.split, line.written)
        for line in lines
        if line.written in transcripts
    ]


@dataclass(frozen=True)
class Figures:
    lines: int
    in_domain: int
    correct: int
    out_of_domain: int
    unmatched: int  # out-of-domain lines that matched nothing, as they should
    wrongly_ending: list[tuple[str, str]]  # (line meaning neither, ending intent it matched)
    wrong: list[tuple[str, str | None, str | None]]  # (line, meant, matched)

    @property
    def accuracy(self) -> float:
        return self.correct / self.in_domain if self.in_domain else 0.0

    @property
    def unmatched_share(self) -> float:
        return self.unmatched / self.out_of_domain if self.out_of_domain else 0.0

    def row(self, label: str) -> str:
        return (
            f"| {label} | {self.lines} | {self.accuracy:.1%} ({self.correct}/{self.in_domain}) "
            f"| {self.unmatched_share:.1%} ({self.unmatched}/{self.out_of_domain}) "
            f"| {len(self.wrongly_ending)} |"
        )


HEADER = [
    "| matcher, text | lines | intent accuracy | out of domain unmatched | wrongly ending |",
    "| --- | --- | --- | --- | --- |",
]


def figures(lines: Iterable[Line], best: Callable[[str], str | None]) -> Figures:
    """`best` gives the intent a text matched, or None."""
    counts = {"lines": 0, "in": 0, "correct": 0, "ood": 0, "unmatched": 0}
    ending: list[tuple[str, str]] = []
    wrong: list[tuple[str, str | None, str | None]] = []
    for line in lines:
        got = best(line.text)
        counts["lines"] += 1
        if line.intent is None:
            counts["ood"] += 1
            counts["unmatched"] += got is None
        else:
            counts["in"] += 1
            counts["correct"] += got == line.intent
        if got != line.intent:
            wrong.append((line.text, line.intent, got))
            if got in ENDING and line.intent not in ENDING:
                # A deny heard as goodbye is wrong (counted above) but ends nothing the
                # caller did not mean to end.
                ending.append((line.text, got))
    return Figures(
        counts["lines"],
        counts["in"],
        counts["correct"],
        counts["ood"],
        counts["unmatched"],
        ending,
        wrong,
    )

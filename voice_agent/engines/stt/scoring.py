"""Word error rate of a transcript against what was said, on words as a caller says them.

Recognisers write the same speech differently: Whisper gives "7 p.m.", "880-555-3535" and
"OK", pocketsphinx "seven pm", "eight eight zero..." and "okay". Scoring either against a
reference needs one spoken form, or a recogniser is charged for its spelling: numbers are read
the way callers say them (times and counts as numbers, phone numbers and codes digit by
digit), punctuation goes, and a few spellings of one word become one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rapidfuzz.distance import Levenshtein

from voice_agent.engines.stt.domain_lm import normalize

# Digit groups joined by dashes, dots or spaces ("880-555-3535", "0770 911 2345"): said digit
# by digit, whatever the grouping.
_DIGIT_RUN = re.compile(r"\d+(?:[-. ]\d+){1,}(?![:\d])")
_CLOCK_SUFFIX = re.compile(r"\b([ap])\.\s?m\.?(?![a-z])")
# One spoken word, many spellings. Backchannels first, so their hyphens survive the split below.
_SPELLINGS = {
    "ok": "okay",
    "mhm": "mm-hmm",
    "mmhmm": "mm-hmm",
    "mm-hm": "mm-hmm",
    "uhhuh": "uh-huh",
    "alright": "all right",
}
_PAIRS = {("mm", "hmm"): "mm-hmm", ("uh", "huh"): "uh-huh"}
_SYMBOLS = {"#": " pound ", "*": " star ", "$": " dollars "}


def spoken_words(text: str) -> list[str]:
    """`text` as the words a caller says: "At 7 p.m., call 880-555-3535. OK?" -> at seven pm
    call eight eight zero five five five three five three five okay."""
    text = text.lower()
    text = _CLOCK_SUFFIX.sub(r"\1m", text)
    text = _DIGIT_RUN.sub(lambda m: " " + " ".join(re.sub(r"\D", "", m[0])) + " ", text)
    for symbol, word in _SYMBOLS.items():
        text = text.replace(symbol, word)
    words: list[str] = []
    for word in normalize(text):
        word = _SPELLINGS.get(word, word)
        if word in ("mm-hmm", "uh-huh"):
            words.append(word)
            continue
        for part in word.replace("-", " ").split():
            if words and (words[-1], part) in _PAIRS:
                words[-1] = _PAIRS[(words[-1], part)]
            else:
                words.extend(_SPELLINGS.get(part, part).split())
    return words


@dataclass
class ErrorCount:
    """Word errors (substitutions, deletions, insertions) over reference words, summed."""

    errors: int = 0
    words: int = 0
    utterances: int = 0

    def add(self, reference: str, hypothesis: str) -> int:
        ref, hyp = spoken_words(reference), spoken_words(hypothesis)
        errors = Levenshtein.distance(ref, hyp)
        self.errors += errors
        self.words += len(ref)
        self.utterances += 1
        return errors

    @property
    def rate(self) -> float:
        return self.errors / self.words if self.words else 0.0


def word_error_rate(reference: str, hypothesis: str) -> float:
    count = ErrorCount()
    count.add(reference, hypothesis)
    return count.rate

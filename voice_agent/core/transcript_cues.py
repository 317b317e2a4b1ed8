"""What the words so far say about whether the caller has finished: a sentence that stops on
"and", "for the" or "my number is oh seven" is not over, whatever the silence after it.

The cues are English, and only the strong ones: a word a sentence cannot end on, the
recogniser's own trailing punctuation, a phone number too short to be one, and an answer
that fills what the agent just asked for.
"""

from __future__ import annotations

import re
from enum import Enum

from voice_agent.core.words import words_of


class Completeness(Enum):
    UNFINISHED = "unfinished"  # the words stop mid-phrase: wait for more
    COMPLETE = "complete"  # the words answer what was asked: no need to wait
    UNKNOWN = "unknown"  # the words say nothing either way


# Words an English sentence does not end on: conjunctions, articles, the prepositions that
# are never a particle ("for", "to", "of": unlike "in", "on", "over"), possessives that are
# not pronouns, contractions that need what follows ("I'm", "it's"), and fillers. A caller
# who stops on one is looking for the next word. Auxiliaries and modals are not here: "than
# he was", "yes I can" end sentences.
_DANGLING = frozenset(
    """
    and but or nor because if than although though whereas
    a an the every
    for to at of from with into onto via per between until till
    my your our their its
    i'm it's that's there's what's he's she's we're you're they're i've we've i'd we'd
    you'd i'll we'll
    um uh er erm uhm umm hmm ah eh
    """.split()
)
# Said alone, these end nothing and start nothing: a hesitation, not an answer.
_FILLERS = frozenset("um uh er erm uhm umm hmm ah eh mm".split())
# The recogniser marks a trailing-off itself: "He was not an ill...", "at the tone, the".
_TRAILING_OFF = re.compile(r"(?:\.\.\.|…|,|-|—|;|:)\s*$")
_YES_NO = frozenset(
    "yes yeah yep yup no nope nah sure correct right okay ok fine absolutely definitely please "
    "thanks".split()
)
_DIGIT_WORDS = {
    "zero": 1,
    "oh": 1,
    "o": 1,
    "one": 1,
    "two": 1,
    "three": 1,
    "four": 1,
    "five": 1,
    "six": 1,
    "seven": 1,
    "eight": 1,
    "nine": 1,
    "double": 1,  # "double four": the second is counted on its own
    "triple": 2,
}
_NUMBER_WORDS = frozenset(
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty thirty forty fifty couple dozen".split()
)
# Enough digits for a phone number in the plans callers use: 10 (NANP) or 11 (UK with 0).
PHONE_DIGITS = 10
_PHONE_INTRO = re.compile(r"\b(?:number|phone|mobile|cell)\b(?:\s+\w+){0,3}\s*$|\bnumber is\b")


def completeness(text: str | None, expecting: str | None = None) -> Completeness:
    """What `text`, the caller's words so far, says about their turn. `expecting`: what the
    agent asked for ("phone", "number", "yes_no", "datetime", "name"), None if nothing."""
    if not text or not text.strip():
        return Completeness.UNKNOWN
    words = words_of(text)
    if not words:
        return Completeness.UNKNOWN
    digits = _digit_count(text, words)
    asked_phone = expecting == "phone" or _PHONE_INTRO.search(text.lower()) is not None
    if asked_phone and 0 < digits < PHONE_DIGITS and not _ends_a_sentence(text):
        return Completeness.UNFINISHED  # "my number is oh seven seven..." and a breath
    if words[-1] in _DANGLING or _TRAILING_OFF.search(text):
        return Completeness.UNFINISHED
    if all(word in _FILLERS for word in words):
        return Completeness.UNFINISHED
    if text.rstrip().endswith("?"):
        return Completeness.COMPLETE
    if expecting == "phone" and digits >= PHONE_DIGITS:
        return Completeness.COMPLETE
    if expecting == "yes_no" and words[0] in _YES_NO and len(words) <= 4:
        return Completeness.COMPLETE
    if expecting in ("number", "integer") and len(words) <= 4 and any(_is_number(w) for w in words):
        return Completeness.COMPLETE
    return Completeness.UNKNOWN


def _ends_a_sentence(text: str) -> bool:
    return text.rstrip().endswith(("?", "!"))


def _is_number(word: str) -> bool:
    return word.isdigit() or word in _NUMBER_WORDS


def _digit_count(text: str, words: list[str]) -> int:
    count = sum(ch.isdigit() for ch in text)
    return count + sum(_DIGIT_WORDS.get(word, 0) for word in words)

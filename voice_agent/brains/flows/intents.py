"""Intent matching for the flow brain: rapidfuzz scores of an utterance against each intent's
example phrases, with parameter spans replaced by type placeholders on both sides."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import numpy as np
from rapidfuzz import fuzz, process

from voice_agent.brains.flows.parameters import (
    Annotation,
    EntitySpec,
    ParameterSpec,
    annotate,
    extract_parameters,
)
from voice_agent.errors import ConfigError
from voice_agent.runtime.intent_match import IntentMatch, MatchResult

__all__ = [
    "FILLERS",
    "MAX_WORDS",
    "IntentMatch",
    "IntentMatcher",
    "IntentSpec",
    "MatchResult",
    "Matcher",
    "matching_key",
    "ranked",
]

# Phrases are prepared against a fixed moment: only where dates and times are matters there.
_PHRASE_NOW = datetime(2000, 1, 3, 12, 0)
# Hesitations carry no intent; "like" is mostly "um, like" or "i would like", also empty.
FILLERS = frozenset({"uh", "um", "umm", "uhm", "er", "erm", "ah", "hmm", "hm", "mm", "eh", "like"})
# A turn this long is no request: about two minutes of speech with no pause for an answer.
# It matches nothing, which also bounds the cost of a pasted essay or a stuck transcript.
MAX_WORDS = 300
# Kept as one word so that filler removal does not turn a "yes" into nothing.
_KEEP_TOGETHER = re.compile(r"\b(uh huh|mm hmm|uh uh)\b")
# Function words: dropped for the word-level scorers so that the words telling intents apart
# ("cancel", "change", "hours") weigh more than "can i", "to my", "for the".
_FUNCTION_WORDS = frozenset(
    "i a an the to is it am are be will would could can you me my our us we please just so "
    "for of on at in and do does did".split()
)
# A phrase's score: token_set_ratio + token_sort_ratio over characters (forgiving misheard
# and inflected words) + ratio over the sorted content words (exact word overlap).
_SET_WEIGHT = 0.4
_SORT_WEIGHT = 0.3
_WORDS_WEIGHT = 0.3
# An intent's confidence: its best phrase score blended with how much of the utterance's
# content words its phrases use at all (token_set_ratio against the intent's vocabulary).
_VOCABULARY_WEIGHT = 0.3
# Words are coded as single characters from here on; coded strings are only compared with
# each other, so any block of code points serves.
_FIRST_CODE = 0x4E00
# How many phrases, best by the cheap scorers, also get the costlier token_set_ratio.
_SHORTLIST = 16


@dataclass(frozen=True)
class IntentSpec:
    """An intent: its name, example phrases as callers say them, and its parameters."""

    name: str
    phrases: tuple[str, ...]
    parameters: tuple[ParameterSpec, ...] = ()


def ranked(
    text: str,
    intents: Sequence[IntentSpec],
    confidences: np.ndarray,
    threshold: float,
    now: datetime,
    entities: Mapping[str, EntitySpec],
) -> MatchResult:
    """The intents whose confidence (0..1, one per intent) is at or above `threshold`, best
    first (ties in the file's order), each with its parameters taken from `text`."""
    matches: list[IntentMatch] = []
    for index in np.argsort(-confidences, kind="stable"):
        confidence = float(confidences[index])
        if confidence < threshold:
            break
        intent = intents[int(index)]
        parameters = extract_parameters(text, intent.parameters, now=now, entities=entities)
        matches.append(IntentMatch(intent.name, round(confidence, 4), parameters))
    return MatchResult(text, tuple(matches))


class Matcher(Protocol):
    """What flows and `match_intent` need of a matcher: the lexical one or by meaning."""

    intents: tuple[IntentSpec, ...]
    entities: dict[str, EntitySpec]
    threshold: float

    def match(self, text: str, *, now: datetime) -> MatchResult: ...
    def scores(self, text: str, *, now: datetime) -> dict[str, float]: ...


def _placeholder(kind: str) -> str:
    # "@seating" -> "xseating": one lower-case word, so the scorers treat it as a token.
    return "x" + re.sub(r"[^a-z0-9]", "", kind.lower())


def matching_key(annotation: Annotation) -> str:
    """The form an utterance is scored in: recognised spans replaced by placeholders
    ("for xnumber xwhen", "xyes"), a placeholder repeated in a row kept once, fillers dropped."""
    text = annotation.text
    words: list[str] = []
    previous_placeholder = ""
    position = 0

    def add_text(chunk: str) -> None:
        nonlocal previous_placeholder
        chunk = _KEEP_TOGETHER.sub(lambda m: m.group(0).replace(" ", ""), chunk)
        for word in chunk.split():
            if word not in FILLERS:
                words.append(word)
                previous_placeholder = ""

    for kind, start, end in annotation.spans:
        add_text(text[position:start])
        placeholder = _placeholder(kind)
        if placeholder != previous_placeholder:
            words.append(placeholder)
            previous_placeholder = placeholder
        position = end
    add_text(text[position:])
    return " ".join(words)


def _content_words(key: str) -> list[str]:
    """The sorted words of a key without function words (all of them if that leaves none)."""
    words = key.split()
    return sorted(w for w in words if w not in _FUNCTION_WORDS) or sorted(words)


class IntentMatcher:
    """Scores utterances against intents' example phrases.

    Each phrase and each utterance is normalised and the spans parameter extraction
    recognises are replaced by placeholders, so "a table for two tomorrow at seven" and
    "a table for 4 on friday at 8pm" both read "a table for xnumber xwhen", and "that's not
    correct" reads "that is xno". A phrase's score combines rapidfuzz scorers:
    token_set_ratio (one side's words found in the other), token_sort_ratio (the whole
    wording, so a short phrase inside a long utterance is no full match) and an edit ratio
    over the sorted content words (whole-word overlap, function words left out). An intent's
    confidence blends its best phrase score with a token_set_ratio of the utterance's
    content words against all words of the intent's phrases, which rewards an intent whose
    phrases share the utterance's telling words even when no single phrase is close.
    Intents at or above the threshold match. Phrases are prepared once, here; a match costs
    about half a millisecond for ten intents of fifteen phrases.
    """

    def __init__(
        self,
        intents: Sequence[IntentSpec],
        entities: Mapping[str, EntitySpec] | None = None,
        *,
        threshold: float = 0.6,
    ) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"threshold must be within 0..1, not {threshold}")
        self.intents: tuple[IntentSpec, ...] = tuple(intents)
        self.entities: dict[str, EntitySpec] = dict(entities or {})
        self.threshold = threshold
        seen: set[str] = set()
        keys: list[str] = []
        owners: list[int] = []
        for index, intent in enumerate(self.intents):
            where = f"intents.{intent.name}"
            if intent.name in seen:
                raise ConfigError("intent defined twice", key=where)
            seen.add(intent.name)
            if not intent.phrases:
                raise ConfigError("an intent needs at least one phrase", key=where)
            for spec in intent.parameters:
                if spec.type == "enum" and spec.entity not in self.entities:
                    raise ConfigError(
                        f"unknown entity {spec.entity!r}", key=f"{where}.parameters.{spec.name}"
                    )
            own: set[str] = set()
            for phrase in intent.phrases:
                key = self.key(phrase, now=_PHRASE_NOW)
                if key and key not in own:
                    own.add(key)
                    keys.append(key)
                    owners.append(index)
        self._keys = keys
        self._sorted_keys = [" ".join(sorted(key.split())) for key in keys]
        self._lengths = np.asarray([len(key.split()) for key in keys], dtype=np.intp)
        # Each word becomes one character so that rapidfuzz's string ratio, its fastest scorer,
        # compares whole words: an edit ratio over words, not letters.
        self._word_codes: dict[str, str] = {}
        self._content = [self._encode(_content_words(key)) for key in keys]
        self._owners = np.asarray(owners, dtype=np.intp)
        vocabularies: list[set[str]] = [set() for _ in self.intents]
        for key, owner in zip(keys, owners, strict=True):
            vocabularies[owner].update(_content_words(key))
        self._vocabularies = [" ".join(sorted(words)) for words in vocabularies]

    def _encode(self, words: list[str], extend: bool = True) -> str:
        codes = self._word_codes
        out = []
        unknown: dict[str, str] = {}
        for word in words:
            code = codes.get(word)
            if code is None and extend:
                code = codes[word] = chr(_FIRST_CODE + len(codes))
            elif code is None:
                # Words no phrase has get codes no phrase uses, the same code for a repeat.
                code = unknown.setdefault(word, chr(_FIRST_CODE + len(codes) + len(unknown)))
            out.append(code)
        return "".join(out)

    def key(self, text: str, *, now: datetime) -> str:
        """The placeholder form `text` is scored in (see `matching_key`)."""
        return matching_key(annotate(text, now=now, entities=self.entities))

    def _confidences(self, key: str) -> np.ndarray:
        """Each intent's confidence for the utterance key, 0..100."""
        content = _content_words(key)
        sorted_key = " ".join(sorted(key.split()))
        # token_sort_ratio is the plain ratio of sorted words, and the phrases are sorted once.
        token_sort = process.cdist([sorted_key], self._sorted_keys, scorer=fuzz.ratio)[0]
        encoded = self._encode(content, extend=False)
        words = process.cdist([encoded], self._content, scorer=fuzz.ratio)[0]
        # token_set_ratio costs ten times more than the others: it is computed for the
        # phrases the cheap scorers rank highest, and the rest use token_sort in its place.
        token_set = token_sort.copy()
        if len(self._keys) > _SHORTLIST:
            shortlist = np.argpartition(-(token_sort + words), _SHORTLIST)[:_SHORTLIST]
        else:
            shortlist = np.arange(len(self._keys))
        # token_set_ratio is 100 when either side's words are all in the other; that should
        # reward an utterance containing a phrase, not a one-word utterance ("what") that a
        # phrase contains: against phrases longer by two words or more, token_sort stays.
        shortlist = shortlist[self._lengths[shortlist] - 1 <= len(key.split())]
        if len(shortlist):
            token_set[shortlist] = process.cdist(
                [key], [self._keys[i] for i in shortlist], scorer=fuzz.token_set_ratio
            )[0]
        phrase_scores = _SET_WEIGHT * token_set + _SORT_WEIGHT * token_sort + _WORDS_WEIGHT * words
        best = np.zeros(len(self.intents))
        np.maximum.at(best, self._owners, phrase_scores)
        vocabulary = process.cdist(
            [" ".join(content)], self._vocabularies, scorer=fuzz.token_set_ratio
        )[0]
        confidences: np.ndarray = (1 - _VOCABULARY_WEIGHT) * best + _VOCABULARY_WEIGHT * vocabulary
        return confidences

    def scores(self, text: str, *, now: datetime) -> dict[str, float]:
        """Every intent's confidence (0..1) for `text`, matched or not; for tuning."""
        key = self.key(text, now=now) if len(text.split()) <= MAX_WORDS else ""
        if not key or not self._keys:
            return {intent.name: 0.0 for intent in self.intents}
        confidences = self._confidences(key)
        return {intent.name: float(confidences[i]) / 100 for i, intent in enumerate(self.intents)}

    def match(self, text: str, *, now: datetime) -> MatchResult:
        """The intents `text` matches at or above the threshold, best first, each with its
        parameters extracted; an empty, filler-only or overlong (MAX_WORDS) utterance
        matches nothing."""
        key = self.key(text, now=now) if len(text.split()) <= MAX_WORDS else ""
        if not key or not self._keys:
            return MatchResult(text, ())
        confidences = self._confidences(key) / 100
        return ranked(text, self.intents, confidences, self.threshold, now, self.entities)

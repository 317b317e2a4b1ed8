"""Intent matching for the flow brain: rapidfuzz scores of an utterance against each intent's
example phrases, with parameter spans replaced by type placeholders on both sides."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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

__all__ = ["IntentMatch", "IntentMatcher", "IntentSpec", "MatchResult", "matching_key"]

# Phrases are prepared against a fixed moment: only where dates and times are matters there.
_PHRASE_NOW = datetime(2000, 1, 3, 12, 0)
_FILLERS = frozenset({"uh", "um", "umm", "uhm", "er", "erm", "ah", "hmm", "hm", "mm", "eh", "like"})
# Kept as one word so that filler removal does not turn a "yes" into nothing.
_KEEP_TOGETHER = re.compile(r"\b(uh huh|mm hmm|uh uh)\b")
# Weights of the rapidfuzz scorers in a phrase's score, see IntentMatcher._scores.
_SET_WEIGHT = 0.45
_SORT_WEIGHT = 0.35
_PARTIAL_WEIGHT = 0.20


@dataclass(frozen=True)
class IntentSpec:
    """An intent: its name, example phrases as callers say them, and its parameters."""

    name: str
    phrases: tuple[str, ...]
    parameters: tuple[ParameterSpec, ...] = ()


@dataclass(frozen=True)
class IntentMatch:
    """An intent an utterance matched, how confidently (0..1), and its extracted parameters."""

    intent: str
    confidence: float
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MatchResult:
    """The utterance and the intents it matched above the threshold, best first."""

    text: str
    matches: tuple[IntentMatch, ...]

    @property
    def best(self) -> IntentMatch | None:
        return self.matches[0] if self.matches else None


def _placeholder(kind: str) -> str:
    # "@seating" -> "xseating": one lower-case word, so the scorers treat it as a token.
    return "x" + re.sub(r"[^a-z0-9]", "", kind.lower())


def matching_key(annotation: Annotation) -> str:
    """The form an utterance is scored in: recognised spans replaced by placeholders
    ("for xnumber xwhen"), repeated placeholders merged, fillers dropped."""
    text = annotation.text
    parts: list[str] = []
    position = 0
    for kind, start, end in annotation.spans:
        parts.append(text[position:start])
        parts.append(f" {_placeholder(kind)} ")
        position = end
    parts.append(text[position:])
    words: list[str] = []
    for word in _KEEP_TOGETHER.sub(lambda m: m.group(0).replace(" ", ""), "".join(parts)).split():
        if word in _FILLERS or (words and word == words[-1] and word.startswith("x")):
            continue
        words.append(word)
    return " ".join(words)


class IntentMatcher:
    """Scores utterances against intents' example phrases.

    Each phrase and each utterance is normalised and its parameter spans are replaced by
    placeholders, so "a table for two tomorrow at seven" and "a table for 4 on friday at 8pm"
    both read "a table for xnumber xwhen". A phrase's score combines three rapidfuzz
    scorers: token_set_ratio (every word of one side found in the other), token_sort_ratio
    (whole wording, order-free, so a short phrase inside a long utterance is not a full
    match) and partial_ratio (the phrase as a fragment of a longer utterance). An intent's
    confidence is its best phrase score, and intents at or above the threshold match.
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
        self._owners = np.asarray(owners, dtype=np.intp)

    def key(self, text: str, *, now: datetime) -> str:
        """The placeholder form `text` is scored in (see `matching_key`)."""
        return matching_key(annotate(text, now=now, entities=self.entities))

    def _scores(self, key: str) -> np.ndarray:
        """Each phrase's score for the utterance key, 0..100."""
        ordered = " ".join(sorted(key.split()))
        token_set = process.cdist([key], self._keys, scorer=fuzz.token_set_ratio)[0]
        # token_sort_ratio is the plain ratio of sorted words; the phrases are sorted once here.
        token_sort = process.cdist([ordered], self._sorted_keys, scorer=fuzz.ratio)[0]
        partial = process.cdist([key], self._keys, scorer=fuzz.partial_ratio)[0]
        scores: np.ndarray = (
            _SET_WEIGHT * token_set + _SORT_WEIGHT * token_sort + _PARTIAL_WEIGHT * partial
        )
        return scores

    def scores(self, text: str, *, now: datetime) -> dict[str, float]:
        """Every intent's confidence (0..1) for `text`, matched or not; for tuning."""
        key = self.key(text, now=now)
        best = np.zeros(len(self.intents))
        if key and self._keys:
            np.maximum.at(best, self._owners, self._scores(key))
        return {intent.name: float(best[i]) / 100.0 for i, intent in enumerate(self.intents)}

    def match(self, text: str, *, now: datetime) -> MatchResult:
        """The intents `text` matches at or above the threshold, best first, each with its
        parameters extracted; an empty or filler-only utterance matches nothing."""
        key = self.key(text, now=now)
        if not key or not self._keys:
            return MatchResult(text, ())
        best = np.zeros(len(self.intents))
        np.maximum.at(best, self._owners, self._scores(key))
        order = np.argsort(-best, kind="stable")
        matches: list[IntentMatch] = []
        for index in order:
            confidence = float(best[index]) / 100.0
            if confidence < self.threshold:
                break
            intent = self.intents[int(index)]
            parameters = extract_parameters(
                text, intent.parameters, now=now, entities=self.entities
            )
            matches.append(IntentMatch(intent.name, round(confidence, 4), parameters))
        return MatchResult(text, tuple(matches))

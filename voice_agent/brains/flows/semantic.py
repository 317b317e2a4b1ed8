"""Intent matching by meaning: a sentence encoder's cosine similarity between the caller's
utterance and each intent's training phrases, blended with the lexical matcher's confidence.

Why a blend and not the encoder alone: all-MiniLM-L6-v2 knows that "call the whole thing off"
means cancelling, which no spelling overlap finds, but it reads one-word answers ("yep",
"nah") and bare details ("the surname's kowalski") loosely, where the lexical matcher's
placeholders ("xyes", "xname") are sure. On the tune split of the evaluation set the blend
beat either alone (docs/performance.md, "Intents by meaning").

Phrase vectors are computed once per set of phrases and kept on disk, named by the encoder
and a hash of the phrases, so a restart does not encode them again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from datetime import datetime
from pathlib import Path

import numpy as np

from voice_agent.brains.flows.intents import (
    FILLERS,
    MAX_WORDS,
    IntentMatcher,
    IntentSpec,
    MatchResult,
    ranked,
)
from voice_agent.brains.flows.parameters import parse_yes_no
from voice_agent.engines.embedding import SentenceEncoder

__all__ = ["THRESHOLD", "SemanticMatcher", "cache_dir", "meaning_text"]

log = logging.getLogger(__name__)

# The share of an intent's confidence that comes from meaning; the rest is the lexical
# confidence. Chosen on the tune split (scripts/eval_intents.py prints the grid).
MEANING_WEIGHT = 0.6
# Intents below this confidence match nothing (nlu.threshold); chosen on the tune split.
THRESHOLD = 0.5
# An intent's similarity is the mean of its TOP_PHRASES closest phrases. The tune split chose
# one: the closest phrase alone, since the few ways of saying a rare request are far apart.
TOP_PHRASES = 1
_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?|\d+")


def cache_dir() -> Path:
    """Where phrase vectors are kept: $VOICE_AGENT_CACHE, else the XDG cache folder."""
    configured = os.environ.get("VOICE_AGENT_CACHE")
    if configured:
        return Path(configured).expanduser() / "nlu"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voice_agent" / "nlu"


def meaning_text(text: str) -> str:
    """What the encoder reads: lower case, words only, hesitations dropped ("um, er, I'd
    like..." reads "i'd like..."); the encoder was not trained on them and they only dilute
    the mean of the token vectors."""
    words = _WORD.findall(text.lower())
    return " ".join(w for w in words if w not in FILLERS)


class SemanticMatcher:
    """Matches like `IntentMatcher` (the same `match` and `scores`), by meaning and wording.

    An intent's confidence is `weight` times the cosine similarity of the utterance to its
    `top` closest training phrases plus the rest times the lexical matcher's confidence; it
    matches at or above `threshold`. Encoding one utterance costs about 10 ms of one core,
    so callers on an event loop run `match` in a thread.
    """

    def __init__(
        self,
        lexical: IntentMatcher,
        encoder: SentenceEncoder,
        *,
        threshold: float,
        weight: float = MEANING_WEIGHT,
        top: int = TOP_PHRASES,
        cache: Path | None = None,
    ) -> None:
        self.lexical = lexical
        self.weight = weight
        self.top = top
        self.encoder = encoder
        self.threshold = threshold
        self.intents: tuple[IntentSpec, ...] = lexical.intents
        self.entities = lexical.entities
        texts: list[str] = []
        owners: list[int] = []
        for index, intent in enumerate(self.intents):
            own: set[str] = set()
            for phrase in intent.phrases:
                text = meaning_text(phrase)
                if text and text not in own:
                    own.add(text)
                    texts.append(text)
                    owners.append(index)
        self._owners = np.asarray(owners, dtype=np.intp)
        self._vectors = self._phrase_vectors(texts, cache if cache is not None else cache_dir())

    def _phrase_vectors(self, texts: list[str], folder: Path) -> np.ndarray:
        digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
        path = folder / f"{self.encoder.name}-{digest}.npy"
        shape = (len(texts), self.encoder.dimensions)
        try:
            cached = np.load(path, allow_pickle=False)
            if cached.shape == shape and cached.dtype == np.float32:
                return cached
        except (OSError, ValueError):
            pass  # no cache yet, or a damaged one: encoded again below
        vectors = self.encoder.encode(texts) if texts else np.zeros(shape, dtype=np.float32)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.part")
            with partial.open("wb") as f:
                np.save(f, vectors, allow_pickle=False)
            partial.replace(path)  # whole or not at all, for processes starting together
        except OSError as exc:
            log.warning("phrase vectors not cached at %s: %s", path, exc)
        return vectors

    def _confidences(self, text: str, now: datetime) -> np.ndarray | None:
        meaning = meaning_text(text)
        if not meaning or len(meaning.split()) > MAX_WORDS or not len(self._owners):
            return None
        lexical = self.lexical.scores(text, now=now)
        # A yes or a no is what the lexical matcher is surest of and the encoder least ("yes
        # cancel it" is near "cancel my booking" in meaning): intents taking the answer keep
        # their lexical confidence when the utterance holds one.
        answered = parse_yes_no(text) is not None
        vector = self.encoder.encode([meaning])[0]
        similarity = self._vectors @ vector
        confidences = np.zeros(len(self.intents))
        for index, intent in enumerate(self.intents):
            own = np.sort(similarity[self._owners == index])[::-1][: self.top]
            closeness = float(np.clip(own.mean(), 0.0, 1.0)) if len(own) else 0.0
            blend = self.weight * closeness + (1 - self.weight) * lexical[intent.name]
            if answered and any(spec.type == "yes_no" for spec in intent.parameters):
                blend = max(blend, lexical[intent.name])
            confidences[index] = blend
        return confidences

    def scores(self, text: str, *, now: datetime) -> dict[str, float]:
        """Every intent's confidence (0..1) for `text`, matched or not; for tuning."""
        confidences = self._confidences(text, now)
        if confidences is None:
            return {intent.name: 0.0 for intent in self.intents}
        return {intent.name: float(confidences[i]) for i, intent in enumerate(self.intents)}

    def match(self, text: str, *, now: datetime) -> MatchResult:
        """The intents `text` matches at or above the threshold, best first, with their
        parameters; an empty, filler-only or overlong utterance matches nothing."""
        confidences = self._confidences(text, now)
        if confidences is None:
            return MatchResult(text, ())
        return ranked(text, self.intents, confidences, self.threshold, now, self.entities)

"""Enums (exact and fuzzy synonyms), yes/no answers, names and quantities in an utterance."""

from __future__ import annotations

from dataclasses import dataclass

from rapidfuzz import fuzz, process
from rapidfuzz.distance import JaroWinkler

from voice_agent.brains.flows.parameters.analysis import Analysis, numbers_in
from voice_agent.brains.flows.parameters.specs import (
    ENUM_FUZZY_JARO_WINKLER,
    ENUM_FUZZY_MIN_CHARS,
    ENUM_FUZZY_RATIO,
    EntitySpec,
)
from voice_agent.brains.flows.parameters.words import (
    DETERMINERS,
    DURATIONS,
    FILLERS,
    NAME_AFTER,
    NAME_CUES_BY_FIRST,
    NAME_WORD,
    NOT_NAME_ALL,
    NUMBER_CUES,
    PEOPLE_WORDS,
    WEAK_YES,
    YES_NO_MAX,
    YES_NO_TABLE,
    normalise,
)


@dataclass(frozen=True)
class _CompiledEntity:
    exact: dict[tuple[str, ...], str]
    longest: int
    fuzzy: dict[int, tuple[list[str], list[str]]]  # word count -> (phrases, canonicals)


_ENTITY_CACHE: dict[int, tuple[EntitySpec, _CompiledEntity]] = {}


def _compile_entity(entity: EntitySpec) -> _CompiledEntity:
    cached = _ENTITY_CACHE.get(id(entity))
    if cached is not None and cached[0] is entity:
        return cached[1]
    exact: dict[tuple[str, ...], str] = {}
    fuzzy: dict[int, tuple[list[str], list[str]]] = {}
    for canonical, synonyms in entity.values.items():
        for phrase in (canonical, canonical.replace("_", " "), *synonyms):
            words = tuple(normalise(str(phrase)).split())
            if not words or words in exact:
                continue
            exact[words] = canonical
            joined = " ".join(words)
            if len(joined) >= ENUM_FUZZY_MIN_CHARS:
                bucket = fuzzy.setdefault(len(words), ([], []))
                bucket[0].append(joined)
                bucket[1].append(canonical)
    compiled = _CompiledEntity(exact, max((len(k) for k in exact), default=0), fuzzy)
    if len(_ENTITY_CACHE) > 512:
        _ENTITY_CACHE.clear()
    _ENTITY_CACHE[id(entity)] = (entity, compiled)
    return compiled


def enum_finds(a: Analysis, entity: EntitySpec) -> list[tuple[int, int, str]]:
    """Whole-word synonym hits, longest first at each word; when there are none, near-misses
    (STT misspellings such as "terras") scored with rapidfuzz."""
    compiled = _compile_entity(entity)
    finds: list[tuple[int, int, str]] = []
    n = len(a.words)
    i = 0
    while i < n:
        for size in range(min(compiled.longest, n - i), 0, -1):
            canonical = compiled.exact.get(tuple(a.words[i : i + size]))
            if canonical is not None and a.free(i, i + size):
                finds.append((i, i + size, canonical))
                i += size
                break
        else:
            i += 1
    if finds:
        return finds
    for size, (phrases, canonicals) in compiled.fuzzy.items():
        starts = [
            i
            for i in range(n - size + 1)
            if a.free(i, i + size)
            # Common words ("both", "inside") are never a garbled synonym.
            and not all(word in NOT_NAME_ALL for word in a.words[i : i + size])
            and sum(map(len, a.words[i : i + size])) + size - 1 >= ENUM_FUZZY_MIN_CHARS
        ]
        if not starts:
            continue
        windows = [" ".join(a.words[i : i + size]) for i in starts]
        similarity = process.cdist(
            windows,
            phrases,
            scorer=JaroWinkler.normalized_similarity,
            score_cutoff=ENUM_FUZZY_JARO_WINKLER,
        )
        for row, i in enumerate(starts):
            best = int(similarity[row].argmax())
            if (
                similarity[row, best]
                and fuzz.ratio(windows[row], phrases[best]) >= ENUM_FUZZY_RATIO
            ):
                finds.append((i, i + size, canonicals[best]))
    finds.sort()
    kept: list[tuple[int, int, str]] = []
    for find in finds:
        if not kept or find[0] >= kept[-1][1]:
            kept.append(find)
    return kept


def yes_no_finds(a: Analysis) -> list[tuple[int, int, bool | None]]:
    """Yes/no phrases left to right, the longest at each word; "unsure" phrases (for example
    "not sure") come out as None so that the yes or no inside them is not read."""
    finds: list[tuple[int, int, bool | None]] = []
    n = len(a.words)
    i = 0
    while i < n:
        for size in range(min(YES_NO_MAX, n - i), 0, -1):
            key = tuple(a.words[i : i + size])
            if key in YES_NO_TABLE and a.free(i, i + size) and (key not in WEAK_YES or i == 0):
                finds.append((i, i + size, YES_NO_TABLE[key]))
                i += size
                break
        else:
            i += 1
    return finds


def yes_no_find(a: Analysis) -> tuple[int, int, bool] | None:
    """The answer of the first yes/no phrase, or None when that phrase is an unsure one."""
    finds = yes_no_finds(a)
    if not finds:
        return None
    start, end, value = finds[0]
    return None if value is None else (start, end, value)


def _name_words(a: Analysis, j: int) -> int:
    end = j
    while end < len(a.words) and end - j < 3 and a.free(end, end + 1):
        word = a.words[end]
        if word in NOT_NAME_ALL or not NAME_WORD.match(word):
            break
        end += 1
    return end


def name_find(a: Analysis, allow_bare: bool) -> tuple[int, int, str] | None:
    """A name after a cue ("my name is", "under", "this is", "mr"), before "speaking" or
    "calling", or, when `allow_bare`, an utterance that is nothing but a name."""
    words = a.words
    for i in range(len(words)):
        for cue in NAME_CUES_BY_FIRST.get(words[i], ()):
            if tuple(words[i : i + len(cue)]) == cue:
                j = i + len(cue)
                end = _name_words(a, j)
                if end > j:
                    return j, end, " ".join(words[j:end]).title()
    for i in range(len(words)):
        if words[i] in NAME_AFTER and 0 < i <= 3 and _name_words(a, 0) == i:
            return 0, i, " ".join(words[:i]).title()
    if allow_bare:
        core = [i for i, w in enumerate(words) if w not in FILLERS and w not in ("please",)]
        if core and _name_words(a, core[0]) == core[-1] + 1 == core[0] + len(core):
            return core[0], core[-1] + 1, " ".join(words[core[0] : core[-1] + 1]).title()
    return None


def quantity_finds(a: Analysis) -> list[tuple[int, int, float]]:
    """Counts in the free words, best party-size candidates first: a number next to "people"
    or after "for"/"of" beats one standing alone. Ordinals and "the one" are not counts."""
    words = a.words
    n = len(words)
    finds: list[tuple[int, int, float]] = []
    numbers = numbers_in(words, a.used)
    i = 0
    while i < n:
        if a.used[i]:
            i += 1
            continue
        w = a.word
        if w(i) == "half" and w(i + 1) == "a" and w(i + 2) == "dozen" and a.free(i, i + 3):
            finds.append((i, i + 3, 6.0))
            i += 3
            continue
        k = i + (w(i) == "a")
        if w(k) in ("couple", "dozen") and a.free(i, k + 1):
            end = k + 1 + (w(k + 1) == "of")
            finds.append((i, end, 2.0 if w(k) == "couple" else 12.0))
            i = end
            continue
        num = numbers.get(i)
        if num is None or num.ordinal:
            i += 1
            continue
        if num.value == 1 and num.end == i + 1 and w(i) == "one" and w(i - 1) in DETERMINERS:
            i += 1
            continue
        value, end = num.value, num.end
        if w(end) == "and" and w(end + 1) == "a" and w(end + 2) == "half" and a.free(end, end + 3):
            value, end = value + 0.5, end + 3
        finds.append((i, end, value))
        i = end

    def rank(find: tuple[int, int, float]) -> int:
        start, end = find[0], find[1]
        after = a.word(end)
        if after in PEOPLE_WORDS or (after == "of" and a.word(end + 1) == "us"):
            return 0
        if after in DURATIONS:
            return 3  # "in twenty minutes" is a count only when nothing else is
        return 1 if a.word(start - 1) in NUMBER_CUES else 2

    return sorted(finds, key=rank)


def as_number(value: float) -> int | float:
    return int(value) if value == int(value) else value

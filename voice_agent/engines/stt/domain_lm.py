"""A small domain language model for pocketsphinx: an ARPA trigram model and a trimmed dictionary
built from the phrases an agent expects plus generic answers (numbers, times, dates, names)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path

from pocketsphinx import get_model_path
from pocketsphinx.lm import ArpaBoLM

log = logging.getLogger(__name__)

# Bump when the corpus recipe, the normaliser or the file layout changes: old cache entries
# then simply stop matching.
FORMAT_VERSION = "5"
DATA_DIR_ENV = "VOICE_AGENT_DATA_DIR"

ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_ORDINAL_WORDS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
DAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
MONTHS = (
    "january february march april may june july august september october november december"
).split()
FIRST_NAMES = (
    "john james robert michael william david richard joseph thomas charles daniel matthew "
    "anthony mark paul steven andrew peter george chris tom mike alex ben sam "
    "mary patricia jennifer linda elizabeth barbara susan jessica sarah karen lisa nancy "
    "emma olivia sophie anna laura kate maria emily rachel amy"
).split()
SURNAMES = (
    "smith johnson williams brown jones garcia miller davis rodriguez martinez wilson "
    "anderson taylor thomas moore jackson martin lee thompson white harris clark lewis "
    "robinson walker young allen king wright scott green baker adams nelson hill campbell "
    "evans turner parker collins edwards stewart morris murphy cook rogers"
).split()
# Conversational sounds CMUdict lacks, in its ARPAbet; used only when the dictionary has none.
EXTRA_PRONUNCIATIONS = {
    "mm-hmm": ("M HH M", "AH M HH AH M"),
    "uh-uh": ("AH AH",),
    "mmm": ("M",),
}
SHORT_ANSWERS = (
    "yes",
    "no",
    "yeah",
    "yep",
    "nope",
    "nah",
    "uh-huh",
    "mm-hmm",
    "uh-uh",
    "uh",
    "um",
    "hmm",
    "okay",
    "sure",
    "right",
    "correct",
    "maybe",
    "please",
    "thanks",
    "thank you",
    "yes please",
    "no thanks",
    "no thank you",
    "yes that's right",
    "no that's wrong",
    "that's right",
    "that's correct",
    "that's it",
    "hello",
    "hi",
    "hi there",
    "bye",
    "goodbye",
    "sorry",
    "pardon",
    "what",
    "excuse me",
    "i don't know",
    "i'm not sure",
    "go ahead",
    "hold on",
    "one moment",
    "wait a second",
    "can you repeat that",
    "say that again",
    "i said",
    "it's",
    "it is",
    "my name is",
    "my number is",
    "my phone number is",
    # Openers of requests in any domain.
    "i would like",
    "i'd like",
    "i would like to",
    "i want to",
    "i need to",
    "can i",
    "could i",
    "can you",
    "could you",
    "i was wondering if",
)


@dataclass(frozen=True)
class DomainLm:
    """A built (or cached) domain model, for a pocketsphinx Decoder's `lm` and `dict`."""

    key: str
    lm_path: Path  # ARPA text, which pocketsphinx loads directly
    dict_path: Path  # the model's dictionary trimmed to the LM's words
    words: frozenset[str]
    dropped: tuple[str, ...]  # words of the phrases with no pronunciation, left out of the LM
    build_seconds: float  # 0.0 when it came from the cache


def default_cache_dir() -> Path:
    """$VOICE_AGENT_DATA_DIR/stt-lm when set, else a folder in the system temp dir."""
    data_dir = os.environ.get(DATA_DIR_ENV)
    if data_dir:
        return Path(data_dir) / "stt-lm"
    return Path(tempfile.gettempdir()) / "voice_agent-stt-lm"


def default_dictionary() -> Path:
    return Path(get_model_path("en-us/cmudict-en-us.dict"))


def number_to_words(n: int) -> str:
    """Cardinal English words for 0 <= n < 10**9, without "and" ("one hundred five")."""
    if n < 0:
        return "minus " + number_to_words(-n)
    if n < 20:
        return ONES[n]
    if n < 100:
        tens, rest = divmod(n, 10)
        return TENS[tens] + (" " + ONES[rest] if rest else "")
    for size, name in ((10**6, "million"), (1000, "thousand"), (100, "hundred")):
        if n >= size:
            head, rest = divmod(n, size)
            if head >= 1000:
                raise ValueError(f"number too large to spell: {n}")
            return (
                number_to_words(head) + " " + name + (" " + number_to_words(rest) if rest else "")
            )
    raise AssertionError("unreachable")


def ordinal_words(n: int) -> str:
    words = number_to_words(n).split()
    last = words[-1]
    if last in _ORDINAL_WORDS:
        words[-1] = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def _digits_to_words(digits: str) -> str:
    return " ".join(ONES[int(d)] for d in digits)


def _integer_to_words(digits: str) -> str:
    # Leading zeros and long runs are codes or phone numbers: callers say those digit by digit.
    if (len(digits) > 1 and digits.startswith("0")) or len(digits) > 4:
        return _digits_to_words(digits)
    n = int(digits)
    if len(digits) == 4 and 1100 <= n <= 2099 and n % 100 and not 2000 <= n <= 2009:
        # Years: "nineteen eighty four", "twenty twenty four".
        return number_to_words(n // 100) + " " + _two_digit_part(n % 100)
    return number_to_words(n)


def _two_digit_part(n: int) -> str:
    return "oh " + ONES[n] if n < 10 else number_to_words(n)


_NUMBER = re.compile(
    r"(?P<int>\d+)(?:[:.](?P<min>\d{2})(?!\d))?\s*(?P<suffix>st|nd|rd|th|am|pm|a\.m\.|p\.m\.)?\b"
)


def _spell_number(match: re.Match[str]) -> str:
    digits, minutes, suffix = match["int"], match["min"], match["suffix"]
    if suffix in ("st", "nd", "rd", "th") and minutes is None and len(digits) <= 4:
        return " " + ordinal_words(int(digits)) + " "
    words = _integer_to_words(digits)
    if minutes is not None:
        words += " " + ("o'clock" if minutes == "00" else _two_digit_part(int(minutes)))
    if suffix in ("am", "pm", "a.m.", "p.m."):
        words += " " + suffix.replace(".", "")
    return " " + words + " "


def normalize(text: str) -> list[str]:
    """Spoken-form, lower-case words of `text`: "Table for 2 at 7:30pm" -> table for two at
    seven thirty pm. Keeps in-word apostrophes and hyphens; drops other punctuation."""
    text = text.lower().replace("’", "'").replace("&", " and ").replace("%", " percent ")
    text = _NUMBER.sub(_spell_number, text)
    return re.findall(r"[a-z]+(?:['-][a-z]+)*", text)


def _de_bruijn_pairs(symbols: Sequence[str]) -> list[str]:
    """A sequence holding every ordered pair of `symbols` once as neighbours (a de Bruijn
    sequence of order 2), so any digit may follow any other in a phone number."""
    k = len(symbols)
    out: list[int] = []
    a = [0] * (k * 2)

    def walk(t: int, p: int) -> None:
        if t > 2:
            if 2 % p == 0:
                out.extend(a[1 : p + 1])
        else:
            a[t] = a[t - p]
            walk(t + 1, p)
            for j in range(a[t - p] + 1, k):
                a[t] = j
                walk(t + 1, t)

    walk(1, 1)
    return [symbols[i] for i in [*out, out[0]]]


def filler_phrases() -> list[str]:
    """Generic things callers say whatever the agent: answers, numbers, times, dates, names."""
    lines: list[str] = list(SHORT_ANSWERS)
    digits = ONES[:10]
    sequence = _de_bruijn_pairs([*digits, "oh"])
    lines += [" ".join(sequence[i : i + 11]) for i in range(0, len(sequence) - 1, 10)]
    lines += [f"double {d}" for d in digits] + [f"triple {d}" for d in digits]
    lines += [number_to_words(n) for n in range(0, 21)]
    lines += [number_to_words(n) for n in range(21, 100)]
    lines += ["a hundred", "one hundred", "a thousand", "two thousand", "a couple", "a few"]
    lines += [f"{n} people" for n in ONES[1:13]] + [f"for {n}" for n in ONES[1:13]]
    lines += [f"party of {n}" for n in ONES[2:13]] + [f"{n} of us" for n in ONES[2:11]]
    for h in ONES[1:13]:
        lines += [
            h,
            f"at {h}",
            f"{h} o'clock",
            f"{h} am",
            f"{h} pm",
            f"{h} fifteen",
            f"{h} thirty",
            f"{h} forty five",
            f"{h} thirty pm",
            f"half past {h}",
            f"quarter past {h}",
            f"quarter to {h}",
            f"at {h} in the evening",
        ]
    lines += ["noon", "midday", "midnight", "in the morning", "in the afternoon", "this evening"]
    lines += ["today", "tonight", "tomorrow", "tomorrow night", "the day after tomorrow"]
    lines += ["this weekend", "next week", "at the weekend"]
    for day in DAYS:
        lines += [day, f"on {day}", f"next {day}", f"this {day}", f"{day} night"]
    ordinals = [ordinal_words(n) for n in range(1, 32)]
    for month, ordinal in zip(MONTHS, cycle(ordinals), strict=False):
        lines += [month, f"{month} {ordinal}", f"the {ordinal} of {month}"]
    lines += [f"the {ordinal}" for ordinal in ordinals]
    lines += FIRST_NAMES + SURNAMES
    for first, last in zip(FIRST_NAMES, cycle(SURNAMES), strict=False):
        lines.append(f"{first} {last}")
    lines += [f"it's {last}" for last in SURNAMES[:10]]
    lines += [f"my name is {first}" for first in FIRST_NAMES[:10]]
    return lines


def _pronunciations(path: Path, wanted: set[str]) -> dict[str, list[str]]:
    """word -> its dictionary lines (alternates included), for the `wanted` words only: one
    pass over the file without keeping its 135k entries."""
    entries: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            head, _, _ = line.partition(" ")
            word = head.split("(", 1)[0]
            if word in wanted:
                entries.setdefault(word, []).append(line.rstrip("\n"))
    return entries


def corpus_lines(
    sentences: Iterable[Sequence[str]], vocabulary: Container[str]
) -> tuple[list[str], list[str]]:
    """The LM training lines from normalised sentences, and the words dropped for having no
    pronunciation in `vocabulary`. A hyphenated word the dictionary lacks is split into its parts
    when it knows them all. A line is split where a word was dropped, so that no n-gram skips
    over the gap.
    """
    lines: list[str] = []
    dropped: dict[str, None] = {}
    for sentence in sentences:
        fragment: list[str] = []
        for word in sentence:
            parts = [word] if word in vocabulary else word.split("-")
            if all(part in vocabulary for part in parts):
                fragment += parts
                continue
            dropped[word] = None
            if fragment:
                lines.append(" ".join(fragment))
            fragment = []
        if fragment:
            lines.append(" ".join(fragment))
    return lines, list(dropped)


_build_lock = threading.Lock()


def build_domain_lm(
    phrases: Iterable[str],
    *,
    cache_dir: Path | None = None,
    dictionary: Path | None = None,
    include_filler: bool = True,
) -> DomainLm:
    """Build the domain LM for `phrases` (plus the generic filler), or load it from the cache.

    Entries are keyed by a hash of the normalised corpus and the dictionary, so the same agent
    starts in milliseconds on later runs. Thread-safe; processes sharing a cache folder write
    each file atomically.
    """
    dictionary = dictionary or default_dictionary()
    cache_dir = cache_dir or default_cache_dir()
    phrase_list = list(phrases)
    if include_filler:
        phrase_list += filler_phrases()
    raw_key = "\n".join([FORMAT_VERSION, str(dictionary.resolve()), *sorted(set(phrase_list))])
    key = hashlib.sha256(raw_key.encode("utf-8")).hexdigest()[:24]
    folder = cache_dir / key
    with _build_lock:
        cached = _load_cached(folder, key)
        if cached is not None:
            return cached
        started = time.perf_counter()
        sentences = [normalize(phrase) for phrase in phrase_list]
        wanted = {
            part for words in sentences for word in words for part in [word, *word.split("-")]
        }
        vocabulary = _pronunciations(dictionary, wanted)
        for word, phones in EXTRA_PRONUNCIATIONS.items():
            if word in wanted and word not in vocabulary:
                vocabulary[word] = [
                    f"{word}{f'({n})' if n > 1 else ''} {p}" for n, p in enumerate(phones, 1)
                ]
        lines, dropped = corpus_lines(sentences, vocabulary)
        if not lines:
            raise ValueError("no phrase has a word the pronunciation dictionary knows")
        if dropped:
            log.warning("STT domain LM: no pronunciation for %s; left out", ", ".join(dropped))
        words = sorted({word for line in lines for word in line.split()})
        arpa = _arpa_text(lines)
        dict_text = "".join(line + "\n" for word in words for line in vocabulary[word])
        meta = json.dumps({"words": words, "dropped": dropped})
        try:
            _write_entry(folder, arpa, dict_text, meta)
        except OSError as e:
            # A read-only or foreign cache folder must not stop the agent from starting.
            log.warning("STT domain LM: cannot write the cache at %s (%s)", folder, e)
            folder = Path(tempfile.mkdtemp(prefix="voice_agent-stt-lm-"))
            _write_entry(folder, arpa, dict_text, meta)
        return DomainLm(
            key=key,
            lm_path=folder / "domain.arpa",
            dict_path=folder / "domain.dict",
            words=frozenset(words),
            dropped=tuple(dropped),
            build_seconds=time.perf_counter() - started,
        )


def _arpa_text(lines: list[str]) -> str:
    model = ArpaBoLM(text="\n".join(lines), add_start=True)
    model.compute()
    out = io.StringIO()
    model.write(out)
    return out.getvalue()


def _write_entry(folder: Path, arpa: str, dict_text: str, meta: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _write_atomic(folder / "domain.arpa", arpa)
    _write_atomic(folder / "domain.dict", dict_text)
    # Written last: its presence marks a complete entry.
    _write_atomic(folder / "meta.json", meta)


def _load_cached(folder: Path, key: str) -> DomainLm | None:
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    lm_path, dict_path = folder / "domain.arpa", folder / "domain.dict"
    if not (lm_path.is_file() and dict_path.is_file()):
        return None
    return DomainLm(
        key=key,
        lm_path=lm_path,
        dict_path=dict_path,
        words=frozenset(meta["words"]),
        dropped=tuple(meta["dropped"]),
        build_seconds=0.0,
    )


def _write_atomic(path: Path, text: str) -> None:
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise

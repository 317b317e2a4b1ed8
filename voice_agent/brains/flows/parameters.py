"""Typed parameter extraction from spoken or typed utterances for the flow brain's NLU:
numbers, digit strings, phone numbers, dates, times, enums, yes/no answers and names."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from functools import lru_cache
from typing import Any, Literal, get_args

from rapidfuzz import fuzz, process
from rapidfuzz.distance import JaroWinkler
from text_to_num import find_numbers

from voice_agent.errors import ConfigError

__all__ = [
    "PARAM_TYPES",
    "Annotation",
    "EntitySpec",
    "Extracted",
    "ParamType",
    "ParameterSpec",
    "annotate",
    "extract_parameters",
    "extract_spans",
    "normalise",
    "parse_date",
    "parse_datetime",
    "parse_digits",
    "parse_enum",
    "parse_integer",
    "parse_name",
    "parse_number",
    "parse_phone",
    "parse_time",
    "parse_yes_no",
]

ParamType = Literal[
    "number", "integer", "digits", "phone", "date", "time", "datetime", "enum", "yes_no", "name",
    "text",
]  # fmt: skip
PARAM_TYPES: frozenset[str] = frozenset(get_args(ParamType))

MIN_PHONE_DIGITS = 7
MAX_PHONE_DIGITS = 15
# A fuzzy enum hit needs both scores: Jaro-Winkler forgives a garbled ending ("terras" for
# "terrace"), the Indel ratio keeps "indoor" from becoming "outdoor" or "terrible" "terrace".
ENUM_FUZZY_JARO_WINKLER = 0.9
ENUM_FUZZY_RATIO = 75.0
# Synonyms shorter than this are matched exactly only: short words fuzz into everything.
ENUM_FUZZY_MIN_CHARS = 5


@dataclass(frozen=True)
class EntitySpec:
    """An enum type: canonical value -> synonyms (the canonical value itself always matches)."""

    name: str
    values: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class ParameterSpec:
    """One parameter an intent wants: its name, type and, for "enum", the entity it draws on."""

    name: str
    type: ParamType
    entity: str | None = None

    def __post_init__(self) -> None:
        if self.type not in PARAM_TYPES:
            raise ConfigError(
                f"unknown parameter type {self.type!r} (expected one of {sorted(PARAM_TYPES)})",
                key=self.name,
            )
        if self.type == "enum" and not self.entity:
            raise ConfigError("an enum parameter needs an entity", key=self.name)


@dataclass(frozen=True)
class Extracted:
    """A value found in an utterance and its character span in the normalised text."""

    value: Any
    start: int
    end: int


@dataclass(frozen=True)
class Annotation:
    """A normalised utterance and the recognised spans in it, as (kind, start, end) character
    spans; kinds are "phone", "when", "@<entity>", "name", "yes", "no" and "number"."""

    text: str
    spans: tuple[tuple[str, int, int], ...]


# --------------------------------------------------------------------------------------------
# Normalisation

_CONTRACTIONS: dict[str, str] = {
    "can't": "can not", "won't": "will not", "shan't": "shall not", "ain't": "is not",
    "let's": "let us", "ma'am": "madam", "y'all": "you all",
}  # fmt: skip
# Words whose "'s" is "is" rather than a possessive.
_S_IS = frozenset(
    "it that what where when who how there here he she name surname number this everything "
    "nothing something everyone".split()
)
# Respellings applied word by word: contractions whose apostrophe STT dropped ("dont"), when
# unambiguous enough, and variants that should look alike ("okay", "alright", "mister").
_RESPELLINGS: dict[str, str] = {
    "im": "i am", "ive": "i have", "youre": "you are", "theyre": "they are", "dont": "do not",
    "doesnt": "does not", "didnt": "did not", "isnt": "is not", "arent": "are not",
    "wasnt": "was not", "werent": "were not", "cant": "can not", "wont": "will not",
    "couldnt": "could not", "wouldnt": "would not", "shouldnt": "should not",
    "havent": "have not", "hasnt": "has not", "thats": "that is", "whats": "what is",
    "wheres": "where is", "hows": "how is", "its": "it is", "lets": "let us",
    "theres": "there is", "heres": "here is", "okay": "ok", "alright": "all right",
    "mister": "mr", "missus": "mrs",
}  # fmt: skip
_SUFFIXES = (("n't", " not"), ("'re", " are"), ("'ve", " have"), ("'ll", " will"),
             ("'d", " would"), ("'m", " am"))  # fmt: skip

_AMPM_DOTTED = re.compile(r"\b([ap])\.\s?m\b\.?")
_OCLOCK = re.compile(r"\bo['\s]?clock\b")
_ISO_DATE = re.compile(r"(?<!\d)(\d{4})-(\d{1,2})-(\d{1,2})(?!\d)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_APOS_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)+")
_GLUED_AMPM = re.compile(r"(\d)(am|pm)\b")
_NOT_KEPT = re.compile(r"[^\w\s:./']|_")
# ":" "." "/" survive only between digits (19:30, 2.5, 12/24); "'" only between letters.
_LONE_SEPARATOR = re.compile(r"(?<!\d)[:./]|[:./](?!\d)|(?<![^\W\d_])'|'(?![^\W\d_])")
_ID_LIKE = re.compile(r"\bid (like|love|prefer|rather|want)\b")


def _expand_apostrophe(match: re.Match[str]) -> str:
    word = match.group(0)
    if word in _CONTRACTIONS:
        return _CONTRACTIONS[word]
    for suffix, expansion in _SUFFIXES:
        if word.endswith(suffix):
            return word[: -len(suffix)] + expansion
    if word.endswith("'s"):
        stem = word[:-2]
        return f"{stem} is" if stem in _S_IS else stem
    return word


@lru_cache(maxsize=2048)
def normalise(text: str) -> str:
    """Lower-case, expand contractions, split "7pm", and drop punctuation except inside
    numbers ("19:30", "2.5", "12/24"); tokens come out separated by single spaces."""
    s = text.lower().replace("\u2019", "'").replace("\u2018", "'").replace("&", " and ")
    s = _AMPM_DOTTED.sub(r" \1m ", s)
    s = _OCLOCK.sub(" oclock ", s)
    s = _ISO_DATE.sub(r"\1/\2/\3", s)
    s = _THOUSANDS.sub("", s)
    s = _APOS_WORD.sub(_expand_apostrophe, s)
    s = _GLUED_AMPM.sub(r"\1 \2", s)
    s = _NOT_KEPT.sub(" ", s)
    s = _LONE_SEPARATOR.sub(" ", s)
    s = " ".join(_RESPELLINGS.get(word, word) for word in s.split())
    return _ID_LIKE.sub(r"i would \1", s)


# --------------------------------------------------------------------------------------------
# Word lists

_UNIT_DIGITS: dict[str, str] = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9",
}  # fmt: skip
_TEEN_DIGITS: dict[str, str] = {
    "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13", "fourteen": "14",
    "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18", "nineteen": "19",
}  # fmt: skip
_TENS_DIGITS: dict[str, str] = {
    "twenty": "2", "thirty": "3", "forty": "4", "fifty": "5", "sixty": "6", "seventy": "7",
    "eighty": "8", "ninety": "9",
}  # fmt: skip
_ZERO_LETTERS = frozenset({"oh", "o"})
_REPEATERS = {"double": 2, "triple": 3}

_WEEKDAYS: dict[str, int] = {
    "monday": 0, "tuesday": 1, "wednesday": 2, "thursday": 3, "friday": 4, "saturday": 5,
    "sunday": 6, "tues": 1, "tue": 1, "weds": 2, "thurs": 3, "thur": 3, "thu": 3, "fri": 4,
}  # fmt: skip
_MONTHS: dict[str, int] = {
    "january": 1, "jan": 1, "february": 2, "feb": 2, "march": 3, "mar": 3, "april": 4, "apr": 4,
    "may": 5, "june": 6, "jun": 6, "july": 7, "jul": 7, "august": 8, "aug": 8, "september": 9,
    "sep": 9, "sept": 9, "october": 10, "oct": 10, "november": 11, "nov": 11, "december": 12,
    "dec": 12,
}  # fmt: skip
_PARTS_OF_DAY: dict[str, str] = {
    "morning": "morning", "afternoon": "afternoon", "evening": "evening", "night": "night",
}  # fmt: skip
# Words anywhere in the utterance that say which half of the clock an hour is in.
_HINT_WORDS: dict[str, str] = {
    **_PARTS_OF_DAY, "tonight": "evening", "breakfast": "morning", "brunch": "morning",
    "lunch": "lunch", "lunchtime": "lunch", "dinner": "evening", "supper": "evening",
}  # fmt: skip
# Hours (start inclusive, end exclusive) each hint allows; "night" wraps past midnight.
_HINT_WINDOWS: dict[str, tuple[tuple[int, int], ...]] = {
    "morning": ((4, 12),), "afternoon": ((12, 18),), "lunch": ((11, 16),),
    "evening": ((16, 24),), "night": ((18, 24), (0, 4)),
}  # fmt: skip
_TIME_CUES = frozenset(
    "at around about by from after before until till til say approximately roughly".split()
)
_PEOPLE_WORDS = frozenset(
    "people persons person guests guest adults adult pax diners seats covers kids children "
    "folks".split()
)
_NOT_TIME_AFTER = _PEOPLE_WORDS | frozenset(
    "minutes minute hours hour days day weeks week months more times tables table of".split()
)
_DURATIONS = frozenset("minutes minute hours hour days day weeks week".split())
_NUMBER_CUES = frozenset("for of be are party table".split())
_DETERMINERS = frozenset("the that this which another any each every no some a one".split())

_YES_PHRASES = (
    "yes", "yeah", "yea", "yep", "yup", "ya", "sure", "surely", "of course", "certainly",
    "correct", "that is correct", "that is right", "exactly", "absolutely", "definitely",
    "indeed", "affirmative", "ok", "all right", "sounds good", "sounds great", "perfect",
    "great", "good", "please do", "go ahead", "go for it", "do it", "yes please", "that works",
    "works for me", "fine", "uh huh", "mm hmm", "mhm", "you got it", "confirmed", "i confirm",
    "true", "you bet", "right", "that is fine", "that is great", "that is good",
    "that is perfect", "that is ok", "that is all right", "very good",
)  # fmt: skip
# Everyday words that answer yes only when they open the utterance: "good", but not the one in
# "have a good evening".
_WEAK_YES = frozenset(
    {("right",), ("good",), ("great",), ("fine",), ("perfect",), ("ok",), ("true",),
     ("exactly",), ("all", "right"), ("indeed",), ("sure",)}
)  # fmt: skip
_NO_PHRASES = (
    "no", "nope", "nah", "not really", "no thanks", "no thank you", "not at all", "negative",
    "incorrect", "wrong", "that is wrong", "not right", "not correct", "not quite", "not ok",
    "not good", "not exactly", "absolutely not", "definitely not", "of course not",
    "certainly not", "i do not think so", "please do not", "that is not it",
    "false", "no way",
)  # fmt: skip
# Phrases that contain a yes/no word but are neither; matching them blocks the words inside.
_UNSURE_PHRASES = (
    "not sure", "i do not know", "no idea", "maybe", "perhaps", "not yet", "no problem",
    "no one", "no worries", "do not know", "right now",
)  # fmt: skip

# Words a name follows. Some also precede ordinary words ("this is great", "i am looking"):
# a name is only taken from words that are not in the stop list below.
_NAME_CUES: tuple[tuple[str, ...], ...] = tuple(
    tuple(cue.split())
    for cue in (
        "my name is", "the name is", "name is", "my name", "under the name of",
        "under the name", "under the surname", "it is under", "book it under", "put it under",
        "under", "this is", "it is", "i am", "call me", "you can call me", "surname is",
        "last name is", "first name is", "mr", "mrs", "ms", "miss", "dr", "doctor",
    )
)  # fmt: skip
_NAME_CUES_BY_FIRST: dict[str, tuple[tuple[str, ...], ...]] = {
    first: tuple(cue for cue in _NAME_CUES if cue[0] == first) for first, *_ in _NAME_CUES
}
# Words a name comes before, at the start of an utterance: "david speaking".
_NAME_AFTER = frozenset({"speaking", "calling", "here"})
# Common words that are not names; with number words, days, months and yes/no words.
_NOT_NAME = frozenset(
    """
    a about above across actually after again against ago ahead all almost alone along already
    also although always am an and another any anybody anyone anything anyway anywhere are
    around as ask asking at available away back be because been before being below best
    better between both busy but by call called calling can cancel cancelled canceling
    cancelling change changed changing check come coming could date day days did do does doing
    done down during each early earlier either else enough even evening ever every everybody
    everyone everything exactly excellent few fine first for free from full get getting give
    go going gone good got great had happy has have having he hello her here hey hi him his
    hold hope how hungry i if in inside instead into is it just kind know last late later
    less let like little look looking lot lovely lunch made make making many may maybe me
    mean meant minute minutes more morning most much must my myself name need needed needing
    never new next nice night no none nope not nothing now number of off oh ok okay on once
    only or other our ours out outside over people person perfect phone please possible
    pretty probably put quite rather ready real really reservation reserve reserved right
    same say saying see seat seats she should so some somebody someone something soon sorry
    speaking still sure table tables take taking talk tell than thank thanks that the their
    them then there these they thing think this those though through till time times to
    today together tomorrow tonight too total two under until up upon us very wait want
    wanted wanting was we well were what when where whether which while who whole whom why
    will wish with without would wrong yeah yep yes yet you your yours booking book booked
    bookings dinner breakfast table afternoon week weekend hour hours party guests guest both
    place places somewhere anywhere nowhere side ringing regarding goodbye bye cheers mind
    """.split()
)
_FILLERS = frozenset({"uh", "um", "umm", "uhm", "er", "erm", "ah", "hmm", "hm", "mm", "eh"})


def _word_sets() -> frozenset[str]:
    words = set(_UNIT_DIGITS) | set(_TEEN_DIGITS) | set(_TENS_DIGITS) | set(_WEEKDAYS)
    words |= set(_MONTHS) | set(_HINT_WORDS) | _FILLERS | {"hundred", "thousand", "dozen"}
    for phrase in _YES_PHRASES + _NO_PHRASES:
        words.update(phrase.split())
    return frozenset(words)


_NOT_NAME_ALL = _NOT_NAME | _word_sets()
_NAME_WORD = re.compile(r"^[^\W\d_]+(?:'[^\W\d_]+)?$")


def _phrase_table(
    groups: Sequence[tuple[Sequence[str], bool | None]],
) -> dict[tuple[str, ...], bool | None]:
    table: dict[tuple[str, ...], bool | None] = {}
    for phrases, value in groups:
        for phrase in phrases:
            table[tuple(normalise(phrase).split())] = value
    return table


_YES_NO_TABLE = _phrase_table([(_YES_PHRASES, True), (_NO_PHRASES, False), (_UNSURE_PHRASES, None)])
_YES_NO_MAX = max(len(key) for key in _YES_NO_TABLE)


# --------------------------------------------------------------------------------------------
# Tokens, numbers and the per-utterance analysis


@dataclass(frozen=True)
class _Num:
    start: int  # token indices, end exclusive
    end: int
    value: float
    ordinal: bool

    @property
    def whole(self) -> int | None:
        return int(self.value) if self.value == int(self.value) else None


class _Token:
    """The token protocol text2num's find_numbers expects; a gap in word indices (words taken
    by other parameters) separates numbers so "two [tomorrow] seven" never reads as one."""

    __slots__ = ("index", "word")

    def __init__(self, word: str, index: int) -> None:
        self.word = word
        self.index = index

    def text(self) -> str:
        return self.word

    def nt_separated(self, previous: _Token) -> bool:
        return previous.index + 1 != self.index

    def not_a_number_part(self) -> bool:
        return False


_TYPED_INT = re.compile(r"^\d+$")
_TYPED_FLOAT = re.compile(r"^\d+\.\d+$")
_TYPED_ORDINAL = re.compile(r"^(\d{1,2})(?:st|nd|rd|th)$")
_HHMM = re.compile(r"^(\d{1,2})[:.](\d{2})$")
_MILITARY = re.compile(r"^([01]\d|2[0-3])([0-5]\d)$")
_SLASH_DATE = re.compile(r"^(\d{1,4})/(\d{1,2})(?:/(\d{2,4}))?$")


def _numbers(words: Sequence[str], used: Sequence[bool]) -> dict[int, _Num]:
    """Numbers among the free words, keyed by their first word: spelled-out ones through
    text2num (cardinals, ordinals, decimals), typed ones with int/float."""
    found: dict[int, _Num] = {}
    tokens: list[_Token] = []
    for index, word in enumerate(words):
        if used[index]:
            continue
        if word[0].isdigit():
            if _TYPED_INT.match(word):
                found[index] = _Num(index, index + 1, float(int(word)), False)
            elif _TYPED_FLOAT.match(word):
                found[index] = _Num(index, index + 1, float(word), False)
            elif m := _TYPED_ORDINAL.match(word):
                found[index] = _Num(index, index + 1, float(m.group(1)), True)
        else:
            tokens.append(_Token(word, index))
    if tokens:
        for occ in find_numbers(tokens, "en", 0):
            first = tokens[occ.start].index
            last = tokens[occ.end - 1].index
            found[first] = _Num(first, last + 1, float(occ.value), bool(occ.is_ordinal))
    return found


@lru_cache(maxsize=512)
def _all_numbers(text: str) -> dict[int, _Num]:
    """The numbers of a whole normalised text; cached: annotation and every intent's
    extraction look at the same utterance. Callers must not modify the result."""
    words = text.split()
    return _numbers(words, [False] * len(words))


@dataclass
class _DateFind:
    start: int
    end: int
    day: date
    hint: str | None


@dataclass
class _TimeFind:
    start: int
    end: int
    hour: int
    minute: int
    ambiguous: bool  # an hour 1-12 said without am/pm
    hint: str | None


@dataclass
class _Temporal:
    dates: list[_DateFind]
    times: list[_TimeFind]
    hint: str | None


class _Analysis:
    """One utterance being taken apart: its words, which are already used by a parameter,
    and lazily computed numbers and temporal expressions."""

    def __init__(
        self,
        text: str,
        now: datetime,
        earlier_date: date | None = None,
        earlier_time: time | None = None,
    ) -> None:
        self.text = normalise(text)
        self.words: list[str] = self.text.split()
        self.starts: list[int] = []
        offset = 0
        for word in self.words:
            self.starts.append(offset)
            offset += len(word) + 1
        self.used: list[bool] = [False] * len(self.words)
        self.now = now.replace(tzinfo=None)
        self.today = self.now.date()
        self._all_numbers: dict[int, _Num] | None = None
        self.temporal: _Temporal | None = None
        self.mentions_time = "time" in self.words
        # What the caller said in an earlier turn, for a datetime said in halves.
        self.earlier_date = earlier_date
        self.earlier_time = earlier_time

    def word(self, index: int) -> str:
        return self.words[index] if 0 <= index < len(self.words) else ""

    def free(self, start: int, end: int) -> bool:
        return end <= len(self.words) and not any(self.used[start:end])

    def take(self, start: int, end: int) -> None:
        for index in range(start, end):
            self.used[index] = True

    def chars(self, start: int, end: int) -> tuple[int, int]:
        return self.starts[start], self.starts[end - 1] + len(self.words[end - 1])

    @property
    def all_numbers(self) -> dict[int, _Num]:
        if self._all_numbers is None:
            self._all_numbers = _all_numbers(self.text)
        return self._all_numbers

    def number_at(self, index: int, *, ordinal: bool | None = False) -> _Num | None:
        """The whole number starting at word `index` if its words are still free; `ordinal`
        None accepts both kinds."""
        num = self.all_numbers.get(index)
        if num is None or num.whole is None or not self.free(num.start, num.end):
            return None
        if ordinal is not None and num.ordinal != ordinal:
            return None
        return num


# --------------------------------------------------------------------------------------------
# Digit strings and phone numbers


def _digit_runs(a: _Analysis) -> list[tuple[int, int, str]]:
    """Maximal runs of digit-like words: "eight eight zero", "double five", "oh", "415",
    "twenty one" (as "21"), "eight hundred" (as "800")."""
    runs: list[tuple[int, int, str]] = []
    words = a.words
    i = 0
    while i < len(words):
        j = i
        digits = ""
        while j < len(words) and not a.used[j]:
            word = words[j]
            nxt = a.word(j + 1) if not (j + 1 < len(words) and a.used[j + 1]) else ""
            if _TYPED_INT.match(word):
                digits += word
                j += 1
            elif word in _UNIT_DIGITS:
                digits += _UNIT_DIGITS[word]
                j += 1
            elif word in _ZERO_LETTERS and (digits or _is_digit_word(nxt)):
                digits += "0"
                j += 1
            elif word in _REPEATERS and (repeated := _single_digit(nxt)) is not None:
                digits += repeated * _REPEATERS[word]
                j += 2
            elif word in _TEEN_DIGITS:
                digits += _TEEN_DIGITS[word]
                j += 1
            elif word in _TENS_DIGITS:
                unit = _UNIT_DIGITS.get(nxt)
                if unit is not None and unit != "0":
                    digits += _TENS_DIGITS[word] + unit
                    j += 2
                else:
                    digits += _TENS_DIGITS[word] + "0"
                    j += 1
            elif word == "hundred" and digits:
                digits += "00"
                j += 1
            elif word == "thousand" and digits:
                digits += "000"
                j += 1
            else:
                break
        if digits:
            runs.append((i, j, digits))
            i = j
        else:
            i += 1
    return runs


def _is_digit_word(word: str) -> bool:
    return bool(word) and (
        word in _UNIT_DIGITS or word in _ZERO_LETTERS or bool(_TYPED_INT.match(word))
    )


def _single_digit(word: str) -> str | None:
    if word in _UNIT_DIGITS:
        return _UNIT_DIGITS[word]
    if word in _ZERO_LETTERS:
        return "0"
    return word if len(word) == 1 and word.isdigit() else None


def _phone_runs(a: _Analysis) -> list[tuple[int, int, str]]:
    return [run for run in _digit_runs(a) if MIN_PHONE_DIGITS <= len(run[2]) <= MAX_PHONE_DIGITS]


# --------------------------------------------------------------------------------------------
# Dates


def _next_month_day(today: date, month: int, day: int) -> date | None:
    for year in range(today.year, today.year + 5):  # five years reach the next 29 February
        try:
            candidate = date(year, month, day)
        except ValueError:
            continue
        if candidate >= today:
            return candidate
    return None


def _next_day_of_month(today: date, day: int) -> date | None:
    year, month = today.year, today.month
    for _ in range(13):
        try:
            candidate = date(year, month, day)
        except ValueError:
            candidate = None
        if candidate is not None and candidate >= today:
            return candidate
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return None


def _year_at(a: _Analysis, k: int) -> tuple[int, int] | None:
    num = a.number_at(k)
    if num is None:
        return None
    value = int(num.value)
    if 1900 <= value <= 2100:
        return value, num.end
    follow = a.number_at(num.end)
    if value in (19, 20) and follow is not None and 0 <= follow.value <= 99:
        return value * 100 + int(follow.value), follow.end  # "twenty twenty six"
    return None


def _day_at(a: _Analysis, k: int, *, cardinal_words: bool) -> tuple[int, int] | None:
    num = a.number_at(k, ordinal=None)
    if num is None or not 1 <= num.value <= 31:
        return None
    typed = a.word(k)[0].isdigit()
    if not num.ordinal and not typed and not cardinal_words:
        return None
    return int(num.value), num.end


def _with_year(a: _Analysis, today: date, month: int, day: int, k: int) -> tuple[date, int] | None:
    year = _year_at(a, k)
    if year is not None:
        try:
            return date(year[0], month, day), year[1]
        except ValueError:
            return None
    found = _next_month_day(today, month, day)
    return (found, k) if found is not None else None


def _month_day(a: _Analysis, k: int) -> tuple[date, int] | None:
    """ "december third", "december the 3rd [2026]", "the third of december", "3 december"."""
    w = a.word
    if w(k) in _MONTHS and not (w(k) == "may" and w(k + 1) in ("i", "we", "you")):
        month = _MONTHS[w(k)]
        j = k + 1 + (w(k + 1) == "the")
        day = _day_at(a, j, cardinal_words=True)
        if day is not None:
            return _with_year(a, a.today, month, day[0], day[1])
        return None
    j = k + (w(k) == "the")
    day = _day_at(a, j, cardinal_words=False)
    if day is None:
        return None
    after = day[1] + (w(day[1]) == "of")
    if w(after) in _MONTHS:
        # A bare typed number before a month may be a count: "for 3, dec 5th" is the 5th.
        cardinal = not a.all_numbers[j].ordinal and j == k
        if cardinal and (w(k - 1) in _NUMBER_CUES or _day_at(a, after + 1, cardinal_words=True)):
            return None
        return _with_year(a, a.today, _MONTHS[w(after)], day[0], after + 1)
    if (w(k) == "the" and a.number_at(j, ordinal=True)) or _TYPED_ORDINAL.match(w(j)):
        found = _next_day_of_month(a.today, day[0])  # "on the third": no month said
        return (found, day[1]) if found is not None else None
    return None


def _slash_date(a: _Analysis, k: int) -> tuple[date, int] | None:
    """Typed "12/24", "12/24/2026", "2026/12/24" (from ISO); month first unless it cannot be."""
    m = _SLASH_DATE.match(a.word(k))
    if m is None or not a.free(k, k + 1):
        return None
    first, second, third = int(m.group(1)), int(m.group(2)), m.group(3)
    try:
        if len(m.group(1)) == 4:
            if third is None:
                return None
            return date(first, second, int(third)), k + 1
        month, day = (second, first) if first > 12 else (first, second)
        if third is not None:
            year = int(third) + (2000 if len(third) == 2 else 0)
            return date(year, month, day), k + 1
    except ValueError:
        return None
    found = _next_month_day(a.today, month, day)
    return (found, k + 1) if found is not None else None


def _weekday_date(a: _Analysis, k: int) -> tuple[date, int, str | None] | None:
    """ "friday", "this friday", "next friday", "friday next week", "next week on friday",
    and British "a week on friday" / "friday week" (the Friday after the coming one)."""
    w = a.word
    mode = "on"
    j = k
    if w(j) == "a" and w(j + 1) == "week" and (w(j + 2) == "on" or w(j + 2) in _WEEKDAYS):
        mode = "week_on"
        j += 2 + (w(j + 2) == "on")
    elif w(j) == "next" and w(j + 1) == "week":
        mode = "next_week"
        j += 2 + (w(j + 2) == "on")
    elif w(j) == "this" and w(j + 1) == "coming":
        j += 2
    elif w(j) in ("this", "coming"):
        j += 1
    elif w(j) == "next":
        mode = "next"
        j += 1
    if w(j) not in _WEEKDAYS:
        return None
    weekday = _WEEKDAYS[w(j)]
    j += 1
    if w(j) == "next" and w(j + 1) == "week":
        mode = "next_week"
        j += 2
    elif w(j) == "week" and mode == "on":  # "friday week"
        mode = "week_on"
        j += 1
    hint = _PARTS_OF_DAY.get(w(j))
    j += hint is not None
    today = a.today
    ahead = (weekday - today.weekday()) % 7
    if mode == "next" and ahead == 0:
        ahead = 7
    elif mode == "next_week":
        ahead = 7 - today.weekday() + weekday
    elif mode == "week_on":
        ahead = ahead + 7 if ahead else 7  # said on a Friday: a week from today
    return today + timedelta(days=ahead), j, hint


def _relative_date(a: _Analysis, k: int) -> tuple[date, int, str | None] | None:
    w = a.word
    today = a.today
    j = k + (w(k) == "the")
    if w(j) == "day" and w(j + 1) == "after" and w(j + 2) == "tomorrow":
        return today + timedelta(days=2), j + 3, _PARTS_OF_DAY.get(w(j + 3))
    if w(k) == "a" and w(k + 1) == "week" and w(k + 2) in ("today", "tomorrow", "tonight"):
        # British "a week today", "a week tomorrow": seven days on from that day.
        days = 7 + (w(k + 2) == "tomorrow")
        hint = "evening" if w(k + 2) == "tonight" else None
        return today + timedelta(days=days), k + 3, hint
    if w(k) == "today":
        return today, k + 1, None
    if w(k) == "tonight":
        return today, k + 1, "evening"
    if w(k) == "this" and w(k + 1) in _PARTS_OF_DAY:
        return today, k + 2, _PARTS_OF_DAY[w(k + 1)]
    if w(k) == "tomorrow":
        hint = _PARTS_OF_DAY.get(w(k + 1))
        return today + timedelta(days=1), k + 1 + (hint is not None), hint
    if w(k) == "in":
        count = 1 if w(k + 1) == "a" else None
        end = k + 2
        num = a.number_at(k + 1)
        if num is not None:
            count, end = int(num.value), num.end
        if count is not None and w(end) in ("day", "days"):
            return today + timedelta(days=count), end + 1, None
        if count is not None and w(end) in ("week", "weeks"):
            return today + timedelta(weeks=count), end + 1, None
    return None


def _date_at(a: _Analysis, i: int) -> _DateFind | None:
    k = i + (a.word(i) == "on")
    for parse in (_relative_date, _weekday_date):
        found = parse(a, k)
        if found is not None:
            return _DateFind(i, found[1], found[0], found[2])
    for simple in (_month_day, _slash_date):
        plain = simple(a, k)
        if plain is not None:
            return _DateFind(i, plain[1], plain[0], None)
    return None


# --------------------------------------------------------------------------------------------
# Times


def _meridiem(a: _Analysis, j: int) -> tuple[str | None, str | None, int]:
    """am/pm (or a part of day said right after the time) at word j: (meridiem, hint, end)."""
    w = a.word
    if w(j) in ("am", "pm"):
        return w(j), None, j + 1
    if w(j) in ("a", "p") and w(j + 1) == "m":
        return w(j) + "m", None, j + 2
    if w(j) == "in" and w(j + 1) == "the" and w(j + 2) in _PARTS_OF_DAY:
        return None, _PARTS_OF_DAY[w(j + 2)], j + 3
    if w(j) == "at" and w(j + 1) == "night":
        return None, "night", j + 2
    return None, None, j


def _relative_time(a: _Analysis, k: int) -> tuple[int, int, int] | None:
    """ "half past seven", "quarter to eight", "twenty past six", "ten minutes to nine",
    British "half seven": (hour said, minutes offset, end of the hour's words)."""
    w = a.word
    j = k + (w(k) == "a" and w(k + 1) == "quarter")
    minutes: int | None = None
    if w(j) == "quarter":
        minutes, j = 15, j + 1
    elif w(j) == "half":
        minutes, j = 30, j + 1
    else:
        num = a.number_at(j)
        if num is not None and 1 <= num.value <= 29:
            j = num.end
            said_minutes = w(j) in ("minutes", "minute")
            j += said_minutes
            # Other counts only with "minutes": "two to four" is a range, not 3:58.
            if said_minutes or num.value in (5, 10, 20, 25):
                minutes = int(num.value)
    if minutes is None:
        return None
    if w(j) in ("past", "after"):
        sign, j = 1, j + 1
    elif w(j) in ("to", "till", "til", "before") and minutes != 30:
        sign, j = -1, j + 1
    elif minutes == 30 and w(k) == "half":
        sign = 1
    else:
        return None
    hour = a.number_at(j)
    if hour is None or not 1 <= hour.value <= 12:
        return None
    h = int(hour.value)
    if sign < 0:
        return (h - 1 or 12), 60 - minutes, hour.end
    return h, minutes, hour.end


def _time_core(a: _Analysis, k: int) -> tuple[int, int, str | None, str | None, int, bool] | None:
    """A time at word k: (hour, minute, meridiem, hint, end, strong); strong means it has
    minutes, am/pm or o'clock, so it is surely a time even without a cue like "at"."""
    w = a.word
    if not a.free(k, k + 1):
        return None
    if w(k) in ("noon", "midday"):
        return 12, 0, "fixed", None, k + 1, True
    if w(k) == "midnight":
        return 0, 0, "fixed", None, k + 1, True
    if w(k) == "twelve" and w(k + 1) in ("noon", "midday", "midnight") and a.free(k, k + 2):
        return (0 if w(k + 1) == "midnight" else 12), 0, "fixed", None, k + 2, True
    relative = _relative_time(a, k)
    if relative is not None:
        hour, minute, end = relative
        end += w(end) == "oclock"
        meridiem, hint, end = _meridiem(a, end)
        return hour, minute, meridiem, hint, end, True
    typed = _HHMM.match(w(k))
    if typed is not None:
        hour, minute = int(typed.group(1)), int(typed.group(2))
        meridiem, hint, end = _meridiem(a, k + 1)
        # "7.30" is only a time with am/pm or a cue; "19:30" always is.
        strong = ":" in w(k) or meridiem is not None
        if hour <= 24 and minute <= 59:
            return hour, minute, meridiem, hint, end, strong
        return None
    military = _MILITARY.match(w(k))
    if military is not None:
        # "at 1930": a time only after a cue word, so "strong" stays False.
        meridiem, hint, end = _meridiem(a, k + 1)
        return int(military.group(1)), int(military.group(2)), "fixed", hint, end, False
    num = a.number_at(k)
    if num is None:
        return None
    value = int(num.value)
    if value >= 100:
        # "nineteen hundred (hours)", military style
        if value % 100 == 0 and value <= 2400 and w(num.end - 1) == "hundred":
            end = num.end + (w(num.end) == "hours")
            return value // 100 % 24, 0, "fixed", None, end, True
        return None
    if value > 24:
        return None
    hour, minute, end, strong = value, 0, num.end, False
    follow = a.number_at(end)
    if w(end) in _ZERO_LETTERS:
        after_oh = a.number_at(end + 1)
        if after_oh is not None and after_oh.end == end + 2 and 1 <= after_oh.value <= 9:
            minute, end, strong = int(after_oh.value), end + 2, True
    elif follow is not None and (10 <= follow.value <= 59 or a.word(end) == "00"):
        minute, end, strong = int(follow.value), follow.end, True
    if w(end) == "oclock":
        end, strong = end + 1, True
    meridiem, hint, end = _meridiem(a, end)
    if meridiem is not None or hint is not None:
        strong = True
    elif not strong and w(end) in _NOT_TIME_AFTER:
        return None
    return hour, minute, meridiem, hint, end, strong


def _time_at(a: _Analysis, i: int, allow_bare: bool) -> _TimeFind | None:
    # "to eight" is a count in "change it to eight people" but a time in "change the time to
    # eight": "to" is a cue only when the utterance speaks of time.
    cue = a.word(i) in _TIME_CUES or (a.word(i) == "to" and a.mentions_time)
    core = _time_core(a, i + 1 if cue else i)
    if core is None:
        return None
    hour, minute, meridiem, hint, end, strong = core
    if not (strong or cue or allow_bare):
        return None
    if meridiem in ("am", "pm") and 1 <= hour <= 12:
        hour = hour % 12 + (12 if meridiem == "pm" else 0)
        ambiguous = False
    else:
        ambiguous = meridiem is None and 1 <= hour <= 12
    return _TimeFind(i, end, hour % 24, minute, ambiguous, hint)


def _in_window(hour: int, hint: str) -> bool:
    return any(lo <= hour < hi for lo, hi in _HINT_WINDOWS[hint])


def _resolve(found: _TimeFind, day: date | None, now: datetime, hint: str | None) -> datetime:
    """The moment a time means; the am/pm rule for an hour said without am/pm:

    1. a part-of-day word (its own "in the evening", "tomorrow morning", or "tonight",
       "dinner", "lunch" anywhere) picks the reading inside that part of the day;
    2. with no day said, or today: the next occurrence after `now` ("seven" at 16:00 is
       19:00, at 20:00 it is 07:00 tomorrow; with no day said the result may be tomorrow,
       with "today" said and both readings past, the pm one);
    3. on a later day: the reading inside 11:00-22:59, i.e. 1-10 are pm, 11 is am and
       12 is noon ("tomorrow at seven" is 19:00).
    """
    hours: tuple[int, ...] = (found.hour,)
    if found.ambiguous:
        morning = found.hour % 12
        hours = (morning, morning + 12)
        hint = found.hint or hint
        if hint is not None:
            inside = tuple(h for h in hours if _in_window(h, hint))
            if len(inside) == 1:
                hours = inside
    today = now.date()
    if day is None:
        for candidate_day in (today, today + timedelta(days=1)):
            for hour in hours:
                candidate = datetime.combine(candidate_day, time(hour, found.minute))
                if candidate > now:
                    return candidate
    if day is None or len(hours) == 1:
        return datetime.combine(day or today, time(hours[0], found.minute))
    if day == today:
        later = [h for h in hours if datetime.combine(day, time(h, found.minute)) > now]
        return datetime.combine(day, time(later[0] if later else hours[1], found.minute))
    hour = hours[0] if found.hour == 11 else hours[1]
    return datetime.combine(day, time(hour, found.minute))


# Words a date or a time can begin with, besides numbers: the parsers run only there.
_DATE_STARTS = frozenset(
    {"on", "the", "today", "tonight", "tomorrow", "this", "next", "coming", "day", "in", "a"}
    | set(_WEEKDAYS)
    | set(_MONTHS)
)
_TIME_STARTS = _TIME_CUES | {"noon", "midday", "midnight", "half", "quarter", "a", "to"}


def _could_start(a: _Analysis, i: int, starts: frozenset[str]) -> bool:
    word = a.words[i]
    return word in starts or word[0].isdigit() or i in a.all_numbers


def _temporal(a: _Analysis, allow_bare: bool) -> _Temporal:
    """Every date and time in the free words (taking them), computed once per analysis."""
    if a.temporal is not None:
        return a.temporal
    dates: list[_DateFind] = []
    times: list[_TimeFind] = []
    i = 0
    while i < len(a.words):
        day = None
        if not a.used[i] and _could_start(a, i, _DATE_STARTS):
            day = _date_at(a, i)
        if day is not None and day.end > day.start and a.free(day.start, day.end):
            dates.append(day)
            a.take(day.start, day.end)
            i = day.end
        else:
            i += 1
    i = 0
    while i < len(a.words):
        clock = None
        if not a.used[i] and _could_start(a, i, _TIME_STARTS):
            clock = _time_at(a, i, False)
        if clock is not None and clock.end > clock.start and a.free(clock.start, clock.end):
            times.append(clock)
            a.take(clock.start, clock.end)
            i = clock.end
        else:
            i += 1
    if not times and allow_bare:
        # A bare hour ("seven") is a time only when nothing else in the utterance is one.
        for i in range(len(a.words)):
            bare = _time_at(a, i, True) if not a.used[i] and i in a.all_numbers else None
            if bare is not None:
                times.append(bare)
                a.take(bare.start, bare.end)
                break
    hint = next((_HINT_WORDS[word] for word in a.words if word in _HINT_WORDS), None)
    hint = next((d.hint for d in dates if d.hint), hint)
    a.temporal = _Temporal(dates, times, hint)
    return a.temporal


# --------------------------------------------------------------------------------------------
# Enums, yes/no, names, numbers


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


def _enum_finds(a: _Analysis, entity: EntitySpec) -> list[tuple[int, int, str]]:
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
            and not all(word in _NOT_NAME_ALL for word in a.words[i : i + size])
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


def _yes_no_finds(a: _Analysis) -> list[tuple[int, int, bool | None]]:
    """Yes/no phrases left to right, the longest at each word; "unsure" phrases (for example
    "not sure") come out as None so that the yes or no inside them is not read."""
    finds: list[tuple[int, int, bool | None]] = []
    n = len(a.words)
    i = 0
    while i < n:
        for size in range(min(_YES_NO_MAX, n - i), 0, -1):
            key = tuple(a.words[i : i + size])
            if key in _YES_NO_TABLE and a.free(i, i + size) and (key not in _WEAK_YES or i == 0):
                finds.append((i, i + size, _YES_NO_TABLE[key]))
                i += size
                break
        else:
            i += 1
    return finds


def _yes_no_find(a: _Analysis) -> tuple[int, int, bool] | None:
    """The answer of the first yes/no phrase, or None when that phrase is an unsure one."""
    finds = _yes_no_finds(a)
    if not finds:
        return None
    start, end, value = finds[0]
    return None if value is None else (start, end, value)


def _name_words(a: _Analysis, j: int) -> int:
    end = j
    while end < len(a.words) and end - j < 3 and a.free(end, end + 1):
        word = a.words[end]
        if word in _NOT_NAME_ALL or not _NAME_WORD.match(word):
            break
        end += 1
    return end


def _name_find(a: _Analysis, allow_bare: bool) -> tuple[int, int, str] | None:
    """A name after a cue ("my name is", "under", "this is", "mr"), before "speaking" or
    "calling", or, when `allow_bare`, an utterance that is nothing but a name."""
    words = a.words
    for i in range(len(words)):
        for cue in _NAME_CUES_BY_FIRST.get(words[i], ()):
            if tuple(words[i : i + len(cue)]) == cue:
                j = i + len(cue)
                end = _name_words(a, j)
                if end > j:
                    return j, end, " ".join(words[j:end]).title()
    for i in range(len(words)):
        if words[i] in _NAME_AFTER and 0 < i <= 3 and _name_words(a, 0) == i:
            return 0, i, " ".join(words[:i]).title()
    if allow_bare:
        core = [i for i, w in enumerate(words) if w not in _FILLERS and w not in ("please",)]
        if core and _name_words(a, core[0]) == core[-1] + 1 == core[0] + len(core):
            return core[0], core[-1] + 1, " ".join(words[core[0] : core[-1] + 1]).title()
    return None


def _quantity_finds(a: _Analysis) -> list[tuple[int, int, float]]:
    """Counts in the free words, best party-size candidates first: a number next to "people"
    or after "for"/"of" beats one standing alone. Ordinals and "the one" are not counts."""
    words = a.words
    n = len(words)
    finds: list[tuple[int, int, float]] = []
    numbers = _numbers(words, a.used)
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
        if num.value == 1 and num.end == i + 1 and w(i) == "one" and w(i - 1) in _DETERMINERS:
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
        if after in _PEOPLE_WORDS or (after == "of" and a.word(end + 1) == "us"):
            return 0
        if after in _DURATIONS:
            return 3  # "in twenty minutes" is a count only when nothing else is
        return 1 if a.word(start - 1) in _NUMBER_CUES else 2

    return sorted(finds, key=rank)


def _as_number(value: float) -> int | float:
    return int(value) if value == int(value) else value


# --------------------------------------------------------------------------------------------
# Public API

_PRIORITY: dict[str, int] = {
    "phone": 0, "digits": 1, "date": 2, "time": 2, "datetime": 2, "enum": 3, "yes_no": 4,
    "name": 5, "number": 6, "integer": 6, "text": 7,
}  # fmt: skip


def extract_spans(
    text: str,
    specs: Sequence[ParameterSpec],
    *,
    now: datetime,
    entities: Mapping[str, EntitySpec] | None = None,
    prompted: str | None = None,
    earlier_date: date | None = None,
    earlier_time: time | None = None,
) -> dict[str, Extracted]:
    """Like `extract_parameters`, with each value's character span in `normalise(text)`.

    The most specific types go first and take their words: phone, digits, date/time, enum,
    yes/no, name, then numbers, so the 7 of "at seven" or of a phone number is never a
    party size. Times and phone numbers are taken out before numbers even when no parameter
    asks for them. A bare hour ("seven", no "at", am/pm or minutes) is a time only when a
    time is asked for and no number or digits are. A bare name ("john smith", no "my name
    is") is a name only when it is the one parameter asked for, or the one the agent has just
    prompted for (`prompted`: a form's answer to "What name should I put it under?").

    A datetime said in halves over two turns ("this friday", then "around eight" when asked
    for the time) is whole: `earlier_date` is the day of a time said alone, and `earlier_time`
    the time of a day said alone, as a person keeps what they were told a moment ago.
    """
    a = _Analysis(text, now, earlier_date, earlier_time)
    entities = entities or {}
    out: dict[str, Extracted] = {}
    kinds = {spec.type for spec in specs}
    allow_bare_time = bool(kinds & {"time", "datetime"}) and not (
        kinds & {"number", "integer", "digits"}
    )
    ordered = sorted(specs, key=lambda spec: _PRIORITY[spec.type])

    def put(name: str, value: Any, start: int, end: int) -> None:
        out[name] = Extracted(value, *a.chars(start, end))
        a.take(start, end)

    prepared = False
    for spec in ordered:
        kind = spec.type
        if _PRIORITY[kind] >= _PRIORITY["date"] and not prepared:
            # Phone numbers nobody asked for still must not turn into times or counts.
            for start, end, _digits in _phone_runs(a):
                a.take(start, end)
            _temporal(a, allow_bare_time)
            prepared = True
        if kind in ("phone", "digits"):
            runs = _phone_runs(a) if kind == "phone" else _digit_runs(a)
            if runs:
                put(spec.name, runs[0][2], runs[0][0], runs[0][1])
        elif kind in ("date", "time", "datetime"):
            value = _temporal_value(a, kind, allow_bare_time)
            if value is not None:
                out[spec.name] = value
        elif kind == "enum":
            entity = entities.get(spec.entity or "")
            if entity is None:
                raise ConfigError(f"unknown entity {spec.entity!r}", key=spec.name)
            hits = _enum_finds(a, entity)
            if hits:
                put(spec.name, hits[0][2], hits[0][0], hits[0][1])
        elif kind == "yes_no":
            answer = _yes_no_find(a)
            if answer is not None:
                put(spec.name, answer[2], answer[0], answer[1])
        elif kind == "name":
            name = _name_find(a, allow_bare=len(specs) == 1 or spec.name == prompted)
            if name is not None:
                put(spec.name, name[2], name[0], name[1])
        elif kind in ("number", "integer"):
            for start, end, count in _quantity_finds(a):
                if kind == "integer" and count != int(count):
                    continue
                put(spec.name, _as_number(count), start, end)
                break
        elif kind == "text":
            stripped = text.strip()
            if stripped:
                out[spec.name] = Extracted(stripped, 0, len(a.text))
    return out


def _temporal_value(a: _Analysis, kind: str, allow_bare: bool) -> Extracted | None:
    found = _temporal(a, allow_bare)
    day = found.dates[0] if found.dates else None
    clock = found.times[0] if found.times else None
    if kind == "date":
        if day is None:
            return None
        return Extracted(day.day.isoformat(), *a.chars(day.start, day.end))
    if clock is None:
        if kind == "datetime" and day is not None and a.earlier_time is not None:
            moment = datetime.combine(day.day, a.earlier_time)
            return Extracted(moment.strftime("%Y-%m-%dT%H:%M"), *a.chars(day.start, day.end))
        return None
    on_day = day.day if day else a.earlier_date if kind == "datetime" else None
    moment = _resolve(clock, on_day, a.now, found.hint)
    if kind == "time":
        return Extracted(moment.strftime("%H:%M"), *a.chars(clock.start, clock.end))
    start, end = clock.start, clock.end
    if day is not None:
        start, end = min(start, day.start), max(end, day.end)
    span = (a.chars(start, end)[0], a.chars(start, end)[1])
    return Extracted(moment.strftime("%Y-%m-%dT%H:%M"), *span)


def extract_parameters(
    text: str,
    specs: Sequence[ParameterSpec],
    *,
    now: datetime,
    entities: Mapping[str, EntitySpec] | None = None,
    prompted: str | None = None,
    earlier_date: date | None = None,
    earlier_time: time | None = None,
) -> dict[str, Any]:
    """The values of `specs` found in `text` (spoken or typed); a parameter not found is
    absent from the result. Values: number -> int or float, integer -> int, digits/phone ->
    str of digits, date -> "YYYY-MM-DD", time -> "HH:MM", datetime -> "YYYY-MM-DDTHH:MM",
    enum -> canonical value, yes_no -> bool, name -> title-cased str, text -> the utterance.
    See `extract_spans` for the order types are taken in and `_resolve` for the am/pm rule."""
    found = extract_spans(
        text,
        specs,
        now=now,
        entities=entities,
        prompted=prompted,
        earlier_date=earlier_date,
        earlier_time=earlier_time,
    )
    return {name: extracted.value for name, extracted in found.items()}


def annotate(
    text: str, *, now: datetime, entities: Mapping[str, EntitySpec] | None = None
) -> Annotation:
    """Every span a parameter could come from, for intent matching to replace by placeholders:
    phone numbers, dates and times ("when"), enum synonyms ("@entity"), names after a cue,
    yes/no answers ("yes", "no") and numbers, taken in that order."""
    a = _Analysis(text, now)
    spans: list[tuple[str, int, int]] = []
    for start, end, _digits in _phone_runs(a):
        spans.append(("phone", start, end))
        a.take(start, end)
    temporal = _temporal(a, False)
    for found in temporal.dates:
        spans.append(("when", found.start, found.end))
    for clock in temporal.times:
        spans.append(("when", clock.start, clock.end))
    for entity in (entities or {}).values():
        for start, end, _value in _enum_finds(a, entity):
            spans.append(("@" + entity.name, start, end))
            a.take(start, end)
    name = _name_find(a, allow_bare=False)
    if name is not None:
        spans.append(("name", name[0], name[1]))
        a.take(name[0], name[1])
    for start, end, answer in _yes_no_finds(a):
        if answer is not None:
            spans.append(("yes" if answer else "no", start, end))
            a.take(start, end)
    for start, end, _count in _quantity_finds(a):
        spans.append(("number", start, end))
    spans.sort(key=lambda span: span[1])
    return Annotation(a.text, tuple((kind, *a.chars(s, e)) for kind, s, e in spans))


def _single(
    text: str,
    kind: ParamType,
    now: datetime | None = None,
    entities: Mapping[str, EntitySpec] | None = None,
    entity: str | None = None,
) -> Any:
    spec = ParameterSpec("value", kind, entity)
    found = extract_parameters(text, [spec], now=now or datetime.now(), entities=entities)
    return found.get("value")


def parse_number(text: str) -> int | float | None:
    """The first count in `text`: "twenty five" -> 25, "a couple" -> 2, "2.5" -> 2.5."""
    value: int | float | None = _single(text, "number")
    return value


def parse_integer(text: str) -> int | None:
    """The first whole number in `text`."""
    value: int | None = _single(text, "integer")
    return value


def parse_digits(text: str) -> str | None:
    """The first run of digits: "double five oh one" -> "5501"."""
    value: str | None = _single(text, "digits")
    return value


def parse_phone(text: str) -> str | None:
    """The first run of at least seven digits: "+1 (415) 555-0100" -> "14155550100"."""
    value: str | None = _single(text, "phone")
    return value


def parse_date(text: str, *, now: datetime) -> str | None:
    """The first date as "YYYY-MM-DD", the next occurrence on or after `now`."""
    value: str | None = _single(text, "date", now)
    return value


def parse_time(text: str, *, now: datetime) -> str | None:
    """The first time as "HH:MM"; see `_resolve` for hours said without am/pm."""
    value: str | None = _single(text, "time", now)
    return value


def parse_datetime(text: str, *, now: datetime) -> str | None:
    """A date and time as "YYYY-MM-DDTHH:MM"; a time alone is its next occurrence."""
    value: str | None = _single(text, "datetime", now)
    return value


def parse_yes_no(text: str) -> bool | None:
    """True for yes-like answers, False for no-like ones, None when neither."""
    value: bool | None = _single(text, "yes_no")
    return value


def parse_name(text: str) -> str | None:
    """A person's name, title-cased, after a cue or as the whole utterance."""
    value: str | None = _single(text, "name")
    return value


def parse_enum(text: str, entity: EntitySpec) -> str | None:
    """The canonical value of `entity` whose canonical form or synonym occurs in `text`."""
    value: str | None = _single(text, "enum", None, {entity.name: entity}, entity.name)
    return value

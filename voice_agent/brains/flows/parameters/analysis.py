"""One utterance taken apart for extraction: its words and tokens, the numbers in it, the
words a parameter already took; and the digit strings and phone numbers said in it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from functools import lru_cache

from text_to_num import find_numbers

from voice_agent.brains.flows.parameters.specs import MAX_PHONE_DIGITS, MIN_PHONE_DIGITS
from voice_agent.brains.flows.parameters.words import (
    REPEATERS,
    TEEN_DIGITS,
    TENS_DIGITS,
    UNIT_DIGITS,
    ZERO_LETTERS,
    normalise,
)

# ---- tokens, numbers and the per-utterance analysis ----------------------------------------


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
TYPED_ORDINAL = re.compile(r"^(\d{1,2})(?:st|nd|rd|th)$")
HHMM = re.compile(r"^(\d{1,2})[:.](\d{2})$")
MILITARY = re.compile(r"^([01]\d|2[0-3])([0-5]\d)$")
SLASH_DATE = re.compile(r"^(\d{1,4})/(\d{1,2})(?:/(\d{2,4}))?$")


def numbers_in(words: Sequence[str], used: Sequence[bool]) -> dict[int, _Num]:
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
            elif m := TYPED_ORDINAL.match(word):
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
    return numbers_in(words, [False] * len(words))


@dataclass
class DateFind:
    start: int
    end: int
    day: date
    hint: str | None


@dataclass
class TimeFind:
    start: int
    end: int
    hour: int
    minute: int
    ambiguous: bool  # an hour 1-12 said without am/pm
    hint: str | None


@dataclass
class Temporal:
    dates: list[DateFind]
    times: list[TimeFind]
    hint: str | None


class Analysis:
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
        self.temporal: Temporal | None = None
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


# ---- digit strings and phone numbers -------------------------------------------------------


def digit_runs(a: Analysis) -> list[tuple[int, int, str]]:
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
            elif word in UNIT_DIGITS:
                digits += UNIT_DIGITS[word]
                j += 1
            elif word in ZERO_LETTERS and (digits or _is_digit_word(nxt)):
                digits += "0"
                j += 1
            elif word in REPEATERS and (repeated := _single_digit(nxt)) is not None:
                digits += repeated * REPEATERS[word]
                j += 2
            elif word in TEEN_DIGITS:
                digits += TEEN_DIGITS[word]
                j += 1
            elif word in TENS_DIGITS:
                unit = UNIT_DIGITS.get(nxt)
                if unit is not None and unit != "0":
                    digits += TENS_DIGITS[word] + unit
                    j += 2
                else:
                    digits += TENS_DIGITS[word] + "0"
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
        word in UNIT_DIGITS or word in ZERO_LETTERS or bool(_TYPED_INT.match(word))
    )


def _single_digit(word: str) -> str | None:
    if word in UNIT_DIGITS:
        return UNIT_DIGITS[word]
    if word in ZERO_LETTERS:
        return "0"
    return word if len(word) == 1 and word.isdigit() else None


def phone_runs(a: Analysis) -> list[tuple[int, int, str]]:
    return [run for run in digit_runs(a) if MIN_PHONE_DIGITS <= len(run[2]) <= MAX_PHONE_DIGITS]

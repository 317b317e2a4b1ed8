"""An utterance normalised for parameter extraction, and the word lists extraction reads."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

# ---- normalisation -------------------------------------------------------------------------

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


# ---- word lists ----------------------------------------------------------------------------

UNIT_DIGITS: dict[str, str] = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9",
}  # fmt: skip
TEEN_DIGITS: dict[str, str] = {
    "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13", "fourteen": "14",
    "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18", "nineteen": "19",
}  # fmt: skip
TENS_DIGITS: dict[str, str] = {
    "twenty": "2", "thirty": "3", "forty": "4", "fifty": "5", "sixty": "6", "seventy": "7",
    "eighty": "8", "ninety": "9",
}  # fmt: skip
ZERO_LETTERS = frozenset({"oh", "o"})
REPEATERS = {"double": 2, "triple": 3}

WEEKDAYS: dict[str, int] = {
    "monday": 0, "tuesday": 1, "wednesday": 2, "thursday": 3, "friday": 4, "saturday": 5,
    "sunday": 6, "tues": 1, "tue": 1, "weds": 2, "thurs": 3, "thur": 3, "thu": 3, "fri": 4,
}  # fmt: skip
MONTHS: dict[str, int] = {
    "january": 1, "jan": 1, "february": 2, "feb": 2, "march": 3, "mar": 3, "april": 4, "apr": 4,
    "may": 5, "june": 6, "jun": 6, "july": 7, "jul": 7, "august": 8, "aug": 8, "september": 9,
    "sep": 9, "sept": 9, "october": 10, "oct": 10, "november": 11, "nov": 11, "december": 12,
    "dec": 12,
}  # fmt: skip
PARTS_OF_DAY: dict[str, str] = {
    "morning": "morning", "afternoon": "afternoon", "evening": "evening", "night": "night",
}  # fmt: skip
# Words anywhere in the utterance that say which half of the clock an hour is in.
HINT_WORDS: dict[str, str] = {
    **PARTS_OF_DAY, "tonight": "evening", "breakfast": "morning", "brunch": "morning",
    "lunch": "lunch", "lunchtime": "lunch", "dinner": "evening", "supper": "evening",
}  # fmt: skip
# Hours (start inclusive, end exclusive) each hint allows; "night" wraps past midnight.
HINT_WINDOWS: dict[str, tuple[tuple[int, int], ...]] = {
    "morning": ((4, 12),), "afternoon": ((12, 18),), "lunch": ((11, 16),),
    "evening": ((16, 24),), "night": ((18, 24), (0, 4)),
}  # fmt: skip
TIME_CUES = frozenset(
    "at around about by from after before until till til say approximately roughly".split()
)
PEOPLE_WORDS = frozenset(
    "people persons person guests guest adults adult pax diners seats covers kids children "
    "folks".split()
)
NOT_TIME_AFTER = PEOPLE_WORDS | frozenset(
    "minutes minute hours hour days day weeks week months more times tables table of".split()
)
DURATIONS = frozenset("minutes minute hours hour days day weeks week".split())
NUMBER_CUES = frozenset("for of be are party table".split())
DETERMINERS = frozenset("the that this which another any each every no some a one".split())

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
WEAK_YES = frozenset(
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
NAME_CUES_BY_FIRST: dict[str, tuple[tuple[str, ...], ...]] = {
    first: tuple(cue for cue in _NAME_CUES if cue[0] == first) for first, *_ in _NAME_CUES
}
# Words a name comes before, at the start of an utterance: "david speaking".
NAME_AFTER = frozenset({"speaking", "calling", "here"})
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
FILLERS = frozenset({"uh", "um", "umm", "uhm", "er", "erm", "ah", "hmm", "hm", "mm", "eh"})


def _word_sets() -> frozenset[str]:
    words = set(UNIT_DIGITS) | set(TEEN_DIGITS) | set(TENS_DIGITS) | set(WEEKDAYS)
    words |= set(MONTHS) | set(HINT_WORDS) | FILLERS | {"hundred", "thousand", "dozen"}
    for phrase in _YES_PHRASES + _NO_PHRASES:
        words.update(phrase.split())
    return frozenset(words)


NOT_NAME_ALL = _NOT_NAME | _word_sets()
NAME_WORD = re.compile(r"^[^\W\d_]+(?:'[^\W\d_]+)?$")


def _phrase_table(
    groups: Sequence[tuple[Sequence[str], bool | None]],
) -> dict[tuple[str, ...], bool | None]:
    table: dict[tuple[str, ...], bool | None] = {}
    for phrases, value in groups:
        for phrase in phrases:
            table[tuple(normalise(phrase).split())] = value
    return table


YES_NO_TABLE = _phrase_table([(_YES_PHRASES, True), (_NO_PHRASES, False), (_UNSURE_PHRASES, None)])
YES_NO_MAX = max(len(key) for key in YES_NO_TABLE)

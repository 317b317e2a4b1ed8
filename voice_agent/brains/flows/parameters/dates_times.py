"""Dates and times as callers say them ("a week on Friday", "half eight", "the 3rd"),
resolved against the call's clock."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta

from voice_agent.brains.flows.parameters.analysis import (
    HHMM,
    MILITARY,
    SLASH_DATE,
    TYPED_ORDINAL,
    Analysis,
    DateFind,
    Temporal,
    TimeFind,
)
from voice_agent.brains.flows.parameters.words import (
    HINT_WINDOWS,
    HINT_WORDS,
    MONTHS,
    NOT_TIME_AFTER,
    NUMBER_CUES,
    PARTS_OF_DAY,
    TIME_CUES,
    WEEKDAYS,
    ZERO_LETTERS,
)

# ---- dates ---------------------------------------------------------------------------------


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


def _year_at(a: Analysis, k: int) -> tuple[int, int] | None:
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


def _day_at(a: Analysis, k: int, *, cardinal_words: bool) -> tuple[int, int] | None:
    num = a.number_at(k, ordinal=None)
    if num is None or not 1 <= num.value <= 31:
        return None
    typed = a.word(k)[0].isdigit()
    if not num.ordinal and not typed and not cardinal_words:
        return None
    return int(num.value), num.end


def _with_year(a: Analysis, today: date, month: int, day: int, k: int) -> tuple[date, int] | None:
    year = _year_at(a, k)
    if year is not None:
        try:
            return date(year[0], month, day), year[1]
        except ValueError:
            return None
    found = _next_month_day(today, month, day)
    return (found, k) if found is not None else None


def _month_day(a: Analysis, k: int) -> tuple[date, int] | None:
    """ "december third", "december the 3rd [2026]", "the third of december", "3 december"."""
    w = a.word
    if w(k) in MONTHS and not (w(k) == "may" and w(k + 1) in ("i", "we", "you")):
        month = MONTHS[w(k)]
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
    if w(after) in MONTHS:
        # A bare typed number before a month may be a count: "for 3, dec 5th" is the 5th.
        cardinal = not a.all_numbers[j].ordinal and j == k
        if cardinal and (w(k - 1) in NUMBER_CUES or _day_at(a, after + 1, cardinal_words=True)):
            return None
        return _with_year(a, a.today, MONTHS[w(after)], day[0], after + 1)
    if (w(k) == "the" and a.number_at(j, ordinal=True)) or TYPED_ORDINAL.match(w(j)):
        found = _next_day_of_month(a.today, day[0])  # "on the third": no month said
        return (found, day[1]) if found is not None else None
    return None


def _slash_date(a: Analysis, k: int) -> tuple[date, int] | None:
    """Typed "12/24", "12/24/2026", "2026/12/24" (from ISO); month first unless it cannot be."""
    m = SLASH_DATE.match(a.word(k))
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


def _weekday_date(a: Analysis, k: int) -> tuple[date, int, str | None] | None:
    """ "friday", "this friday", "next friday", "friday next week", "next week on friday",
    and British "a week on friday" / "friday week" (the Friday after the coming one)."""
    w = a.word
    mode = "on"
    j = k
    if w(j) == "a" and w(j + 1) == "week" and (w(j + 2) == "on" or w(j + 2) in WEEKDAYS):
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
    if w(j) not in WEEKDAYS:
        return None
    weekday = WEEKDAYS[w(j)]
    j += 1
    if w(j) == "next" and w(j + 1) == "week":
        mode = "next_week"
        j += 2
    elif w(j) == "week" and mode == "on":  # "friday week"
        mode = "week_on"
        j += 1
    hint = PARTS_OF_DAY.get(w(j))
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


def _relative_date(a: Analysis, k: int) -> tuple[date, int, str | None] | None:
    w = a.word
    today = a.today
    j = k + (w(k) == "the")
    if w(j) == "day" and w(j + 1) == "after" and w(j + 2) == "tomorrow":
        return today + timedelta(days=2), j + 3, PARTS_OF_DAY.get(w(j + 3))
    if w(k) == "a" and w(k + 1) == "week" and w(k + 2) in ("today", "tomorrow", "tonight"):
        # British "a week today", "a week tomorrow": seven days on from that day.
        days = 7 + (w(k + 2) == "tomorrow")
        hint = "evening" if w(k + 2) == "tonight" else None
        return today + timedelta(days=days), k + 3, hint
    if w(k) == "today":
        return today, k + 1, None
    if w(k) == "tonight":
        return today, k + 1, "evening"
    if w(k) == "this" and w(k + 1) in PARTS_OF_DAY:
        return today, k + 2, PARTS_OF_DAY[w(k + 1)]
    if w(k) == "tomorrow":
        hint = PARTS_OF_DAY.get(w(k + 1))
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


def _date_at(a: Analysis, i: int) -> DateFind | None:
    k = i + (a.word(i) == "on")
    for parse in (_relative_date, _weekday_date):
        found = parse(a, k)
        if found is not None:
            return DateFind(i, found[1], found[0], found[2])
    for simple in (_month_day, _slash_date):
        plain = simple(a, k)
        if plain is not None:
            return DateFind(i, plain[1], plain[0], None)
    return None


# ---- times ---------------------------------------------------------------------------------


def _meridiem(a: Analysis, j: int) -> tuple[str | None, str | None, int]:
    """am/pm (or a part of day said right after the time) at word j: (meridiem, hint, end)."""
    w = a.word
    if w(j) in ("am", "pm"):
        return w(j), None, j + 1
    if w(j) in ("a", "p") and w(j + 1) == "m":
        return w(j) + "m", None, j + 2
    if w(j) == "in" and w(j + 1) == "the" and w(j + 2) in PARTS_OF_DAY:
        return None, PARTS_OF_DAY[w(j + 2)], j + 3
    if w(j) == "at" and w(j + 1) == "night":
        return None, "night", j + 2
    return None, None, j


def _relative_time(a: Analysis, k: int) -> tuple[int, int, int] | None:
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


def _time_core(a: Analysis, k: int) -> tuple[int, int, str | None, str | None, int, bool] | None:
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
    typed = HHMM.match(w(k))
    if typed is not None:
        hour, minute = int(typed.group(1)), int(typed.group(2))
        meridiem, hint, end = _meridiem(a, k + 1)
        # "7.30" is only a time with am/pm or a cue; "19:30" always is.
        strong = ":" in w(k) or meridiem is not None
        if hour <= 24 and minute <= 59:
            return hour, minute, meridiem, hint, end, strong
        return None
    military = MILITARY.match(w(k))
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
    if w(end) in ZERO_LETTERS:
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
    elif not strong and w(end) in NOT_TIME_AFTER:
        return None
    return hour, minute, meridiem, hint, end, strong


def _time_at(a: Analysis, i: int, allow_bare: bool) -> TimeFind | None:
    # "to eight" is a count in "change it to eight people" but a time in "change the time to
    # eight": "to" is a cue only when the utterance speaks of time.
    cue = a.word(i) in TIME_CUES or (a.word(i) == "to" and a.mentions_time)
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
    return TimeFind(i, end, hour % 24, minute, ambiguous, hint)


def _in_window(hour: int, hint: str) -> bool:
    return any(lo <= hour < hi for lo, hi in HINT_WINDOWS[hint])


def resolve_time(found: TimeFind, day: date | None, now: datetime, hint: str | None) -> datetime:
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
    | set(WEEKDAYS)
    | set(MONTHS)
)
_TIME_STARTS = TIME_CUES | {"noon", "midday", "midnight", "half", "quarter", "a", "to"}


def _could_start(a: Analysis, i: int, starts: frozenset[str]) -> bool:
    word = a.words[i]
    return word in starts or word[0].isdigit() or i in a.all_numbers


def temporal_in(a: Analysis, allow_bare: bool) -> Temporal:
    """Every date and time in the free words (taking them), computed once per analysis."""
    if a.temporal is not None:
        return a.temporal
    dates: list[DateFind] = []
    times: list[TimeFind] = []
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
    hint = next((HINT_WORDS[word] for word in a.words if word in HINT_WORDS), None)
    hint = next((d.hint for d in dates if d.hint), hint)
    a.temporal = Temporal(dates, times, hint)
    return a.temporal

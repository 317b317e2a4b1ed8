"""Extraction as the flow brain asks for it: the spans of every parameter an utterance fills,
the values of a page's parameters, annotations of training phrases, and one value at a time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime, time
from typing import Any

from voice_agent.brains.flows.parameters.analysis import Analysis, digit_runs, phone_runs
from voice_agent.brains.flows.parameters.dates_times import resolve_time, temporal_in
from voice_agent.brains.flows.parameters.specs import (
    Annotation,
    EntitySpec,
    Extracted,
    ParameterSpec,
    ParamType,
)
from voice_agent.brains.flows.parameters.values import (
    as_number,
    enum_finds,
    name_find,
    quantity_finds,
    yes_no_find,
    yes_no_finds,
)
from voice_agent.errors import ConfigError

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
    a = Analysis(text, now, earlier_date, earlier_time)
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
            for start, end, _digits in phone_runs(a):
                a.take(start, end)
            temporal_in(a, allow_bare_time)
            prepared = True
        if kind in ("phone", "digits"):
            runs = phone_runs(a) if kind == "phone" else digit_runs(a)
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
            hits = enum_finds(a, entity)
            if hits:
                put(spec.name, hits[0][2], hits[0][0], hits[0][1])
        elif kind == "yes_no":
            answer = yes_no_find(a)
            if answer is not None:
                put(spec.name, answer[2], answer[0], answer[1])
        elif kind == "name":
            name = name_find(a, allow_bare=len(specs) == 1 or spec.name == prompted)
            if name is not None:
                put(spec.name, name[2], name[0], name[1])
        elif kind in ("number", "integer"):
            for start, end, count in quantity_finds(a):
                if kind == "integer" and count != int(count):
                    continue
                put(spec.name, as_number(count), start, end)
                break
        elif kind == "text":
            stripped = text.strip()
            if stripped:
                out[spec.name] = Extracted(stripped, 0, len(a.text))
    return out


def _temporal_value(a: Analysis, kind: str, allow_bare: bool) -> Extracted | None:
    found = temporal_in(a, allow_bare)
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
    moment = resolve_time(clock, on_day, a.now, found.hint)
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
    See `extract_spans` for the order types are taken in and `resolve_time` for the am/pm rule."""
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
    a = Analysis(text, now)
    spans: list[tuple[str, int, int]] = []
    for start, end, _digits in phone_runs(a):
        spans.append(("phone", start, end))
        a.take(start, end)
    temporal = temporal_in(a, False)
    for found in temporal.dates:
        spans.append(("when", found.start, found.end))
    for clock in temporal.times:
        spans.append(("when", clock.start, clock.end))
    for entity in (entities or {}).values():
        for start, end, _value in enum_finds(a, entity):
            spans.append(("@" + entity.name, start, end))
            a.take(start, end)
    name = name_find(a, allow_bare=False)
    if name is not None:
        spans.append(("name", name[0], name[1]))
        a.take(name[0], name[1])
    for start, end, answer in yes_no_finds(a):
        if answer is not None:
            spans.append(("yes" if answer else "no", start, end))
            a.take(start, end)
    for start, end, _count in quantity_finds(a):
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
    """The first time as "HH:MM"; see `resolve_time` for hours said without am/pm."""
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

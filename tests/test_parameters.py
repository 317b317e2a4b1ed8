"""Parameter extraction: a table of spoken (STT-style) and typed forms for every type, plus
utterances with several parameters where types compete for the same words."""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from typing import Any

import pytest

from voice_agent.brains.flows.parameters import (
    EntitySpec,
    ParameterSpec,
    ParamType,
    annotate,
    extract_parameters,
    extract_spans,
    normalise,
    parse_date,
    parse_datetime,
    parse_digits,
    parse_enum,
    parse_name,
    parse_number,
    parse_phone,
    parse_time,
    parse_yes_no,
)
from voice_agent.errors import ConfigError

NOW = datetime(2026, 11, 30, 16, 0)  # a Monday, 4 pm
SEATING = EntitySpec(
    "seating",
    {
        "indoor": ("inside", "indoors", "dining room"),
        "terrace": ("outside", "outdoors", "patio", "terrace"),
        "bar": ("at the bar", "bar seats"),
    },
)
ENTITIES = {"seating": SEATING}

# (text, type, expected value; None = the parameter is absent)
CASES: list[tuple[str, ParamType, Any]] = [
    # number
    ("two", "number", 2),
    ("twenty five", "number", 25),
    ("a couple", "number", 2),
    ("a couple of people", "number", 2),
    ("a dozen", "number", 12),
    ("half a dozen", "number", 6),
    ("2.5", "number", 2.5),
    ("two and a half", "number", 2.5),
    ("two point five", "number", 2.5),
    ("for 4", "number", 4),
    ("a table for six people please", "number", 6),
    ("one hundred and twenty", "number", 120),
    ("there will be four of us", "number", 4),
    ("just one", "number", 1),
    ("the one on the left", "number", None),
    ("hello", "number", None),
    # integer
    ("seven", "integer", 7),
    ("a dozen", "integer", 12),
    ("for 10", "integer", 10),
    ("two and a half", "integer", None),
    # digits
    ("eight eight zero zero five five five three five three five", "digits", "88005553535"),
    ("double five", "digits", "55"),
    ("five oh five", "digits", "505"),
    ("oh nine", "digits", "09"),
    ("triple seven two", "digits", "7772"),
    ("my code is one two three four", "digits", "1234"),
    ("1234", "digits", "1234"),
    ("no digits here", "digits", None),
    # phone
    ("+1 (415) 555-0100", "phone", "14155550100"),
    (
        "my number is eight eight zero zero five five five three five three five",
        "phone",
        "88005553535",
    ),
    ("four one five five five five zero one zero zero", "phone", "4155550100"),
    ("the number's oh seven seven double oh nine double oh one two three", "phone", "07700900123"),
    ("zero seven seven zero nine double one two three four five", "phone", "07709112345"),
    ("eight hundred five five five one two one two", "phone", "8005551212"),
    ("call me on 555 0100", "phone", "5550100"),
    ("my number is five five five", "phone", None),
    # date
    ("today", "date", "2026-11-30"),
    ("tomorrow", "date", "2026-12-01"),
    ("the day after tomorrow", "date", "2026-12-02"),
    ("next friday", "date", "2026-12-04"),
    ("on friday", "date", "2026-12-04"),
    ("this saturday", "date", "2026-12-05"),
    ("monday", "date", "2026-11-30"),
    ("next monday", "date", "2026-12-07"),
    ("friday next week", "date", "2026-12-11"),
    # British: the Friday after the coming one, and seven days on from a day
    ("a week on friday", "date", "2026-12-11"),
    ("friday week", "date", "2026-12-11"),
    ("a week on monday", "date", "2026-12-07"),  # said on a Monday
    ("a week today", "date", "2026-12-07"),
    ("a week tomorrow", "date", "2026-12-08"),
    ("a table for a week", "date", None),
    ("december third", "date", "2026-12-03"),
    ("the 3rd of december", "date", "2026-12-03"),
    ("the third of december", "date", "2026-12-03"),
    ("december the twenty fourth", "date", "2026-12-24"),
    ("12/24", "date", "2026-12-24"),
    ("3/12", "date", "2027-03-12"),
    ("24/12", "date", "2026-12-24"),
    ("2026-12-24", "date", "2026-12-24"),
    ("december third twenty twenty seven", "date", "2027-12-03"),
    ("november twenty ninth", "date", "2027-11-29"),
    ("january first", "date", "2027-01-01"),
    ("on the fifth", "date", "2026-12-05"),
    ("in two days", "date", "2026-12-02"),
    ("in a week", "date", "2026-12-07"),
    ("tonight", "date", "2026-11-30"),
    ("may i book", "date", None),
    # time
    ("seven thirty pm", "time", "19:30"),
    ("half past seven", "time", "19:30"),
    ("quarter to eight", "time", "19:45"),
    ("quarter past six", "time", "18:15"),
    ("twenty past six", "time", "18:20"),
    ("half seven", "time", "19:30"),
    ("noon", "time", "12:00"),
    ("twelve noon", "time", "12:00"),
    ("midnight", "time", "00:00"),
    ("19:30", "time", "19:30"),
    ("7pm", "time", "19:00"),
    ("7:30 p.m.", "time", "19:30"),
    ("seven o'clock", "time", "19:00"),
    ("at seven", "time", "19:00"),
    ("seven", "time", "19:00"),
    ("at 8", "time", "20:00"),
    ("at eight in the morning", "time", "08:00"),
    ("ten thirty am", "time", "10:30"),
    ("seven oh five", "time", "19:05"),
    ("nineteen hundred hours", "time", "19:00"),
    ("at 1930", "time", "19:30"),
    # No am/pm: the next occurrence after 16:00 is 03:00 tomorrow (documented rule).
    ("at three", "time", "03:00"),
    ("at three in the afternoon", "time", "15:00"),
    ("dinner at six", "time", "18:00"),
    ("no time here", "time", None),
    # datetime
    ("tomorrow at seven thirty pm", "datetime", "2026-12-01T19:30"),
    ("at seven", "datetime", "2026-11-30T19:00"),
    ("at three", "datetime", "2026-12-01T03:00"),
    ("at 2pm", "datetime", "2026-12-01T14:00"),
    ("today at five", "datetime", "2026-11-30T17:00"),
    ("tomorrow at seven", "datetime", "2026-12-01T19:00"),
    ("tomorrow at eleven", "datetime", "2026-12-01T11:00"),
    ("tomorrow morning at nine", "datetime", "2026-12-01T09:00"),
    ("friday at noon", "datetime", "2026-12-04T12:00"),
    ("tonight at nine", "datetime", "2026-11-30T21:00"),
    ("saturday at half past eight", "datetime", "2026-12-05T20:30"),
    ("on the 24th of december at 7:30pm", "datetime", "2026-12-24T19:30"),
    ("at eight on friday", "datetime", "2026-12-04T20:00"),
    ("tomorrow", "datetime", None),
    # yes_no
    ("yes", "yes_no", True),
    ("yeah", "yes_no", True),
    ("sure", "yes_no", True),
    ("that's right", "yes_no", True),
    ("correct", "yes_no", True),
    ("yep go ahead", "yes_no", True),
    ("of course", "yes_no", True),
    ("uh huh", "yes_no", True),
    ("Yes, please!", "yes_no", True),
    ("no", "yes_no", False),
    ("nope", "yes_no", False),
    ("not really", "yes_no", False),
    ("no thanks", "yes_no", False),
    ("that's not right", "yes_no", False),
    ("i don't think so", "yes_no", False),
    ("nah", "yes_no", False),
    ("i'm not sure", "yes_no", None),
    ("maybe", "yes_no", None),
    ("have a good evening", "yes_no", None),
    # name
    ("my name is john smith", "name", "John Smith"),
    ("this is sarah calling", "name", "Sarah"),
    ("it's o'brien", "name", "O'Brien"),
    ("under the name of jones please", "name", "Jones"),
    ("name's bob", "name", "Bob"),
    ("the surname's kowalski", "name", "Kowalski"),  # "surname's" is "surname is"
    ("mr patel", "name", "Patel"),
    ("david speaking", "name", "David"),
    ("john smith", "name", "John Smith"),
    ("i am looking for a table", "name", None),
    ("it's for tomorrow", "name", None),
    # enum
    ("we'd like to sit outside", "enum", "terrace"),
    ("in the dining room please", "enum", "indoor"),
    ("Outdoors!", "enum", "terrace"),
    ("can we sit at the bar", "enum", "bar"),
    ("on the terras", "enum", "terrace"),
    ("indoor", "enum", "indoor"),
    ("somewhere quiet", "enum", None),
    ("both of us", "enum", None),
    # text
    ("  hello there  ", "text", "hello there"),
    ("", "text", None),
]


def _case_id(case: tuple[str, ParamType, Any]) -> str:
    return f"{case[1]}:{case[0].strip() or '<empty>'}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_spoken_and_typed_forms(case: tuple[str, ParamType, Any]) -> None:
    text, kind, expected = case
    spec = ParameterSpec("value", kind, "seating" if kind == "enum" else None)
    found = extract_parameters(text, [spec], now=NOW, entities=ENTITIES)
    if expected is None:
        assert "value" not in found, found
    else:
        assert found == {"value": expected}
        assert type(found["value"]) is type(expected)


def test_the_table_is_big_and_covers_every_type() -> None:
    assert len(CASES) >= 60
    assert {kind for _, kind, _ in CASES} == {
        "number", "integer", "digits", "phone", "date", "time", "datetime", "enum", "yes_no",
        "name", "text",
    }  # fmt: skip


BOOKING = [
    ParameterSpec("party_size", "number"),
    ParameterSpec("when", "datetime"),
    ParameterSpec("phone", "phone"),
    ParameterSpec("name", "name"),
    ParameterSpec("seating", "enum", "seating"),
]

MULTI: list[tuple[str, dict[str, Any]]] = [
    ("a table for two tomorrow at seven", {"party_size": 2, "when": "2026-12-01T19:00"}),
    (
        "for 4 on friday at 8pm my number is 415 555 0100",
        {"party_size": 4, "when": "2026-12-04T20:00", "phone": "4155550100"},
    ),
    ("book for six at seven thirty", {"party_size": 6, "when": "2026-11-30T19:30"}),
    ("there will be four of us at half past eight", {"party_size": 4, "when": "2026-11-30T20:30"}),
    ("table for two at 19:30", {"party_size": 2, "when": "2026-11-30T19:30"}),
    ("seven people at eight", {"party_size": 7, "when": "2026-11-30T20:00"}),
    ("at seven for two", {"party_size": 2, "when": "2026-11-30T19:00"}),
    (
        "my name is anna and my number is eight eight zero zero five five five three five three"
        " five",
        {"name": "Anna", "phone": "88005553535"},
    ),
    (
        "i'd like a table for three on the terrace on december third at seven pm",
        {"party_size": 3, "when": "2026-12-03T19:00", "seating": "terrace"},
    ),
    (
        "Table for 3, Dec 5th, 6:45pm",
        {"party_size": 3, "when": "2026-12-05T18:45"},
    ),
    ("can you change the time to eight", {"when": "2026-11-30T20:00"}),
    ("can you change it to eight people", {"party_size": 8}),
    ("two", {"party_size": 2}),
    ("hello there", {}),
]


@pytest.mark.parametrize(("text", "expected"), MULTI)
def test_several_parameters(text: str, expected: dict[str, Any]) -> None:
    assert extract_parameters(text, BOOKING, now=NOW, entities=ENTITIES) == expected


@pytest.mark.parametrize(
    "text",
    [
        "my number is eight eight zero zero five five five three five three five",
        "call me on 415 555 0100",
        "at seven",
        "half past eight",
        "tomorrow at seven thirty",
        "on december third",
    ],
)
def test_numbers_inside_phones_and_times_are_not_counts(text: str) -> None:
    only_count = [ParameterSpec("party_size", "number")]
    assert extract_parameters(text, only_count, now=NOW) == {}


def test_bare_hour_is_a_count_when_a_count_is_asked_for_too() -> None:
    specs = [ParameterSpec("party_size", "number"), ParameterSpec("time", "time")]
    assert extract_parameters("seven", specs, now=NOW) == {"party_size": 7}
    assert extract_parameters("seven", specs[1:], now=NOW) == {"time": "19:00"}


def test_date_and_time_and_datetime_share_one_expression() -> None:
    specs = [
        ParameterSpec("when", "datetime"),
        ParameterSpec("date", "date"),
        ParameterSpec("time", "time"),
    ]
    found = extract_parameters("next friday at half past seven", specs, now=NOW)
    assert found == {"when": "2026-12-04T19:30", "date": "2026-12-04", "time": "19:30"}
    assert extract_parameters("for friday", specs, now=NOW) == {"date": "2026-12-04"}


def test_spans_point_into_the_normalised_text() -> None:
    text = "I'd like a table for TWO tomorrow at 7:30pm, outside!"
    found = extract_spans(text, BOOKING, now=NOW, entities=ENTITIES)
    normalised = normalise(text)
    assert normalised == "i would like a table for two tomorrow at 7:30 pm outside"
    assert normalised[found["party_size"].start : found["party_size"].end] == "two"
    assert normalised[found["when"].start : found["when"].end] == "tomorrow at 7:30 pm"
    assert normalised[found["seating"].start : found["seating"].end] == "outside"


def test_annotate_marks_every_kind() -> None:
    annotation = annotate(
        "yes my name is ann a table for two outside tomorrow at seven my number is 5550100",
        now=NOW,
        entities=ENTITIES,
    )
    kinds = [kind for kind, _, _ in annotation.spans]
    assert kinds == ["yes", "name", "number", "@seating", "when", "when", "phone"]
    starts = [start for _, start, _ in annotation.spans]
    assert starts == sorted(starts)


def test_normalise() -> None:
    assert normalise("What's the time? It's 7.30 P.M.") == "what is the time it is 7.30 pm"
    assert normalise("can't won't don't") == "can not will not do not"
    assert normalise("id like 2,500 twenty-five") == "i would like 2500 twenty five"
    assert normalise("We're at O'Brien's") == "we are at o'brien"


def test_single_type_helpers() -> None:
    assert parse_number("twenty five") == 25
    assert parse_digits("double five") == "55"
    assert parse_phone("+1 (415) 555-0100") == "14155550100"
    assert parse_date("next friday", now=NOW) == "2026-12-04"
    assert parse_time("quarter to eight", now=NOW) == "19:45"
    assert parse_datetime("tomorrow at seven thirty pm", now=NOW) == "2026-12-01T19:30"
    assert parse_yes_no("nope") is False
    assert parse_name("my name is john smith") == "John Smith"
    assert parse_enum("on the patio", SEATING) == "terrace"
    assert parse_number("nothing") is None


def test_aware_now_is_accepted() -> None:
    aware = datetime(2026, 11, 30, 16, 0, tzinfo=UTC)
    found = extract_parameters("tomorrow at 7pm", [ParameterSpec("w", "datetime")], now=aware)
    assert found == {"w": "2026-12-01T19:00"}


def test_bad_specs_raise_config_errors() -> None:
    with pytest.raises(ConfigError):
        ParameterSpec("x", "colour")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ParameterSpec("x", "enum")
    with pytest.raises(ConfigError):
        extract_parameters("outside", [ParameterSpec("x", "enum", "nope")], now=NOW)


def test_a_bare_name_answers_the_prompt_it_was_asked_for() -> None:
    """A form asking for a name and a phone takes "john smith" alone as the name only when
    the name is what the agent just prompted for; a greeting or a goodbye is never a name."""
    form = [ParameterSpec("name", "name"), ParameterSpec("phone", "phone")]
    assert extract_parameters("john smith", form, now=NOW) == {}
    assert extract_parameters("john smith", form, now=NOW, prompted="name") == {
        "name": "John Smith"
    }
    assert extract_parameters("uh ada please", form, now=NOW, prompted="name") == {"name": "Ada"}
    assert extract_parameters("john smith", form, now=NOW, prompted="phone") == {}
    for said in ("goodbye", "hello", "never mind", "i don't know", "book a table"):
        assert extract_parameters(said, form, now=NOW, prompted="name") == {}, said


@pytest.mark.parametrize(
    ("text", "earlier", "expected"),
    [
        # "this friday" in one turn, then the time asked for: Friday, at 8 pm (a later day)
        ("around eight", {"earlier_date": date(2026, 12, 4)}, "2026-12-04T20:00"),
        ("at nine thirty am", {"earlier_date": date(2026, 12, 4)}, "2026-12-04T09:30"),
        # "at seven" first, then the day: that day at seven
        ("saturday", {"earlier_time": time(19, 0)}, "2026-12-05T19:00"),
        # what is said now wins over what was said before
        ("tomorrow at six pm", {"earlier_date": date(2026, 12, 4)}, "2026-12-01T18:00"),
        ("friday at noon", {"earlier_time": time(19, 0)}, "2026-12-04T12:00"),
        # nothing earlier: a time alone is its next occurrence, a day alone no datetime
        ("around eight", {}, "2026-11-30T20:00"),
        ("saturday", {}, None),
    ],
)
def test_a_datetime_said_in_halves_over_two_turns(
    text: str, earlier: dict[str, Any], expected: str | None
) -> None:
    spec = ParameterSpec("when", "datetime")
    found = extract_parameters(text, [spec], now=NOW, **earlier)
    assert found.get("when") == expected


def test_the_earlier_halves_fill_only_a_datetime() -> None:
    """A date or a time parameter is what this turn said, never what an earlier one did."""
    specs = [ParameterSpec("date", "date"), ParameterSpec("time", "time")]
    found = extract_parameters(
        "around eight", specs, now=NOW, earlier_date=date(2026, 12, 4), earlier_time=time(7)
    )
    assert found == {"time": "20:00"}

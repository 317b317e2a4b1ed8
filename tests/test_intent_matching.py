"""Intent matching on the default booking agent: accuracy on held-out paraphrases, rejection of
out-of-domain speech, parameters of matched intents, validation and speed."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import report
from voice_agent.brains.flows.intents import IntentMatcher, IntentSpec, MatchResult
from voice_agent.brains.flows.parameters import EntitySpec, ParameterSpec, normalise
from voice_agent.errors import ConfigError

CONFIG = Path(__file__).resolve().parent.parent / "config" / "booking_intents.yaml"
NOW = datetime(2026, 11, 30, 16, 0)  # a Monday afternoon


def load_booking_intents(path: Path = CONFIG) -> tuple[list[IntentSpec], dict[str, EntitySpec]]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    entities = {
        name: EntitySpec(name, {str(k): tuple(str(s) for s in v) for k, v in values.items()})
        for name, values in (data.get("entities") or {}).items()
    }
    intents = []
    for name, body in data["intents"].items():
        parameters = []
        for param, declared in (body.get("parameters") or {}).items():
            if str(declared).startswith("@"):
                parameters.append(ParameterSpec(param, "enum", str(declared)[1:]))
            else:
                parameters.append(ParameterSpec(param, declared))
        intents.append(IntentSpec(name, tuple(str(p) for p in body["phrases"]), tuple(parameters)))
    return intents, entities


@pytest.fixture(scope="module")
def booking() -> tuple[list[IntentSpec], dict[str, EntitySpec]]:
    return load_booking_intents()


@pytest.fixture(scope="module")
def matcher(booking: tuple[list[IntentSpec], dict[str, EntitySpec]]) -> IntentMatcher:
    return IntentMatcher(*booking)


# Caller utterances in speech-to-text style that are not training phrases; written from how
# callers talk, not from the scorer's behaviour.
HELD_OUT: list[tuple[str, str]] = [
    ("hi i'd like to book a table for four people on saturday at eight", "book_table"),
    ("can i get a reservation for tomorrow night", "book_table"),
    ("do you have any tables free this friday for six", "book_table"),
    ("i want to reserve a spot for two at seven thirty tonight", "book_table"),
    ("could i make a booking for three people next tuesday", "book_table"),
    ("hello we're looking to book dinner for eight people", "book_table"),
    ("is it possible to get a table for two this evening", "book_table"),
    ("book me a table for tomorrow at half past eight please", "book_table"),
    ("i'd love to make a reservation for my anniversary on december twelfth", "book_table"),
    ("have you got a table for four outside on sunday", "book_table"),
    ("yeah hi can i book a table", "book_table"),
    ("i'd like to move my booking to thursday", "change_booking"),
    ("can we change our reservation from seven to eight thirty", "change_booking"),
    ("i need to change the number of guests on my reservation", "change_booking"),
    ("could you reschedule our table for next saturday", "change_booking"),
    ("we need to make our booking for six instead of four", "change_booking"),
    ("can i change my reservation time", "change_booking"),
    ("i booked a table for friday but i need to move it", "change_booking"),
    ("is it possible to change my booking to sit inside", "change_booking"),
    ("i want to cancel my reservation", "cancel_booking"),
    ("please cancel our table for tomorrow night", "cancel_booking"),
    ("i'm afraid we have to cancel our booking", "cancel_booking"),
    ("we won't be able to make it on friday can you cancel it", "cancel_booking"),
    ("i'd like to cancel the table for two under the name brown", "cancel_booking"),
    ("cancel my booking please", "cancel_booking"),
    ("can you cancel the reservation for tonight", "cancel_booking"),
    ("unfortunately we need to call off our dinner booking", "cancel_booking"),
    ("there'll be six of us", "provide_details"),
    ("it's for three people", "provide_details"),
    ("saturday at eight thirty", "provide_details"),
    ("my name's emma watson", "provide_details"),
    ("you can call me back on four one five five five five one two three four", "provide_details"),
    ("we'll be two adults", "provide_details"),
    ("around seven thirty if possible", "provide_details"),
    ("the booking is under williams", "provide_details"),
    ("next friday at seven", "provide_details"),
    ("we'd like to sit on the terrace", "provide_details"),
    ("five of us", "provide_details"),
    ("yes that's correct", "confirm"),
    ("yeah", "confirm"),
    ("yep that's right", "confirm"),
    ("sure go ahead", "confirm"),
    ("yes that sounds good", "confirm"),
    ("absolutely yes", "confirm"),
    ("okay sounds great", "confirm"),
    ("uh huh", "confirm"),
    ("no that's wrong", "deny"),
    ("nope not right", "deny"),
    ("no no", "deny"),
    ("no it isn't", "deny"),
    ("that's not correct", "deny"),
    ("no that's not it", "deny"),
    ("nah not really", "deny"),
    ("what time are you open until", "opening_hours"),
    ("when do you close", "opening_hours"),
    ("are you open on saturday", "opening_hours"),
    ("what are the opening times", "opening_hours"),
    ("how late is the kitchen open tonight", "opening_hours"),
    ("what time do you open in the morning", "opening_hours"),
    ("are you guys open on monday", "opening_hours"),
    ("what are your hours on sunday", "opening_hours"),
    ("ok thank you goodbye", "goodbye"),
    ("bye bye", "goodbye"),
    ("that's all thanks", "goodbye"),
    ("thanks a lot see you", "goodbye"),
    ("that's everything thank you bye", "goodbye"),
    ("alright cheers", "goodbye"),
    ("have a good evening", "goodbye"),
    ("can i speak to a real human", "talk_to_human"),
    ("i'd like to talk to someone please", "talk_to_human"),
    ("put me through to a person", "talk_to_human"),
    ("can i speak to the manager please", "talk_to_human"),
    ("i want to talk to a member of staff", "talk_to_human"),
    ("let me talk to a human being", "talk_to_human"),
    ("get me an operator", "talk_to_human"),
]

OUT_OF_DOMAIN = [
    "what's the weather like on mars",
    "uh",
    "",
    "um uh",
    "   ",
    "the cat sat on the mat",
    "how do i get to the airport from here",
    "play some jazz music",
    "what is the capital of france",
    "banana",
]


def test_held_out_lines_are_not_training_phrases(
    booking: tuple[list[IntentSpec], dict[str, EntitySpec]],
) -> None:
    intents, _ = booking
    training = {normalise(phrase) for intent in intents for phrase in intent.phrases}
    assert len(HELD_OUT) >= 60
    leaked = [text for text, _ in HELD_OUT if normalise(text) in training]
    assert not leaked
    names = {intent.name for intent in intents}
    assert {expected for _, expected in HELD_OUT} == names
    assert all(text == text.lower() and not any(c.isdigit() for c in text) for text, _ in HELD_OUT)


def test_training_phrases_per_intent(
    booking: tuple[list[IntentSpec], dict[str, EntitySpec]],
) -> None:
    intents, entities = booking
    assert "seating" in entities
    # Enough ways of saying each thing to be matched by meaning, and few enough to read
    # through when a caller is misunderstood (docs/config.md, "nlu").
    for intent in intents:
        assert 10 <= len(intent.phrases) <= 30, intent.name


def test_accuracy_on_held_out_paraphrases(
    matcher: IntentMatcher, record_property: Callable[[str, Any], None]
) -> None:
    wrong = []
    for text, expected in HELD_OUT:
        best = matcher.match(text, now=NOW).best
        got = best.intent if best else None
        if got != expected:
            wrong.append((text, expected, got, matcher.scores(text, now=NOW)))
    accuracy = 1 - len(wrong) / len(HELD_OUT)
    print(f"intent accuracy on held-out paraphrases: {accuracy:.3f} ({len(HELD_OUT)} utterances)")
    for text, expected, got, scores in wrong:
        top = sorted(scores.items(), key=lambda item: -item[1])[:3]
        print(f"  MISS {text!r}: expected {expected}, got {got}; top {top}")
    record_property("intent_accuracy", round(accuracy, 3))
    report(f"intent accuracy on held-out paraphrases: {accuracy:.3f} ({len(HELD_OUT)} lines)")
    assert accuracy >= 0.90


@pytest.mark.parametrize("text", OUT_OF_DOMAIN)
def test_out_of_domain_matches_nothing(matcher: IntentMatcher, text: str) -> None:
    result = matcher.match(text, now=NOW)
    assert result.best is None, (result, matcher.scores(text, now=NOW))
    assert result.matches == ()
    assert result.text == text


def test_training_phrases_match_their_own_intent(
    matcher: IntentMatcher, booking: tuple[list[IntentSpec], dict[str, EntitySpec]]
) -> None:
    intents, _ = booking
    for intent in intents:
        for phrase in intent.phrases:
            best = matcher.match(phrase, now=NOW).best
            assert best is not None and best.intent == intent.name, (phrase, best)
            assert best.confidence == pytest.approx(1.0, abs=0.01)


def test_book_table_parameters(matcher: IntentMatcher) -> None:
    best = matcher.match("i'd like a table for four on friday at eight pm", now=NOW).best
    assert best is not None and best.intent == "book_table"
    assert best.parameters["party_size"] == 4
    assert best.parameters["when"] == "2026-12-04T20:00"
    assert best.parameters["date"] == "2026-12-04"
    assert best.parameters["time"] == "20:00"

    spoken = "can i book a table for two tomorrow at seven thirty pm outside please"
    best = matcher.match(spoken, now=NOW).best
    assert best is not None and best.intent == "book_table"
    assert best.parameters == {
        "party_size": 2,
        "when": "2026-12-01T19:30",
        "date": "2026-12-01",
        "time": "19:30",
        "seating": "terrace",
    }

    typed = "Hi! Can I book a table for 6 on 12/24 at 7:30pm? My number is +1 (415) 555-0100."
    best = matcher.match(typed, now=NOW).best
    assert best is not None and best.intent == "book_table"
    assert best.parameters["party_size"] == 6
    assert best.parameters["when"] == "2026-12-24T19:30"
    assert best.parameters["phone"] == "14155550100"


def test_provide_details_parameters(matcher: IntentMatcher) -> None:
    spoken = "my name is anna and my number is eight eight zero zero five five five three five"
    best = matcher.match(spoken + " three five", now=NOW).best
    assert best is not None and best.intent == "provide_details"
    assert best.parameters == {"name": "Anna", "phone": "88005553535"}

    best = matcher.match("there will be six of us at half past eight", now=NOW).best
    assert best is not None and best.intent == "provide_details"
    assert best.parameters["party_size"] == 6
    assert best.parameters["time"] == "20:30"


def test_confirm_and_deny_carry_the_answer(matcher: IntentMatcher) -> None:
    yes = matcher.match("yeah that's great", now=NOW).best
    no = matcher.match("no not at all", now=NOW).best
    assert yes is not None and yes.intent == "confirm" and yes.parameters == {"answer": True}
    assert no is not None and no.intent == "deny" and no.parameters == {"answer": False}


def test_matches_are_ranked_and_above_threshold(matcher: IntentMatcher) -> None:
    result = matcher.match("i need to change my booking", now=NOW)
    assert isinstance(result, MatchResult)
    confidences = [m.confidence for m in result.matches]
    assert confidences == sorted(confidences, reverse=True)
    assert all(0.6 <= c <= 1.0 for c in confidences)
    assert result.best is not None and result.best.intent == "change_booking"


def test_threshold_filters(booking: tuple[list[IntentSpec], dict[str, EntitySpec]]) -> None:
    strict = IntentMatcher(*booking, threshold=0.99)
    assert strict.match("can i reserve a table for us", now=NOW).best is None
    assert strict.match("i want to cancel", now=NOW).best is not None


def test_invalid_configuration_is_rejected() -> None:
    with pytest.raises(ConfigError):
        IntentMatcher([IntentSpec("a", ())])
    with pytest.raises(ConfigError):
        IntentMatcher([IntentSpec("a", ("x",)), IntentSpec("a", ("y",))])
    with pytest.raises(ConfigError):
        IntentMatcher([IntentSpec("a", ("x",), (ParameterSpec("s", "enum", "nope"),))])
    with pytest.raises(ConfigError):
        IntentMatcher([IntentSpec("a", ("x",))], threshold=1.5)
    with pytest.raises(ConfigError):
        ParameterSpec("p", "colour")  # type: ignore[arg-type]


def test_empty_matcher_matches_nothing() -> None:
    assert IntentMatcher([]).match("book a table", now=NOW).best is None


def test_match_is_fast(matcher: IntentMatcher) -> None:
    texts = [text for text, _ in HELD_OUT]
    for text in texts[:5]:
        matcher.match(text, now=NOW)
    started = time.perf_counter()
    rounds = 3
    for _ in range(rounds):
        for text in texts:
            matcher.match(text, now=NOW)
    per_match = (time.perf_counter() - started) / (rounds * len(texts))
    print(f"mean match time: {per_match * 1e3:.3f} ms")
    assert per_match < 0.005  # a generous bound for slow CI machines; typically well under 1 ms

"""The default agent in config/ via `voice-agent chat --script`: book, change, cancel, offline."""

from __future__ import annotations

import datetime
import os
import sqlite3
from pathlib import Path

import pytest

from voice_agent.cli import main

ROOT = Path(__file__).parent.parent
SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"
CONFIG = ROOT / "config" / "agents.yaml"


def play(script: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    """The agent's lines and the whole transcript of one scripted call."""
    code = main(["chat", "--config", str(CONFIG), "--script", str(script)])
    out = capsys.readouterr().out
    assert code == 0, out
    said = [line[len("agent> ") :] for line in out.splitlines() if line.startswith("agent> ")]
    return said, out


def chat(lines: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> list[str]:
    path = tmp_path / "script.txt"
    path.write_text(lines)
    return play(path, capsys)[0]


def bookings() -> list[tuple[str, int, str, int]]:
    data_dir = Path(os.environ["VOICE_AGENT_DATA_DIR"])
    with sqlite3.connect(data_dir / "bookings.sqlite3") as db:
        return db.execute(
            "SELECT name, party_size, substr(at, 12), cancelled FROM bookings"
        ).fetchall()


def test_book_change_and_cancel_over_three_calls(capsys: pytest.CaptureFixture[str]) -> None:
    said, out = play(SCRIPTS / "book.txt", capsys)
    assert said[0].startswith("Hello, thanks for calling Bella Vista!")
    assert said[1:4] == [
        "What name should I put the booking under?",
        "And what's a good phone number to reach you?",
        said[3],
    ]
    assert said[3].startswith("A table for 2 on ") and said[3].endswith(
        "at 7 PM, under the name John Smith. Shall I book it?"
    )
    assert said[4].startswith("You're booked! Your confirmation code is ")
    assert said[-1] == "Thanks for calling Bella Vista. Goodbye!"
    assert "[tool] book_table(" in out and '[state] name: null -> "John Smith"' in out
    assert bookings() == [("John Smith", 2, "19:00", 0)]

    said, _ = play(SCRIPTS / "change.txt", capsys)
    assert said[1] == "What phone number is the booking under?"
    assert said[2].startswith("I found your booking for 2 on ")
    assert said[3].startswith("Done: your table is now for 4 on ") and "at 8 PM" in said[3]
    assert bookings() == [("John Smith", 4, "20:00", 0)]

    said, out = play(SCRIPTS / "cancel.txt", capsys)
    assert said[1] == "We're open every day from noon to eleven pm."  # the dtmf EventTrigger
    assert "[trigger] event dtmf: on_keypad" in out
    assert said[3].startswith("I found your booking for 4 on ")
    assert said[4] == "Your booking is cancelled. Anything else?"
    assert bookings() == [("John Smith", 4, "20:00", 1)]


def test_unknown_number_is_said_back_and_asked_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    said = chat(
        "i want to cancel my booking\nfive five five one two three four\n/end\n", capsys, tmp_path
    )
    assert said[2:] == [
        "I couldn't find a booking under 5 5 5 1 2 3 4.",
        "What phone number is the booking under?",
    ]


def test_no_match_and_no_input_have_fallbacks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    said = chat("what's the weather like on mars\n/no-input\n/end\n", capsys, tmp_path)
    assert said[1:] == [
        "Sorry, I didn't catch that. I can book, change or cancel a table.",
        "Are you still there? I can book, change or cancel a table.",
    ]


def test_a_caller_who_answers_each_question_plainly_gets_booked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A name said alone answers "What name should I put the booking under?", and "yes all
    correct" to "Shall I book it?" books the table, though "all" alone would be a goodbye."""
    lines = "book a table for four on friday at eight pm\nmaria garcia\n07700 900123\n"
    said = chat(lines + "yes all correct\nno thanks\n", capsys, tmp_path)
    assert said[1:3] == [
        "What name should I put the booking under?",
        "And what's a good phone number to reach you?",
    ]
    assert said[3].endswith("under the name Maria Garcia. Shall I book it?")
    assert said[4].startswith("You're booked!")
    assert said[-1] == "Thanks for calling Bella Vista. Goodbye!"
    assert ("Maria Garcia", 4, "20:00", 0) in bookings()


def test_a_day_said_first_and_the_time_when_asked_is_one_booking(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """ "For three next friday", and "around eight" to "For what day and time?": eight in the
    evening on that Friday, not eight o'clock today."""
    lines = "book a table for three next friday\naround eight\nmaria garcia\n07700 900123\n"
    said = chat(lines + "yes\nno thanks\n", capsys, tmp_path)
    assert said[1] == "For what day and time?"
    assert said[4].startswith("A table for 3 on Friday, "), said[4]
    assert " at 8 PM, under the name Maria Garcia" in said[4]
    assert ("Maria Garcia", 3, "20:00", 0) in bookings()


def test_a_day_asked_about_is_the_day_of_a_booking_for_a_time_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """ "Are you open on <a day>?", then "a table for two at eight": for that day, at 8 pm."""
    day = (datetime.date.today() + datetime.timedelta(days=3)).strftime("%A")  # never today
    lines = f"are you open on {day.lower()}\ngreat, a table for two at eight please\n"
    said = chat(lines + "lee\n07700 900456\n/end\n", capsys, tmp_path)
    assert said[-1].startswith(f"A table for 2 on {day}, "), said[-1]
    assert " at 8 PM, " in said[-1]


def test_a_yes_that_sounds_like_a_goodbye_books_and_does_not_hang_up(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The words "that's everything" alone are a goodbye; with a yes, to "Shall I book it?",
    they are the caller's confirmation."""
    lines = "book a table for two on saturday at six pm\nmy name is lee\n07700 900456\n"
    said = chat(lines + "yes that's everything\n/end\n", capsys, tmp_path)
    assert said[3].endswith("Shall I book it?")
    assert said[4].startswith("You're booked!")
    assert ("Lee", 2, "18:00", 0) in bookings()

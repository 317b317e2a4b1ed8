"""The end-of-turn decision on a virtual clock: the caller's turn ends when the evidence says
their thought is over (the acoustic model, the words so far, what the agent asked), between
a short and a long silence, and the silence rule stands when the evidence fails."""

from __future__ import annotations

import pytest

from tests.test_call_core import Driver, of
from voice_agent.core.call import Audit, FinishStt, JudgeTurn, SendClear, StartUserTurn
from voice_agent.core.end_of_turn import EndOfTurnConfig
from voice_agent.core.transcript_cues import Completeness, completeness

SMART = EndOfTurnConfig(
    enabled=True, min_silence_ms=200, max_silence_ms=2000, unsure_silence_ms=1200
)


def pause(d: Driver, speech_ms: int = 1000) -> JudgeTurn:
    """The caller speaks, then pauses long enough for STT's tail: the core asks."""
    d.frames(speech_ms, speech=True)
    asked = d.frames(200, speech=False)
    assert not of(FinishStt, asked)
    (judge,) = of(JudgeTurn, asked + d.frames(20, speech=False))
    return judge


def silence_until_end(d: Driver, limit_ms: int = 3000) -> float:
    """Feeds silence until the turn ends: how long the caller was silent by then."""
    start = d.now - d.core.turns.silence_ms
    for _ in range(limit_ms // 20):
        if of(FinishStt, d.frames(20, speech=False)):
            return d.now - start
    raise AssertionError("the turn never ended")


def test_a_caller_who_sounds_finished_is_answered_after_the_short_silence() -> None:
    d = Driver(end_of_turn=SMART)
    judge = pause(d)
    ended = d.run(d.core.turn_judged(judge.pause_id, 0.93, "A table for two please.", d.now))
    assert of(FinishStt, ended)  # 220 ms of silence had passed: at once
    (judged,) = [a for a in of(Audit, ended) if a.type == "turn_judged"]
    assert judged.data["reason"] == "sounds finished"


def test_a_caller_who_sounds_unfinished_is_waited_for_longer() -> None:
    d = Driver(end_of_turn=SMART)
    judge = pause(d)
    assert not of(FinishStt, d.run(d.core.turn_judged(judge.pause_id, 0.1, None, d.now)))
    assert silence_until_end(d) == pytest.approx(1200, abs=20)


def test_words_that_stop_mid_phrase_wait_the_longest_whatever_the_model_says() -> None:
    d = Driver(end_of_turn=SMART)
    judge = pause(d)
    d.run(d.core.turn_judged(judge.pause_id, 0.97, "I'd like a table for", d.now))
    assert silence_until_end(d) == pytest.approx(2000, abs=20)  # the long maximum


def test_a_mid_thought_pause_is_not_cut_off_and_the_turn_goes_on() -> None:
    d = Driver(end_of_turn=SMART)
    judge = pause(d)
    d.run(d.core.turn_judged(judge.pause_id, 0.2, "I'd like a table for", d.now))
    assert not of(FinishStt, d.frames(1100, speech=False))  # "um..." 1.3 s in all
    d.frames(800, speech=True)  # "...four on Friday"
    second = pause(d, speech_ms=0)
    assert second.pause_id == judge.pause_id + 1
    ended = d.run(d.core.turn_judged(second.pause_id, 0.9, "for four on Friday.", d.now))
    assert of(FinishStt, ended)


def test_evidence_for_a_pause_the_caller_spoke_through_is_ignored() -> None:
    """The caller went on while the speculative decode ran: its verdict is about a pause
    that is over, and ends nothing."""
    d = Driver(end_of_turn=SMART)
    judge = pause(d)
    d.frames(300, speech=True)
    assert d.run(d.core.turn_judged(judge.pause_id, 0.99, "Friday.", d.now)) == []
    assert not of(FinishStt, d.frames(400, speech=False))


def test_without_evidence_the_turn_ends_at_the_longest_silence() -> None:
    d = Driver(end_of_turn=SMART)
    pause(d)
    assert silence_until_end(d) == pytest.approx(2000, abs=20)


def test_a_failed_detector_falls_back_on_the_silence_rule() -> None:
    d = Driver(end_of_turn=SMART)
    judge = pause(d)
    d.run(d.core.turn_judged(judge.pause_id, None, None, d.now))
    assert silence_until_end(d) == pytest.approx(500, abs=20)  # end_of_turn_silence_ms


def test_an_answer_to_what_was_asked_ends_the_turn_even_if_it_sounds_unfinished() -> None:
    """Smart Turn hears flat synthetic voices as unfinished; a yes to a yes/no question is
    an answer however it sounds."""
    d = Driver(end_of_turn=SMART)
    d.core.expecting = "yes_no"
    judge = pause(d, speech_ms=400)
    assert of(FinishStt, d.run(d.core.turn_judged(judge.pause_id, 0.05, "Yes please.", d.now)))


def test_a_phone_number_with_too_few_digits_is_waited_for() -> None:
    d = Driver(end_of_turn=SMART)
    d.core.expecting = "phone"
    judge = pause(d)
    d.run(d.core.turn_judged(judge.pause_id, 0.9, "It's oh seven seven double four.", d.now))
    assert not of(FinishStt, d.frames(1500, speech=False))


def test_the_silence_rule_alone_asks_nothing() -> None:
    d = Driver()
    d.frames(1000, speech=True)
    assert not of(JudgeTurn, d.frames(600, speech=False))


def test_a_barge_in_after_a_pause_still_stops_the_agent() -> None:
    d = Driver(end_of_turn=SMART, min_interruption_ms=300)
    d.core.agent_turn_started(d.now)
    d.say(1, "Your table is booked for Friday at eight in the evening.")
    d.play(600)
    judge = pause(d, speech_ms=200)  # a short sound, then a pause: no barge-in yet
    assert not of(SendClear, d.actions)
    d.run(d.core.turn_judged(judge.pause_id, 0.1, None, d.now))
    assert of(SendClear, d.frames(300, speech=True))  # the caller goes on: now it is one
    d.frames(200, speech=False)
    d.frames(1200, speech=False)
    final = d.run(d.core.stt_final("wait, make it nine", d.now))
    assert of(StartUserTurn, final) == [StartUserTurn("wait, make it nine")]


@pytest.mark.parametrize(
    ("text", "expecting", "expected"),
    [
        ("I'd like a table for", None, Completeness.UNFINISHED),
        ("and then um", None, Completeness.UNFINISHED),
        ("He was not an ill...", None, Completeness.UNFINISHED),
        ("at the sound of the tone, the", None, Completeness.UNFINISHED),
        ("my number is oh seven seven", None, Completeness.UNFINISHED),
        ("uh", None, Completeness.UNFINISHED),
        ("Can I book a table?", None, Completeness.COMPLETE),
        ("07700 900123", "phone", Completeness.COMPLETE),
        ("oh seven seven double four one two three four five six", "phone", Completeness.COMPLETE),
        ("five five five one two", "phone", Completeness.UNFINISHED),
        ("yes please", "yes_no", Completeness.COMPLETE),
        ("four", "number", Completeness.COMPLETE),
        ("A table for two please.", None, Completeness.UNKNOWN),
        ("", None, Completeness.UNKNOWN),
    ],
)
def test_what_the_words_say_about_the_turn(
    text: str, expecting: str | None, expected: Completeness
) -> None:
    assert completeness(text, expecting) is expected


def test_a_quiet_tail_the_vad_calls_speech_is_a_pause_too() -> None:
    """The VAD often calls a decaying tail speech: 35 dB under the loudest, it is silence to
    the turn, so STT pauses and the pause is weighed like any other."""
    from voice_agent.core.call import PauseStt

    d = Driver(end_of_turn=SMART)
    loud = (10000).to_bytes(2, "little", signed=True) * 320
    quiet = (20).to_bytes(2, "little", signed=True) * 320
    for _ in range(50):
        d.now += 20
        d.run(d.core.audio_frame(loud, True, "", d.now))
    asked = []
    for _ in range(15):
        d.now += 20
        asked += d.run(d.core.audio_frame(quiet, True, "", d.now))
    assert of(PauseStt, asked) and of(JudgeTurn, asked)

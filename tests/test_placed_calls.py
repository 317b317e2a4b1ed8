"""The plain parts of placing calls: when an outbound agent speaks first (the callee's hello),
the table tying a placed call's stream and callbacks to its request, and how Twilio's status
and answering-machine callbacks read."""

from __future__ import annotations

import math

from voice_agent.core.callee_hello import MIN_SPEECH_MS, PAUSE_MS, QUIET_MS, CalleeHello
from voice_agent.server.placed_calls import PlacedCalls, Unanswered, Verdict
from voice_agent.server.twilio_rest import parse_status, stream_twiml


def feed(hello: CalleeHello, pattern: list[tuple[bool, float]], start_ms: float = 0.0) -> float:
    """Frames of (speech?, for ms); the time at which `frame` first said go, or -1."""
    now = start_ms
    for is_speech, ms in pattern:
        for _ in range(int(ms // 20)):
            now += 20
            if hello.frame(is_speech, now):
                return now
    return -1.0


PAUSE = 20 * math.ceil(PAUSE_MS / 20)  # the pause, in whole 20 ms frames


def test_the_greeting_follows_the_callees_hello_after_a_short_pause() -> None:
    hello = CalleeHello(0.0)
    went = feed(hello, [(False, 400), (True, 500), (False, 1000)])
    assert went == 400 + 500 + PAUSE


def test_a_callee_who_says_nothing_is_greeted_after_the_quiet_spell() -> None:
    hello = CalleeHello(0.0)
    assert feed(hello, [(False, 5000)]) == QUIET_MS
    assert not hello.heard


def test_a_click_is_no_hello_and_a_hello_that_goes_on_is_waited_for() -> None:
    hello = CalleeHello(0.0)
    # A 60 ms click at 2 s: not a hello; the quiet spell waits out its pause, then goes.
    went = feed(hello, [(False, 2000), (True, 60), (False, 3000)])
    assert not hello.heard and went == 2060 + PAUSE
    talker = CalleeHello(0.0)
    # "Hello, Bella Vista, Ada speaking": pauses shorter than PAUSE_MS within it.
    went = feed(talker, [(True, 400), (False, 300), (True, 800), (False, 1000)])
    assert talker.heard and went == 400 + 300 + 800 + PAUSE
    assert MIN_SPEECH_MS < 400


def test_a_placed_calls_token_is_taken_once_and_only_with_its_key() -> None:
    now = [0.0]
    calls = PlacedCalls(expire_s=100.0, clock=lambda: now[0])
    call = calls.add("c1", "booking", {"name": "Ada"}, "+14155550123", "twilio")
    assert calls.get("c1", "wrong") is None and calls.get("c2", call.key) is None
    assert calls.valid_token(call.token) and not calls.valid_token("c1.guess")
    assert calls.claim(call.token) is call
    assert calls.claim(call.token) is None  # a replayed stream
    assert not calls.valid_token(call.token)


def test_placed_calls_their_carrier_never_reports_on_are_dropped() -> None:
    now = [0.0]
    calls = PlacedCalls(expire_s=100.0, clock=lambda: now[0])
    waiting = calls.add("c1", "booking", {}, "+1", "twilio")
    streaming = calls.add("c2", "booking", {}, "+2", "twilio")
    calls.claim(streaming.token)
    now[0] = 99.0
    assert calls.expired() == []
    now[0] = 100.0
    assert calls.expired() == [waiting]
    assert len(calls) == 1  # the one on a call stays until its stream ends


def test_twilios_callbacks_read_as_what_became_of_the_call() -> None:
    assert parse_status({"CallStatus": "ringing"}) is None
    assert parse_status({"CallStatus": "busy"}) == Unanswered("busy: the callee's line was busy")
    assert parse_status({"CallStatus": "no-answer"}) == Unanswered("no answer: nobody picked up")
    failed = parse_status({"CallStatus": "failed", "SipResponseCode": "404"})
    assert failed == Unanswered("call failed: Twilio could not place the call (code 404)")
    assert parse_status({"AnsweredBy": "human"}) == Verdict("person", said="human")
    beep = parse_status({"AnsweredBy": "machine_end_beep", "CallStatus": "in-progress"})
    assert beep == Verdict("message", beep=True, said="machine_end_beep")
    assert parse_status({"AnsweredBy": "unknown"}) is None


def test_the_stream_twiml_escapes_what_it_carries() -> None:
    twiml = stream_twiml('wss://h/twilio?a="b"', "id.k&y")
    assert 'url="wss://h/twilio?a=&quot;b&quot;"' in twiml
    assert 'value="id.k&amp;y"' in twiml

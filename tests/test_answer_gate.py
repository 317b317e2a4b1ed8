"""The answer gate (voice_agent.core.answer_gate) on a virtual clock: when a call's agent may
begin, whether with its greeting, and what the audit is told. The end-to-end behaviour (a
placed call's greeting after the callee's hello, a mailbox's message after its beep) is in
tests/test_placed_calls.py and tests/test_answering_machine.py."""

from __future__ import annotations

from voice_agent.core.answer_gate import (
    QUIET_CHECK_MS,
    AnswerGate,
    Begin,
    GateAction,
    MessageMayStart,
    Note,
)
from voice_agent.core.callee_hello import PAUSE_MS, QUIET_MS
from voice_agent.core.voicemail import BeepHeard, Human, Machine

SILENCE = bytes(320)  # 20 ms of 8 kHz PCM16


def frames(gate: AnswerGate, start_ms: float, ms: float, *, speech: bool) -> list[GateAction]:
    actions: list[GateAction] = []
    now = start_ms
    while now < start_ms + ms:
        actions += gate.frame(SILENCE, speech, now)
        now += 20
    return actions


def begins(actions: list[GateAction]) -> list[Begin]:
    return [a for a in actions if isinstance(a, Begin)]


def test_a_call_that_came_in_begins_with_its_greeting_at_once() -> None:
    gate = AnswerGate(placed=False)
    assert gate.start(0) == [Begin(greet=True)]
    assert gate.done and not gate.waiting


def test_a_placed_call_greets_after_the_callees_hello_and_its_pause() -> None:
    gate = AnswerGate(placed=True)
    assert gate.start(0) == [Note("waiting_for_callee", {})]
    assert gate.waiting
    assert frames(gate, 0, 600, speech=True) == []  # "Hello?"
    assert gate.took_frame  # the hello is no user turn
    assert frames(gate, 600, PAUSE_MS - 40, speech=False) == []  # not yet: a breath
    actions = frames(gate, 600 + PAUSE_MS - 40, 60, speech=False)
    assert actions == [Note("callee_hello", {"heard": True}), Begin(greet=True)]
    assert gate.done


def test_a_callee_who_says_nothing_is_greeted_after_the_quiet_spell_by_the_clock() -> None:
    # A stream that sends no audio while quiet: only the clock can start the agent.
    gate = AnswerGate(placed=True)
    gate.start(1000)
    assert gate.next_deadline_ms() == 1000 + QUIET_MS
    assert gate.tick(1000 + QUIET_MS - 1) == []
    assert gate.tick(1000 + QUIET_MS) == [Note("callee_hello", {"heard": False}), Begin(True)]
    assert gate.next_deadline_ms() is None


def test_a_short_sound_at_the_quiet_spells_end_is_given_time_to_be_a_hello() -> None:
    gate = AnswerGate(placed=True)
    gate.start(0)
    frames(gate, QUIET_MS - 60, 60, speech=True)  # a click just before the spell ends
    assert gate.tick(QUIET_MS) == []
    assert gate.next_deadline_ms() == QUIET_MS + QUIET_CHECK_MS
    later = QUIET_MS + PAUSE_MS
    assert begins(gate.tick(later)) == [Begin(greet=True)]


def test_a_person_by_the_carriers_verdict_before_the_start_is_greeted_at_the_start() -> None:
    gate = AnswerGate(placed=True)
    assert gate.carrier_verdict(Human(after_ms=900)) == []  # kept: the call is not up yet
    actions = gate.start(0)
    assert actions == [
        Note("waiting_for_callee", {}),
        Note("answering_machine", {"answer": "person", "after_ms": 900, "source": "carrier"}),
        Begin(greet=True),
    ]
    assert not gate.waiting


def test_a_machine_keeps_the_agent_waiting_until_its_message_may_start_without_a_greeting() -> None:
    gate = AnswerGate(placed=True)
    gate.start(0)
    frames(gate, 0, 1000, speech=True)  # the mailbox's greeting
    machine = gate.carrier_verdict(Machine(after_ms=1000, reason="carrier"))
    assert machine == [
        Note(
            "answering_machine",
            {"answer": "machine", "reason": "carrier", "after_ms": 1000, "source": "carrier"},
        )
    ]
    assert gate.waiting
    started = gate.carrier_verdict(BeepHeard(at_ms=1200))
    assert started[0] == Note(
        "answering_machine", {"answer": "message may start", "beep": True, "source": "carrier"}
    )
    assert started[1:] == [Begin(greet=False), MessageMayStart("carrier", beep=True)]
    # Once the message has started, later verdicts change nothing.
    assert gate.carrier_verdict(Human(after_ms=9500)) == []


def test_silence_taken_for_the_beep_says_no_beep_was_heard() -> None:
    gate = AnswerGate(placed=False)
    gate.start(0)
    gate.carrier_verdict(Machine(after_ms=3000, reason="long greeting"))
    actions = gate.carrier_verdict(BeepHeard(at_ms=8000, assumed=True))
    # A call that came in has begun already: the message event is raised, the agent not
    # begun again.
    assert begins(actions) == []
    assert actions[-1] == MessageMayStart("long greeting", beep=False)

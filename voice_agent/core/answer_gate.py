"""Who answered a call and when its agent may begin, sans-I/O: the gate between the answer and
the agent's first words.

A call that came in begins at once. A call the server placed waits for the callee's hello
(core/callee_hello.py). With answering-machine detection on (`answering_machine: true`), the
server's detector (core/voicemail.py) and the carrier's own verdicts (a placed call's status
callback) say whether a person or a machine answered: a person starts the greeting at once; a
machine keeps the agent waiting until its message may start (after the beep), then the agent
begins without a greeting and the `voicemail` event is raised. Whichever verdict comes first
decides; the carrier's verdicts that come before the call has started are kept until it does.

Fed the caller's frames (with their VAD decision), the carrier's verdicts and a clock in
milliseconds; its actions say what to do. While `waiting`, the caller's audio is the callee's
hello or a machine's greeting, no user turn: the driver keeps it from the call core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from voice_agent.core.callee_hello import QUIET_MS, CalleeHello
from voice_agent.core.voicemail import BeepHeard, Human, Machine, VoicemailDetector

# A callee whose line sends no audio while quiet is checked this often once QUIET_MS has passed.
QUIET_CHECK_MS = 100.0

Verdict = Human | Machine | BeepHeard


@dataclass(frozen=True, slots=True)
class Begin:
    """The agent may begin: with its greeting, or (a machine's message may start) without."""

    greet: bool


@dataclass(frozen=True, slots=True)
class Note:
    """An entry for the call's audit."""

    type: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class MessageMayStart:
    """A machine answered and its message may start now: raise the `voicemail` event."""

    reason: str  # why a machine: "long greeting", "beep", "carrier"
    beep: bool  # whether a beep was heard (False: silence was taken for its end)


GateAction = Begin | Note | MessageMayStart


class AnswerGate:
    def __init__(self, *, placed: bool, detector: VoicemailDetector | None = None) -> None:
        self.placed = placed
        self.detector = detector
        self.started = False
        self._callee: CalleeHello | None = None
        self._next_check_ms: float | None = None
        self._early: list[Verdict] = []  # the carrier's verdicts before the start
        self._machine_reason = ""
        self._message_started = False
        # Whether the last frame was the callee's (a hello or a machine's greeting): the driver
        # keeps such a frame from the call core.
        self.took_frame = False

    @property
    def waiting(self) -> bool:
        """The agent waits for the callee (a placed call not yet begun)."""
        return self._callee is not None

    @property
    def done(self) -> bool:
        """Nothing is left for the gate to do: the driver may stop feeding it."""
        return self.started and self._callee is None and self.detector is None

    def start(self, now_ms: float) -> list[GateAction]:
        """The call is up: a call that came in begins; a placed one waits for its callee."""
        self.started = True
        if not self.placed:
            return [Begin(greet=True)]
        self._callee = CalleeHello(now_ms)
        self._next_check_ms = now_ms + QUIET_MS
        actions: list[GateAction] = [Note("waiting_for_callee", {})]
        for verdict in self._early:
            actions += self._verdict(verdict, "carrier")
        self._early.clear()
        return actions

    def frame(self, pcm: bytes, is_speech: bool, now_ms: float) -> list[GateAction]:
        """One 20 ms frame of the caller's audio at the detector's rate, with its VAD decision."""
        actions: list[GateAction] = []
        if self.detector is not None:
            actions += self._verdict(self.detector.frame(pcm, is_speech, now_ms), "server")
        callee = self._callee
        self.took_frame = callee is not None
        # A machine's greeting is no hello: with the detector listening, its verdict decides.
        if callee is not None and callee.frame(is_speech, now_ms) and self.detector is None:
            actions += self._hello_over(callee)
        return actions

    def carrier_verdict(self, verdict: Verdict) -> list[GateAction]:
        """The carrier's answering-machine detection: taken like the server's own detector's."""
        if not self.started:
            self._early.append(verdict)
            return []
        return self._verdict(verdict, "carrier")

    def next_deadline_ms(self) -> float | None:
        return self._next_check_ms if self._callee is not None else None

    def tick(self, now_ms: float) -> list[GateAction]:
        """The clock alone decides for a callee whose line sends no audio while quiet."""
        callee = self._callee
        if callee is None or self._next_check_ms is None or now_ms < self._next_check_ms:
            return []
        if self.detector is not None and callee.heard:
            self._next_check_ms = None  # the detector is listening to someone: it decides
            return []
        if callee.quiet(now_ms):
            return self._hello_over(callee)
        self._next_check_ms = now_ms + QUIET_CHECK_MS
        return []

    def _hello_over(self, callee: CalleeHello) -> list[GateAction]:
        self._callee = None
        return [Note("callee_hello", {"heard": callee.heard}), Begin(greet=True)]

    def _begin_waiting(self, *, greet: bool) -> list[GateAction]:
        if self._callee is None:
            return []
        self._callee = None
        return [Begin(greet=greet)]

    def _verdict(self, verdict: Verdict | None, source: str) -> list[GateAction]:
        if verdict is None or self._message_started:
            return []
        actions: list[GateAction]
        if isinstance(verdict, Human):
            self.detector = None
            data = {"answer": "person", "after_ms": round(verdict.after_ms), "source": source}
            return [Note("answering_machine", data), *self._begin_waiting(greet=True)]
        if isinstance(verdict, Machine):
            self._machine_reason = verdict.reason
            data = {
                "answer": "machine",
                "reason": verdict.reason,
                "after_ms": round(verdict.after_ms),
                "source": source,
            }
            actions = [Note("answering_machine", data)]
        else:
            beep = not verdict.assumed
            data = {"answer": "message may start", "beep": beep, "source": source}
            self._message_started = True
            self.detector = None
            actions = [
                Note("answering_machine", data),
                *self._begin_waiting(greet=False),
                MessageMayStart(self._machine_reason, beep),
            ]
        if self.detector is not None and self.detector.done:
            self.detector = None
        return actions

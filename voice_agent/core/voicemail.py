"""Answering-machine detection for outbound calls: a person or a machine, and when to speak.

Sans-I/O like the rest of the core: `VoicemailDetector.frame` takes each 20 ms frame of the far
end's audio, the server's own VAD decision for it and the time at the frame's end, and returns
a decision when it has one. The heuristics are Asterisk's app_amd ones (its amd.conf defaults
are quoted below), simplified to the greeting's length, plus a beep detector
(`voice_agent.audio.tones`):

- a person answers with a short greeting ("Hello?", 0.5-1.5 s) and then waits, silent, for the
  caller: a greeting followed by `AFTER_GREETING_SILENCE_MS` of silence is `Human`;
- a machine plays a long greeting with only short pauses: speech going on `LONG_GREETING_MS`
  after the greeting began is `Machine("long greeting")`;
- a beep at any time is `Machine("beep")`, even after `Human` was said (a short greeting, "Hi,
  it's Pat, leave a message", looks human until its beep);
- nothing decided by `DECISION_TIMEOUT_MS` after the answer is `Human`: talking to a machine
  wastes a message, hanging up on a person loses the call.

After `Machine` the detector listens for the beep and says `BeepHeard` once: when the beep has
ended and the line has gone quiet (the moment to start the message), or, when no beep comes,
after `NO_BEEP_SILENCE_MS` of silence (`assumed=True`: many mailboxes record without a tone).

Known limits: a person who answers with a long sentence ("Good afternoon, Riverside Plumbing,
Sam speaking, how can I help?") is taken for a machine, and a machine whose greeting is one
short phrase followed by a second of silence is taken for a person until its beep; a beep-like
sound near a person (a microwave, a phone's key tone) within `HUMAN_BEEP_WATCH_MS` of the
`Human` decision turns it into `Machine("beep")`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from voice_agent.audio.tones import Tone, ToneDetector

__all__ = ["BeepHeard", "Decision", "Human", "Machine", "VoicemailConfig", "VoicemailDetector"]

# Speech shorter than this is a click, a breath or line noise, not a word (amd.conf
# min_word_length = 100).
MIN_WORD_MS = 100
# A person says their greeting and waits for the caller: this much silence after it means a
# person (amd.conf after_greeting_silence = 800). Machines pause between sentences for less: at
# most 700 ms, as the VAD hears it, inside the greetings of the fixtures' tune half.
AFTER_GREETING_SILENCE_MS = 800
# A greeting still going on this long after it began is a machine's. On the tune half of the
# fixtures (tests/test_voicemail.py) the longest person's answer ran 1.84 s from its first
# speech frame to its last ("Hi, this is Sam speaking." in a slow eSpeak voice) and the shortest
# machine's first utterance 3.04 s ("Hey, it's Chris. Leave a message and I'll call you back.");
# 2500 is near the middle. With amd.conf's greeting = 1500, 4 of those 21 people were machines.
LONG_GREETING_MS = 2500
# Undecided this long after the answer: a person (amd.conf total_analysis_time = 5000), since
# hanging up on a person costs more than a message spoken over a machine's greeting.
DECISION_TIMEOUT_MS = 5000
# After Machine, no beep and this much silence: the mailbox is recording without a tone. Longer
# than a pause inside a greeting and than the gap between a greeting's last word and its beep
# (0.15-1 s in the fixtures); Voice Elements' beep-detector guide waits 3 s in the same case.
NO_BEEP_SILENCE_MS = 2500
# After Machine, at most this long for the beep whatever is heard: greetings rarely pass 30 s.
MAX_BEEP_WAIT_MS = 30_000
# After Human, a beep this soon still means a machine with a short greeting: its beep follows
# the greeting by a second or two, or a carrier's "record your message at the tone" first.
HUMAN_BEEP_WATCH_MS = 10_000


@dataclass(frozen=True)
class Human:
    """A person answered; `after_ms` since the answer."""

    after_ms: float


@dataclass(frozen=True)
class Machine:
    """A machine answered; `after_ms` since the answer."""

    after_ms: float
    reason: Literal["long greeting", "beep", "carrier"]  # carrier: its own detection said


@dataclass(frozen=True)
class BeepHeard:
    """Start the message now: `at_ms` on the caller's clock, after the beep (`tone`) and the
    silence after it, or, with `assumed`, after silence when no beep came."""

    at_ms: float
    assumed: bool = False
    tone: Tone | None = None


Decision = Human | Machine | BeepHeard


@dataclass(frozen=True)
class VoicemailConfig:
    frame_ms: int = 20
    min_word_ms: int = MIN_WORD_MS
    after_greeting_silence_ms: int = AFTER_GREETING_SILENCE_MS
    long_greeting_ms: int = LONG_GREETING_MS
    decision_timeout_ms: int = DECISION_TIMEOUT_MS
    no_beep_silence_ms: int = NO_BEEP_SILENCE_MS
    max_beep_wait_ms: int = MAX_BEEP_WAIT_MS
    human_beep_watch_ms: int = HUMAN_BEEP_WATCH_MS


_State = Literal["listening", "human", "machine", "done"]


class VoicemailDetector:
    """One outbound call's answering-machine detection, from the answer on.

    `answered_ms` is when the call was answered on the caller's clock; by default the start of
    the first frame fed. Once `done` (BeepHeard said, or the watch after Human over), frames are
    ignored and the caller may stop feeding them.
    """

    def __init__(
        self,
        sample_rate: int,
        config: VoicemailConfig | None = None,
        *,
        answered_ms: float | None = None,
    ) -> None:
        self.config = config or VoicemailConfig()
        self.tones = ToneDetector(sample_rate, frame_ms=self.config.frame_ms)
        self.state: _State = "listening"
        self._answered_ms = answered_ms
        self._decided_ms = 0.0  # when Human or Machine was last said, since the answer
        self._speech_run_ms = 0
        self._silence_run_ms = 0
        self._greeting_start_ms: float | None = None
        self._beep: Tone | None = None  # a beep that ended, waiting for the line to go quiet
        self._pending: deque[Decision] = deque()

    @property
    def done(self) -> bool:
        return self.state == "done" and not self._pending

    def frame(self, pcm: bytes, is_speech: bool, now_ms: float) -> Decision | None:
        """Feed one frame; `now_ms` is the time at its end. Returns at most one decision; a
        second one due on the same frame comes with the next."""
        if self.state != "done":
            self._step(pcm, is_speech, now_ms)
        return self._pending.popleft() if self._pending else None

    def _step(self, pcm: bytes, is_speech: bool, now_ms: float) -> None:
        config = self.config
        if self._answered_ms is None:
            self._answered_ms = now_ms - config.frame_ms
        elapsed = now_ms - self._answered_ms
        ended = self.tones.feed(pcm, now_ms)
        if ended is not None:
            self._beep = ended
        self._count_speech(is_speech, now_ms)

        if self.state in ("listening", "human") and self.tones.active is not None:
            self._decide(Machine(elapsed, "beep"), elapsed)
        if self.state == "machine":
            if self._beep is not None and not self.tones.in_tone:
                # A tone followed at once by another (the three of a special information tone)
                # is not over until the last one is: wait for a frame with none.
                self._say_beep(BeepHeard(now_ms, tone=self._beep))
            elif not self.tones.in_tone and (
                self._silence_run_ms >= config.no_beep_silence_ms
                or elapsed - self._decided_ms >= config.max_beep_wait_ms
            ):
                self._say_beep(BeepHeard(now_ms, assumed=True))
        elif self.state == "human":
            if elapsed - self._decided_ms >= config.human_beep_watch_ms:
                self.state = "done"
        elif self.state == "listening":
            self._listen(elapsed, now_ms)

    def _count_speech(self, is_speech: bool, now_ms: float) -> None:
        frame_ms = self.config.frame_ms
        self._speech_run_ms = self._speech_run_ms + frame_ms if is_speech else 0
        if self._speech_run_ms >= self.config.min_word_ms:
            self._silence_run_ms = 0
            if self._greeting_start_ms is None:
                self._greeting_start_ms = now_ms - self._speech_run_ms
        else:
            # Frames of a word too short so far count as silence until it is long enough.
            self._silence_run_ms += frame_ms

    def _listen(self, elapsed: float, now_ms: float) -> None:
        config = self.config
        start = self._greeting_start_ms
        if start is not None:
            if self._silence_run_ms == 0 and now_ms - start >= config.long_greeting_ms:
                self._decide(Machine(elapsed, "long greeting"), elapsed)
                return
            if self._silence_run_ms >= config.after_greeting_silence_ms:
                self._decide(Human(elapsed), elapsed)
                return
        if elapsed >= config.decision_timeout_ms:
            self._decide(Human(elapsed), elapsed)

    def _decide(self, decision: Human | Machine, elapsed: float) -> None:
        self._pending.append(decision)
        self._decided_ms = elapsed
        self.state = "human" if isinstance(decision, Human) else "machine"
        if isinstance(decision, Machine):
            # The no-beep wait counts silence from here: a pause before the decision is not
            # a mailbox waiting to record.
            self._silence_run_ms = 0

    def _say_beep(self, decision: BeepHeard) -> None:
        self._pending.append(decision)
        self.state = "done"

"""What the call core (voice_agent.core.call) asks its driver to do: plain values, one per
thing a driver does with the engines and the transport (start, feed, pause and finish the STT;
judge a turn; run the agent's turn or cancel it; synthesise; send audio, a mark, a clear;
commit what was heard; raise an event; audit; report a turn's timings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StartStt:
    pass


@dataclass(slots=True)  # made for every frame of speech: not frozen, see twilio.Media
class FeedStt:
    frame: bytes


@dataclass(frozen=True)
class PauseStt:
    """The caller paused: STT gets no more audio unless they speak again (see TurnStep)."""


@dataclass(frozen=True)
class FinishStt:
    pass


@dataclass(frozen=True)
class JudgeTurn:
    """The caller paused: gather the evidence of whether they have finished (the acoustic
    model's verdict on the turn's audio so far, the words so far) and hand it to
    `CallCore.turn_judged` with this `pause_id`. Only with an end-of-turn detector."""

    pause_id: int


@dataclass(frozen=True)
class StartUserTurn:
    """The caller's turn, for the agent to answer. `continues`: the caller went on after a
    pause the server took for the end of their turn, and `text` is the whole of it, both parts:
    it replaces that turn (whose reply, if any began, was cut and committed as heard)."""

    text: str
    continues: bool = False


@dataclass(frozen=True)
class CancelAgentTurn:
    pass


@dataclass(frozen=True)
class Synthesize:
    reply_id: int
    text: str


@dataclass(frozen=True)
class SendAudio:
    audio: bytes


@dataclass(frozen=True)
class SendMark:
    name: str


@dataclass(frozen=True)
class SendClear:
    pass


@dataclass(frozen=True)
class CommitReply:
    reply_id: int
    heard: str | None
    # How far into the reply's audio the caller heard: what a speech-to-speech model's item is
    # truncated to (its audio is one chunk). None when it was heard to its end. Left out of
    # equality: what a reply commits is its text; this only locates the cut in its audio.
    heard_ms: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RaiseEvent:
    name: str


@dataclass(frozen=True)
class Audit:
    type: str
    data: dict[str, Any]


@dataclass(frozen=True)
class TurnMetrics:
    data: dict[str, float | None]


Action = (
    StartStt
    | FeedStt
    | PauseStt
    | FinishStt
    | JudgeTurn
    | StartUserTurn
    | CancelAgentTurn
    | Synthesize
    | SendAudio
    | SendMark
    | SendClear
    | CommitReply
    | RaiseEvent
    | Audit
    | TurnMetrics
)

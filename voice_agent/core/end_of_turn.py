"""When the caller's turn is over: how much silence ends it, from an acoustic end-of-turn
model's verdict, the words so far and what the agent asked, between a short and a long
silence instead of one fixed one.

The call core asks for evidence when the caller pauses (the JudgeTurn action) and hands what
comes back to `silence_needed_ms`; the turn ends once the caller's silence reaches it. Without
evidence (no model, or it failed or was late) the fixed silence rule stands.
"""

from __future__ import annotations

from dataclasses import dataclass

from voice_agent.core.transcript_cues import Completeness, completeness


@dataclass(frozen=True)
class EndOfTurnConfig:
    """`enabled`: a detector answers JudgeTurn; otherwise every turn ends after the fixed
    silence (TurnConfig.end_of_turn_silence_ms)."""

    enabled: bool = False
    min_silence_ms: int = 200  # the shortest silence that ends a turn, however sure
    max_silence_ms: int = 2500  # the longest the caller's silence is ever waited out
    # The acoustic model's probability at or above which the caller sounds finished.
    finished_threshold: float = 0.5
    # Silence that ends a turn the model hears as unfinished but whose words say nothing.
    unsure_silence_ms: int = 1600


@dataclass(frozen=True)
class Evidence:
    """What is known at a pause. `acoustic`: the model's probability that the caller has
    finished (None: no model, or it failed); `text`: the words so far (None: not known);
    `expecting`: what the agent asked for ("phone", "number", "yes_no", ...)."""

    acoustic: float | None
    text: str | None
    expecting: str | None = None


@dataclass(frozen=True)
class Verdict:
    silence_ms: float  # the turn ends once the caller has been silent this long
    reason: str  # for the audit: which piece of evidence decided


def silence_needed_ms(
    evidence: Evidence, config: EndOfTurnConfig, fixed_silence_ms: float
) -> Verdict:
    """The silence after which this pause ends the turn."""
    cue = completeness(evidence.text, evidence.expecting)
    if cue is Completeness.UNFINISHED:
        return Verdict(config.max_silence_ms, "words unfinished")
    if cue is Completeness.COMPLETE:
        return Verdict(config.min_silence_ms, "answer complete")
    acoustic = evidence.acoustic
    if acoustic is None:
        return Verdict(fixed_silence_ms, "silence rule")
    if acoustic >= config.finished_threshold:
        return Verdict(config.min_silence_ms, "sounds finished")
    return Verdict(config.unsure_silence_ms, "sounds unfinished")

"""What matching an utterance against intents gives: the runtime's view of it, as flows and
`match_intent` in code blocks see it. The matchers themselves (by wording, by meaning) are the
flow brain's (voice_agent/brains/flows/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class IntentMatch:
    """An intent an utterance matched, how confidently (0..1), and its extracted parameters."""

    intent: str
    confidence: float
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MatchResult:
    """The utterance and the intents it matched above the threshold, best first."""

    text: str
    matches: tuple[IntentMatch, ...]

    @property
    def best(self) -> IntentMatch | None:
        return self.matches[0] if self.matches else None


class MatchesIntents(Protocol):
    """All the runtime asks of an agent's intent matcher."""

    def match(self, text: str, *, now: datetime) -> MatchResult: ...

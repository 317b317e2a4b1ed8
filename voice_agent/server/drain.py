"""Draining a worker: refuse new calls, let live ones finish, end the rest at a deadline.

Plain state over an injected clock, so the rules are testable without a server:

    serving --start()--> draining --deadline, or hurry()--> ending --last call ended--> (exit)

While draining, new calls are refused (WebSocket 1013, SIP 503, /healthz 503) and live calls
run on. At the deadline each call still live hears its agent's goodbye and is ended with
`REASON`; one that has not ended `GOODBYE_GRACE_S` later (the caller talked over the goodbye,
the TTS failed) is cut. The server exits once its last call has ended.
"""

from __future__ import annotations

import enum
import math
from typing import Any

# The end reason of a call the drain ended; outcome `interrupted` (voice_agent.store.outcomes).
REASON = "interrupted: server draining"
# How long a goodbye may take to play before the call is cut: a sentence or two of speech.
GOODBYE_GRACE_S = 15.0
REFUSAL = "this server is draining: call again to reach another one"


class Phase(enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"  # refusing new calls; live ones run on
    ENDING = "ending"  # the deadline has come: live calls hear the goodbye and end


class Drain:
    def __init__(self, deadline_s: float) -> None:
        if deadline_s < 0 or math.isnan(deadline_s):
            raise ValueError(f"a drain deadline must be 0 s or more, not {deadline_s}")
        self.deadline_s = deadline_s
        self.started_at: float | None = None
        self.ends_at: float | None = None
        self.why = ""

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def start(self, now: float, why: str) -> bool:
        """Begin draining (False when it already is: a second request changes nothing)."""
        if self.started_at is not None:
            return False
        self.started_at, self.ends_at, self.why = now, now + self.deadline_s, why
        return True

    def hurry(self, now: float) -> None:
        """The deadline is now (a second SIGTERM or Ctrl-C: the operator will not wait)."""
        if self.started_at is None:
            self.start(now, "told to stop at once")
        self.ends_at = min(self.ends_at if self.ends_at is not None else now, now)

    def phase(self, now: float) -> Phase:
        if self.ends_at is None:
            return Phase.SERVING
        return Phase.ENDING if now >= self.ends_at else Phase.DRAINING

    def time_left_s(self, now: float) -> float | None:
        """Seconds until the live calls are ended; None while serving."""
        if self.ends_at is None:
            return None
        return max(0.0, self.ends_at - now)

    def status(self, now: float, live_calls: int) -> dict[str, Any]:
        """What /healthz and POST /admin/drain say about it."""
        left = self.time_left_s(now)
        return {
            "status": "draining" if self.draining else "ok",
            "phase": self.phase(now).value,
            "why": self.why or None,
            "live_calls": live_calls,
            "deadline_in_s": round(left, 1) if left is not None else None,
        }

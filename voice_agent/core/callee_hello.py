"""When the agent of a call the server placed speaks first: after the callee's hello.

People answer a phone with a word ("Hello?", "Bella Vista, Ada speaking") and wait; an agent
that talks from the moment the line is up talks over it, and its first words are lost or heard
as rude. So the greeting waits for the callee's first words and a short pause after them, or,
if the callee says nothing, for a quiet spell (some answer in silence, waiting for the caller).
The callee's hello is no user turn: the agent's greeting answers it.

Plain code fed with VAD decisions and a clock (milliseconds), like the turn-taking core.
"""

from __future__ import annotations

# A pause this long after the callee's words ends their hello: shorter than the end-of-turn
# silence (a hello is one or two words, and the callee is waiting), longer than a breath.
PAUSE_MS = 450.0
# Less speech than this is a click or a breath on the line, not a hello.
MIN_SPEECH_MS = 120.0
# The callee has said nothing this long after answering: the agent speaks anyway.
QUIET_MS = 2500.0


class CalleeHello:
    """Feed every 20 ms frame's VAD decision; `frame` says True once the greeting may start."""

    def __init__(
        self,
        started_ms: float,
        *,
        frame_ms: float = 20.0,
        pause_ms: float = PAUSE_MS,
        min_speech_ms: float = MIN_SPEECH_MS,
        quiet_ms: float = QUIET_MS,
    ) -> None:
        self.started_ms = started_ms
        self.frame_ms = frame_ms
        self.pause_ms = pause_ms
        self.min_speech_ms = min_speech_ms
        self.quiet_ms = quiet_ms
        self.speech_ms = 0.0
        self._last_speech_ms: float | None = None

    @property
    def heard(self) -> bool:
        """Whether the callee has said something (more than a click)."""
        return self.speech_ms >= self.min_speech_ms

    def frame(self, is_speech: bool, now_ms: float) -> bool:
        if is_speech:
            self.speech_ms += self.frame_ms
            self._last_speech_ms = now_ms
            return False
        return self.quiet(now_ms)

    def quiet(self, now_ms: float) -> bool:
        """Whether the greeting may start at `now_ms` with no new audio."""
        if self.heard:
            assert self._last_speech_ms is not None
            return now_ms - self._last_speech_ms >= self.pause_ms
        if self._last_speech_ms is not None and now_ms - self._last_speech_ms < self.pause_ms:
            return False  # a short sound just now: let it turn out to be a hello or not
        return now_ms - self.started_ms >= self.quiet_ms

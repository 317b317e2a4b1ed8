"""Turn detection from per-frame VAD decisions: when a caller starts and stops an utterance.

A pre-roll of recent frames goes to STT with the first speech frames, so the first syllable,
which VAD only recognises after it began, is not lost.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TurnConfig:
    frame_ms: int = 20
    min_speech_ms: int = 100  # this much speech in a row starts an utterance
    end_of_turn_silence_ms: int = 600  # this much silence ends it
    pre_roll_ms: int = 300
    # How long the VAD goes on calling frames speech after the caller stops (its hangover, which
    # keeps word endings from being cut). That much of the end-of-turn silence has passed when
    # the VAD first says silence, so the turn ends end_of_turn_silence_ms after the real end of
    # speech rather than that long after the VAD noticed.
    vad_release_ms: int = 0
    # Silence after speech that STT still gets; the rest of the end-of-turn wait is held back
    # (and released only if speech resumes), since STT engines hallucinate words in silence.
    stt_tail_ms: int = 200


@dataclass
class TurnStep:
    """What one frame changed; `stt_frames` are the frames to hand to STT now, in order."""

    started: bool = False
    ended: bool = False
    stt_frames: list[bytes] = field(default_factory=list)


_NOTHING = TurnStep()


class TurnDetector:
    def __init__(self, config: TurnConfig) -> None:
        self.config = config
        self._pre_roll: deque[bytes] = deque(maxlen=max(1, config.pre_roll_ms // config.frame_ms))
        self._speech_run_ms = 0
        self._silence_run_ms = 0
        self.in_speech = False
        self.speech_start_ms: float | None = None  # when the current utterance's speech began
        self.speech_end_ms: float | None = None  # end of the last speech frame heard
        self._held: list[bytes] = []

    def feed(self, frame: bytes, is_speech: bool, now_ms: float) -> TurnStep:
        """`now_ms` is the time at the end of this frame."""
        frame_ms = self.config.frame_ms
        if not self.in_speech:
            self._pre_roll.append(frame)
            if not is_speech:
                self._speech_run_ms = 0
                return _NOTHING
            self._speech_run_ms += frame_ms
            if self._speech_run_ms < self.config.min_speech_ms:
                return _NOTHING
            self.in_speech = True
            self._silence_run_ms = 0
            self.speech_start_ms = now_ms - self._speech_run_ms
            self.speech_end_ms = now_ms
            frames = list(self._pre_roll)
            self._pre_roll.clear()
            return TurnStep(started=True, stt_frames=frames)
        if is_speech:
            self._silence_run_ms = 0
            self.speech_end_ms = now_ms
            frames, self._held = [*self._held, frame], []
            return TurnStep(stt_frames=frames)
        self._silence_run_ms += frame_ms
        if self._silence_run_ms + self.config.vad_release_ms >= self.config.end_of_turn_silence_ms:
            self.in_speech = False
            self._speech_run_ms = 0
            self._held.clear()
            return TurnStep(ended=True)
        if self._silence_run_ms <= self.config.stt_tail_ms:
            return TurnStep(stt_frames=[frame])
        self._held.append(frame)
        return TurnStep()

    def speech_ms(self, now_ms: float) -> float:
        """How long the current utterance has lasted (0 outside one)."""
        if not self.in_speech or self.speech_start_ms is None:
            return 0.0
        return now_ms - self.speech_start_ms

"""Turn detection from per-frame VAD decisions: when a caller starts and stops an utterance.

A pre-roll of recent frames goes to STT with the first speech frames, so the first syllable,
which VAD only recognises after it began, is not lost.

The end-of-turn silence is counted from the best estimate of when the caller's speech really
ended. A VAD goes on saying "speech" after that (its hangover, and often a few frames of a
decaying tail), so the estimate is the earlier of: the end of the last speech frame within
`quiet_db` of the utterance's loudest frame, and the VAD's own last speech frame less the
hangover it declares (`vad_release_ms`, what remains when background noise keeps the tail loud).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from voice_agent.audio.frames import frame_rms


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
    # Speech frames this far below the utterance's loudest frame count as silence towards the
    # end of the turn (not for starting one, nor for what STT gets); None: only the VAD decides.
    quiet_db: float | None = 35.0
    # Silence after speech that STT still gets; the rest of the end-of-turn wait is held back
    # (and released only if speech resumes), since STT engines hallucinate words in silence.
    stt_tail_ms: int = 200
    # Speech that begins this soon after a turn ended, before the agent's answer to it has been
    # heard to the end, is the rest of that turn (core/continuation.py, docs/protocol.md).
    continuation_window_ms: int = 1500


@dataclass
class TurnStep:
    """What one frame changed; `stt_frames` are the frames to hand to STT now, in order."""

    started: bool = False
    ended: bool = False
    # STT has all the audio it gets unless the caller speaks again (stt_tail_ms of silence):
    # an engine that decodes whole utterances can start, inside the end-of-turn wait.
    paused: bool = False
    stt_frames: list[bytes] = field(default_factory=list)


_NOTHING = TurnStep()
_PAUSED = TurnStep(paused=True)


class TurnDetector:
    def __init__(self, config: TurnConfig) -> None:
        self.config = config
        self._pre_roll: deque[bytes] = deque(maxlen=max(1, config.pre_roll_ms // config.frame_ms))
        self._speech_run_ms = 0
        self._silence_run_ms = 0
        self.in_speech = False
        self.speech_start_ms: float | None = None  # when the current utterance's speech began
        self.speech_end_ms: float | None = None  # end of the caller's speech, best estimate
        self._held: list[bytes] = []
        self._peak = 0  # the utterance's loudest speech frame, RMS
        self._quiet_ratio = 10 ** (config.quiet_db / 20) if config.quiet_db is not None else None
        self._vad_silent = False  # the VAD has said silence since the last loud speech frame
        # The silence that ends this pause's turn: the fixed rule unless the call core, having
        # weighed the pause (core/end_of_turn.py), sets another; reset when speech resumes.
        self.default_silence_ms: float = config.end_of_turn_silence_ms
        self.required_silence_ms: float = self.default_silence_ms

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
            self.required_silence_ms = self.default_silence_ms
            self._vad_silent = False
            self._peak = frame_rms(frame)
            self.speech_start_ms = now_ms - self._speech_run_ms
            self.speech_end_ms = now_ms
            frames = list(self._pre_roll)
            self._pre_roll.clear()
            return TurnStep(started=True, stt_frames=frames)
        if is_speech and self._loud(frame):
            self._silence_run_ms = 0
            self._vad_silent = False
            self.speech_end_ms = now_ms
            self.required_silence_ms = self.default_silence_ms
            frames, self._held = [*self._held, frame], []
            return TurnStep(stt_frames=frames)
        if is_speech:
            self._silence_run_ms += frame_ms  # a quiet tail: the caller has stopped
        else:
            if not self._vad_silent:
                # The VAD's first "silence" since loud speech: its hangover, less the quiet
                # frames already counted, had passed since the speech ended.
                self._vad_silent = True
                self._silence_run_ms += max(0, self.config.vad_release_ms - self._silence_run_ms)
            self._silence_run_ms += frame_ms
        if self._silence_run_ms >= self.required_silence_ms:
            return self.end()
        if self._silence_run_ms <= self.config.stt_tail_ms:
            return TurnStep(stt_frames=[frame])
        # A quiet tail past STT's share is held like silence: released if speech resumes.
        self._held.append(frame)
        return _PAUSED if len(self._held) == 1 else _NOTHING

    @property
    def silence_ms(self) -> float:
        """How long the caller has been silent inside the current utterance (0 while they
        speak, and outside one)."""
        return self._silence_run_ms if self.in_speech else 0.0

    def end(self) -> TurnStep:
        """The utterance's turn ends now (its silence has reached what ends it)."""
        self.in_speech = False
        self._speech_run_ms = 0
        self._held.clear()
        self.required_silence_ms = self.default_silence_ms
        return TurnStep(ended=True)

    def _loud(self, frame: bytes) -> bool:
        """Whether a speech frame is within quiet_db of the utterance's loudest (and note it)."""
        ratio = self._quiet_ratio
        if ratio is None:
            return True
        level = frame_rms(frame)
        if level > self._peak:
            self._peak = level
        return level * ratio >= self._peak

    def speech_ms(self, now_ms: float) -> float:
        """How long the current utterance has lasted (0 outside one)."""
        if not self.in_speech or self.speech_start_ms is None:
            return 0.0
        return now_ms - self.speech_start_ms

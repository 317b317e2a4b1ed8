"""The call core's settings from an agent's voice settings (the `voice:` block of the config):
what the pipeline builds each call's core with, and the measurements (tests/support/turn_sim.py,
scripts/eval_pause.py) build theirs with, so that they measure the server's own settings."""

from __future__ import annotations

from voice_agent.config import VoiceSettings
from voice_agent.core import call as core
from voice_agent.core.end_of_turn import EndOfTurnConfig
from voice_agent.core.turns import TurnConfig


def core_config(
    voice: VoiceSettings,
    no_input_timeout_s: float,
    vad_release_ms: int = 0,
) -> core.CoreConfig:
    return core.CoreConfig(
        turn=TurnConfig(
            min_speech_ms=voice.turn.min_speech_ms,
            end_of_turn_silence_ms=voice.turn.end_of_turn_silence_ms,
            pre_roll_ms=voice.turn.pre_roll_ms,
            vad_release_ms=vad_release_ms,
            quiet_db=voice.turn.quiet_db,
            continuation_window_ms=voice.turn.continuation_window_ms,
        ),
        end_of_turn=EndOfTurnConfig(
            enabled=voice.turn.detector == "smart",
            min_silence_ms=voice.turn.min_silence_ms,
            max_silence_ms=voice.turn.max_silence_ms,
            finished_threshold=voice.turn.finished_threshold,
            unsure_silence_ms=voice.turn.unsure_silence_ms,
        ),
        interruption=core.InterruptionConfig(
            min_interruption_ms=voice.interruption.min_interruption_ms,
            min_interruption_words=voice.interruption.min_interruption_words,
            false_interruption_timeout_ms=voice.interruption.false_interruption_timeout_ms,
            backchannels=tuple(voice.interruption.backchannels),
            resume_after_false_interruption=voice.interruption.resume_after_false_interruption,
            backchannel_max_ms=voice.interruption.backchannel_max_ms,
        ),
        no_input_timeout_ms=int(no_input_timeout_s * 1000),
    )

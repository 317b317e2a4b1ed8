"""The end-of-turn model interface: how likely a caller's turn so far is finished, from its
audio alone, and the loader that turns a configured name or path into a model."""

from __future__ import annotations

from typing import Protocol

from voice_agent.errors import VoiceAgentError

SAMPLE_RATE = 16000


class TurnModelError(VoiceAgentError):
    """A turn model that cannot be loaded or audio it cannot take; the message names what."""


class TurnModel(Protocol):
    sample_rate: int  # of the PCM end_probability takes: 16000

    def end_probability(self, pcm: bytes) -> float:
        """PCM16 mono of the caller's turn so far, up to now (a model looks at its last
        seconds only: Smart Turn at 8 s): the probability that the speaker has finished.
        Synchronous and safe to call from several executor threads at once."""
        ...


def load_turn_model(name_or_path: str) -> TurnModel:
    """A bundled model's name (`smart-turn-v3.2`) or the path of a Smart Turn ONNX file.
    Raises TurnModelError naming what is wrong (unknown name, no such file, not a model)."""
    from voice_agent.engines.turn.smart_turn import SmartTurn, resolve_model

    return SmartTurn(resolve_model(name_or_path))

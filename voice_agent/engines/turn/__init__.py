"""Acoustic end-of-turn models: the TurnModel interface and `load_turn_model` (Smart Turn)."""

from voice_agent.engines.turn.base import SAMPLE_RATE, TurnModel, TurnModelError, load_turn_model

__all__ = ["SAMPLE_RATE", "TurnModel", "TurnModelError", "load_turn_model"]

"""Acoustic end-of-turn models: does the caller sound finished? (placeholder until the
Smart Turn engine lands; see engines/turn/base.py there)."""

from __future__ import annotations

from typing import Protocol


class TurnModel(Protocol):
    sample_rate: int

    def end_probability(self, pcm: bytes) -> float:
        """PCM16 mono at `sample_rate`, the caller's turn so far: the probability that they
        have finished. Thread-safe: calls run in a thread pool."""
        ...

"""Sentence embeddings for intent matching by meaning (brains/flows/semantic.py)."""

from voice_agent.engines.embedding.base import (
    EmbeddingError,
    SentenceEncoder,
    load_encoder,
)

__all__ = ["EmbeddingError", "SentenceEncoder", "load_encoder"]

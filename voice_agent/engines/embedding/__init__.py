"""Sentence embeddings, for matching what callers say to intents by meaning."""

from voice_agent.engines.embedding.base import (
    EmbeddingError,
    SentenceEncoder,
    load_encoder,
)

__all__ = ["EmbeddingError", "SentenceEncoder", "load_encoder"]

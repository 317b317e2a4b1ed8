"""The sentence encoder interface: texts in, unit vectors out, so that a dot product is the
cosine similarity of two meanings; and the loader that turns a configured name or path into
an encoder (all-MiniLM-L6-v2 on numpy, or another BERT-style model's folder)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from voice_agent.errors import VoiceAgentError

BUNDLED_NAME = "all-MiniLM-L6-v2"


class EmbeddingError(VoiceAgentError):
    """An encoder that cannot be loaded; the message names the model and what is wrong."""


class SentenceEncoder(Protocol):
    name: str  # identifies the vectors: a cache of phrase vectors is kept per name
    dimensions: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dimensions) float32, each row of length 1. Synchronous, safe to call
        from several threads at once; an empty text gets a vector too."""
        ...


_LOADED: dict[str, SentenceEncoder] = {}
_LOCK = threading.Lock()


def load_encoder(name_or_path: str) -> SentenceEncoder:
    """`all-MiniLM-L6-v2` (installed by scripts/_env.sh) or the folder of a BERT-style
    sentence-transformers model (config.json, model.safetensors, tokenizer.json). Models are
    loaded once per process and shared: their weights are read-only. Raises EmbeddingError
    naming what is wrong."""
    from voice_agent.engines.embedding.minilm import BertEncoder, resolve_model

    folder = resolve_model(name_or_path)
    key = str(folder.resolve())
    with _LOCK:
        encoder = _LOADED.get(key)
        if encoder is None:
            encoder = _LOADED[key] = BertEncoder(folder)
    return encoder

"""The embedded sentence encoder (engines/embedding, all-MiniLM-L6-v2 on numpy): requests said
in other words lie closer than requests that mean something else, and a model path that is
not a model is an error naming it. Parity with sentence-transformers itself is checked by
scripts/check_minilm_parity.py (it needs PyTorch, so it runs in a scratch environment)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from voice_agent.engines.embedding import EmbeddingError, SentenceEncoder, load_encoder


@pytest.fixture(scope="module")
def encoder() -> SentenceEncoder:
    return load_encoder("all-MiniLM-L6-v2")


def test_a_paraphrase_is_nearer_than_another_request(encoder: SentenceEncoder) -> None:
    cancel, paraphrase, book, parking = encoder.encode(
        [
            "i need to cancel my booking",
            "we won't be able to come after all, please take us off the list",
            "i'd like to book a table for four",
            "where can i park my car",
        ]
    )
    assert paraphrase @ cancel > paraphrase @ parking
    assert float(np.linalg.norm(paraphrase)) == pytest.approx(1.0, abs=1e-5)
    assert book @ cancel > parking @ cancel  # both about a booking


def test_empty_huge_and_garbage_text_give_unit_vectors(encoder: SentenceEncoder) -> None:
    vectors = encoder.encode(["", " ".join(["table"] * 10_000), "\x00\xff\ufffd" * 50])
    assert vectors.shape == (3, encoder.dimensions)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_a_model_path_that_is_not_a_model_is_named(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingError, match="does not exist"):
        load_encoder(str(tmp_path / "nowhere"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(EmbeddingError, match=r"no model\.safetensors, tokenizer\.json"):
        load_encoder(str(tmp_path))

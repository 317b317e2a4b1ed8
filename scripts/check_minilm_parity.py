"""Checks voice_agent's numpy all-MiniLM-L6-v2 against sentence-transformers on the same files.

sentence-transformers (and PyTorch) are not dependencies: run this in a scratch environment
that has them, e.g.

    python3 -m venv /tmp/st && /tmp/st/bin/pip install torch sentence-transformers
    /tmp/st/bin/python scripts/check_minilm_parity.py

It prints the largest difference between the two encoders' vectors and their cosine over a
set of lines (utterances of every kind, an empty one, a long one past the token limit) and
fails if any cosine is below 0.9999.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LINES = [
    "i'd like to book a table for four on friday at half seven",
    "um so yeah we can't make it tonight after all, sorry",
    "what time do you close on sundays",
    "no",
    "yes please",
    "is this the dentist",
    "",
    "Hello? HELLO?! 123 456 7890 £5 café naïve",
    " ".join(["word"] * 400),
]


def main() -> None:
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from voice_agent.engines.embedding.minilm import MAX_TOKENS, BertEncoder, resolve_model

    folder = resolve_model(sys.argv[1] if len(sys.argv) > 1 else "all-MiniLM-L6-v2")
    ours = BertEncoder(folder).encode(LINES)
    reference = SentenceTransformer(str(folder), device="cpu")
    reference.max_seq_length = MAX_TOKENS
    theirs = reference.encode(LINES, normalize_embeddings=True, convert_to_numpy=True)
    cosines = (ours * theirs).sum(axis=1)
    print(
        f"{len(LINES)} lines: largest difference {np.abs(ours - theirs).max():.2e}, "
        f"lowest cosine {cosines.min():.6f}"
    )
    if cosines.min() < 0.9999:
        sys.exit("the encoders disagree")


if __name__ == "__main__":
    main()

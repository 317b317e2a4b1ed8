"""Cuts streamed agent text into sentences, so TTS can start on the first one at once."""

from __future__ import annotations

import re

# A sentence ends at . ! ? (or ; :) followed by space; "Dr." style abbreviations stay whole.
_END = re.compile(r"(?<=[.!?;:])[\"')\]]*\s+")
_ABBREVIATIONS = frozenset(
    {"mr.", "mrs.", "ms.", "dr.", "st.", "no.", "e.g.", "i.e.", "vs.", "etc."}
)


class SentenceSplitter:
    """Feed text deltas; get back complete sentences. Very short fragments wait for more text."""

    def __init__(self, min_chars: int = 12) -> None:
        self._buffer = ""
        self._min_chars = min_chars

    def push(self, text: str) -> list[str]:
        self._buffer += text
        sentences: list[str] = []
        start = 0
        for match in _END.finditer(self._buffer):
            candidate = self._buffer[start : match.start()].strip()
            last_word = candidate.rsplit(" ", 1)[-1].lower()
            if last_word in _ABBREVIATIONS or len(candidate) < self._min_chars:
                continue
            sentences.append(candidate)
            start = match.end()
        self._buffer = self._buffer[start:]
        return sentences

    def flush(self) -> list[str]:
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []

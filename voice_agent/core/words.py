"""A transcript's words as the call core compares them: lower case, hyphens split."""

from __future__ import annotations

import re

_WORDS = re.compile(r"[a-z0-9']+")


def words_of(text: str) -> list[str]:
    return _WORDS.findall(text.lower().replace("-", " "))

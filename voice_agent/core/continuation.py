"""Joining a caller's sentence that a pause split in two: the words after the pause are the
rest of the turn before it, not a new one (the rule's window is in docs/protocol.md)."""

from __future__ import annotations

import re

# A recogniser ends every utterance as if it were a sentence ("He might even have been."):
# a full stop, comma or ellipsis at the join is the pause, not the caller's punctuation.
_TRAILING_PAUSE = re.compile(r"[\s.,;:…-]+$")
# Words whose capital is their own, not the start of a sentence the recogniser assumed.
_OWN_CAPITAL = re.compile(r"^(?:I\b|I'|[A-Z]{2})")


def join_utterances(before: str, added: str) -> str:
    """`before` and then `added` as one utterance: "He might even have been." + "Made amiable
    himself." -> "He might even have been made amiable himself."."""
    before, added = before.strip(), added.strip()
    if not before or not added:
        return before or added
    if before[-1] in "?!":
        return f"{before} {added}"
    if not _OWN_CAPITAL.match(added):
        added = added[0].lower() + added[1:]
    return f"{_TRAILING_PAUSE.sub('', before)} {added}"

#!/usr/bin/env python3
"""Writes tests/fixtures/voicemail: the Piper (joe) lines of tests/test_voicemail.py's greetings
and answers, as 8 kHz mu-law, named by a hash of voice and text.

    .venv/bin/python scripts/make_voicemail_fixtures.py

Only Piper's lines are stored: synthesizing them takes 3 to 13 s on two cores, too long for a
test that should run in seconds; eSpeak NG's take 0.4 s and are made by the test itself. The
test synthesizes any stored line that is missing (slowly), so a changed text still works; run
this again after changing the texts, and it removes the files no text uses any more.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import test_voicemail as corpus  # noqa: E402


def main() -> None:
    wanted = [item for item in corpus.wanted_speech() if item[0] in corpus.STORED_VOICES]
    spoken = asyncio.run(corpus.synthesize(wanted))
    corpus.SPEECH.mkdir(parents=True, exist_ok=True)
    keep = set()
    for (voice, text), ulaw in spoken.items():
        path = corpus.speech_file(voice, text)
        path.write_bytes(ulaw)
        keep.add(path)
        print(f"{path.relative_to(ROOT)}  {len(ulaw) / corpus.RATE:5.2f} s  {text}")
    for stale in set(corpus.SPEECH.glob("*.ulaw")) - keep:
        stale.unlink()
        print(f"removed {stale.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

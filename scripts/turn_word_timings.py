"""Regenerates tests/fixtures/turn_eval/word_timings.json: where each word of the turn-taking
set's recordings is, from the bundled Whisper tiny.en with word timestamps (two processes;
about 15 minutes on this 2-core machine under other load).

    PYTHONPATH=. .venv/bin/python scripts/turn_word_timings.py
"""

from __future__ import annotations

import json
from multiprocessing import Pool
from typing import Any

import numpy as np

from tests.support import turn_eval
from voice_agent.engines.stt.whisper import bundled_model_path

_model: Any = None


def _load() -> None:
    global _model
    from faster_whisper import WhisperModel

    _model = WhisperModel(
        str(bundled_model_path()), device="cpu", compute_type="int8", cpu_threads=1
    )


def _words(recording: turn_eval.Recording) -> tuple[str, list[list[object]]]:
    audio = np.frombuffer(recording.pcm(), dtype="<i2").astype(np.float32) / 32768.0
    segments, _ = _model.transcribe(
        audio,
        language="en",
        beam_size=1,
        temperature=0.0,
        # A 10 s encoder window, not 30 s: three times cheaper, and the utterances are short
        # (Codec2's long ones are taken 10 s at a time).
        chunk_length=10,
        word_timestamps=True,
        condition_on_previous_text=False,
        vad_filter=False,
    )
    words = [
        [w.word.strip(), round(w.start, 3), round(w.end, 3)]
        for segment in segments
        for w in segment.words or ()
    ]
    return recording.name, words


def main() -> None:
    turn_eval.word_timings.cache_clear()
    turn_eval.TIMINGS.write_text('{"recordings": {}}\n')  # without timings: whole recordings
    turn_eval.word_timings.cache_clear()
    found: dict[str, list[list[object]]] = {}
    with Pool(2, initializer=_load) as pool:
        for name, words in pool.imap(_words, turn_eval.recordings()):
            found[name] = words
            print(name, " ".join(str(w[0]) for w in words), flush=True)
            _write(found)  # as it goes: a stopped run leaves what it has


def _write(found: dict[str, list[list[object]]]) -> None:
    lines = ",\n".join(f"{json.dumps(name)}: {json.dumps(words)}" for name, words in found.items())
    tmp = turn_eval.TIMINGS.with_suffix(".tmp")
    tmp.write_text(
        "{\n"
        '"about": "Word timings of tests/support/turn_eval.py\'s recordings: Whisper tiny.en '
        "(bundled), faster-whisper word_timestamps, beam 1, 10 s windows; "
        '[word, start s, end s]",\n'
        '"command": "PYTHONPATH=. .venv/bin/python scripts/turn_word_timings.py",\n'
        f'"recordings": {{\n{lines}\n}}\n}}\n'
    )
    tmp.replace(turn_eval.TIMINGS)


if __name__ == "__main__":
    main()

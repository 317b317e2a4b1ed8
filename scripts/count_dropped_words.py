"""How many utterances with words the call core would drop as noise when said over the agent,
under the rule before and after "words are never thrown away" (docs/performance.md).

Each utterance goes through Whisper (the default agent's engine, its prompt included) over the
phone path, and its transcript through the over-the-agent decision: before, a transcript was
dropped when Whisper's confidence was under 0.47, or it held one word that was not one of the
confirm words; now only when it has no words, or its words are all backchannels and hums.
Sets: the real recordings (tests/support/speech_eval.py), their second halves (cut at the word
boundary nearest the middle: what a caller says after a pause), the off-script lines in the
three fixture voices, and the backchannel fixtures.

    .venv/bin/python scripts/count_dropped_words.py
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.speech_eval import (  # noqa: E402
    FIXTURES,
    Utterance,
    default_agent_phrases,
    offscript_lines,
    real_speech,
)
from voice_agent.audio.g711 import ulaw_decode  # noqa: E402
from voice_agent.audio.resample import StreamResampler  # noqa: E402
from voice_agent.core.call import _FILLER, DEFAULT_BACKCHANNELS  # noqa: E402
from voice_agent.core.words import words_of  # noqa: E402
from voice_agent.engines.stt.whisper import (  # noqa: E402
    WhisperDecoder,
    WhisperOptions,
    bundled_model_path,
    prompt_from,
)

OLD_FLOOR = 0.47
OLD_CONFIRM_WORDS = {"stop", "wait", "no", "yes", "hello", "hey", "sorry", "hold", "help"}
BACKCHANNEL_WORDS = {w for phrase in DEFAULT_BACKCHANNELS for w in words_of(phrase)}


def real_words(text: str) -> list[str]:
    return [w for w in words_of(text) if w not in BACKCHANNEL_WORDS and not _FILLER.match(w)]


def dropped_before(text: str, confidence: float | None) -> bool:
    real = real_words(text)
    if confidence is not None and confidence < OLD_FLOOR:
        real = []
    return not (len(real) >= 2 or (len(real) == 1 and real[0] in OLD_CONFIRM_WORDS))


def dropped_now(text: str) -> bool:
    return not real_words(text)


def phone(utterance: Utterance) -> bytes:
    return utterance.audio("phone")


def second_half(audio: bytes) -> bytes:
    """From the quietest 20 ms within 0.3 s of the middle: what follows a mid-phrase pause."""
    import numpy as np

    samples = np.frombuffer(audio, dtype="<i2")
    frame = 320  # 20 ms at 16 kHz
    middle = samples.size // 2 // frame
    around = range(max(1, middle - 15), min(samples.size // frame - 1, middle + 15))
    quietest = min(around, key=lambda i: float(np.abs(samples[i * frame : (i + 1) * frame]).mean()))
    return samples[quietest * frame :].tobytes()


def fixture(name: str) -> bytes:
    up = StreamResampler(8000, 16000)
    return up.process(ulaw_decode((FIXTURES / f"{name}.ulaw").read_bytes())) + up.flush()


async def main() -> None:
    options = WhisperOptions(
        model_path=str(bundled_model_path()), threads=2, prompt=prompt_from(default_agent_phrases())
    )
    decoder = WhisperDecoder(options)
    speech = real_speech()
    sets: dict[str, list[tuple[str, bytes, bool]]] = {
        "real speech": [(u.name, phone(u), True) for u in speech],
        "real speech, second halves": [(u.name, second_half(phone(u)), True) for u in speech],
        "off-script lines (3 voices)": [(u.name, phone(u), True) for u in offscript_lines()],
        "backchannel fixtures": [
            (p.stem, fixture(p.stem), False) for p in sorted(FIXTURES.glob("*_bc*.ulaw"))
        ],
        "cough, silence": [(n, fixture(n), False) for n in ("cough", "silence")],
    }
    print(
        "| set | utterances | no words from Whisper | with words, dropped before |"
        " with words, dropped now |"
    )
    print("| --- | --- | --- | --- | --- |")
    for label, items in sets.items():
        counts: Counter[str] = Counter()
        for name, audio, spoken in items:
            transcript = decoder.transcribe(audio)
            counts["all"] += 1
            if not words_of(transcript.text):
                counts["silent"] += 1
                continue
            before = dropped_before(transcript.text, transcript.confidence)
            now = dropped_now(transcript.text)
            counts["before"] += before
            counts["now"] += now
            if before != now or (not spoken and not now):
                rule = "a turn now" if before and not now else "dropped now"
                print(f"  {label}: {name} {transcript.text!r} ({rule})", file=sys.stderr)
        print(
            f"| {label} | {counts['all']} | {counts['silent']} | {counts['before']} |"
            f" {counts['now']} |"
        )


if __name__ == "__main__":
    asyncio.run(main())

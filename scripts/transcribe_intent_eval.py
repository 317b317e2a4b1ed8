#!/usr/bin/env python3
"""Whisper's transcripts of the intent evaluation lines, as the fixture voices say them on a
phone call: regenerates tests/fixtures/intents/transcripts.json.

Why (issue 29): the intent matcher's accuracy should be measured on what Whisper really writes
down when a caller says an evaluation line, not on the clean text of tests/fixtures/intents/
eval.yaml. Each line is spoken by the three fixture voices exactly as scripts/make_fixtures.py
makes them (Piper joe, eSpeak NG en-us and en-us+f3; trimmed, peak-normalised), sent down the
phone path as the /twilio gateway gets it (8 kHz mu-law, decoded and upsampled to 16 kHz by
the server's streaming resampler, as tests/support/speech_eval.py does) and transcribed by the
default agent's STT (config/agents.yaml: Whisper tiny.en, int8, beam 1, no prompt) in a pool
of worker processes, fed as the pipeline feeds it (speech_eval.transcribe).

    .venv/bin/python scripts/transcribe_intent_eval.py                    # all three voices
    .venv/bin/python scripts/transcribe_intent_eval.py --voices joe espeak --out /tmp/t.json

Needs the `piper` and `whisper` extras (scripts/test installs them); about five minutes on two
cores. Piper samples noise, so a re-run may change a few transcripts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # its sibling, as mypy scripts/*.py names it

from make_fixtures import ULAW_RATE, VOICES, speak  # noqa: E402

from tests.support import speech_eval  # noqa: E402
from voice_agent.audio.g711 import ulaw_decode, ulaw_encode  # noqa: E402
from voice_agent.audio.resample import StreamResampler, resample  # noqa: E402
from voice_agent.config import SttSettings, load_config  # noqa: E402
from voice_agent.engines.stt import Stt, SttConfig, make_stt  # noqa: E402
from voice_agent.engines.tts import make_tts  # noqa: E402

EVAL = ROOT / "tests" / "fixtures" / "intents" / "eval.yaml"
OUT = ROOT / "tests" / "fixtures" / "intents" / "transcripts.json"
AGENTS = ROOT / "config" / "agents.yaml"
WORKERS = 2  # Whisper worker processes: one per core of the machine this was made on
PROGRESS_EVERY = 50


def eval_texts() -> list[str]:
    """The evaluation lines' texts, in the file's order, each once."""
    lines = yaml.safe_load(EVAL.read_text(encoding="utf-8"))["lines"]
    return list(dict.fromkeys(str(line["text"]) for line in lines))


def default_stt() -> SttSettings:
    """The STT settings of config/agents.yaml's default agent, as the server resolves them."""
    config = load_config(AGENTS).config
    settings = config.agents[config.default_agent].voice(config.voice).stt
    if settings.provider != "whisper":
        sys.exit(f"the default agent's STT is {settings.provider}, not whisper")
    return settings


def make_whisper(settings: SttSettings, processes: int) -> Stt:
    """The engine as server/app.py builds it from `settings`, in `processes` workers."""
    return make_stt(
        SttConfig(
            provider=settings.provider,
            language_model=settings.language_model,
            phrases=tuple(settings.phrases),
            model=settings.model,
            processes=processes,
            compute_type=settings.compute_type,
            beam_size=settings.beam_size,
            threads=settings.threads,
            prompt=settings.prompt,
        )
    )


def phone_audio(samples: np.ndarray, rate: int) -> bytes:
    """Speech from `speak` as Whisper gets it over /twilio: make_fixtures.save's 8 kHz mu-law,
    decoded and upsampled to 16 kHz by the server's streaming resampler (Utterance.audio's
    phone path in tests/support/speech_eval.py)."""
    pcm = np.clip(np.round(samples), -32768, 32767).astype("<i2").tobytes()
    line = ulaw_encode(resample(pcm, rate, ULAW_RATE))
    up = StreamResampler(ULAW_RATE, speech_eval.RATE)
    return up.process(ulaw_decode(line)) + up.flush()


async def transcribe_all(
    texts: list[str], voices: list[str], stt: Stt, workers: int
) -> dict[str, dict[str, str]]:
    """Every text in every voice, synthesised here while the workers decode."""
    results: dict[str, dict[str, str]] = {voice: {} for voice in voices}
    total = len(texts) * len(voices)
    # Synthesis runs ahead of decoding by at most `workers` utterances.
    gate = asyncio.Semaphore(2 * workers)
    started = time.monotonic()
    done = 0
    tasks: list[asyncio.Task[None]] = []

    async def one(voice: str, text: str, audio: bytes) -> None:
        nonlocal done
        try:
            results[voice][text] = (await speech_eval.transcribe(stt, audio)).strip()
        finally:
            gate.release()
        done += 1
        if done % PROGRESS_EVERY == 0 or done == total:
            elapsed = time.monotonic() - started
            print(
                f"{done}/{total} utterances, {elapsed:.0f} s, {done / elapsed:.2f} a second",
                flush=True,
            )

    for voice in voices:
        config, _ = VOICES[voice]
        tts = make_tts(config)
        try:
            for text in texts:
                await gate.acquire()
                audio = phone_audio(await speak(tts, text), tts.sample_rate)
                tasks.append(asyncio.create_task(one(voice, text, audio)))
        finally:
            await tts.aclose()
    await asyncio.gather(*tasks)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=OUT, help="the JSON file to write")
    parser.add_argument(
        "--voices", nargs="+", choices=list(VOICES), default=list(VOICES), help="fixture voices"
    )
    args = parser.parse_args()
    voices: list[str] = list(dict.fromkeys(args.voices))
    texts = eval_texts()
    settings = default_stt()
    print(
        f"{len(texts)} lines x {len(voices)} voices ({', '.join(voices)}), Whisper "
        f"{settings.model} {settings.compute_type} beam {settings.beam_size}, {WORKERS} workers",
        flush=True,
    )

    async def run() -> dict[str, dict[str, str]]:
        stt = make_whisper(settings, WORKERS)
        try:
            return await transcribe_all(texts, voices, stt, WORKERS)
        finally:
            await stt.aclose()

    started = time.monotonic()
    transcripts = asyncio.run(run())
    about = (
        f"Whisper {settings.model} ({settings.compute_type}, beam {settings.beam_size}) "
        f"transcripts of tests/fixtures/intents/eval.yaml's lines, each spoken by the fixture "
        f"voices of scripts/make_fixtures.py and sent down the phone path (8 kHz mu-law, "
        f"upsampled to 16 kHz as /twilio does), made by scripts/transcribe_intent_eval.py."
    )
    document = {"about": about, "voices": transcripts}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(document, indent=1, ensure_ascii=False, sort_keys=True) + "\n",
        encoding="utf-8",
    )
    print(f"wrote {args.out} in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()

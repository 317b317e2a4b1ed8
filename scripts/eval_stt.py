#!/usr/bin/env python3
"""Whisper settings on the evaluation set: word error rate and CPU per utterance, per path.

    .venv/bin/python scripts/eval_stt.py                          # the tune split, defaults
    .venv/bin/python scripts/eval_stt.py --split tune '{"min_window_s": 30}' '{"pad_s": 2}'

Each argument is a JSON object of `WhisperOptions` fields to try; `"prompt": "intents"` puts
the default agent's training phrases in the prompt. Choose settings on the `tune` split only:
the `report` split is what tests/test_stt_accuracy.py reports (docs/performance.md).
Decodes in this process, on `--threads` threads, one utterance at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import speech_eval  # noqa: E402
from voice_agent.engines.stt.scoring import ErrorCount  # noqa: E402
from voice_agent.engines.stt.whisper import (  # noqa: E402
    WhisperDecoder,
    WhisperOptions,
    prompt_from,
    resolve_model,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("variants", nargs="*", default=["{}"])
    parser.add_argument("--split", choices=["tune", "report"], default="tune")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    missing = speech_eval.missing_packages()
    if missing:
        sys.exit(f"install the Debian packages {' '.join(missing)} first (scripts/test does)")
    sets = {
        "real": speech_eval.sample(speech_eval.real_speech(), args.split),
        "offscript": speech_eval.sample(speech_eval.offscript_lines(), args.split),
    }
    print(
        f"{args.split} split: {len(sets['real'])} real lines, {len(sets['offscript'])} off-script"
    )
    model = str(resolve_model(None))
    for variant in args.variants:
        fields = json.loads(variant)
        if fields.get("prompt") == "intents":
            fields["prompt"] = prompt_from(speech_eval.default_agent_phrases())
        decoder = WhisperDecoder(WhisperOptions(model, threads=args.threads, **fields))
        for route in ("phone", "browser"):
            for name, utterances in sets.items():
                count = ErrorCount()
                started = time.process_time()
                for utterance in utterances:
                    count.add(utterance.transcript, decoder.transcribe(utterance.audio(route)).text)
                cpu = (time.process_time() - started) / max(1, len(utterances))
                print(
                    f"{variant:40} {route:7} {name:9} WER {count.rate:.3f} "
                    f"({count.words} words) CPU {cpu:.2f} s per utterance"
                )


if __name__ == "__main__":
    main()

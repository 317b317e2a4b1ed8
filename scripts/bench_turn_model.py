"""CPU cost of the turn-taking models on this machine: Smart Turn's end_probability (features
and inference apart) on one thread, and the bundled Whisper tiny.en decoding a 2-4 s
utterance (WhisperDecoder.transcribe) with 1 and 2 threads, for the turn's latency budget.

    PYTHONPATH=. .venv/bin/python scripts/bench_turn_model.py --runs 30
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import numpy as np

from tests.support import speech_eval
from voice_agent.engines.stt.whisper import WhisperDecoder, WhisperOptions, bundled_model_path
from voice_agent.engines.turn.smart_turn import SmartTurn, resolve_model


def timed(runs: int, call: Callable[[], object]) -> tuple[float, float]:
    """Median CPU and wall ms of `runs` calls (one warm-up first)."""
    call()
    cpu, wall = [], []
    for _ in range(runs):
        c, w = time.process_time(), time.perf_counter()
        call()
        cpu.append((time.process_time() - c) * 1000)
        wall.append((time.perf_counter() - w) * 1000)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    clips = [
        u.audio("browser")
        for u in speech_eval.sample(speech_eval.real_speech(), "tune")
        if 2.0 <= len(u.audio("browser")) / 32000 <= 4.0
    ][:6]
    model = SmartTurn(resolve_model("smart-turn-v3.2"), threads=1)
    pcm = clips[0]
    features = model.features(pcm)[None].astype(np.float32)
    session = model._session  # the inference alone, on features made once
    print("Smart Turn v3.2 (intra-op threads 1), median of", args.runs)
    for label, fn in (
        ("features (numpy)", lambda: model.features(pcm)),
        ("inference (onnxruntime)", lambda: session.run(None, {"input_features": features})),
        ("end_probability", lambda: model.end_probability(pcm)),
    ):
        cpu, wall = timed(args.runs, fn)
        print(f"  {label:26} cpu {cpu:6.1f} ms  wall {wall:6.1f} ms")
    seconds = [len(c) / 32000 for c in clips]
    span = f"{min(seconds):.1f}-{max(seconds):.1f} s"
    print(f"Whisper tiny.en transcribe, {len(clips)} utterances of {span}")
    for threads in (1, 2):
        decoder = WhisperDecoder(WhisperOptions(str(bundled_model_path()), threads=threads))
        runs = max(3, args.runs // 6)
        per_clip = [timed(runs, functools.partial(decoder.transcribe, c)) for c in clips]
        cpu = statistics.median(p[0] for p in per_clip)
        wall = statistics.median(p[1] for p in per_clip)
        print(
            f"  threads {threads}: cpu {cpu:6.0f} ms  wall {wall:6.0f} ms (median over utterances)"
        )


if __name__ == "__main__":
    main()

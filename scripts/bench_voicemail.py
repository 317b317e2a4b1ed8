#!/usr/bin/env python3
"""Answering-machine detection on the held-out fixtures: the table for docs/performance.md.

    .venv/bin/python scripts/bench_voicemail.py            # the report half
    .venv/bin/python scripts/bench_voicemail.py --split tune
    .venv/bin/python scripts/bench_voicemail.py --clips    # and every clip's decisions

The fixtures are tests/test_voicemail.py's (synthesized greetings and answers at 8 kHz, plus
Asterisk's and CMU Sphinx's real recordings when installed), run through the server's VAD
(webrtcvad mode 2) and `VoicemailDetector` as configured by default. The thresholds were chosen
on the tune half; the report half is the one to quote. Also prints the detector's CPU per
20 ms frame (VAD excluded), median of 5 passes over the clips.

Run it with OPENBLAS_NUM_THREADS=1, as scripts/run serves: the tone detector's one matrix
product per frame is tiny, and threads only add their start-up cost to it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import test_voicemail as fixtures  # noqa: E402
from voice_agent.core.voicemail import VoicemailDetector  # noqa: E402
from voice_agent.engines.vad import WebRtcVad  # noqa: E402


def cpu_per_frame_us(clips: list[fixtures.Clip], repeats: int = 5) -> float:
    """CPU time of `VoicemailDetector.frame` per frame, VAD decisions computed beforehand, over
    the frames each clip feeds until the detector is done (what a call pays while it listens)."""
    prepared = []
    for clip in clips:
        vad = WebRtcVad(aggressiveness=2, sample_rate=fixtures.RATE)
        prepared.append([(frame, vad.is_speech(frame)) for frame in fixtures.frames(clip.pcm)])
    runs = []
    for _ in range(repeats):
        count = 0
        started = time.process_time_ns()
        for frames in prepared:
            detector = VoicemailDetector(fixtures.RATE, answered_ms=0.0)
            for number, (frame, is_speech) in enumerate(frames, 1):
                detector.frame(frame, is_speech, number * 20.0)
                count += 1
                if detector.done:
                    break
        runs.append((time.process_time_ns() - started) / count / 1000)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("tune", "report"), default="report")
    parser.add_argument("--clips", action="store_true", help="print every clip's decisions")
    args = parser.parse_args()

    started = time.perf_counter()
    clips = fixtures.clips(args.split)
    built = time.perf_counter() - started
    outcomes = [fixtures.run(clip) for clip in clips]
    if args.clips:
        for outcome in outcomes:
            clip = outcome.clip
            said = ", ".join(
                f"{type(d).__name__}@{at:.0f}" + (f"({d.reason})" if hasattr(d, "reason") else "")
                for at, d in outcome.decisions
            )
            beep = (
                f"beep {clip.beep.frequency_hz:.0f} Hz ends {clip.beep.end_ms:.0f}"
                if clip.beep
                else "no beep"
            )
            ends = f"speech ends {clip.speech_end_ms:6.0f}"
            print(f"{clip.name:28} {clip.kind:8} {ends}  {beep:28} {said}")
        print()
    kinds = {kind: sum(clip.kind == kind for clip in clips) for kind in ("machine", "human")}
    sources = sorted({clip.source for clip in clips})
    print(
        f"{args.split} half: {kinds['machine']} machines "
        f"({sum(clip.beep is not None for clip in clips)} with a beep), {kinds['human']} people; "
        f"sources {', '.join(sources)} (fixtures built in {built:.1f} s)"
    )
    print(fixtures.table(fixtures.score(outcomes)))
    print(f"detector CPU per 20 ms frame, VAD excluded: {cpu_per_frame_us(clips):.0f} us")


if __name__ == "__main__":
    main()

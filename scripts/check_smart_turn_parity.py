"""Checks our Smart Turn features and probabilities against Pipecat's own analyzer.

Pipecat cannot be installed beside us (it pins openai<3), so it runs in a scratch venv:

    python3 -m venv /tmp/pipecat-venv
    /tmp/pipecat-venv/bin/pip install pipecat-ai==1.14.0 'transformers>=5.10,<6'
    PYTHONPATH=. .venv/bin/python scripts/check_smart_turn_parity.py --pipecat-python \
        /tmp/pipecat-venv/bin/python

This side writes the clips (real speech of tests/support/speech_eval.py: whole, cut, short,
longer than 8 s) to a .npz, runs itself under that Python with --reference to get Pipecat's
`LocalSmartTurnAnalyzerV3._predict_endpoint` probabilities and transformers'
`WhisperFeatureExtractor` features, and prints how far ours are from them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def reference(clips: Path, out: Path) -> None:
    """Runs under Pipecat's venv: its analyzer's probability and transformers' features."""
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
    from transformers import WhisperFeatureExtractor

    analyzer = LocalSmartTurnAnalyzerV3()
    extractor = WhisperFeatureExtractor(chunk_length=8)
    data = np.load(clips)
    result = {}
    for name in data.files:
        audio = data[name].astype(np.float32) / 32768.0
        probability = analyzer._predict_endpoint(audio)["probability"]
        window = audio[-128000:]
        window = np.pad(window, (128000 - window.size, 0))
        features = extractor(
            window,
            sampling_rate=16000,
            padding="max_length",
            max_length=128000,
            truncation=True,
            do_normalize=True,
            return_tensors="np",
        ).input_features[0]
        np.save(out.parent / f"{name.replace('/', '_')}.npy", features)
        result[name] = probability
    out.write_text(json.dumps(result))


def clips() -> dict[str, bytes]:
    from tests.support import speech_eval

    real = speech_eval.real_speech()
    chosen = [
        *[u for u in real if u.source == "asterisk"][::60][:8],
        *[u for u in real if u.source == "librivox"][:3],
        *[u for u in real if u.source in ("sphinx", "alsa")][::4][:3],
    ]
    out: dict[str, bytes] = {}
    for u in chosen:
        audio = u.audio("browser")
        out[u.name] = audio
        out[f"{u.name}#half"] = audio[: len(audio) // 4 * 2]
    out["short-120ms"] = chosen[0].audio("browser")[: 2 * 1920]
    out["long-over-8s"] = b"".join(u.audio("browser") for u in chosen[:4])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipecat-python", help="the scratch venv's python")
    parser.add_argument("--reference", nargs=2, metavar=("CLIPS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference:
        reference(Path(args.reference[0]), Path(args.reference[1]))
        return
    from voice_agent.engines.turn.smart_turn import SmartTurn, resolve_model

    model = SmartTurn(resolve_model("smart-turn-v3.2"))
    audio = clips()
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "clips.npz"
        arrays: dict[str, object] = {k: np.frombuffer(v, dtype="<i2") for k, v in audio.items()}
        np.savez(npz, allow_pickle=False, **arrays)  # type: ignore[arg-type]
        out = Path(tmp) / "pipecat.json"
        subprocess.run(
            [args.pipecat_python, __file__, "--reference", str(npz), str(out)], check=True
        )
        theirs = json.loads(out.read_text())
        worst_p = worst_f = 0.0
        print(f"{'clip':42} {'seconds':>7} {'pipecat':>8} {'ours':>8} {'|dp|':>8} {'|dfeat|':>8}")
        for name, pcm in audio.items():
            ours = model.end_probability(pcm)
            reference_features = np.load(Path(tmp) / f"{name.replace('/', '_')}.npy")
            feature_diff = float(np.abs(model.features(pcm) - reference_features).max())
            diff = abs(ours - theirs[name])
            worst_p, worst_f = max(worst_p, diff), max(worst_f, feature_diff)
            print(
                f"{name:42} {len(pcm) / 32000:7.2f} {theirs[name]:8.4f} {ours:8.4f} "
                f"{diff:8.1e} {feature_diff:8.1e}"
            )
        print(
            f"{len(audio)} clips: largest probability difference {worst_p:.3g}, "
            f"largest feature difference {worst_f:.1e}"
        )
        sys.exit(0 if worst_p < 1e-3 else 1)


if __name__ == "__main__":
    main()

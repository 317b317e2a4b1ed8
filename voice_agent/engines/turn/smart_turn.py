"""Pipecat's Smart Turn v3 on onnxruntime: a Whisper-tiny encoder and a classifier over the
last 8 s of 16 kHz audio, fed the Whisper log-mel features that Pipecat's analyzer computes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from voice_agent.engines.turn.base import SAMPLE_RATE, TurnModelError

BUNDLED = {"smart-turn-v3.2": "smart-turn-v3.2-cpu.onnx"}
WINDOW_SAMPLES = 8 * SAMPLE_RATE  # the model's input: 8 s, 800 frames of 10 ms
_N_FRAMES = 800
_ONNX_MAGIC = b"\x08"  # an ONNX ModelProto starts with field 1 (ir_version), a varint


def bundled_dir() -> Path:
    """Where scripts/_env.sh puts the model it takes from the pipecat-ai wheel."""
    return Path(sys.prefix) / "share" / "voice_agent" / "smart-turn"


def resolve_model(name_or_path: str) -> Path:
    """A bundled name to its file in the venv, or a path the user brings, checked."""
    if name_or_path in BUNDLED:
        path = bundled_dir() / BUNDLED[name_or_path]
        if not path.is_file():
            raise TurnModelError(
                f"turn model {name_or_path!r} is not installed: scripts/_env.sh's "
                f"ensure_smart_turn puts it at {str(path)!r}"
            )
        return path
    path = Path(name_or_path).expanduser()
    if not path.exists():
        known = ", ".join(repr(n) for n in BUNDLED)
        raise TurnModelError(
            f"turn model {name_or_path!r} does not exist (an ONNX file, or one of {known})"
        )
    if not path.is_file():
        raise TurnModelError(f"turn model {str(path)!r} is not a file")
    with path.open("rb") as f:
        if f.read(1) != _ONNX_MAGIC:
            raise TurnModelError(f"turn model {str(path)!r} is not an ONNX model")
    return path


class SmartTurn:
    """One loaded model; `end_probability` may run in several threads (onnxruntime's run is
    thread-safe and releases the GIL)."""

    sample_rate = SAMPLE_RATE

    def __init__(self, path: Path, *, threads: int = 1) -> None:
        import onnxruntime as ort
        from faster_whisper.feature_extractor import FeatureExtractor

        options = ort.SessionOptions()
        # One thread per inference: calls run side by side in executor threads instead.
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self._session = ort.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # onnxruntime raises its own types for a corrupt file
            raise TurnModelError(f"turn model {str(path)!r} is not an ONNX model: {e}") from e
        inputs = self._session.get_inputs()
        if len(inputs) != 1 or list(inputs[0].shape)[1:] != [80, _N_FRAMES]:
            raise TurnModelError(
                f"turn model {str(path)!r} is not a Smart Turn v3 model "
                f"(wants one input of 80 x {_N_FRAMES} log-mel features)"
            )
        self._input = inputs[0].name
        self._features = FeatureExtractor(feature_size=80, chunk_length=8)

    def features(self, pcm: bytes) -> np.ndarray:
        """80 x 800 log-mel features of the last 8 s, as Smart Turn was trained on: the
        audio left-padded with zeros to 8 s, then scaled to zero mean and unit variance
        (transformers' do_normalize) before Whisper's log-mel."""
        if len(pcm) % 2:
            raise TurnModelError(f"PCM16 audio has an odd number of bytes ({len(pcm)})")
        audio = np.frombuffer(pcm, dtype="<i2")[-WINDOW_SAMPLES:].astype(np.float32) / 32768.0
        window = np.zeros(WINDOW_SAMPLES, dtype=np.float32)
        window[WINDOW_SAMPLES - audio.size :] = audio
        window = (window - window.mean()) / np.sqrt(window.var() + 1e-7)
        return self._features(window, padding=0)[:, :_N_FRAMES]

    def end_probability(self, pcm: bytes) -> float:
        if not pcm:
            return 0.0  # nothing said is no finished turn
        features = self.features(pcm)[None].astype(np.float32)
        (out,) = self._session.run(None, {self._input: features})
        return float(np.asarray(out).reshape(-1)[0])

"""The evidence at each pause of the turn-taking set, computed with the real engines and kept in
tests/fixtures/turn_eval/evidence-PATH.json: Smart Turn's probability, Whisper tiny.en's
speculative transcript, and what each cost in CPU time on the machine that made the file (one
thread each, as the server runs them: on a core of its own, that is its wall time too).
scripts/eval_turn_taking.py fills it; the suite reads it and computes what is missing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.support.turn_eval import TurnItem
from tests.support.turn_sim import Evidence

FOLDER = Path(__file__).resolve().parent.parent / "fixtures" / "turn_eval"


def evidence_file(path: str) -> Path:
    return FOLDER / f"evidence-{path}.json"


class EvidenceCache:
    """Evidence by (item, path, how much audio): loaded from EVIDENCE, the rest computed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] = {}
        if path.exists():
            self._entries = json.loads(path.read_text())["evidence"]
        self.computed = 0
        self._model: Any = None
        self._decoder: Any = None

    def gather(self, item: TurnItem, now_ms: float, stt_pcm: bytes) -> Evidence:
        key = f"{item.name}|{item.path}|{now_ms:.0f}|{len(stt_pcm)}"
        entry = self._entries.get(key)
        if entry is None:
            entry = self._compute(item.pcm16k(int(now_ms)), stt_pcm)
            self._entries[key] = entry
            self.computed += 1
        return Evidence(entry["acoustic"], entry["acoustic_ms"], entry["text"], entry["text_ms"])

    def final_text_ms(self, item: TurnItem, stt_pcm: bytes) -> float:
        """Decoding the whole utterance, when no pause's decoding covers it."""
        key = f"{item.name}|{item.path}|final|{len(stt_pcm)}"
        entry = self._entries.get(key)
        if entry is None:
            _, text_ms = self._transcribe(stt_pcm)
            entry = self._entries[key] = {"text_ms": text_ms}
            self.computed += 1
        return float(entry["text_ms"])

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "about": "tests/support/turn_evidence.py; made by scripts/eval_turn_taking.py",
            "evidence": dict(sorted(self._entries.items())),
        }
        self.path.write_text(json.dumps(data, indent=0, ensure_ascii=False) + "\n")

    def _compute(self, turn_pcm: bytes, stt_pcm: bytes) -> dict[str, Any]:
        if self._model is None:
            from voice_agent.engines.turn import load_turn_model

            self._model = load_turn_model("smart-turn-v3.2")
        started = time.process_time()
        acoustic = self._model.end_probability(turn_pcm[-8 * 16000 * 2 :])
        acoustic_ms = (time.process_time() - started) * 1000
        text, text_ms = self._transcribe(stt_pcm)
        return {
            "acoustic": round(float(acoustic), 4),
            "acoustic_ms": round(acoustic_ms, 1),
            "text": text,
            "text_ms": text_ms,
        }

    def _transcribe(self, stt_pcm: bytes) -> tuple[str, float]:
        if self._decoder is None:
            from voice_agent.engines.stt.whisper import (
                WhisperDecoder,
                WhisperOptions,
                bundled_model_path,
            )

            self._decoder = WhisperDecoder(WhisperOptions(model_path=str(bundled_model_path())))
        started = time.process_time()
        text = self._decoder.transcribe(stt_pcm).text
        return text, round((time.process_time() - started) * 1000, 1)

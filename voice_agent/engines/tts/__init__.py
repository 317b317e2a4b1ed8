"""Text-to-speech engines behind one streaming interface: eSpeak NG and Piper embedded, or an
OpenAI-compatible speech endpoint; `make_tts` builds one from a `TtsConfig`."""

from __future__ import annotations

import concurrent.futures

from voice_agent.engines.tts.base import Tts, TtsChunk, TtsConfig, TtsError, WordTiming
from voice_agent.errors import ConfigError

__all__ = ["Tts", "TtsChunk", "TtsConfig", "TtsError", "WordTiming", "make_tts"]


def make_tts(config: TtsConfig, *, executor: concurrent.futures.Executor | None = None) -> Tts:
    """The engine `config` names. Embedded engines run on `executor` if given, else on a
    one-thread executor of their own; the openai engine needs none.

    Engine modules are imported here, on demand, so piper (an optional extra) and the model it
    loads cost nothing to a process that speaks with another engine.
    """
    if config.provider == "espeak":
        from voice_agent.engines.tts.espeak import EspeakTts

        return EspeakTts(config, executor=executor)
    if config.provider == "piper":
        from voice_agent.engines.tts.piper import PiperTts

        return PiperTts(config, executor=executor)
    if config.provider == "openai":
        from voice_agent.engines.tts.openai import OpenAITts

        return OpenAITts(config)
    raise ConfigError(f"unknown TTS provider {config.provider!r}", key="tts.provider")

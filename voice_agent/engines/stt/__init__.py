"""Speech-to-text engines: `make_stt` builds pocketsphinx (domain or full language model) or an
OpenAI-compatible transcription service from an `SttConfig`."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

from voice_agent.engines.stt.base import Stt, SttConfig, SttError, SttStream, Transcript
from voice_agent.engines.stt.domain_lm import DomainLm, build_domain_lm
from voice_agent.engines.stt.openai import OpenAiStt
from voice_agent.engines.stt.pocketsphinx import PocketsphinxStt

__all__ = [
    "DomainLm",
    "OpenAiStt",
    "PocketsphinxStt",
    "Stt",
    "SttConfig",
    "SttError",
    "SttStream",
    "Transcript",
    "build_domain_lm",
    "make_stt",
]


def make_stt(
    config: SttConfig, *, phrases: Sequence[str] = (), executor: Executor | None = None
) -> Stt:
    """The engine `config` names. `phrases` (the agent's intents' training phrases) and
    `config.phrases` make pocketsphinx's domain language model, built once and then cached on
    disk; `executor` runs pocketsphinx decoding (default: the engine's own two threads)."""
    if config.provider == "openai":
        return OpenAiStt(model=config.model, base_url=config.base_url, api_key=config.api_key)
    if config.provider != "pocketsphinx":
        raise SttError(f"unknown STT provider {config.provider!r} (pocketsphinx, openai)")
    if config.language_model == "full":
        return PocketsphinxStt(None, executor=executor)
    if config.language_model != "domain":
        raise SttError(f"unknown language_model {config.language_model!r} (domain, full)")
    return PocketsphinxStt(build_domain_lm([*phrases, *config.phrases]), executor=executor)

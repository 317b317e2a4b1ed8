"""Speech-to-text engines: `make_stt` builds Whisper (faster-whisper, in worker processes),
pocketsphinx (domain or full language model; decoding in worker processes or in-process threads)
or an OpenAI-compatible transcription service from an `SttConfig`."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from voice_agent.engines.stt.base import Stt, SttConfig, SttError, SttStream, Transcript
from voice_agent.engines.stt.domain_lm import DomainLm, build_domain_lm
from voice_agent.engines.stt.pocketsphinx import PocketsphinxStt
from voice_agent.engines.stt.pool import ProcessPoolStt, default_processes

if TYPE_CHECKING:
    from voice_agent.engines.stt.openai import OpenAiStt

__all__ = [
    "DomainLm",
    "OpenAiStt",
    "PocketsphinxStt",
    "ProcessPoolStt",
    "Stt",
    "SttConfig",
    "SttError",
    "SttStream",
    "Transcript",
    "build_domain_lm",
    "default_processes",
    "make_stt",
]


def __getattr__(name: str) -> Any:
    # The OpenAI SDK is imported on first use: importing it takes ~1 s and ~40 MB, which every
    # pocketsphinx worker process (they import this package) would otherwise pay for nothing.
    if name == "OpenAiStt":
        from voice_agent.engines.stt.openai import OpenAiStt

        return OpenAiStt
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_stt(
    config: SttConfig, *, phrases: Sequence[str] = (), executor: Executor | None = None
) -> Stt:
    """The engine `config` names. `phrases` (the agent's intents' training phrases) and
    `config.phrases` make pocketsphinx's domain language model, built once and then cached on
    disk; Whisper gets `config.prompt` and `config.phrases` as its initial prompt.
    pocketsphinx decodes in `config.processes` worker processes (None: one per CPU core;
    0: in-process, on `executor` or the engine's own two threads)."""
    if config.provider == "openai":
        from voice_agent.engines.stt.openai import OpenAiStt

        return OpenAiStt(model=config.model, base_url=config.base_url, api_key=config.api_key)
    if config.processes is not None and config.processes < 0:
        raise SttError(f"STT processes must be 0 or more, not {config.processes}")
    if config.provider == "whisper":
        return _whisper(config)
    if config.provider != "pocketsphinx":
        raise SttError(f"unknown STT provider {config.provider!r} (whisper, pocketsphinx, openai)")
    if config.language_model not in ("domain", "full"):
        raise SttError(f"unknown language_model {config.language_model!r} (domain, full)")
    # Built here, in the server process, once: the workers get its files' paths.
    domain_lm = (
        build_domain_lm([*phrases, *config.phrases]) if config.language_model == "domain" else None
    )
    if config.processes == 0:
        return PocketsphinxStt(domain_lm, executor=executor)
    return ProcessPoolStt(domain_lm, processes=config.processes or default_processes())


def _whisper(config: SttConfig) -> Stt:
    from voice_agent.engines.stt.whisper import WhisperOptions, prompt_from, resolve_model

    if config.processes == 0:
        raise SttError("whisper decodes in worker processes: stt.processes must be 1 or more")
    options = WhisperOptions(
        model_path=str(resolve_model(config.model)),
        compute_type=config.compute_type,
        beam_size=config.beam_size,
        threads=config.threads,
        # Only what the config says: the intents' training phrases made Whisper worse
        # (docs/performance.md, "Speech recognition").
        prompt=prompt_from(config.phrases, config.prompt),
    )
    return ProcessPoolStt(processes=config.processes or default_processes(), whisper=options)

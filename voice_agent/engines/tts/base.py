"""The text-to-speech contract: engines stream PCM16 chunks for a text, with word timings when the
engine knows them, so the interruption tracker can tell which words the caller heard."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol

from voice_agent.errors import VoiceAgentError


@dataclass(frozen=True)
class WordTiming:
    """One word of the text and where it sounds, in ms from the start of the utterance's audio."""

    word: str
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class TtsChunk:
    """A piece of an utterance's audio: PCM16 LE mono at the engine's `sample_rate`.

    `words` holds the words whose start falls in this chunk; it is empty when the engine gives no
    timings (`Tts.gives_word_timings` is False) or no word starts here.
    """

    pcm: bytes
    words: tuple[WordTiming, ...] = ()


class Tts(Protocol):
    """A text-to-speech engine.

    `synthesize` streams: the first chunk comes long before the whole text is synthesized.
    Closing the iterator early (`aclose()`, or cancelling the task iterating it) stops the
    synthesis and leaves the engine ready for the next call; calls may run concurrently.
    """

    sample_rate: int
    gives_word_timings: bool

    def synthesize(self, text: str) -> AsyncIterator[TtsChunk]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class TtsConfig:
    """Which engine speaks, and how.

    `voice`: espeak a voice name with an optional variant ("en-us", "en-us+f3"); piper the path
    of an `.onnx` voice model (its config beside it as `.onnx.json`), default the bundled joe
    voice; openai a voice name ("alloy", the default). `model`, `base_url` and `api_key` are for
    openai only. `speed` scales the speaking rate: 1.0 is the engine's normal pace.
    """

    provider: Literal["espeak", "piper", "openai"] = "espeak"
    voice: str | None = None
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    speed: float = 1.0


class TtsError(VoiceAgentError):
    """The TTS engine or provider failed to synthesize a text."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.message = message
        self.status = status
        super().__init__(message)


_SHARED_EXECUTORS: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_SHARED_EXECUTORS_LOCK = threading.Lock()


def shared_executor(name: str) -> concurrent.futures.ThreadPoolExecutor:
    """A single-thread executor for engine `name`, one per process, created on first use.

    One thread is right for both embedded engines: libespeak-ng can only run one synthesis at a
    time, and onnxruntime already spreads one Piper inference over every core, so a second
    thread would only make the two calls fight for the same cores.
    """
    with _SHARED_EXECUTORS_LOCK:
        executor = _SHARED_EXECUTORS.get(name)
        if executor is None:
            executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"tts-{name}"
            )
            _SHARED_EXECUTORS[name] = executor
        return executor

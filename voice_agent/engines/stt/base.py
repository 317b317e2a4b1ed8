"""The speech-to-text interface the pipeline uses: an Stt engine opens one SttStream per caller
utterance, fed PCM16 mono frames while the caller speaks (16 kHz, or any rate for an engine
whose `sample_rate` is None)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from voice_agent.errors import VoiceAgentError

SAMPLE_RATE = 16000
SAMPLE_WIDTH = 2  # bytes: PCM16


@dataclass(frozen=True)
class Transcript:
    text: str  # "" when nothing was recognised
    confidence: float | None = None
    words: tuple[str, ...] = ()


class SttStream(Protocol):
    def push(self, pcm: bytes) -> None:
        """Queue 16 kHz PCM16 mono audio. Called on the event loop, so it only queues."""
        ...

    def partial(self) -> str:
        """The best hypothesis so far, "" if none (or if the engine has no partials)."""
        ...

    def pause(self) -> None:
        """The caller has paused: no audio follows unless they speak again. An engine that
        decodes whole utterances starts now, so that finish() finds the text ready if the
        pause turns out to be the end of the turn (and decodes again if more audio came)."""
        ...

    async def speculation(self) -> str | None:
        """The words of the audio up to the last pause(), once the engine has them: a
        streaming engine's partial at once, an engine that decodes at pauses that decoding.
        None when it has none (it failed, or the caller spoke again since)."""
        ...

    async def finish(self) -> Transcript:
        """End of utterance: the final text. Pushes after this are ignored."""
        ...

    def cancel(self) -> None:
        """Drop the utterance; a pending or later finish() then returns an empty Transcript."""
        ...


class Stt(Protocol):
    @property
    def sample_rate(self) -> int | None:
        """The rate streams must be fed; None: any rate, named at start(). A hosted service
        takes the caller's 8 kHz as it is, which saves resampling every frame of speech."""
        ...

    def start(self, sample_rate: int = SAMPLE_RATE) -> SttStream:
        """A stream for one new utterance. Cheap: heavy set-up happens off the event loop."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class SttConfig:
    provider: Literal["pocketsphinx", "whisper", "openai"] = "pocketsphinx"
    language_model: Literal["domain", "full"] = "domain"
    # Extra expected phrases; the caller adds its intents' training phrases to make_stt.
    phrases: tuple[str, ...] = ()
    # openai: "gpt-4o-mini-transcribe" / "whisper-1"; whisper: "tiny.en" (bundled) or a folder
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    # pocketsphinx: decoding in this many worker processes, None: one per CPU core (see
    # pool.default_processes); 0: in-process threads, which stall the event loop while decoding.
    processes: int | None = None
    # whisper: see whisper.WhisperOptions.
    compute_type: str = "int8"
    beam_size: int = 1
    threads: int = 1
    prompt: str | None = None


class SttError(VoiceAgentError):
    """Recognition failed (engine error, unreachable or refusing transcription service)."""


def require_rate(engine: str, sample_rate: int) -> None:
    if sample_rate != SAMPLE_RATE:
        raise ValueError(f"{engine} takes {SAMPLE_RATE} Hz audio, not {sample_rate} Hz")

"""OpenAI-compatible STT: the utterance is buffered while the caller speaks and sent as one WAV to
the transcription endpoint (POST /v1/audio/transcriptions) when the caller pauses, and again at
the end of the turn only if they spoke on meanwhile. No partials."""

from __future__ import annotations

import asyncio
import io
import os
import wave
from collections.abc import Coroutine
from typing import Any

import openai
from openai import AsyncOpenAI

from voice_agent.engines.openai_http import connection_failure, http_client
from voice_agent.engines.stt.base import SAMPLE_RATE, SAMPLE_WIDTH, SttError, Transcript

DEFAULT_MODEL = "gpt-4o-mini-transcribe"
# Local OpenAI-compatible servers often need no key, but the SDK refuses to start without one.
_PLACEHOLDER_KEY = "no-key-configured"
# The API rejects audio shorter than 0.1 s; such a blip holds no words anyway.
_MIN_AUDIO_S = 0.1


def wav_bytes(pcm: bytes, sample_rate: int = SAMPLE_RATE) -> bytes:
    """PCM16 mono audio wrapped in a WAV header."""
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(SAMPLE_WIDTH)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm)
    return out.getvalue()


class OpenAiStream:
    def __init__(self, engine: OpenAiStt, sample_rate: int = SAMPLE_RATE) -> None:
        self._engine = engine
        self.sample_rate = sample_rate
        self._audio = bytearray()
        self._open = True
        self._cancelled = False
        # The request sent when the caller paused, and how much audio it holds.
        self._guess: tuple[int, asyncio.Task[Transcript]] | None = None

    def push(self, pcm: bytes) -> None:
        if self._open:
            self._audio += pcm

    def partial(self) -> str:
        return ""

    def pause(self) -> None:
        if not self._open or self._too_short():
            return
        if self._guess is not None and self._guess[0] == len(self._audio):
            return
        self._drop_guess()
        task = asyncio.get_running_loop().create_task(self._transcribe())
        # A guess nobody awaits (the caller spoke on) must not log "exception never retrieved".
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._guess = (len(self._audio), task)

    async def speculation(self) -> str | None:
        guess = self._guess
        if guess is None or guess[0] != len(self._audio):
            return None  # no request at the pause, or the caller spoke on
        try:
            return (await asyncio.shield(guess[1])).text
        except (asyncio.CancelledError, Exception):
            return None  # finish() sends the request again, and reports a failure

    async def finish(self) -> Transcript:
        self._open = False
        if self._cancelled or self._too_short():
            return Transcript("")
        guess = self._guess
        if guess is not None and guess[0] == len(self._audio):
            return await guess[1]
        self._drop_guess()
        return await self._transcribe()

    def cancel(self) -> None:
        self._open = False
        self._cancelled = True
        self._drop_guess()
        self._audio.clear()

    def _too_short(self) -> bool:
        return len(self._audio) < _MIN_AUDIO_S * SAMPLE_WIDTH * self.sample_rate

    def _transcribe(self) -> Coroutine[Any, Any, Transcript]:
        audio = bytes(self._audio[: len(self._audio) - len(self._audio) % SAMPLE_WIDTH])
        return self._engine.transcribe(audio, self.sample_rate)

    def _drop_guess(self) -> None:
        if self._guess is not None:
            self._guess[1].cancel()
            self._guess = None


class OpenAiStt:
    """Transcription through the OpenAI SDK. base_url/api_key default to the SDK's environment
    variables (OPENAI_BASE_URL, OPENAI_API_KEY); with no key at all a placeholder is sent, which
    local servers accept and OpenAI answers with 401."""

    sample_rate = None  # the service takes any rate: the caller's audio goes as it is

    def __init__(
        self,
        *,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        language: str | None = None,
        timeout_s: float = 15.0,
        max_retries: int = 1,
        client: AsyncOpenAI | None = None,
    ) -> None:
        self.model = model or DEFAULT_MODEL
        self._language = language
        self._owns_client = client is None
        if client is None:
            key = api_key or os.environ.get("OPENAI_API_KEY") or _PLACEHOLDER_KEY
            client = AsyncOpenAI(
                base_url=base_url,
                api_key=key,
                timeout=timeout_s,
                max_retries=max_retries,
                http_client=http_client(timeout_s),
            )
        self._client = client

    def start(self, sample_rate: int = SAMPLE_RATE) -> OpenAiStream:
        return OpenAiStream(self, sample_rate)

    async def transcribe(self, pcm: bytes, sample_rate: int = SAMPLE_RATE) -> Transcript:
        """One utterance's PCM16 mono audio to text."""
        try:
            result = await self._client.audio.transcriptions.create(
                model=self.model,
                file=("audio.wav", wav_bytes(pcm, sample_rate), "audio/wav"),
                language=self._language or openai.omit,
            )
        except openai.APIStatusError as e:
            raise SttError(f"transcription failed: HTTP {e.status_code}: {e.message}") from e
        except openai.APIError as e:
            raise SttError(f"transcription failed: {connection_failure(e) or e.message}") from e
        text = (result if isinstance(result, str) else result.text).strip()
        return Transcript(text, None, tuple(text.split()))

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.close()

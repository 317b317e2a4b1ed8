"""OpenAI-compatible speech endpoint (`POST /v1/audio/speech`) through the `openai` SDK, streamed
as 24 kHz PCM16 chunks while the response body arrives."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import openai

from voice_agent.engines.openai_http import connection_failure, http_client
from voice_agent.engines.tts.base import TtsChunk, TtsConfig, TtsError
from voice_agent.errors import ConfigError

SAMPLE_RATE = 24000  # what the endpoint sends for response_format="pcm"
DEFAULT_MODEL = "gpt-4o-mini-tts"
DEFAULT_VOICE = "alloy"
# OpenAI-compatible local servers usually want no key, but the SDK refuses to start without one.
_PLACEHOLDER_KEY = "no-key-configured"
# A real-time reply cannot wait out the SDK's default back-off; one quick retry at most.
_MAX_RETRIES = 1
_TIMEOUT_S = 30.0


class OpenAITts:
    """Speech from an OpenAI-compatible endpoint; no word timings (the tracker estimates them).

    `base_url` and `api_key` fall back to the SDK's OPENAI_BASE_URL and OPENAI_API_KEY; with a
    base URL but no key anywhere, a placeholder key is sent.
    """

    sample_rate: int = SAMPLE_RATE
    gives_word_timings: bool = False

    def __init__(self, config: TtsConfig) -> None:
        base_url = config.base_url or os.environ.get("OPENAI_BASE_URL") or None
        api_key = config.api_key or os.environ.get("OPENAI_API_KEY") or None
        if api_key is None:
            if base_url is None:
                raise ConfigError(
                    "the openai TTS needs an API key (tts.api_key or OPENAI_API_KEY)"
                    " or the base_url of an OpenAI-compatible server",
                    key="tts.api_key",
                )
            api_key = _PLACEHOLDER_KEY
        if not config.speed > 0:
            raise ConfigError(f"speed must be positive, got {config.speed}", key="tts.speed")
        self.model = config.model or DEFAULT_MODEL
        self.voice = config.voice or DEFAULT_VOICE
        self.speed = config.speed
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            max_retries=_MAX_RETRIES,
            timeout=_TIMEOUT_S,
            http_client=http_client(_TIMEOUT_S),
        )

    async def synthesize(self, text: str) -> AsyncIterator[TtsChunk]:
        if not text.strip():
            return
        extra: dict[str, Any] = {}
        if self.speed != 1.0:
            # Sent only when asked for: not every compatible server accepts the field.
            extra["speed"] = self.speed
        speech = self._client.audio.speech.with_streaming_response
        try:
            async with speech.create(
                model=self.model, voice=self.voice, input=text, response_format="pcm", **extra
            ) as response:
                carry = b""
                async for data in response.iter_bytes():
                    # HTTP chunks may split a sample; a chunk must hold whole samples.
                    data = carry + data
                    whole = len(data) - len(data) % 2
                    carry = data[whole:]
                    if whole:
                        yield TtsChunk(data[:whole], ())
        except openai.APIStatusError as exc:
            raise TtsError(
                f"speech request failed with HTTP {exc.status_code}: {exc.message}",
                status=exc.status_code,
            ) from exc
        except openai.APIError as exc:
            reason = connection_failure(exc) or exc.message
            raise TtsError(f"speech request failed: {reason}") from exc

    async def aclose(self) -> None:
        await self._client.close()

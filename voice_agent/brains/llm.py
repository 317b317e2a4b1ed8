"""The streaming chat LLM client over the `openai` SDK: text deltas as they arrive, complete tool
calls at the end, retries with backoff inside one turn deadline, prompt close on barge-in."""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import openai
from openai import AsyncOpenAI, AsyncStream
from openai.types.chat import ChatCompletionChunk

from voice_agent.engines.openai_http import connection_failure, http_client
from voice_agent.errors import LlmError

__all__ = ["ChatLLM", "LlmEvent", "LlmSettings", "TextDelta", "ToolCallRequest"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# Sent when no key is configured: local OpenAI-compatible servers ignore it, and the SDK refuses
# to build a client without one.
_PLACEHOLDER_KEY = "no-key-configured"
_RETRYABLE_STATUSES = frozenset({408, 409, 429})
_MAX_DETAIL_CHARS = 300


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallRequest:
    id: str
    name: str
    arguments: str  # the raw JSON text the model produced; may be invalid, the caller checks


LlmEvent = TextDelta | ToolCallRequest


@dataclass(frozen=True)
class LlmSettings:
    model: str = "gpt-4o-mini"
    base_url: str | None = None  # None: the SDK's OPENAI_BASE_URL env var, else its default
    api_key: str | None = None  # None: OPENAI_API_KEY, else a placeholder (local endpoints)
    temperature: float | None = None
    turn_deadline_s: float = 12.0  # all attempts of one request must fit in this
    request_timeout_s: float = 8.0  # per connect / per read of one attempt
    max_attempts: int = 4
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 2.0
    parallel_tool_calls: bool = True


@dataclass
class _Failure:
    """Why one attempt failed, and whether another attempt may help."""

    cause: str
    retryable: bool
    retry_after_s: float | None = None
    deadline_spent: bool = False
    error: BaseException | None = None


class _DeadlineSpent(Exception):
    pass


class _TruncatedStream(Exception):
    pass


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _ToolCallAssembly:
    """Tool-call fragments accumulated by index until the stream ends."""

    def __init__(self) -> None:
        self._calls: dict[int, _PartialCall] = {}

    def add(self, fragment: Any) -> None:
        index = getattr(fragment, "index", None)
        frag_id = getattr(fragment, "id", None) or ""
        if index is None:
            # Some compatible servers omit the index: a new id starts a new call, anything else
            # continues the latest one.
            known = {call.id for call in self._calls.values()}
            if not self._calls or (frag_id and frag_id not in known):
                index = len(self._calls)
            else:
                index = max(self._calls)
        call = self._calls.setdefault(int(index), _PartialCall())
        if frag_id and not call.id:
            call.id = frag_id
        function = getattr(fragment, "function", None)
        if function is not None:
            name = getattr(function, "name", None)
            # OpenAI sends the name once; some servers repeat it on every fragment.
            if name and not call.name:
                call.name = name
            arguments = getattr(function, "arguments", None)
            if arguments:
                call.arguments.append(arguments)

    def complete(self) -> list[ToolCallRequest]:
        return [
            ToolCallRequest(
                id=call.id or f"call_{index}", name=call.name, arguments="".join(call.arguments)
            )
            for index, call in sorted(self._calls.items())
        ]


class ChatLLM:
    """Streams chat completions from an OpenAI-compatible endpoint as `LlmEvent`s.

    Each `stream()` call is one turn: it retries transient failures (connection, timeout, 408,
    409, 429, 5xx, a malformed or truncated stream) with capped exponential backoff while nothing
    has been yielded and the turn deadline allows, and raises `LlmError` otherwise.
    """

    def __init__(
        self,
        settings: LlmSettings,
        *,
        client: AsyncOpenAI | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._settings = settings
        self._sleep = sleep
        if client is None:
            key = settings.api_key or os.environ.get("OPENAI_API_KEY") or _PLACEHOLDER_KEY
            self._api_key: str | None = key
            # max_retries=0: the SDK's own retries would not respect our turn deadline.
            self._client = AsyncOpenAI(
                base_url=settings.base_url,
                api_key=key,
                max_retries=0,
                timeout=settings.request_timeout_s,
                http_client=http_client(settings.request_timeout_s),
            )
            self._owns_client = True
        else:
            self._api_key = client.api_key
            self._client = client.with_options(max_retries=0, timeout=settings.request_timeout_s)
            self._owns_client = False

    @property
    def settings(self) -> LlmSettings:
        return self._settings

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it; an injected one is the caller's."""
        if self._owns_client:
            await self._client.close()

    async def stream(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> AsyncGenerator[LlmEvent, None]:
        """Yield text deltas as they arrive, then the complete tool calls in index order.

        Stop early with `break`, `aclose()` or cancellation: the HTTP stream is closed at once.
        """
        settings = self._settings
        request: dict[str, Any] = {
            "model": settings.model,
            "messages": [dict(m) for m in messages],
            "stream": True,
        }
        if tools:
            request["tools"] = [dict(t) for t in tools]
            request["parallel_tool_calls"] = settings.parallel_tool_calls
        if settings.temperature is not None:
            request["temperature"] = settings.temperature

        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.turn_deadline_s
        last: _Failure | None = None
        attempt = 0
        while True:
            attempt += 1
            yielded = False
            finished = False
            failure: _Failure | None = None
            response: AsyncStream[ChatCompletionChunk] | None = None
            calls = _ToolCallAssembly()
            try:
                response = await self._within(deadline, self._open(request))
                while True:
                    # Once speech has started the deadline no longer applies; the per-read
                    # timeout still catches a stalled stream.
                    if yielded:
                        chunk = await anext(response, None)
                    else:
                        chunk = await self._within(deadline, anext(response, None))
                    if chunk is None:
                        break
                    for choice in chunk.choices or ():
                        if choice.finish_reason is not None:
                            finished = True
                        delta = choice.delta
                        if delta is None:
                            continue
                        # A refusal is the model's answer to the user; saying it beats silence.
                        text = (delta.content or "") + (getattr(delta, "refusal", None) or "")
                        if text:
                            yielded = True
                            yield TextDelta(text)
                        for fragment in delta.tool_calls or ():
                            calls.add(fragment)
                if not finished:
                    raise _TruncatedStream
                for call in calls.complete():
                    yielded = True
                    yield call
            except Exception as exc:
                failure = self._classify(exc)
                failure.cause = self._scrub(failure.cause)
                failure.error = exc
            finally:
                if response is not None:
                    await response.close()

            if failure is None:
                return
            if finished:
                # The model's output was complete (finish_reason seen); only the tail ([DONE],
                # usage) was lost, so deliver what we have rather than fail or repeat the turn.
                log.debug("LLM stream ended uncleanly after finish_reason: %s", failure.cause)
                for call in calls.complete():
                    yield call
                return
            if yielded:
                raise LlmError(
                    f"LLM stream failed after part of the reply was delivered: {failure.cause}"
                ) from failure.error
            if failure.deadline_spent:
                cause = last.cause if last is not None else "still waiting for the first reply"
                raise LlmError(
                    f"LLM request gave up: the {settings.turn_deadline_s:g}s turn deadline ran out "
                    f"during attempt {attempt} (last cause: {cause})"
                ) from failure.error
            last = failure
            if not failure.retryable:
                raise LlmError(f"LLM request failed: {failure.cause}") from failure.error
            if attempt >= settings.max_attempts:
                raise LlmError(
                    f"LLM request failed after {attempt} attempts: {failure.cause}"
                ) from failure.error
            delay = self._backoff(attempt)
            if failure.retry_after_s is not None:
                delay = failure.retry_after_s
            if loop.time() + delay >= deadline:
                raise LlmError(
                    f"LLM request gave up after {attempt} attempt(s): waiting {delay:.2f}s "
                    f"to retry would overrun the {settings.turn_deadline_s:g}s turn deadline "
                    f"(last cause: {failure.cause})"
                ) from failure.error
            log.warning(
                "LLM attempt %d of %d failed (%s); retrying in %.2fs",
                attempt,
                settings.max_attempts,
                failure.cause,
                delay,
            )
            await self._sleep(delay)

    # ---- helpers ---------------------------------------------------------------------------

    async def _open(self, request: dict[str, Any]) -> AsyncStream[ChatCompletionChunk]:
        opened = await self._client.chat.completions.create(**request)
        if not isinstance(opened, AsyncStream):
            raise TypeError("the SDK returned a complete response to a streaming request")
        return opened

    @staticmethod
    async def _within(deadline: float, awaitable: Awaitable[_T]) -> _T:
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                return await awaitable
        except TimeoutError:
            if scope.expired():
                raise _DeadlineSpent from None
            raise

    def _backoff(self, attempt: int) -> float:
        s = self._settings
        delay = min(s.backoff_max_s, s.backoff_initial_s * 2 ** (attempt - 1))
        # Up to a quarter less, so clients failing together do not retry in lockstep.
        return delay * (1.0 - 0.25 * random.random())

    def _scrub(self, text: str) -> str:
        if self._api_key and self._api_key != _PLACEHOLDER_KEY and len(self._api_key) >= 4:
            text = text.replace(self._api_key, "<api key>")
        return text

    def _classify(self, exc: Exception) -> _Failure:
        timeout_s = self._settings.request_timeout_s
        if isinstance(exc, _DeadlineSpent):
            return _Failure("the turn deadline was spent", retryable=False, deadline_spent=True)
        if isinstance(exc, _TruncatedStream):
            return _Failure("malformed stream: it ended without a finish_reason", retryable=True)
        if isinstance(exc, json.JSONDecodeError):
            return _Failure(f"malformed stream: a chunk is not valid JSON ({exc})", retryable=True)
        unreachable = connection_failure(exc)
        if unreachable is not None:
            return _Failure(f"cannot reach {self._client.base_url} ({unreachable})", retryable=True)
        if isinstance(exc, openai.APITimeoutError | httpx.TimeoutException):
            return _Failure(f"no response within the {timeout_s:g}s request timeout", True)
        if isinstance(exc, openai.APIConnectionError):
            reason = f": {exc.__cause__}" if exc.__cause__ else ""
            return _Failure(
                f"cannot reach {self._client.base_url} ({exc.message}{reason})", retryable=True
            )
        if isinstance(exc, httpx.TransportError):
            return _Failure(f"connection lost mid-stream ({type(exc).__name__}: {exc})", True)
        if isinstance(exc, openai.APIStatusError):
            return self._classify_status(exc)
        if isinstance(exc, openai.APIError):
            # An error event inside an otherwise healthy stream: provider-side, usually transient.
            return _Failure(f"provider error mid-stream: {_clip(exc.message)}", retryable=True)
        return _Failure(f"unexpected {type(exc).__name__}: {_clip(str(exc))}", retryable=False)

    def _classify_status(self, exc: openai.APIStatusError) -> _Failure:
        status = exc.status_code
        body = exc.body
        detail = body.get("message") if isinstance(body, dict) else None
        if not isinstance(detail, str) or not detail:
            detail = exc.message
        cause = f"HTTP {status} from the provider: {_clip(detail)}"
        if status == 401 and self._api_key == _PLACEHOLDER_KEY:
            cause += " (no API key is configured: set OPENAI_API_KEY or LlmSettings.api_key)"
        retryable = status in _RETRYABLE_STATUSES or status >= 500
        retry_after = _retry_after_s(exc.response.headers) if retryable else None
        return _Failure(cause, retryable=retryable, retry_after_s=retry_after)


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 1] + "…"


def _retry_after_s(headers: httpx.Headers) -> float | None:
    """Seconds from retry-after-ms or Retry-After (delta-seconds or an HTTP date), if present."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())

"""The HTTP client under the `openai` SDK for hosted engines and LLMs.

The SDK runs on httpx by default; every streamed chunk of a TTS or LLM response then passes
through httpx, httpcore, h11 and anyio (with a cancel scope per read). The SDK's own
`DefaultAioHttpClient` (the `openai[aiohttp]` extra, httpx's interface on aiohttp's transport)
does the same work for a fifth of the CPU: 8-10 ms against 40-43 ms per TTS + STT request pair
against the load test's stand-in (see docs/performance.md). At hundreds of calls per process
that is a quarter of a core.

One difference matters to users: httpx-aiohttp 0.2 reports a refused or failed connection as a
connect timeout, so `connection_failure` digs the real reason out of the exception chain.
"""

from __future__ import annotations

import aiohttp
import httpx
from openai import DefaultAioHttpClient

__all__ = ["connection_failure", "http_client", "load_sdk"]


def load_sdk() -> None:
    """Import the SDK's API resources now.

    The SDK imports all of them (0.7-0.9 s here) on the first `client.audio` or `client.chat`.
    Made on a caller's first turn, that import stalled the worker's event loop, and so every
    call on it, for as long. Engines and LLM brains call this when they are made, at start.
    """
    import openai.resources  # noqa: F401


def http_client(timeout: float | httpx.Timeout) -> httpx.AsyncClient:
    """A client for AsyncOpenAI(http_client=...); the AsyncOpenAI that uses it closes it."""
    load_sdk()
    return DefaultAioHttpClient(timeout=timeout)


def connection_failure(exc: BaseException) -> str | None:
    """ "cannot connect to HOST:PORT (reason)" when `exc` comes from a connection that failed
    to open (refused, unresolvable, unreachable); None otherwise."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, aiohttp.ClientConnectorError):
            reason = seen.os_error.strerror or str(seen.os_error)
            return f"cannot connect to {seen.host}:{seen.port} ({reason})"
        seen = seen.__cause__ or seen.__context__
    return None

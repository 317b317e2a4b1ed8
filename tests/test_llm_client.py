"""Tests for ChatLLM: the real `openai` SDK against the OpenAIStandIn HTTP server."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from tests.support.openai_server import OpenAIStandIn, Reply
from voice_agent.brains.llm import ChatLLM, LlmEvent, LlmSettings, TextDelta, ToolCallRequest
from voice_agent.errors import LlmError

MESSAGES = [
    {"role": "system", "content": "You are a helpful phone agent."},
    {"role": "user", "content": "What's the weather in Paris?"},
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
KEY = "sk-test-7f3a9c1d5e"


def settings_for(base_url: str | None, **overrides: Any) -> LlmSettings:
    values: dict[str, Any] = {
        "model": "test-model",
        "base_url": base_url,
        "api_key": KEY,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "request_timeout_s": 2.0,
        "turn_deadline_s": 5.0,
    }
    values.update(overrides)
    return LlmSettings(**values)


async def collect(events: AsyncIterator[LlmEvent]) -> list[LlmEvent]:
    async def drain() -> list[LlmEvent]:
        return [event async for event in events]

    return await asyncio.wait_for(drain(), 5)


def text_of(events: list[LlmEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


class SleepRecorder:
    """An injected sleep that records the backoff delays and then really sleeps them."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(delay)


@pytest.fixture
async def server() -> AsyncIterator[OpenAIStandIn]:
    async with OpenAIStandIn() as standin:
        yield standin


@pytest.fixture
async def make_llm() -> AsyncIterator[Callable[..., ChatLLM]]:
    created: list[ChatLLM] = []

    def make(settings: LlmSettings, **kwargs: Any) -> ChatLLM:
        llm = ChatLLM(settings, **kwargs)
        created.append(llm)
        return llm

    yield make
    for llm in created:
        await llm.aclose()


# ---- streaming -----------------------------------------------------------------------------


async def test_first_text_delta_arrives_before_the_rest_is_sent(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    release = asyncio.Event()
    text = "The weather in Paris is sunny."
    # Chunks: the role chunk, "The ", then the server holds until released.
    server.script(Reply(text=text, chunk_chars=4, delay_s=0.01, hold=release, hold_after_chunks=2))
    events = make_llm(settings_for(server.base_url)).stream(MESSAGES)

    first = await asyncio.wait_for(anext(events), 5)

    assert first == TextDelta("The ")
    assert server.completed == 0  # the server has not sent the last chunk yet
    release.set()
    rest = await collect(events)
    assert text_of([first, *rest]) == text
    assert all(isinstance(e, TextDelta) for e in rest)
    assert len(rest) == len(text) // 4  # one delta per remaining chunk, not one lump
    assert server.completed == 1


@pytest.mark.parametrize("interleave", [False, True])
async def test_parallel_tool_calls_are_assembled_from_fragments(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM], interleave: bool
) -> None:
    weather = {"city": "Paris", "unit": "celsius"}
    clock = {"timezone": "Europe/Paris"}
    server.script(
        Reply(
            tool_calls=[("get_weather", weather), ("get_time", clock)],
            chunk_chars=5,
            interleave_tool_calls=interleave,
        )
    )

    events = await collect(make_llm(settings_for(server.base_url)).stream(MESSAGES, [WEATHER_TOOL]))

    assert [type(e) for e in events] == [ToolCallRequest, ToolCallRequest]
    first, second = events
    assert isinstance(first, ToolCallRequest) and isinstance(second, ToolCallRequest)
    assert (first.id, first.name, json.loads(first.arguments)) == ("call_1", "get_weather", weather)
    assert (second.id, second.name, json.loads(second.arguments)) == ("call_2", "get_time", clock)


async def test_text_then_tool_call_and_invalid_arguments_are_passed_through(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    server.script(Reply(text="Let me check.", tool_calls=[("get_weather", '{"city": "Par')]))

    events = await collect(make_llm(settings_for(server.base_url)).stream(MESSAGES, [WEATHER_TOOL]))

    assert text_of(events) == "Let me check."
    assert events[-1] == ToolCallRequest(id="call_1", name="get_weather", arguments='{"city": "Par')


async def test_request_body_is_what_was_passed(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    server.script(Reply(text="ok"), Reply(text="ok"))
    llm = make_llm(settings_for(server.base_url, temperature=0.3, parallel_tool_calls=False))

    await collect(llm.stream(MESSAGES, [WEATHER_TOOL]))
    await collect(llm.stream(MESSAGES))

    assert server.requests[0] == {
        "model": "test-model",
        "messages": MESSAGES,
        "tools": [WEATHER_TOOL],
        "parallel_tool_calls": False,
        "temperature": 0.3,
        "stream": True,
    }
    # Without tools neither tools nor parallel_tool_calls is sent.
    assert server.requests[1] == {
        "model": "test-model",
        "messages": MESSAGES,
        "temperature": 0.3,
        "stream": True,
    }
    assert server.last_api_key == KEY


# ---- retries -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(Reply(status=500), id="http-500"),
        pytest.param(Reply(status=503), id="http-503"),
        pytest.param(Reply(status=408), id="http-408"),
        pytest.param(Reply(status=429, headers={"Retry-After": "0"}), id="http-429"),
        pytest.param(Reply(text="lost", malformed=True), id="malformed-chunk"),
        pytest.param(Reply(text="lost", truncate_after_chunks=1), id="no-finish"),
        pytest.param(
            Reply(tool_calls=[("f", {})], malformed=True, malformed_after_chunks=3),
            id="malformed-during-tool-calls",
        ),
    ],
)
async def test_transient_failure_is_retried(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM], failure: Reply
) -> None:
    server.script(failure, Reply(text="Recovered."))
    sleep = SleepRecorder()

    events = await collect(make_llm(settings_for(server.base_url), sleep=sleep).stream(MESSAGES))

    assert text_of(events) == "Recovered."
    assert len(server.requests) == 2
    assert len(sleep.delays) == 1
    if failure.status == 429:
        assert sleep.delays == [0.0]  # Retry-After, not the backoff
    else:
        assert 0.0075 <= sleep.delays[0] <= 0.01  # the first backoff step, with its jitter


async def test_stalled_server_times_out_and_is_retried(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    server.script(Reply(text="never", stall_after_chunks=1), Reply(text="Recovered."))
    llm = make_llm(settings_for(server.base_url, request_timeout_s=0.2))

    events = await collect(llm.stream(MESSAGES))

    assert text_of(events) == "Recovered."
    assert len(server.requests) == 2


async def test_connection_refused_is_retried(make_llm: Callable[..., ChatLLM]) -> None:
    # Bound but not listening: connections are refused until the stand-in starts on it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    standin = OpenAIStandIn(sock=sock)
    standin.script(Reply(text="Recovered."))
    refused_then_started: list[float] = []

    async def start_server_during_backoff(delay: float) -> None:
        refused_then_started.append(delay)
        if len(refused_then_started) == 1:
            await standin.start()

    try:
        llm = make_llm(
            settings_for(f"http://127.0.0.1:{port}/v1"), sleep=start_server_during_backoff
        )
        events = await collect(llm.stream(MESSAGES))
    finally:
        await standin.close()

    assert text_of(events) == "Recovered."
    assert len(refused_then_started) == 1
    assert len(standin.requests) == 1


async def test_attempts_exhausted_names_the_last_cause(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    server.responder = lambda body: Reply(status=502, error_message="upstream is down")
    llm = make_llm(settings_for(server.base_url, max_attempts=3))

    with pytest.raises(LlmError) as caught:
        await collect(llm.stream(MESSAGES))

    assert "after 3 attempts" in str(caught.value)
    assert "HTTP 502" in str(caught.value) and "upstream is down" in str(caught.value)
    assert len(server.requests) == 3


async def test_deadline_spent_while_waiting(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    server.script(Reply(status=500, error_message="hiccup"))
    server.responder = lambda body: Reply(stall_after_chunks=0)
    llm = make_llm(settings_for(server.base_url, turn_deadline_s=0.4, request_timeout_s=5.0))

    with pytest.raises(LlmError) as caught:
        await collect(llm.stream(MESSAGES))

    message = str(caught.value)
    assert "0.4s turn deadline" in message and "HTTP 500" in message and "hiccup" in message
    assert len(server.requests) == 2
    await asyncio.wait_for(server.wait_disconnect(), 2)  # the stalled attempt was hung up on


async def test_backoff_that_would_overrun_the_deadline_gives_up_at_once(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    server.script(Reply(status=429, headers={"Retry-After": "30"}, error_message="slow down"))
    sleep = SleepRecorder()
    llm = make_llm(settings_for(server.base_url), sleep=sleep)

    with pytest.raises(LlmError) as caught:
        await collect(llm.stream(MESSAGES))

    assert "HTTP 429" in str(caught.value) and "turn deadline" in str(caught.value)
    assert sleep.delays == []
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_client_errors_are_not_retried(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM], status: int
) -> None:
    server.script(Reply(status=status, error_message="you did it wrong"), Reply(text="unused"))

    with pytest.raises(LlmError) as caught:
        await collect(make_llm(settings_for(server.base_url)).stream(MESSAGES))

    assert f"HTTP {status}" in str(caught.value) and "you did it wrong" in str(caught.value)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(
            Reply(text="Hello world", malformed=True, malformed_after_chunks=2), id="malformed"
        ),
        pytest.param(Reply(text="Hello world", stall_after_chunks=2), id="stall"),
        pytest.param(Reply(text="Hello world", truncate_after_chunks=2), id="truncated"),
    ],
)
async def test_no_retry_once_text_was_yielded(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM], broken: Reply
) -> None:
    server.script(broken, Reply(text="a second answer must not be fetched"))
    events = make_llm(settings_for(server.base_url, request_timeout_s=0.2)).stream(MESSAGES)
    received: list[LlmEvent] = []

    with pytest.raises(LlmError, match="after part of the reply was delivered"):
        async for event in events:
            received.append(event)

    assert received == [TextDelta("Hell")]
    assert len(server.requests) == 1


async def test_nothing_scripted_fails_clearly(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    with pytest.raises(LlmError, match="nothing was scripted"):
        await collect(make_llm(settings_for(server.base_url, max_attempts=1)).stream(MESSAGES))


# ---- cancellation --------------------------------------------------------------------------


async def test_breaking_out_closes_the_stream(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    server.script(Reply(text="A long answer the caller interrupts. " * 20, delay_s=0.05))
    llm = make_llm(settings_for(server.base_url))

    async def first_only() -> list[LlmEvent]:
        got = []
        async for event in llm.stream(MESSAGES):
            got.append(event)
            break
        return got

    assert await asyncio.wait_for(first_only(), 5) == [TextDelta("A lo")]
    await asyncio.wait_for(server.wait_disconnect(), 2)
    assert server.completed == 0

    # The client is still usable after a barge-in.
    server.script(Reply(text="Next turn."))
    assert text_of(await collect(llm.stream(MESSAGES))) == "Next turn."


async def test_aclose_closes_the_stream(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    server.script(Reply(text="Interrupted answer.", stall_after_chunks=2))
    events = make_llm(settings_for(server.base_url)).stream(MESSAGES)

    assert await asyncio.wait_for(anext(events), 5) == TextDelta("Inte")
    await asyncio.wait_for(events.aclose(), 2)
    await asyncio.wait_for(server.wait_disconnect(), 2)


async def test_cancelling_the_consumer_closes_the_stream(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    server.script(Reply(text="Interrupted answer.", stall_after_chunks=2))
    llm = make_llm(settings_for(server.base_url))
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in llm.stream(MESSAGES):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    await asyncio.wait_for(server.wait_disconnect(), 2)


# ---- configuration -------------------------------------------------------------------------


async def test_base_url_and_key_fall_back_to_the_environment(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-env-only-9b8c7d6e5f"
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    server.script(
        Reply(text="From the environment."),
        # A careless provider echoing the key back must not get it into our error.
        Reply(status=401, error_message=f"Incorrect API key provided: {secret}."),
    )
    llm = make_llm(LlmSettings(model="env-model", backoff_initial_s=0.01))

    events = await collect(llm.stream(MESSAGES))
    with pytest.raises(LlmError) as caught:
        await collect(llm.stream(MESSAGES))

    assert text_of(events) == "From the environment."
    assert server.last_api_key == secret
    assert server.requests[0]["model"] == "env-model"
    assert "HTTP 401" in str(caught.value)
    assert secret not in str(caught.value)


async def test_key_never_appears_in_connection_errors(
    make_llm: Callable[..., ChatLLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        llm = make_llm(settings_for(f"http://127.0.0.1:{port}/v1", api_key=None, max_attempts=2))
        with pytest.raises(LlmError) as caught:
            await collect(llm.stream(MESSAGES))

    assert "after 2 attempts" in str(caught.value) and "cannot reach" in str(caught.value)
    assert KEY not in str(caught.value)


async def test_local_endpoint_without_a_key_gets_a_placeholder(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.script(Reply(text="ok"), Reply(status=401, error_message="a key is needed here"))
    llm = make_llm(settings_for(server.base_url, api_key=None))

    events = await collect(llm.stream(MESSAGES))
    with pytest.raises(LlmError, match="no API key is configured"):
        await collect(llm.stream(MESSAGES))

    assert text_of(events) == "ok"
    assert server.last_api_key  # some bearer token was sent


async def test_injected_client_is_used_and_left_open(
    server: OpenAIStandIn, make_llm: Callable[..., ChatLLM]
) -> None:
    client = AsyncOpenAI(base_url=server.base_url, api_key="sk-injected")
    server.script(Reply(text="ok"))
    llm = make_llm(settings_for(None, api_key=None), client=client)

    assert text_of(await collect(llm.stream(MESSAGES))) == "ok"
    await llm.aclose()
    assert not client.is_closed()
    assert server.last_api_key == "sk-injected"
    await client.close()


# ---- the stand-in itself -------------------------------------------------------------------


async def test_stand_in_speaks_non_streaming_and_models(server: OpenAIStandIn) -> None:
    server.script(Reply(text="Plain answer.", tool_calls=[("get_weather", {"city": "Oslo"})]))
    async with AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0) as client:
        completion = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}]
        )
        models = await client.models.list()

    choice = completion.choices[0]
    assert choice.message.content == "Plain answer."
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("call_1", "get_weather", '{"city": "Oslo"}')
    ]
    assert [m.id for m in models.data] == ["gpt-4o-mini"]


async def test_stand_in_requires_a_bearer_token(server: OpenAIStandIn) -> None:
    server.script(Reply(text="unused"))
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{server.base_url}/chat/completions", json={"model": "m"}) as r:
            status, body = r.status, await r.json()

    assert status == 401
    assert "API key" in body["error"]["message"]
    assert server.pending == 1  # the scripted reply is still there for an authorised request

"""200 calls at once in one process, each writing and reading its own state by implicit names."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.conftest import FIXTURES, speech
from tests.support.openai_server import OpenAIStandIn, Reply
from voice_agent.agents.registry import AgentRegistry
from voice_agent.runtime.session import CallSession

CALLS = 200


def scripted_clerk(body: dict[str, Any]) -> Reply:
    """remember(token) -> recall() -> say what recall returned, for every call independently."""
    messages = body["messages"]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if not results:
        token = messages[-1]["content"].split()[-1]
        return Reply(tool_calls=[("remember", {"token": token})])
    if len(results) == 1:
        return Reply(tool_calls=[("recall", {})])
    return Reply(text=f"Your token is {json.loads(results[-1])['result']}.")


async def test_two_hundred_concurrent_calls_never_see_each_others_state(
    llm: OpenAIStandIn,
) -> None:
    llm.responder = scripted_clerk
    registry = AgentRegistry.from_file(FIXTURES / "concurrency" / "agents.yaml")
    try:

        async def one_call(n: int) -> tuple[CallSession, list[str]]:
            session = CallSession(registry, args={"caller": f"caller-{n}"}, call_id=f"call-{n}")
            await speech(session.start())
            said = await speech(session.user_turn(f"my token is token-{n}"))
            return session, said

        outcomes = await asyncio.gather(*(one_call(n) for n in range(CALLS)))
    finally:
        await registry.aclose()

    for n, (session, said) in enumerate(outcomes):
        token = f"token-{n}"
        assert said == [f"Your token is {token}."]
        assert session.state == {
            "caller": f"caller-{n}",
            "token": token,
            "history": [token],
            "recalled": token,
        }
        prompts = {
            r["messages"][0]["content"]
            for r in llm.requests
            if r["messages"][1]["content"] == f"my token is {token}"
        }
        assert prompts == {f"Remember tokens. Caller caller-{n}."}
    module = registry.agents["clerk"].functions
    assert module is not None
    # The calls really overlapped inside user functions, not one after another.
    assert module.module.most_in_flight > 1
    assert len(llm.requests) == 3 * CALLS

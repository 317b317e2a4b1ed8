"""Shared fixtures: the seed agent config wired to a live OpenAI stand-in and weather server."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from tests.support.openai_server import OpenAIStandIn
from voice_agent.agents.registry import AgentRegistry
from voice_agent.runtime.secrets import Secrets
from voice_agent.runtime.turn_events import AgentEvent, AgentSpeech, AgentSpeechEnd

FIXTURES = Path(__file__).parent / "fixtures"
MEASUREMENTS: list[str] = []


def report(line: str) -> None:
    """A measurement a test wants printed at the end of the run (accuracy, error rates)."""
    MEASUREMENTS.append(line)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if MEASUREMENTS:
        terminalreporter.section("measurements")
        for line in MEASUREMENTS:
            terminalreporter.write_line(line)


SECRET_VALUE = "sk-canary-7f3a9c2e1d"


@pytest.fixture(autouse=True, scope="session")
def _session_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """For servers made by module-scoped fixtures, which start before per-test fixtures."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VOICE_AGENT_DATA_DIR", str(tmp_path_factory.mktemp("data")))
        yield


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("VOICE_AGENT_DATA_DIR", str(tmp_path / "data"))
    yield


@pytest.fixture
async def llm(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OpenAIStandIn]:
    async with OpenAIStandIn() as server:
        # The agents name no endpoint: the SDK's own environment variables point them here.
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        yield server


class WeatherServer:
    def __init__(self) -> None:
        self.paths: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()

        async def weather(request: web.Request) -> web.Response:
            self.paths.append(request.path)
            return web.json_response({"city": request.match_info["city"], "sky": "sunny"})

        app.router.add_get("/weather/{city}", weather)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def weather() -> AsyncIterator[WeatherServer]:
    server = WeatherServer()
    await server.start()
    yield server
    await server.close()


def write_seed_config(tmp_path: Path, weather_url: str, **changes: Any) -> Path:
    """The seed config in tmp_path, with its remote tool pointed at a live server."""
    folder = tmp_path / "agents"
    shutil.copytree(FIXTURES / "agents", folder, dirs_exist_ok=True)
    data = yaml.safe_load((folder / "seed.yaml").read_text())
    data["agents"]["booking"]["tools"]["weather"]["base_url"] = weather_url
    for key, value in changes.items():
        data["agents"]["booking"][key] = value
    path = folder / "seed.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
async def seed_registry(
    tmp_path: Path, weather: WeatherServer, llm: OpenAIStandIn
) -> AsyncIterator[AgentRegistry]:
    registry = AgentRegistry.from_file(
        write_seed_config(tmp_path, weather.url), Secrets({"api_key": SECRET_VALUE})
    )
    yield registry
    await registry.aclose()


async def speech(events: AsyncIterator[AgentEvent]) -> list[str]:
    """The agent's complete utterances, in order."""
    said: list[str] = []
    parts: list[str] = []
    async for event in events:
        if isinstance(event, AgentSpeech):
            parts.append(event.text)
        elif isinstance(event, AgentSpeechEnd):
            said.append("".join(parts))
            parts = []
    return said

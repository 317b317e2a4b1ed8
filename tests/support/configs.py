"""Servers built by tests: copies of the default agents file with sections replaced, and a
server on a free port for one of them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

from voice_agent.agents.registry import AgentRegistry
from voice_agent.core.sentences import SentenceSplitter
from voice_agent.runtime.secrets import Secrets
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).resolve().parent.parent.parent
# pocketsphinx's domain model (it hears the scripted lines word for word) and the agent speaking
# at 1.6 times its pace: for tests of a transport, where every call waits out the greeting.
QUICK_VOICE = {"stt": {"provider": "pocketsphinx"}, "tts": {"speed": 1.6}}
# The default agent's first line (config/agents.yaml), which most call tests hear first.
GREETING = (
    "Hello, thanks for calling Bella Vista! I can book, change or cancel a table. "
    "What would you like to do?"
)


def default_config_with(folder: Path, **sections: Any) -> Path:
    """config/agents.yaml written to `folder` with top-level `sections` replaced; the agents'
    functions and intents files still resolve to config/."""
    data = yaml.safe_load((ROOT / "config" / "agents.yaml").read_text())
    for agent in data["agents"].values():
        for key in ("functions", "intents"):
            if key in agent:
                agent[key] = str(ROOT / "config" / agent[key])
    data.update(sections)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "agents.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


async def serving(
    config: Path,
    *,
    sip: bool | list[str] = False,
    secrets: Mapping[str, str] | None = None,
) -> AsyncIterator[VoiceServer]:
    """A VoiceServer for `config` on a free localhost port, shut down after use; with `sip`,
    also taking SIP calls on a free UDP port of 127.0.0.1 (`server.sip.port`), or on the
    listeners `sip` lists (as `sip.listen` takes them: "tcp:127.0.0.1:0", ...)."""
    registry = AgentRegistry.from_file(config, Secrets(secrets) if secrets else None)
    listen = sip if isinstance(sip, list) else "127.0.0.1:0" if sip else None
    voice_server = VoiceServer(registry, port=0, sip_listen=listen)
    if "max_loop_lag_ms" not in registry.loaded.config.server.model_fields_set:
        # The suite runs on two workers sharing two cores, and some tests collect garbage on
        # purpose: the loop is late then for reasons no caller of a real server meets, and
        # admission would refuse the next call. Admission by lag is tested on its own
        # (tests/test_admission.py); a config that sets max_loop_lag_ms keeps it.
        voice_server.admission.max_loop_lag_ms = None
    await voice_server.start()
    yield voice_server
    await voice_server.shutdown(1)
    await registry.aclose()


async def ended_call(server: VoiceServer, call_id: str) -> dict[str, Any]:
    """The call as `GET /calls/{id}` shows it, once the call has ended."""
    pipeline = server.pipelines.get(call_id)
    if pipeline is not None:
        await pipeline.finished.wait()
    async with httpx.AsyncClient() as http:
        response = await http.get(f"http://127.0.0.1:{server.port}/calls/{call_id}")
    assert response.status_code == 200
    call: dict[str, Any] = response.json()
    return call


async def words_played(server: VoiceServer, text: str, played_ms: float) -> int:
    """How many words of `text` end within its first `played_ms` of the default agent's
    speech, sentence by sentence as the pipeline speaks it, by the TTS's own timings."""
    tts = server.engines(server.registry.agents["booking"]).tts
    splitter = SentenceSplitter()
    offset_ms, count = 0.0, 0
    for sentence in [*splitter.push(text), *splitter.flush()]:
        audio = b""
        async for chunk in tts.synthesize(sentence):
            audio += chunk.pcm
            count += sum(1 for w in chunk.words if offset_ms + w.end_ms <= played_ms)
        offset_ms += len(audio) / (tts.sample_rate * 2) * 1000
    return count

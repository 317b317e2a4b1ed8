"""What the tests of calls placed through a carrier share: the agent that meets answering
machines, POST /calls, a callback URL's public address on the control port, and the call's
record once it has ended."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from tests.support.configs import QUICK_VOICE, default_config_with
from voice_agent.server.app import VoiceServer

MESSAGE = "Hi, this is Bella Vista with a reminder of your booking tonight. Goodbye."
PUBLIC = "https://voice.example.com"  # where the carrier is told the streams go
CONTROL_PUBLIC = "https://control.example.com:8444"  # and its callbacks


def add_reminder_agent(config: Path) -> None:
    """A `reminder` agent beside the default one: the booking agent that detects answering
    machines and leaves MESSAGE when one's message may start."""
    data = yaml.safe_load(config.read_text())
    reminder = copy.deepcopy(data["agents"]["booking"])
    reminder["answering_machine"] = True
    reminder["flow"].setdefault("events", {})["voicemail"] = {"say": MESSAGE, "end_call": True}
    data["agents"]["reminder"] = reminder
    config.write_text(yaml.safe_dump(data, sort_keys=False))


def placing_config(folder: Path, *, server: dict[str, Any], carriers: dict[str, Any]) -> Path:
    """The default config of a server that places calls through `carriers`: the control API on
    a port of its own behind the `control` token's secret, public URLs for streams and
    callbacks, quick voice engines, and the reminder agent; `server` adds to its settings."""
    path = default_config_with(
        folder,
        voice=QUICK_VOICE,
        server={
            "api_tokens": ["control"],
            "control_listen": "127.0.0.1:0",
            "public_url": PUBLIC,
            "control_public_url": CONTROL_PUBLIC,
            **server,
        },
        carriers=carriers,
    )
    add_reminder_agent(path)
    return path


async def place(server: VoiceServer, token: str, body: dict[str, Any]) -> httpx.Response:
    assert server.control is not None
    async with httpx.AsyncClient() as http:
        return await http.post(
            f"http://127.0.0.1:{server.control.port}/calls",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        )


def on_control_port(server: VoiceServer, url: str) -> str:
    """The control port a callback URL's public address stands for."""
    assert server.control is not None
    parts = urlsplit(url)
    return f"http://127.0.0.1:{server.control.port}{parts.path}?{parts.query}"


async def get_record(server: VoiceServer, token: str, call_id: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.get(
            f"http://127.0.0.1:{server.port}/calls/{call_id}",
            headers={"Authorization": f"Bearer {token}"},
        )


async def record_when_ended(server: VoiceServer, token: str, call_id: str) -> dict[str, Any]:
    """The call's record once it has ended: after its pipeline, if it reached one; a call
    never answered is written when its callback or its refusal comes, polled for here."""
    pipeline = server.pipelines.get(call_id)
    if pipeline is not None:
        await pipeline.finished.wait()
    for _ in range(200):  # 10 s
        response = await get_record(server, token, call_id)
        if response.status_code == 200 and response.json().get("ended_at"):
            record: dict[str, Any] = response.json()
            return record
        await asyncio.sleep(0.05)
    raise AssertionError(f"call {call_id} has no ended record")

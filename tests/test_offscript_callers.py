"""The default agent, as shipped (Whisper tiny.en), understands callers who do not say what its
intents' training phrases say: off-script booking lines over the phone path (/twilio, 8 kHz
mu-law) and from the browser (/rtc, 16 kHz Opus), asserting what the flow made of them.

The lines (tests/fixtures/audio/*_offscript*) were written for the evaluation set, phrased
unlike any training phrase: "hey there could i get a spot for three people this friday around
eight", "put it under maria garcia".
"""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import async_playwright

from tests.support.configs import ended_call, serving
from tests.test_browser import call as start_page_call
from tests.test_browser import caller_wav, open_browser
from voice_agent.callers import TwilioClient
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VoiceServer]:
    async for voice_server in serving(ROOT / "config" / "agents.yaml"):
        yield voice_server


def intents(call: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    return [(e["intent"], e["parameters"]) for e in call["audit"] if e["type"] == "intent_match"]


def assert_booking_request_understood(state: dict[str, Any]) -> None:
    """'...a spot for three people this friday around eight': three at eight pm on a Friday."""
    assert state["party_size"] == 3
    assert datetime.date.fromisoformat(state["date"]).weekday() == 4
    assert state["time"] == "20:00"


async def test_an_off_script_caller_over_the_phone(server: VoiceServer) -> None:
    stt = server.engines(server.registry.agents["booking"]).stt
    assert getattr(stt, "whisper", None) is not None  # the default agent hears with Whisper
    async with TwilioClient(
        f"ws://127.0.0.1:{server.port}/twilio", call_sid="CAoffscript", timeout=60
    ) as caller:
        await caller.wait_silence_after_audio(500)
        for line in ("joe_offscript1", "joe_offscript2"):
            heard = caller.received_ms
            await caller.send_audio((AUDIO / f"{line}.ulaw").read_bytes())
            await caller.wait_audio(heard + 1)
            await caller.wait_silence_after_audio(700)
        await caller.stop()
    call = await ended_call(server, "CAoffscript")
    matched = intents(call)
    assert matched[0][0] == "book_table", matched
    assert_booking_request_understood(call["state"])
    assert call["state"]["name"] == "Maria Garcia"
    asked = [m["content"] for m in call["context"]["messages"] if m["role"] == "assistant"]
    assert asked[-1] == "And what's a good phone number to reach you?"


async def test_an_off_script_caller_in_the_browser(server: VoiceServer, tmp_path: Path) -> None:
    wav = caller_wav(tmp_path / "caller.wav", 8.0, "joe_offscript1")
    async with async_playwright() as playwright:
        context = await open_browser(playwright, tmp_path, wav)
        page = context.pages[0] if context.pages else await context.new_page()
        call_id = await start_page_call(page, server)
        await page.wait_for_selector("#transcript li.user", timeout=30_000)
        await page.wait_for_selector('#transcript li.agent[data-reply-id="2"]', timeout=20_000)
        await page.click("#hangup")
        await page.wait_for_function(
            "document.querySelector('#status').textContent.includes('ended')", timeout=10_000
        )
        await context.close()
    call = await ended_call(server, call_id)
    assert call["transport"] == "webrtc"
    assert intents(call)[0][0] == "book_table", json.dumps(intents(call))
    assert_booking_request_understood(call["state"])

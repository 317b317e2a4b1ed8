"""The call page in a real browser: headless Chromium (Debian's, no download) driven by
Playwright, its fake microphone playing a caller fixture, calling the default agent over WebRTC.

Set VOICE_AGENT_SCREENSHOTS=DIR to keep a screenshot of the page mid-call (docs/call-page.png
is one)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from playwright.async_api import BrowserContext, Page, async_playwright

from tests.support.browser import CHROMIUM
from tests.support.browser import CHROMIUM_FLAGS as BROWSER_FLAGS
from tests.support.configs import GREETING, serving
from tests.support.configs import ended_call as record
from voice_agent.audio.wav import read_wav, write_wav
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
CHROMIUM_FLAGS = [
    *BROWSER_FLAGS,
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(autouse=True)
def chromium_installed() -> None:
    # Never a silent skip: without the browser these tests fail and say why.
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: scripts/test installs chromium"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VoiceServer]:
    async for voice_server in serving(ROOT / "config" / "agents.yaml"):
        yield voice_server
    assert not voice_server.rtc.peers, "peer connections left behind"


def caller_wav(path: Path, silence_s: float, line: str) -> Path:
    """The fake microphone's file: silence, the caller's line, then silence to the test's end."""
    pcm, rate = read_wav(AUDIO / f"{line}.wav")
    quiet = np.zeros(int(rate * silence_s), dtype="<i2").tobytes()
    write_wav(path, quiet + pcm + bytes(rate * 2 * 40), rate)
    return path


async def open_browser(playwright: Any, tmp: Path, wav: Path) -> BrowserContext:
    context: BrowserContext = await playwright.chromium.launch_persistent_context(
        str(tmp / "profile"),  # a fresh profile per browser
        executable_path=CHROMIUM,
        headless=True,
        args=[*CHROMIUM_FLAGS, f"--use-file-for-fake-audio-capture={wav}"],
        viewport={"width": 1100, "height": 760},
        bypass_csp=True,  # lets the test evaluate its checks; the page itself runs under the CSP
    )
    return context


async def call(page: Page, server: VoiceServer) -> str:
    await page.goto(f"http://127.0.0.1:{server.port}/")
    await page.wait_for_function("document.querySelector('#agent').options.length > 0")
    await page.select_option("#agent", "booking")
    await page.click("#call")
    await page.wait_for_function("window.voiceAgent && window.voiceAgent.callId", timeout=20_000)
    call_id: str = await page.evaluate("window.voiceAgent.callId")
    return call_id


def assistant(call: dict[str, Any]) -> list[str]:
    return [m["content"] for m in call["context"]["messages"] if m["role"] == "assistant"]


async def test_a_caller_books_through_the_page(server: VoiceServer, tmp_path: Path) -> None:
    wav = caller_wav(tmp_path / "caller.wav", 8.0, "joe_book1")
    async with async_playwright() as playwright:
        context = await open_browser(playwright, tmp_path, wav)
        page = context.pages[0] if context.pages else await context.new_page()
        call_id = await call(page, server)
        await page.wait_for_selector("#transcript li.user", timeout=30_000)
        # The reply has played out in the browser: the server committed it.
        await page.wait_for_selector('#transcript li.agent[data-reply-id="2"][data-committed]')
        await page.wait_for_selector("#metrics :text('ms')", timeout=10_000)
        user_line = await page.inner_text("#transcript li.user")
        energy = await page.evaluate("window.voiceAgent.inboundAudioEnergy()")
        state_text = await page.inner_text("#state")
        await page.click("#hangup")
        await page.wait_for_function(
            "document.querySelector('#status').textContent.includes('ended')", timeout=10_000
        )
        await context.close()

    assert "book a table" in user_line
    assert "party_size" in state_text
    assert energy > 0.01, "the browser received no agent audio above silence"
    call_record = await record(server, call_id)
    assert call_record["transport"] == "webrtc"
    assert assistant(call_record) == [GREETING, "What name should I put the booking under?"]
    assert call_record["state"]["party_size"] == 2


async def test_a_barge_in_through_the_page_strikes_the_unheard_words(
    server: VoiceServer, tmp_path: Path
) -> None:
    wav = caller_wav(tmp_path / "caller.wav", 2.0, "joe_book1")
    async with async_playwright() as playwright:
        context = await open_browser(playwright, tmp_path, wav)
        page = context.pages[0] if context.pages else await context.new_page()
        call_id = await call(page, server)
        await page.wait_for_selector("#transcript li.agent del", timeout=30_000)
        struck = await page.inner_text("#transcript li.agent del")
        await page.wait_for_selector('#transcript li.agent[data-reply-id="2"][data-committed]')
        screenshots = os.environ.get("VOICE_AGENT_SCREENSHOTS")
        if screenshots:
            await page.screenshot(path=str(Path(screenshots) / "call-page.png"))
        await page.click("#hangup")
        await context.close()

    call_record = await record(server, call_id)
    heard = assistant(call_record)[0]
    assert GREETING.startswith(heard.rstrip(".,!?")) and len(heard) < len(GREETING)
    assert struck.strip() and GREETING.endswith(struck.strip())
    assert any(e["type"] == "barge_in" for e in call_record["audit"])

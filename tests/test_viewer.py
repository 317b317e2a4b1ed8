"""The call viewer: the list of calls (/calls/view) and one call's page (/calls/{id}/view).

A real call first: a Twilio caller says "yeah" over the greeting (a backchannel, dropped), barges
in with a booking line (the rest of the greeting is cut), then gives a name and a phone number
(state changes, a tool call, one latency waterfall per turn). Then headless Chromium (Debian's,
no download) opens the pages, under their content security policy.

Set VOICE_AGENT_SCREENSHOTS=DIR to keep a screenshot of the call's page (docs/call-view.png is one).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright

from tests.support.browser import CHROMIUM, CHROMIUM_FLAGS
from tests.support.configs import GREETING, QUICK_VOICE, default_config_with, serving
from voice_agent.callers import TwilioClient
from voice_agent.server.app import VoiceServer
from voice_agent.server.pages import CONTENT_SECURITY_POLICY, calls_view_response, page_response

ROOT = Path(__file__).parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"
CALL_ID = "CAviewer"

ASYNC = pytest.mark.asyncio(loop_scope="module")


def ulaw(name: str) -> bytes:
    return (AUDIO / f"{name}.ulaw").read_bytes()


# ---- the pages' routes, without a server --------------------------------------------------


def test_the_viewer_pages_are_served_with_the_strict_policy() -> None:
    for path, marker in [
        ("/calls/view", b'data-page="calls"'),
        ("/calls/view/?token=abc", b'data-page="calls"'),
        ("/calls/CA123/view", b'data-page="call"'),
        ("/calls/CA123/view?token=abc", b'data-page="call"'),
    ]:
        response = calls_view_response(path)
        assert response is not None, path
        assert response.status_code == 200, path
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert marker in response.body
        assert b"<script>" not in response.body and b"style=" not in response.body
        assert b'<script src="/static/viewer.js" defer></script>' in response.body


def test_other_paths_are_not_viewer_pages() -> None:
    for path in ["/calls", "/calls/CA123", "/calls/a/b/view", "/calls//view", "/view", "/"]:
        assert calls_view_response(path) is None, path
    missing = page_response("nothing.html")
    assert missing.status_code == 404
    assert page_response("../pages.py").status_code == 404


# ---- a real call, then the browser --------------------------------------------------------


@pytest.fixture(scope="module")
def chromium_installed() -> None:
    # Never a silent skip: without the browser these tests fail and say why.
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: scripts/test installs chromium"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    # The viewer shows whatever the call was; the transport tests' quick voice makes it sooner.
    config = default_config_with(tmp_path_factory.mktemp("viewer"), voice=QUICK_VOICE)
    async for voice_server in serving(config):
        yield voice_server


async def say_and_wait(caller: TwilioClient, audio: bytes) -> None:
    heard = caller.received_ms
    await caller.send_audio(audio)
    await caller.wait_audio(heard + 1)
    await caller.wait_silence_after_audio(500)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def call(server: VoiceServer) -> dict[str, Any]:
    """The call as `GET /calls/{id}` shows it once it has ended."""
    url = f"ws://127.0.0.1:{server.port}/twilio"
    async with TwilioClient(url, call_sid=CALL_ID, timeout=60) as caller:
        await caller.wait_audio(1)
        await caller.send_silence(1200)
        await caller.send_audio(ulaw("joe_bc-yeah"))  # a backchannel: the agent goes on
        await caller.send_silence(1500)
        await caller.send_audio(ulaw("joe_book1"))  # a barge-in: the rest is never heard
        await caller.wait_clear()
        await caller.wait_audio(caller.received_ms + 1)
        await caller.wait_silence_after_audio(500)
        await say_and_wait(caller, ulaw("joe_book2"))
        await say_and_wait(caller, ulaw("joe_book3"))  # the quote: a tool call
        await caller.stop()
    pipeline = server.pipelines.get(CALL_ID)
    if pipeline is not None:
        await pipeline.finished.wait()
    async with httpx.AsyncClient() as http:
        response = await http.get(f"http://127.0.0.1:{server.port}/calls/{CALL_ID}")
    assert response.status_code == 200
    record: dict[str, Any] = response.json()
    return record


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def browser(chromium_installed: None) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
        )
        yield chromium
        await chromium.close()


async def open_page(browser: Browser, url: str, problems: list[str]) -> Page:
    """The page once its script has rendered the data; console errors go into `problems`."""
    page = await browser.new_page(viewport={"width": 1200, "height": 900})
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    await page.goto(url)
    await page.wait_for_selector("body[data-loaded]", state="attached", timeout=10_000)
    return page


def audit(call: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [event for event in call["audit"] if event["type"] == kind]


@ASYNC
async def test_the_call_page_shows_the_conversation(
    server: VoiceServer, call: dict[str, Any], browser: Browser
) -> None:
    # The call went as planned: otherwise the page has nothing to show.
    assert audit(call, "user_utterance_dropped")[0]["reason"] == "backchannel"
    assert audit(call, "barge_in")
    assert any(e["name"] == "quote_booking" for e in audit(call, "tool_call"))
    problems: list[str] = []
    base = f"http://127.0.0.1:{server.port}"
    requests: list[str] = []
    page = await open_page(browser, f"{base}/calls/{CALL_ID}/view?token=t0k", problems)
    page.on("request", lambda r: requests.append(r.url))
    await page.reload()
    await page.wait_for_selector("body[data-loaded]", state="attached")

    assert await page.inner_text("#call-id") == CALL_ID
    details = await page.inner_text("#details")
    assert "twilio" in details and "booking" in details and "caller hung up" in details
    assert await page.get_attribute("#back", "href") == "/calls/view?token=t0k"
    assert f"{base}/calls/{CALL_ID}?token=t0k" in requests

    callers = await page.locator("#timeline .bubble.user:not(.dropped)").all_inner_texts()
    assert any("book a table for two" in line for line in callers), callers
    assert any("john smith" in line.lower() for line in callers), callers

    # The greeting as generated: the heard words, then the unheard rest struck through.
    greeting = page.locator("#timeline .bubble.agent").first
    struck = (await greeting.locator("del").inner_text()).strip()
    assert struck and GREETING.endswith(struck) and len(struck) < len(GREETING)
    assert "interrupted" in (await greeting.inner_text()).lower()
    assert (await page.locator("#timeline .meta.barge").count()) >= 1

    dropped = await page.locator("#timeline .bubble.dropped").first.inner_text()
    assert "backchannel" in dropped.lower() and "yeah" in dropped.lower()

    diffs = " ".join(await page.locator("#timeline .meta.state").all_inner_texts())
    assert "party_size" in diffs and "\u2192 2" in diffs and "John Smith" in diffs
    tool = page.locator("#timeline .meta.tool", has_text="quote_booking").first
    await tool.locator("summary").click()
    assert "spoken" in await tool.inner_text()  # the (redacted) result, expanded
    assert await page.locator("#timeline .meta.flow", has_text="collect_booking").count()

    # One waterfall per turn, each with a bar per step, laid out by the script (under the CSP).
    turns = len(call["turns"])
    assert turns >= 3
    assert await page.locator("#waterfall figure.turn").count() == turns
    # A bar per step the turn measured (a turn the caller cut off may lack its later steps).
    steps = ("end_of_turn_ms", "stt_final_ms", "first_token_ms", "first_tts_audio_ms",
             "first_audio_sent_ms")  # fmt: skip
    measured = [
        sum(isinstance(turn.get(key), int | float) for key in steps)
        for turn in call["turns"]
        if isinstance(turn.get("speech_end_ms"), int | float)
        or isinstance(turn.get("user_turn_ms"), int | float)
    ]
    bars = page.locator("#waterfall .bar")
    assert await bars.count() == sum(measured) >= 3 * turns
    widths = [(await bar.bounding_box() or {"width": 0})["width"] for bar in await bars.all()]
    track = await page.locator("#waterfall .track").first.bounding_box()
    assert track is not None and all(0 < w <= track["width"] + 1 for w in widths)
    assert max(widths) > track["width"] / 2  # the longest step spans most of the scale
    assert "party_size" in await page.inner_text("#state")

    screenshots = os.environ.get("VOICE_AGENT_SCREENSHOTS")
    if screenshots:
        await tool.locator("summary").click()  # folded again, as a visitor first sees it
        await page.screenshot(path=str(Path(screenshots) / "call-view.png"), full_page=True)
    await page.close()
    assert not problems, problems


@ASYNC
async def test_the_list_page_links_to_the_call(
    server: VoiceServer, call: dict[str, Any], browser: Browser
) -> None:
    problems: list[str] = []
    base = f"http://127.0.0.1:{server.port}"
    page = await open_page(browser, f"{base}/calls/view?token=t0k", problems)
    href = f'a[href="/calls/{CALL_ID}/view?token=t0k"]'
    link = page.locator(f"#calls {href}")
    assert await link.count() == 1
    row = await page.locator("#calls tbody tr", has=page.locator(href)).inner_text()
    assert "booking" in row and "twilio" in row

    # A filter that matches nothing, then back to every call.
    await page.select_option("#agent", "concierge")
    await page.click("#apply")
    await page.wait_for_selector("#calls td.empty")
    assert "agent=concierge" in page.url and "token=t0k" in page.url
    await page.go_back()
    await link.wait_for()

    await link.click()
    await page.wait_for_url(f"{base}/calls/{CALL_ID}/view?token=t0k")
    await page.wait_for_selector("body[data-loaded]", state="attached")
    assert await page.inner_text("#call-id") == CALL_ID
    await page.close()
    assert not problems, problems

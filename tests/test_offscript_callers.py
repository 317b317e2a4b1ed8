"""The default agent, as shipped (Whisper tiny.en), understands callers who do not say what its
intents' training phrases say: off-script booking lines over the phone path (/twilio, 8 kHz
mu-law) and from the browser (/rtc, 16 kHz Opus), asserting what the flow made of them; and
it takes neither a backchannel over its speech nor noise on the line for a turn.

The lines (tests/fixtures/audio/*_offscript*) were written for the evaluation set, phrased
unlike any training phrase: "hey there could i get a spot for three people this friday around
eight", "put it under maria garcia".
"""

from __future__ import annotations

import asyncio
import datetime
import json
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from playwright.async_api import async_playwright

from tests.support.configs import GREETING, ended_call, serving
from tests.test_browser import call as start_page_call
from tests.test_browser import caller_wav, open_browser
from voice_agent.audio.g711 import ulaw_decode, ulaw_encode
from voice_agent.callers import Clear, TwilioClient
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


def assert_booking_request_understood(call: dict[str, Any]) -> None:
    """'...a spot for three people this friday around eight': three at eight pm on a Friday,
    however the line was split into turns; a failure says what the server heard."""
    heard = [(e["text"], e["parameters"]) for e in call["audit"] if e["type"] == "intent_match"]
    when = call["state"].get("when")
    assert call["state"]["party_size"] == 3, heard
    assert when is not None, heard
    assert datetime.datetime.fromisoformat(when).weekday() == 4, heard
    assert when.endswith("T20:00"), heard


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
    assert_booking_request_understood(call)
    assert call["state"]["name"] == "Maria Garcia"
    asked = [m["content"] for m in call["context"]["messages"] if m["role"] == "assistant"]
    assert asked[-1] == "And what's a good phone number to reach you?"


async def browser_call(server: VoiceServer, tmp_path: Path) -> dict[str, Any]:
    """One call from the page with the fake microphone playing the booking line."""
    await asyncio.to_thread(tmp_path.mkdir)
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
    return await ended_call(server, call_id)


def heard_friday(call: dict[str, Any]) -> bool:
    return any(
        "friday" in e["text"].lower() for e in call["audit"] if e["type"] == "user_utterance"
    )


async def test_an_off_script_caller_in_the_browser(server: VoiceServer, tmp_path: Path) -> None:
    call = await browser_call(server, tmp_path / "first")
    if not heard_friday(call):
        # On a loaded two-core runner the line once reached Whisper with about a tenth of a
        # second of "this Friday" gone: it read "to straight", as it reads a 120 ms hole there
        # offline (shifted starts and single lost packets never change its reading). The
        # likeliest cause is Chromium's fake microphone starved of CPU; it was not reproduced
        # here. So one more call, which must be understood whole.
        warnings.warn(
            f"browser call misheard, calling again: {json.dumps(intents(call))}", stacklevel=1
        )
        call = await browser_call(server, tmp_path / "second")
    assert call["transport"] == "webrtc"
    assert intents(call)[0][0] == "book_table", json.dumps(intents(call))
    assert_booking_request_understood(call)


# Every word in the natural voice; in the eSpeak ones the two hums, which Whisper reads worst.
# Three of those it reads as words ("And I'm not.", "Bye.", "And man, um..."): words are the
# caller's turn, however unsure the reading (docs/protocol.md), so those are no backchannel to the
# server; docs/performance.md counts how often that happens ("Words never thrown away").
READ_AS_WORDS = {("joe", "mm-hmm"), ("joe", "right"), ("espeak", "mm-hmm")}
LONG_BACKCHANNELS = [
    pair
    for pair in [
        *(("joe", word) for word in ("uh-huh", "mm-hmm", "yeah", "okay", "right")),
        *((voice, word) for voice in ("espeak", "espeakf") for word in ("uh-huh", "mm-hmm")),
    ]
    if pair not in READ_AS_WORDS
]


@pytest.mark.parametrize(("voice", "word"), LONG_BACKCHANNELS)
async def test_a_drawn_out_backchannel_is_never_taken_for_a_turn(
    server: VoiceServer, word: str, voice: str
) -> None:
    """0.6 to 1.3 s of "okaaay" while the agent speaks. Whisper gives no words until the caller
    stops, so the agent pauses at min_interruption_ms; one of up to 1 s has it go on at the
    caller's pause, from where it stopped, a longer one when the transcript shows a
    backchannel: the greeting is heard whole, nothing of it twice, and committed; the caller's
    "okay" is not (docs/protocol.md, "Pause, not stop")."""
    sid = f"CAbclong{voice}{word}"
    async with TwilioClient(f"ws://127.0.0.1:{server.port}/twilio", call_sid=sid) as caller:
        await caller.wait_audio(1)
        await caller.send_silence(1500)
        await caller.send_audio((AUDIO / f"{voice}_bclong-{word}.ulaw").read_bytes())
        clear = await caller.wait_clear()
        await caller.wait_audio_after(clear)  # the agent speaks again...
        await caller.wait_silence_after_audio(800)  # ...to the end of what it says
        await caller.stop()
    call = await ended_call(server, sid)
    said = [m["content"] for m in call["context"]["messages"]]
    assert said == [GREETING]  # no user turn; the greeting heard, and committed, whole
    dropped = [e["reason"] for e in call["audit"] if e["type"] == "user_utterance_dropped"]
    assert len(dropped) == 1 and len(caller.clears) == 1
    (went_on,) = [e["reason"] for e in call["audit"] if e["type"] == "false_interruption"]
    if went_on == "brief":
        assert_goes_on_where_it_stopped(caller, clear)


def assert_goes_on_where_it_stopped(caller: TwilioClient, clear: Clear) -> None:
    """The audio sent after `clear` carries on from the sample the caller had heard to when
    it came, give or take the clear's trip (not from the start of the word, said again)."""
    before = caller.frames[: clear.frames_before]
    sent = b"".join(f.data for f in before)
    heard = sum(f.played_bytes(clear.at, caller.bytes_per_second) for f in before)
    again = b"".join(f.data for f in caller.frames[clear.frames_before :])
    start = next(i for i, byte in enumerate(again) if byte not in (0xFF, 0x7F))  # past silence
    piece = again[start : start + 800]  # 100 ms of the agent's voice
    found = sent.find(piece, max(0, heard - 8 * 500))
    assert found != -1, "the audio after the clear is not the rest of what was sent before it"
    assert abs(found - start - heard) <= 8 * 60, (found - start, heard)


def door_slam(rate: int = 8000, seed: int = 11) -> np.ndarray:
    """A thump: a low resonance struck hard, with a rattle of noise, dying in 0.3 s."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * 0.4)) / rate
    body = np.sin(2 * np.pi * 90 * t) + 0.5 * np.sin(2 * np.pi * 180 * t)
    rattle = rng.standard_normal(t.size) * 0.3
    return (body + rattle) * np.exp(-t / 0.08) * 20000


async def test_noise_on_the_line_never_becomes_a_turn(server: VoiceServer) -> None:
    """A door, a cough and two seconds of hiss after the greeting: no user turn, no reply."""
    rng = np.random.default_rng(5)
    hiss = rng.standard_normal(8000 * 2) * 300
    silence = np.zeros(8000)
    cough = np.frombuffer(ulaw_decode((AUDIO / "cough.ulaw").read_bytes()), dtype="<i2")
    noise = np.concatenate([door_slam(), silence, cough, silence, hiss, silence])
    line = ulaw_encode(np.clip(noise, -32768, 32767).astype("<i2").tobytes())
    async with TwilioClient(
        f"ws://127.0.0.1:{server.port}/twilio", call_sid="CAnoiseline"
    ) as caller:
        await caller.wait_silence_after_audio(500)
        greeted_ms = caller.received_ms
        await caller.send_audio(line)
        await caller.send_silence(1500)
        await caller.stop()
    call = await ended_call(server, "CAnoiseline")
    assert [m for m in call["context"]["messages"] if m["role"] == "user"] == []
    assert caller.received_ms == greeted_ms  # the agent said nothing more

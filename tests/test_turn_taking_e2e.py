"""Turn-taking over /twilio with `turn.detector: smart`, on real recorded speech (LibriVox,
from pocketsphinx-testdata): a finished sentence is answered after the short silence, and a
pause of a second or more inside a phrase is waited out, not answered half-heard.

The figures (how fast, how often a pause is cut off) are measured on a held-out set by
scripts/eval_turns.py, not here: these tests assert what the caller notices.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.support.configs import default_config_with, ended_call, serving
from tests.support.speech_eval import ASTERISK
from tests.test_words_kept import split_at
from voice_agent.audio.g711 import ulaw_encode
from voice_agent.audio.resample import resample
from voice_agent.audio.wav import read_wav
from voice_agent.callers import TwilioClient
from voice_agent.core.words import words_of
from voice_agent.server.app import VoiceServer

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VoiceServer]:
    config = default_config_with(
        tmp_path_factory.mktemp("smart"),
        voice={"stt": {"provider": "whisper", "model": "tiny.en"}, "turn": {"detector": "smart"}},
    )
    async for voice_server in serving(config):
        yield voice_server


def judged(call: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in call["audit"] if e["type"] == "turn_judged"]


async def after_greeting(server: VoiceServer, sid: str) -> TwilioClient:
    caller = TwilioClient(f"ws://127.0.0.1:{server.port}/twilio", call_sid=sid, timeout=60)
    await caller.connect()
    await caller.wait_audio(1)
    await caller.wait_silence_after_audio(300)
    return caller


async def test_a_finished_sentence_is_answered_after_the_short_silence(
    server: VoiceServer,
) -> None:
    # A whole prompt, said as one (a LibriVox sentence is read on into the next: it sounds
    # unfinished, and is).
    pcm, rate = read_wav(ASTERISK / "vm-nobox.wav")  # "You cannot reply to this message..."
    caller = await after_greeting(server, "CAsmartdone")
    await caller.send_audio(ulaw_encode(resample(pcm, rate, 8000)))
    await caller.wait_audio(caller.received_ms + 1)
    await caller.wait_silence_after_audio(500)
    await caller.stop()
    call = await ended_call(server, "CAsmartdone")
    # Which evidence decided depends on how soon it came (the speculative transcript waits
    # for a Whisper worker): that the pause was weighed, and the sentence answered, does not.
    verdict = judged(call)[-1]
    assert verdict["acoustic"] is not None and verdict["silence_ms"] < 2500, verdict
    said = [m["content"] for m in call["context"]["messages"] if m["role"] == "user"]
    assert len(said) == 1 and "mailbox" in said[0].lower(), said


@pytest.mark.parametrize(
    ("name", "cut_s", "pause_s"),
    [
        # "...rather cold-hearted and | rather selfish...": the words stop on "and"
        ("sense_and_sensibility_01_austen_64kb-0890", 2.64, 1.2),
        # "He might even have been | made amiable himself": it sounds unfinished
        ("sense_and_sensibility_01_austen_64kb-0930", 1.40, 1.0),
    ],
)
async def test_a_pause_inside_a_phrase_is_waited_out(
    server: VoiceServer, name: str, cut_s: float, pause_s: float
) -> None:
    first, rest = split_at(name, cut_s)
    sid = f"CAsmartpause{name[-4:]}"
    caller = await after_greeting(server, sid)
    heard = caller.received_ms
    await caller.send_audio(first)
    await caller.send_silence(int(pause_s * 1000))
    assert caller.received_ms == heard  # nothing said into the pause...
    await caller.send_audio(rest)
    await caller.wait_audio(heard + 1)  # ...and the whole sentence answered
    await caller.wait_silence_after_audio(500)
    await caller.stop()
    call = await ended_call(server, sid)
    assert not caller.clears
    said = [m["content"] for m in call["context"]["messages"] if m["role"] == "user"]
    assert len(said) == 1 and len(words_of(said[0])) >= 6, said
    assert not [e for e in call["audit"] if e["type"] == "user_turn_continued"]
    assert judged(call), "the pauses were not weighed"

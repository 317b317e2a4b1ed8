"""A caller's sentence split by a pause, over /twilio to the default agent (Whisper): real
recorded speech (LibriVox, read by a person, from pocketsphinx-testdata) cut at a word
boundary mid-phrase with 0.8 to 1.2 s of silence held there. Nothing the caller said is
dropped, the sentence is one user message, and a reply begun in the pause is cut.

The cut points are the word boundaries faster-whisper's word timestamps gave on tiny.en
(moved to the quietest 20 ms within 60 ms); the sentences are not in any training phrase.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from tests.support.configs import GREETING, ended_call, serving
from tests.support.speech_eval import SPHINX
from voice_agent.audio.g711 import ulaw_encode
from voice_agent.audio.resample import resample
from voice_agent.audio.wav import read_wav
from voice_agent.callers import TwilioClient
from voice_agent.core.call import DEFAULT_BACKCHANNELS
from voice_agent.core.words import words_of
from voice_agent.server.app import VoiceServer

ROOT = Path(__file__).parent.parent
LIBRIVOX = SPHINX / "librivox"
pytestmark = pytest.mark.asyncio(loop_scope="module")

# (recording, where its phrase is cut in s, the pause held there in s, a word of each part)
SPLIT_SENTENCES = [
    ("sense_and_sensibility_01_austen_64kb-0930", 1.40, 1.0, ("might", "made")),
    ("sense_and_sensibility_01_austen_64kb-0920", 3.52, 0.8, ("married", "respectable")),
    ("sense_and_sensibility_01_austen_64kb-0870", 5.12, 1.2, ("dashwood", "power")),
]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VoiceServer]:
    async for voice_server in serving(ROOT / "config" / "agents.yaml"):
        yield voice_server


def split_at(name: str, cut_s: float) -> tuple[bytes, bytes]:
    """The recording as 8 kHz mu-law in two parts, cut at the quietest 20 ms near `cut_s`."""
    pcm, rate = read_wav(LIBRIVOX / f"{name}.wav")
    narrow = np.frombuffer(resample(pcm, rate, 8000), dtype="<i2")
    frames = [narrow[i : i + 160] for i in range(0, narrow.size - 160, 160)]
    around = range(max(0, int(cut_s * 50) - 3), min(len(frames), int(cut_s * 50) + 4))
    quietest = min(around, key=lambda i: float(np.abs(frames[i].astype(np.float64)).mean()))
    cut = quietest * 160 + 80
    audio = narrow.tobytes()
    return ulaw_encode(audio[: cut * 2]), ulaw_encode(audio[cut * 2 :])


def is_backchannel(text: str) -> bool:
    allowed = {w for phrase in DEFAULT_BACKCHANNELS for w in words_of(phrase)}
    return all(word in allowed for word in words_of(text))


@pytest.mark.parametrize(("name", "cut_s", "pause_s", "heard"), SPLIT_SENTENCES)
async def test_a_sentence_split_by_a_pause_is_kept_whole(
    server: VoiceServer, name: str, cut_s: float, pause_s: float, heard: tuple[str, str]
) -> None:
    first, rest = split_at(name, cut_s)
    sid = f"CAsplit{name[-4:]}"
    async with TwilioClient(
        f"ws://127.0.0.1:{server.port}/twilio", call_sid=sid, timeout=60
    ) as caller:
        await caller.wait_audio(1)
        await caller.wait_silence_after_audio(300)  # the greeting, heard out
        await caller.send_audio(first)
        await caller.send_silence(int(pause_s * 1000))
        await caller.send_audio(rest)
        # Whatever the agent began in the pause was cleared by now: what comes next is its
        # answer to the whole sentence.
        await caller.wait_audio(caller.received_ms + 1)
        await caller.wait_silence_after_audio(800)
        await caller.stop()
    call = await ended_call(server, sid)
    audit: list[dict[str, Any]] = call["audit"]
    dropped = [e["text"] for e in audit if e["type"] == "user_utterance_dropped"]
    assert all(is_backchannel(text) for text in dropped), dropped
    said = [m["content"] for m in call["context"]["messages"] if m["role"] == "user"]
    assert len(said) == 1, said
    words = words_of(said[0])
    assert heard[0] in words and heard[1] in words, said
    assert [e for e in audit if e["type"] == "user_turn_continued"], said
    # Whatever the agent began to say in the pause is cut: committed as heard, no more.
    answers = [e for e in audit if e["type"] == "agent_utterance" and e["generated"] != GREETING]
    assert all(e["interrupted"] for e in answers[:-1]), answers
    assert not answers[-1]["interrupted"], answers

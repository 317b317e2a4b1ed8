"""The Whisper engine: decoding in the worker processes, the speculative decoding at a pause,
what silence and noise give, and a model that is not there."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.speech_eval import RATE, transcribe
from voice_agent.audio.g711 import ulaw_decode
from voice_agent.audio.resample import resample
from voice_agent.engines.stt import ProcessPoolStt, SttConfig, SttError, Transcript, make_stt
from voice_agent.engines.stt.scoring import word_error_rate
from voice_agent.engines.stt.whisper import (
    WhisperUtterance,
    bundled_model_path,
    prompt_from,
    resolve_model,
)

FIXTURES = Path(__file__).parent / "fixtures" / "audio"
module_loop = pytest.mark.asyncio(loop_scope="module")  # the engine fixture's loop


def phone_audio(name: str) -> bytes:
    """A fixture as the phone path gives it to STT: 8 kHz mu-law, upsampled to 16 kHz."""
    return resample(ulaw_decode((FIXTURES / f"{name}.ulaw").read_bytes()), 8000, RATE)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def whisper() -> AsyncIterator[ProcessPoolStt]:
    stt = make_stt(SttConfig(provider="whisper", processes=1))
    assert isinstance(stt, ProcessPoolStt)
    yield stt
    await stt.aclose()


class CountingDecoder:
    """Stands in for the model inside one utterance: says how much audio it was given."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def transcribe(self, pcm: bytes) -> Transcript:
        self.calls.append(len(pcm))
        return Transcript(f"{len(pcm)} bytes")


def test_a_pause_decodes_and_the_end_reuses_it_unless_the_caller_spoke_on() -> None:
    decoder = CountingDecoder()
    utterance = WhisperUtterance(decoder)  # type: ignore[arg-type]
    utterance.feed(b"\0" * 640)
    assert utterance.pause() == "640 bytes"  # the guess is the partial meanwhile
    assert utterance.end().text == "640 bytes"
    assert decoder.calls == [640]  # the end decoded nothing again

    resumed = WhisperUtterance(decoder)  # type: ignore[arg-type]
    resumed.feed(b"\0" * 640)
    resumed.pause()
    resumed.feed(b"\0" * 320)  # the caller went on after the pause
    assert resumed.end().text == "960 bytes"
    assert decoder.calls == [640, 640, 960]


@module_loop
async def test_an_off_script_line_over_the_phone(whisper: ProcessPoolStt) -> None:
    text = await transcribe(whisper, phone_audio("joe_offscript1"))
    said = "hey there could i get a spot for three people this friday around eight"
    assert word_error_rate(said, text) <= 0.2, text


@module_loop
async def test_audio_pushed_at_once_then_a_pause_and_the_end(whisper: ProcessPoolStt) -> None:
    """The pipeline's order through the worker: audio, the pause's decoding, the end (which
    reuses it: tested on WhisperUtterance above)."""
    stream = whisper.start(RATE)
    stream.push(phone_audio("joe_change3"))
    stream.pause()
    final = await stream.finish()
    assert word_error_rate("can we make it eight pm for four people instead", final.text) <= 0.2


@module_loop
@pytest.mark.parametrize("name", ["silence", "cough"])
async def test_silence_and_noise_give_no_words(whisper: ProcessPoolStt, name: str) -> None:
    assert await transcribe(whisper, phone_audio(name)) == ""


@module_loop
async def test_long_line_noise_gives_no_words(whisper: ProcessPoolStt) -> None:
    """Two seconds of hiss at a line's level (about -40 dBFS), as VAD might pass on a bad line."""
    import numpy as np

    rng = np.random.default_rng(3)
    hiss = (rng.standard_normal(2 * RATE) * 300).astype("<i2").tobytes()
    assert await transcribe(whisper, hiss) == ""


def test_a_missing_or_wrong_model_is_named(tmp_path: Path) -> None:
    with pytest.raises(SttError, match="does not exist"):
        resolve_model(str(tmp_path / "base.en"))
    (tmp_path / "model.bin").write_bytes(b"")
    with pytest.raises(SttError, match=r"no config\.json"):
        resolve_model(str(tmp_path))
    assert resolve_model("tiny.en") == bundled_model_path()


def test_the_prompt_keeps_whole_phrases_within_its_length() -> None:
    prompt = prompt_from(["table for two", "cancel my booking"] * 100, "A restaurant.")
    assert prompt is not None and prompt.startswith("A restaurant. table for two.")
    assert len(prompt) <= 600 and prompt.endswith(".")
    assert prompt_from([]) is None

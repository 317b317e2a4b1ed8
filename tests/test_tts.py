"""TTS engines: eSpeak NG and Piper for real, and the openai engine against a local server that
speaks the real speech endpoint."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import logging
import re
import socket
import wave
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from tests.support.configs import default_config_with, serving
from voice_agent.callers import TwilioClient
from voice_agent.engines.stt import SttError
from voice_agent.engines.stt.openai import OpenAiStt
from voice_agent.engines.tts import TtsChunk, TtsConfig, TtsError, make_tts
from voice_agent.engines.tts.base import Tts
from voice_agent.engines.tts.espeak import EspeakTts
from voice_agent.engines.tts.openai import OpenAITts
from voice_agent.engines.tts.piper import PiperTts
from voice_agent.errors import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "audio"
SENTENCE = "Your table for two is booked for tomorrow at seven in the evening."
TWO_SENTENCES = "Sure, I can help with that. What name should I put the booking under?"
THREE_SENTENCES = "Thank you for calling. Your booking is confirmed. Have a lovely evening."


async def collect(stream: AsyncIterator[TtsChunk]) -> list[TtsChunk]:
    return [chunk async for chunk in stream]


def stream(tts: Tts, text: str) -> AsyncGenerator[TtsChunk, None]:
    """`tts.synthesize(text)`, which every engine makes an async generator so it can be closed."""
    chunks = tts.synthesize(text)
    assert isinstance(chunks, AsyncGenerator)
    return chunks


def samples(chunks: list[TtsChunk]) -> np.ndarray:
    return np.frombuffer(b"".join(c.pcm for c in chunks), dtype="<i2").astype(np.float64)


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm**2))) if pcm.size else 0.0


def text_words(text: str) -> list[str]:
    return [w.strip("\"'`()[]{}<>.,;:!?…“”‘’«»—–-") for w in text.split()]


class RecordingExecutor(concurrent.futures.ThreadPoolExecutor):
    """A one-thread executor that counts the tasks it has finished."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.finished = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        def run() -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                self.finished += 1

        return super().submit(run)


@pytest.fixture
async def espeak() -> AsyncIterator[Tts]:
    tts = make_tts(TtsConfig(provider="espeak"))
    yield tts
    await tts.aclose()


@pytest.fixture
async def piper() -> AsyncIterator[Tts]:
    tts = make_tts(TtsConfig(provider="piper"))
    yield tts
    await tts.aclose()


@pytest.fixture(params=["espeak", "piper"])
async def embedded(request: pytest.FixtureRequest) -> AsyncIterator[Tts]:
    tts = make_tts(TtsConfig(provider=request.param))
    yield tts
    await tts.aclose()


# --- both embedded engines ---------------------------------------------------------------------


async def test_embedded_engine_speaks_a_sentence(embedded: Tts) -> None:
    chunks = await collect(embedded.synthesize(SENTENCE))
    pcm = samples(chunks)
    seconds = pcm.size / embedded.sample_rate
    # 13 words at a conversational 2 to 4 words a second, plus pauses.
    assert 2.5 < seconds < 8.0
    assert rms(pcm) > 500  # speech, not near-silence
    assert all(len(c.pcm) % 2 == 0 for c in chunks)


async def test_embedded_engine_streams_a_multi_sentence_text(embedded: Tts) -> None:
    chunks = await collect(embedded.synthesize(THREE_SENTENCES))
    assert len(chunks) >= 3
    assert all(c.pcm for c in chunks)


async def test_piper_sends_the_first_sentence_before_synthesizing_the_rest() -> None:
    executor = RecordingExecutor()
    tts = PiperTts(TtsConfig(provider="piper"), executor=executor)
    await tts.load()
    loaded = executor.finished
    chunks = tts.synthesize(THREE_SENTENCES)
    first = await anext(chunks)
    # One executor task per sentence: only the first has run when its audio arrives.
    assert first.pcm and executor.finished == loaded + 1
    rest = await collect(chunks)
    assert len(rest) == 2
    assert executor.finished == loaded + 4  # three sentences, then the end of the generator
    executor.shutdown()


async def test_piper_has_no_word_timings(piper: Tts) -> None:
    assert piper.gives_word_timings is False
    assert piper.sample_rate == 22050
    chunks = await collect(piper.synthesize("Hello there."))
    assert all(c.words == () for c in chunks)


async def test_closing_the_stream_early_leaves_the_engine_usable(embedded: Tts) -> None:
    abandoned = stream(embedded, THREE_SENTENCES)
    first = await anext(abandoned)
    assert first.pcm
    await abandoned.aclose()
    pcm = samples(await collect(embedded.synthesize(TWO_SENTENCES)))
    assert 2.5 < pcm.size / embedded.sample_rate < 9.0
    assert rms(pcm) > 500


async def test_cancelling_the_consuming_task_leaves_the_engine_usable(embedded: Tts) -> None:
    got_one = asyncio.Event()

    async def consume() -> None:
        async for _chunk in embedded.synthesize(THREE_SENTENCES):
            got_one.set()
            await asyncio.Event().wait()  # a caller who never asks for more

    task = asyncio.create_task(consume())
    await got_one.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    chunks = await collect(embedded.synthesize("Are you still there?"))
    assert rms(samples(chunks)) > 500


async def test_two_concurrent_syntheses_both_complete(embedded: Tts) -> None:
    first, second = await asyncio.gather(
        collect(embedded.synthesize(TWO_SENTENCES)), collect(embedded.synthesize(SENTENCE))
    )
    for chunks, low, high in ((first, 2.5, 9.0), (second, 2.5, 8.0)):
        pcm = samples(chunks)
        assert low < pcm.size / embedded.sample_rate < high
        assert rms(pcm) > 500


async def test_empty_text_gives_no_audio(embedded: Tts) -> None:
    assert await collect(embedded.synthesize("  \n")) == []


# --- eSpeak NG -----------------------------------------------------------------------------------


async def test_espeak_word_timings_follow_the_text_and_the_audio(espeak: Tts) -> None:
    assert espeak.gives_word_timings is True
    assert espeak.sample_rate == 22050
    text = 'Hello there, my friend! It is 7:30 pm; "Café" opens (again) at 8.'
    chunks = await collect(espeak.synthesize(text))
    words = [w for c in chunks for w in c.words]
    assert [w.word for w in words] == text_words(text)
    for word, after in itertools.pairwise(words):
        assert word.start_ms <= after.start_ms
        assert word.end_ms <= after.start_ms
    assert all(w.start_ms < w.end_ms for w in words)
    duration_ms = samples(chunks).size * 1000 / espeak.sample_rate
    assert words[-1].end_ms <= duration_ms
    # Each chunk carries exactly the words that start inside its audio.
    offset_ms = 0.0
    for chunk in chunks:
        length_ms = len(chunk.pcm) / 2 * 1000 / espeak.sample_rate
        for word in chunk.words:
            assert offset_ms - 1 <= word.start_ms < offset_ms + length_ms + 1
        offset_ms += length_ms


async def test_espeak_word_timings_restart_for_each_utterance(espeak: Tts) -> None:
    await collect(espeak.synthesize(TWO_SENTENCES))
    chunks = await collect(espeak.synthesize("Goodbye now."))
    words = [w for c in chunks for w in c.words]
    assert [w.word for w in words] == ["Goodbye", "now"]
    assert words[0].start_ms < 50


async def test_espeak_word_is_silent_between_its_end_and_the_next_word(espeak: Tts) -> None:
    chunks = await collect(espeak.synthesize("Yes. No."))
    pcm = samples(chunks)
    yes, no = (w for c in chunks for w in c.words)
    gap = pcm[int(yes.end_ms * 22.05) + 50 : int(no.start_ms * 22.05) - 50]
    assert gap.size > 0.1 * 22050  # the sentence pause is outside both words
    assert rms(gap) < 50


async def test_espeak_concurrent_syntheses_do_not_mix(espeak: Tts) -> None:
    # The library's output drifts a little between calls (its pitch flutter runs on), so compare
    # words and lengths rather than bytes: a mix-up of two jobs would show in both.
    texts = (TWO_SENTENCES, SENTENCE, TWO_SENTENCES)
    together = await asyncio.gather(*(collect(espeak.synthesize(t)) for t in texts))
    for text, chunks in zip(texts, together, strict=True):
        solo = await collect(espeak.synthesize(text))
        assert [w.word for c in chunks for w in c.words] == text_words(text)
        assert abs(samples(chunks).size - samples(solo).size) < 0.05 * samples(solo).size


async def test_espeak_voice_and_speed() -> None:
    normal = EspeakTts(TtsConfig(voice="en-us"))
    fast = EspeakTts(TtsConfig(voice="en-us", speed=2.0))
    female = EspeakTts(TtsConfig(voice="en-us+f3"))
    assert (fast.wpm, normal.wpm) == (350, 175)
    base = samples(await collect(normal.synthesize(SENTENCE)))
    quick = samples(await collect(fast.synthesize(SENTENCE)))
    other = samples(await collect(female.synthesize(SENTENCE)))
    assert quick.size < 0.7 * base.size
    assert other.size != base.size or not np.array_equal(other, base)


async def test_espeak_runs_on_a_given_executor() -> None:
    executor = RecordingExecutor()
    tts = make_tts(TtsConfig(provider="espeak"), executor=executor)
    chunks = await collect(tts.synthesize("Hello."))
    assert chunks and executor.finished == 1
    executor.shutdown()


def test_espeak_rejects_an_unknown_voice_and_a_bad_speed() -> None:
    with pytest.raises(ConfigError, match="no voice"):
        make_tts(TtsConfig(provider="espeak", voice="xx-nonexistent"))
    with pytest.raises(ConfigError, match="speed"):
        make_tts(TtsConfig(provider="espeak", speed=0))


def test_make_tts_builds_the_named_engine(tmp_path: Path) -> None:
    assert isinstance(make_tts(TtsConfig()), EspeakTts)
    assert isinstance(make_tts(TtsConfig(provider="piper")), PiperTts)
    with pytest.raises(ConfigError, match="does not exist"):
        make_tts(TtsConfig(provider="piper", voice=str(tmp_path / "missing.onnx")))


# --- openai, against a local speech endpoint -------------------------------------------------


class SpeechServer:
    """`POST /v1/audio/speech` as OpenAI serves it: a JSON body in, chunked PCM16 out.

    After piece `hold_after` the server waits for `hold` (when set) before sending the rest;
    `gap_s` spaces the pieces out, as an engine synthesising them one by one would.
    """

    def __init__(
        self,
        pieces: list[bytes],
        *,
        status: int | None = None,
        hold_after: int = 0,
        gap_s: float = 0.0,
    ) -> None:
        self.pieces = pieces
        self.status = status
        self.hold: asyncio.Event | None = None
        self.hold_after = hold_after
        self.gap_s = gap_s
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self._arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((dict(request.headers), await request.json()))
        self._arrived.set()
        if self.status is not None:
            error = {"message": "voice not available", "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=self.status)
        response = web.StreamResponse(headers={"Content-Type": "audio/pcm"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for index, piece in enumerate(self.pieces):
            if index and self.gap_s:
                await asyncio.sleep(self.gap_s)
            await response.write(piece)
            if index == self.hold_after and self.hold is not None:
                await self.hold.wait()
        await response.write_eof()
        return response

    async def wait_requests(self, count: int) -> None:
        async with asyncio.timeout(30):  # a safety net, not a measurement
            while len(self.requests) < count:
                self._arrived.clear()
                await self._arrived.wait()

    def release(self) -> None:
        """Let every held response go on."""
        if self.hold is not None:
            self.hold.set()

    async def __aenter__(self) -> SpeechServer:
        app = web.Application()
        app.router.add_post("/v1/audio/speech", self._speech)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def pcm_ramp(count: int) -> bytes:
    return (np.arange(count, dtype="<i2") * 7).tobytes()


async def test_openai_streams_pcm_from_the_speech_endpoint() -> None:
    audio = pcm_ramp(6000)
    # Odd-sized pieces: the engine must realign them to whole samples.
    pieces = [audio[:1001], audio[1001:5001], audio[5001:]]
    async with SpeechServer(pieces) as server:
        server.hold = asyncio.Event()
        tts = make_tts(
            TtsConfig(
                provider="openai",
                base_url=server.base_url,
                api_key="sk-test",
                model="tts-1",
                voice="nova",
                speed=1.25,
            )
        )
        assert tts.sample_rate == 24000 and tts.gives_word_timings is False
        chunks = tts.synthesize("Your table is booked.")
        first = await asyncio.wait_for(anext(chunks), timeout=10)
        # The server has not sent the rest yet: this chunk came while the body was streaming.
        assert first.pcm == audio[:1000]
        server.hold.set()
        rest = await collect(chunks)
        await tts.aclose()
    assert first.pcm + b"".join(c.pcm for c in rest) == audio
    assert all(len(c.pcm) % 2 == 0 and c.words == () for c in rest)
    headers, body = server.requests[0]
    assert headers["Authorization"] == "Bearer sk-test"
    assert body == {
        "model": "tts-1",
        "voice": "nova",
        "input": "Your table is booked.",
        "response_format": "pcm",
        "speed": 1.25,
    }


@contextlib.asynccontextmanager
async def hosted_voice_call(tmp_path: Path, speech: SpeechServer) -> AsyncIterator[TwilioClient]:
    """A Twilio call to the default agent speaking through `speech`, which holds each
    response at its `hold_after` piece until `speech.release()`."""
    speech.hold = asyncio.Event()
    async with speech:
        tts = {"provider": "openai", "base_url": speech.base_url, "api_key": "sk-test"}
        async for server in serving(default_config_with(tmp_path, voice={"tts": tts})):
            url = f"ws://127.0.0.1:{server.port}/twilio"
            try:
                async with TwilioClient(url, call_sid="CAhosted", timeout=30) as caller:
                    yield caller
            finally:
                speech.release()  # a failed test must not leave the server waiting on it


def first_100_ms_then_held() -> SpeechServer:
    """Each sentence the engine is asked for: 100 ms of audio at once, the rest (1 s) when the
    test calls `release()`."""
    return SpeechServer([pcm_ramp(2400), pcm_ramp(24000)])


async def test_a_hosted_voice_reaches_the_caller_while_its_sentence_still_streams(
    tmp_path: Path,
) -> None:
    speech = first_100_ms_then_held()
    async with hosted_voice_call(tmp_path, speech) as caller:
        heard = await caller.wait_audio(90)
        # The caller already has the first piece; the sentence's mark waits for the rest,
        # which the engine has not sent yet.
        assert heard < 200 and caller.pending_marks == [] == caller.marks_echoed
        assert caller.sentence_streaming
        speech.release()
        await caller.wait_until(
            lambda: caller.pending_marks or caller.marks_echoed or None, "the sentence's mark"
        )
        assert caller.received_ms >= 1090


async def test_the_next_sentence_is_requested_while_the_one_before_still_streams(
    tmp_path: Path,
) -> None:
    speech = first_100_ms_then_held()
    async with hosted_voice_call(tmp_path, speech) as caller:
        await caller.wait_audio(90)
        # The first sentence is still streaming, and the second is already asked for, so its
        # audio is there when the first ends, without the engine's delay in between. One
        # sentence ahead only: the third waits.
        await speech.wait_requests(2)
        assert len(speech.requests) == 2
        speech.release()
        await caller.wait_until(lambda: len(caller.marks_echoed) >= 3 or None, "three sentences")
    said = [body["input"] for _, body in speech.requests]
    assert said == [
        "Hello, thanks for calling Bella Vista!",
        "I can book, change or cancel a table.",
        "What would you like to do?",
    ]


async def test_after_a_barge_in_the_next_reply_does_not_wait_for_the_cut_sentences_stream(
    tmp_path: Path,
) -> None:
    speech = first_100_ms_then_held()
    async with hosted_voice_call(tmp_path, speech) as caller:
        await caller.wait_audio(90)
        # The caller talks over the greeting, whose first sentence the engine still holds.
        await caller.send_audio((FIXTURES / "joe_book1.ulaw").read_bytes())
        await caller.wait_clear()
        heard = caller.received_ms
        # The answer's first piece plays though the cut sentence's stream never ended: once
        # the barge-in is real, nothing of that sentence can play again, so it is dropped.
        await caller.wait_audio(heard + 90)
        assert len(speech.requests) >= 3


class LogLine(logging.Handler):
    """Sets `seen` once a record containing `text` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


async def test_a_failing_hosted_voice_is_in_the_log_as_the_calls_error(tmp_path: Path) -> None:
    line = LogLine("call CAhosted: tts error: TtsError: speech request failed with HTTP 500")
    logger = logging.getLogger("voice_agent.server")
    logger.addHandler(line)
    try:
        async with hosted_voice_call(tmp_path, SpeechServer([], status=500)):
            await asyncio.wait_for(line.seen.wait(), 30)
    finally:
        logger.removeHandler(line)


async def test_audio_held_back_goes_out_when_the_hosted_voice_stalls(tmp_path: Path) -> None:
    # 100 ms, 400 ms and 100 ms of the greeting's first sentence 50 ms apart, then nothing
    # until the test says. The last 100 ms comes while the caller is 450 ms ahead, so it is
    # held back to go with more; as no more comes, it must go before the caller runs short.
    pieces = [pcm_ramp(2400), pcm_ramp(9600), pcm_ramp(2400), pcm_ramp(24000)]
    speech = SpeechServer(pieces, hold_after=2, gap_s=0.05)
    async with hosted_voice_call(tmp_path, speech) as caller:
        await caller.wait_audio(590)  # all 600 ms, less the resampler's 2.4 ms
        speech.release()


async def test_openai_falls_back_to_the_sdk_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    async with SpeechServer([pcm_ramp(100)]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
        tts = make_tts(TtsConfig(provider="openai"))
        chunks = await collect(tts.synthesize("Hi."))
        await tts.aclose()
        monkeypatch.delenv("OPENAI_API_KEY")
        keyless = make_tts(TtsConfig(provider="openai"))
        await collect(keyless.synthesize("Hi."))
        await keyless.aclose()
    assert b"".join(c.pcm for c in chunks) == pcm_ramp(100)
    (first_headers, body), (second_headers, _) = server.requests
    assert first_headers["Authorization"] == "Bearer sk-from-env"
    assert second_headers["Authorization"].startswith("Bearer ")  # a placeholder, not nothing
    assert body["model"] == "gpt-4o-mini-tts" and body["voice"] == "alloy"
    assert "speed" not in body


async def test_openai_error_becomes_tts_error() -> None:
    async with SpeechServer([], status=400) as server:
        tts = make_tts(TtsConfig(provider="openai", base_url=server.base_url))
        with pytest.raises(TtsError, match="HTTP 400") as caught:
            await collect(tts.synthesize("Hi."))
        await tts.aclose()
    assert caught.value.status == 400


async def test_openai_closing_early_leaves_the_engine_usable() -> None:
    audio = pcm_ramp(4000)
    async with SpeechServer([audio[:2000], audio[2000:]]) as server:
        server.hold = asyncio.Event()
        tts = make_tts(TtsConfig(provider="openai", base_url=server.base_url))
        abandoned = stream(tts, "First.")
        await asyncio.wait_for(anext(abandoned), timeout=10)
        await abandoned.aclose()
        server.hold.set()  # lets the abandoned response finish, so the server can shut down
        chunks = await collect(tts.synthesize("Second."))
        await tts.aclose()
    assert b"".join(c.pcm for c in chunks) == audio
    assert isinstance(tts, OpenAITts)


def test_openai_needs_a_key_or_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="API key"):
        make_tts(TtsConfig(provider="openai"))


# --- the committed audio fixtures --------------------------------------------------------------


def test_audio_fixtures_are_listed_and_readable() -> None:
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([\w.-]+)\.wav` `\1\.ulaw` \|", readme, flags=re.MULTILINE)
    listed = {f"{name}{suffix}" for name in rows for suffix in (".wav", ".ulaw")}
    files = {p.name for p in FIXTURES.iterdir() if p.suffix in (".wav", ".ulaw")}
    assert files and files == listed
    for name in files:
        path = FIXTURES / name
        if path.suffix == ".wav":
            with wave.open(str(path)) as wav:
                assert (wav.getframerate(), wav.getsampwidth(), wav.getnchannels()) == (16000, 2, 1)
                seconds = wav.getnframes() / 16000
            ulaw = path.with_suffix(".ulaw")
            # Every 16 kHz file has its 8 kHz mu-law twin: one byte per sample, half the rate.
            assert abs(ulaw.stat().st_size - seconds * 8000) <= 2
    manifest = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))
    entries = {entry["name"]: entry for entry in manifest["files"]}
    assert {f"{name}.wav" for name in entries} == {n for n in files if n.endswith(".wav")}
    for voice in manifest["conversations"].values():
        for steps in voice.values():
            assert all(step.startswith("/") or step in entries for step in steps)
    assert sum(p.stat().st_size for p in FIXTURES.iterdir()) < 7 * 1024 * 1024


async def test_hosted_engines_say_when_their_server_cannot_be_reached() -> None:
    # A port that is bound but not listening refuses connections at once.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        base_url = f"http://127.0.0.1:{port}/v1"
        tts = OpenAITts(TtsConfig(provider="openai", base_url=base_url))
        stt = OpenAiStt(base_url=base_url, max_retries=0)
        try:
            with pytest.raises(TtsError, match=f"cannot connect to 127.0.0.1:{port}"):
                async for _ in tts.synthesize("Hello."):
                    pass
            with pytest.raises(SttError, match=f"cannot connect to 127.0.0.1:{port}"):
                await stt.transcribe(bytes(8000))
        finally:
            await tts.aclose()
            await stt.aclose()

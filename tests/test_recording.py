"""Call recording: a synthetic call written to a file and read back, channel by channel."""

from __future__ import annotations

import logging
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from tests.conftest import report
from voice_agent.audio.g711 import ulaw_decode
from voice_agent.pipeline import recording
from voice_agent.pipeline.recording import (
    CallRecorder,
    Recording,
    find_recording,
    prune_recordings,
    recording_path,
    recordings_dir,
    safe_file_stem,
)

FRAME_MS = 20
CALLER_HZ = 400
AGENT_HZ = 1000
AMPLITUDE = 8000

HAS_OPUS = recording.opus_available()


def tone(freq: float, ms: float, rate: int) -> bytes:
    n = round(ms * rate / 1000)
    t = np.arange(n) / rate
    return (AMPLITUDE * np.sin(2 * np.pi * freq * t)).astype("<i2").tobytes()


def silence(ms: float, rate: int) -> bytes:
    return bytes(2 * round(ms * rate / 1000))


# The synthetic call (ms on the pipeline's clock):
#   caller: speaks 500-1500 (a question), and 4000-4600 (a barge-in), silent otherwise;
#   agent: a sentence sent at 1800 (1200 ms: plays 1800-3000), another sent at 2000 while that
#          plays (1000 ms: queued, plays 3000-4000), a third sent at 2100 (1500 ms: would play
#          4000-5500); the caller barges in and a clear at 4300 cuts the third one;
#          after it, a short reply sent at 5000 (500 ms: plays 5000-5500);
#   the call ends at 6000.
CALLER_SPEECH = ((500, 1500), (4000, 4600))
AGENT_HEARD = ((1800, 4300), (5000, 5500))
CUT = (4300, 5000)  # where the third sentence would have played, had it not been cleared
CALL_END_MS = 6000
BOTH_SILENT = ((0, 500), (1500, 1800), (4600, 5000), (5500, 6000))


def caller_frame(k: int, rate: int) -> bytes:
    start = k * FRAME_MS
    if any(lo <= start < hi for lo, hi in CALLER_SPEECH):
        # Phase-continuous: the tone is the same across frames.
        n = FRAME_MS * rate // 1000
        t = (np.arange(n) + k * n) / rate
        return (AMPLITUDE * np.sin(2 * np.pi * CALLER_HZ * t)).astype("<i2").tobytes()
    return silence(FRAME_MS, rate)


def play_call(recorder: CallRecorder, rate: int) -> Recording | None:
    agent_sends = {
        1800: tone(AGENT_HZ, 1200, rate),
        2000: tone(AGENT_HZ, 1000, rate),
        2100: tone(AGENT_HZ, 1500, rate),
        5000: tone(AGENT_HZ, 500, rate),
    }
    for k in range(CALL_END_MS // FRAME_MS):
        now = k * FRAME_MS
        if now in agent_sends:
            recorder.agent(agent_sends[now], float(now))
        if now == 4300:
            recorder.clear(4300.0)
        recorder.caller(caller_frame(k, rate), float(now))
    return recorder.finish(float(CALL_END_MS))


# ---- reading the files back (independently of the recorder's code) ----------------------------


def read_opus(path: Path) -> tuple[npt.NDArray[np.float64], int]:
    import av

    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name == "opus"
        assert container.format.name == "ogg"
        chunks = [frame.to_ndarray() for frame in container.decode(stream)]
        rate = stream.codec_context.sample_rate
    samples = np.concatenate(chunks, axis=1).astype(np.float64) * 32768  # planar float
    assert samples.shape[0] == 2, "stereo"
    return samples, rate


def read_mulaw_wav(path: Path) -> tuple[npt.NDArray[np.float64], int]:
    """A WAVE_FORMAT_MULAW file (Python 3.11's wave module reads PCM only)."""
    data = path.read_bytes()
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    assert struct.unpack("<I", data[4:8])[0] == len(data) - 8
    chunks: dict[bytes, bytes] = {}
    pos = 12
    while pos < len(data):
        name, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        chunks[name] = data[pos + 8 : pos + 8 + size]
        pos += 8 + size + (size & 1)
    tag, channels, rate, byte_rate, block_align, bits = struct.unpack(
        "<HHIIHH", chunks[b"fmt "][:16]
    )
    assert (tag, channels, bits, block_align, byte_rate) == (7, 2, 8, 2, rate * 2)
    frames = len(chunks[b"data"]) // 2
    assert struct.unpack("<I", chunks[b"fact"])[0] == frames
    pcm = np.frombuffer(ulaw_decode(chunks[b"data"]), dtype="<i2").astype(np.float64)
    return pcm.reshape(-1, 2).T, rate


def read_recording(path: Path) -> tuple[npt.NDArray[np.float64], int]:
    return read_opus(path) if path.suffix == ".opus" else read_mulaw_wav(path)


def rms(samples: npt.NDArray[np.float64], rate: int, lo_ms: float, hi_ms: float) -> float:
    margin = 60  # codec onsets and tails
    window = samples[int((lo_ms + margin) * rate / 1000) : int((hi_ms - margin) * rate / 1000)]
    assert len(window) > 0
    return float(np.sqrt(np.mean(window**2)))


def dominant_hz(samples: npt.NDArray[np.float64], rate: int, lo_ms: float, hi_ms: float) -> float:
    window = samples[int(lo_ms * rate / 1000) : int(hi_ms * rate / 1000)]
    spectrum = np.abs(np.fft.rfft(window * np.hanning(len(window))))
    return float(np.fft.rfftfreq(len(window), 1 / rate)[int(np.argmax(spectrum))])


def complement(spans: tuple[tuple[int, int], ...], end: int) -> list[tuple[int, int]]:
    quiet, at = [], 0
    for lo, hi in spans:
        if lo - at > 200:
            quiet.append((at, lo))
        at = hi
    if end - at > 200:
        quiet.append((at, end))
    return quiet


def check_call(path: Path, result: Recording, rate: int) -> None:
    samples, decoded_rate = read_recording(path)
    left, right = samples
    duration_ms = len(left) * 1000 / decoded_rate
    assert abs(duration_ms - CALL_END_MS) <= 2 * FRAME_MS
    assert abs(result.duration_s * 1000 - CALL_END_MS) <= 2 * FRAME_MS
    # The tones' RMS is ~5660. Opus codes the two channels jointly (mid and side): one speaking
    # leaks into the other at -30 dB or so (at most 5%, -26 dB, here); where neither speaks,
    # both are silent.
    loud, quiet, silent = 2000.0, 0.05 * AMPLITUDE / np.sqrt(2), 30.0
    for lo, hi in CALLER_SPEECH:
        assert rms(left, decoded_rate, lo, hi) > loud, ("caller", lo, hi)
        assert abs(dominant_hz(left, decoded_rate, lo, hi) - CALLER_HZ) < 20
    for lo, hi in complement(CALLER_SPEECH, CALL_END_MS):
        assert rms(left, decoded_rate, lo, hi) < quiet, ("caller silent", lo, hi)
    for lo, hi in AGENT_HEARD:
        assert rms(right, decoded_rate, lo, hi) > loud, ("agent", lo, hi)
        assert abs(dominant_hz(right, decoded_rate, lo, hi) - AGENT_HZ) < 20
    for lo, hi in complement(AGENT_HEARD, CALL_END_MS):
        assert rms(right, decoded_rate, lo, hi) < quiet, ("agent silent", lo, hi)
    for lo, hi in BOTH_SILENT:
        assert rms(left, decoded_rate, lo, hi) < silent, ("silence", lo, hi)
        assert rms(right, decoded_rate, lo, hi) < silent, ("silence", lo, hi)
    # The cleared sentence is gone: silence where it would have played.
    assert rms(right, decoded_rate, *CUT) < quiet
    assert rms(right, decoded_rate, CALLER_SPEECH[1][1], CUT[1]) < silent
    # The agent's audio was not cut short before the clear: it plays right up to it.
    assert rms(right, decoded_rate, 4000, 4300) > loud


# ---- the tests ----------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_OPUS, reason="PyAV with libopus is not installed")
@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
def test_opus_recording_of_a_call(tmp_path: Path, rate: int) -> None:
    recorder = CallRecorder.for_call(tmp_path, "CA-opus", rate)
    assert recorder.format == "opus"
    result = play_call(recorder, rate)
    assert result is not None and recorder.error is None
    assert result.path == tmp_path / "recordings" / "CA-opus.opus" == recorder.path
    assert result.format == "opus" and result.media_type.startswith("audio/ogg")
    assert result.bytes == result.path.stat().st_size
    # Voice bitrate: 24-32 kbit/s at most (much less where a channel is silent), + Ogg overhead.
    assert result.bytes < 6 * 32000 / 8 * 1.15
    check_call(result.path, result, rate)


@pytest.mark.parametrize("rate", [8000, 16000])
def test_mulaw_wav_fallback_without_av(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rate: int
) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` now raises ImportError
    assert not recording.opus_available()
    recorder = CallRecorder.for_call(tmp_path, "CA-wav", rate)
    assert recorder.format == "wav"
    result = play_call(recorder, rate)
    assert result is not None
    assert result.path == tmp_path / "recordings" / "CA-wav.wav"
    assert result.media_type == "audio/wav" and result.description == "wav/mulaw"
    # One byte per sample and channel: half of PCM16, and exact.
    assert result.bytes == 58 + CALL_END_MS * rate // 1000 * 2
    check_call(result.path, result, rate)


def test_wav_can_be_chosen_even_with_av(tmp_path: Path) -> None:
    recorder = CallRecorder.for_call(tmp_path, "CA-1", 8000, fmt="wav")
    result = play_call(recorder, 8000)
    assert result is not None and result.path.suffix == ".wav"
    check_call(result.path, result, 8000)


def test_caller_audio_follows_on_through_jitter_and_gaps_become_silence(tmp_path: Path) -> None:
    rate = 8000
    recorder = CallRecorder.for_call(tmp_path, "jitter", rate, fmt="wav")
    frame = tone(CALLER_HZ, FRAME_MS, rate)
    # 1 s of frames arriving with up to 60 ms of jitter, in bunches: still contiguous audio.
    rng = np.random.default_rng(1)
    arrivals = np.maximum.accumulate(300 + np.arange(50) * FRAME_MS + rng.uniform(0, 60, 50))
    for at in arrivals:
        recorder.caller(frame, float(at))
    # Then nothing for a second (a network outage): the next frames start where they arrive.
    for k in range(25):
        recorder.caller(frame, 2500.0 + k * FRAME_MS)
    result = recorder.finish(3000.0)
    assert result is not None
    (left, right), _ = read_mulaw_wav(result.path)
    first_start = int(arrivals[0] * rate / 1000)
    burst = left[first_start : first_start + rate]  # 1 s of tone with no holes
    assert np.min(np.abs(burst).reshape(-1, 80).max(axis=1)) > AMPLITUDE / 2
    assert not left[:first_start].any()
    assert rms(left, rate, 1400, 2500) == 0
    assert rms(left, rate, 2500, 3000) > 2000
    assert not right.any()


def test_agent_audio_sent_while_some_is_queued_plays_after_it(tmp_path: Path) -> None:
    rate = 8000
    recorder = CallRecorder.for_call(tmp_path, "queue", rate, fmt="wav")
    recorder.agent(tone(AGENT_HZ, 500, rate), 100.0)  # plays 100-600
    recorder.agent(silence(200, rate), 200.0)  # queued: 600-800
    recorder.agent(tone(AGENT_HZ, 300, rate), 300.0)  # queued: 800-1100
    recorder.agent(tone(AGENT_HZ, 100, rate), 1500.0)  # nothing queued: plays at once
    result = recorder.finish(2000.0)
    assert result is not None and result.duration_s == 2.0
    (_, right), _ = read_mulaw_wav(result.path)
    assert rms(right, rate, 100, 600) > 2000
    assert rms(right, rate, 600, 800) == 0
    assert rms(right, rate, 800, 1100) > 2000
    assert rms(right, rate, 1100, 1500) == 0
    assert np.abs(right[int(1.5 * rate) : int(1.6 * rate)]).max() > AMPLITUDE / 2


def test_agent_audio_still_queued_at_hang_up_was_not_heard(tmp_path: Path) -> None:
    rate = 8000
    recorder = CallRecorder.for_call(tmp_path, "hangup", rate, fmt="wav")
    recorder.agent(tone(AGENT_HZ, 3000, rate), 0.0)
    result = recorder.finish(1000.0)
    assert result is not None and result.duration_s == 1.0
    (_, right), _ = read_mulaw_wav(result.path)
    assert len(right) == rate


def test_memory_stays_bounded_over_a_long_call(tmp_path: Path) -> None:
    rate = 8000
    recorder = CallRecorder.for_call(tmp_path, "long", rate, fmt="wav")
    speech = tone(CALLER_HZ, FRAME_MS, rate)
    quiet = silence(FRAME_MS, rate)
    sentence = tone(AGENT_HZ, 3000, rate)
    peak = 0
    minutes = 10
    for k in range(minutes * 60_000 // FRAME_MS):
        now = float(k * FRAME_MS)
        if k % 500 == 0:  # every 10 s the agent says two 3 s sentences at once
            recorder.agent(sentence, now)
            recorder.agent(sentence, now)
        recorder.caller(speech if k % 500 > 350 else quiet, now)
        peak = max(peak, recorder.buffered_bytes)
    result = recorder.finish(minutes * 60_000.0)
    assert result is not None
    assert result.duration_s == minutes * 60
    assert result.bytes == 58 + minutes * 60 * rate * 2
    # The agent's 6 s scheduled ahead (96 kB) plus a batch and the jitter room; not the call.
    assert peak < 6 * rate * 2 + 2 * rate * 2, peak
    report(f"recording: {minutes} min call at {rate} Hz, peak PCM buffered {peak / 1000:.0f} kB")
    assert recorder.buffered_bytes == 0


@pytest.mark.skipif(not HAS_OPUS, reason="PyAV with libopus is not installed")
def test_memory_stays_bounded_with_opus(tmp_path: Path) -> None:
    rate = 16000
    recorder = CallRecorder.for_call(tmp_path, "long-opus", rate)
    frame = tone(CALLER_HZ, FRAME_MS, rate)
    peak = 0
    for k in range(60_000 // FRAME_MS):
        recorder.caller(frame, float(k * FRAME_MS))
        peak = max(peak, recorder.buffered_bytes)
    result = recorder.finish(60_000.0)
    assert result is not None and abs(result.duration_s - 60) < 0.001
    assert peak < rate * 2  # under a second of audio
    report(
        f"recording: 1 min of caller audio at {rate} Hz to Ogg/Opus: {result.bytes / 1000:.0f} kB"
        f", peak PCM buffered {peak / 1000:.0f} kB"
    )
    samples, decoded_rate = read_opus(result.path)
    assert abs(samples.shape[1] / decoded_rate - 60) < 2 * FRAME_MS / 1000


def test_a_write_failure_stops_recording_without_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rate = 8000
    recorder = CallRecorder.for_call(tmp_path, "full", rate, fmt="wav")
    assert recorder.path.exists()
    calls = 0

    def disk_full(self: object, stereo: object) -> None:
        nonlocal calls
        calls += 1
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(recording._MulawWavWriter, "write", disk_full)
    frame = tone(CALLER_HZ, FRAME_MS, rate)
    with caplog.at_level(logging.WARNING, logger="voice_agent.recording"):
        for k in range(500):
            recorder.caller(frame, float(k * FRAME_MS))
            recorder.agent(frame, float(k * FRAME_MS))
        recorder.clear(10_000.0)
        assert recorder.finish(10_000.0) is None
    assert calls == 1
    assert recorder.failed and "No space left" in (recorder.error or "")
    assert recorder.buffered_bytes == 0
    assert not recorder.path.exists()  # the partial file is not left behind
    assert len([r for r in caplog.records if "recording stopped" in r.getMessage()]) == 1


def test_an_unwritable_directory_fails_quietly(tmp_path: Path) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("a file where the directory should be")
    recorder = CallRecorder.for_call(blocker, "x", 8000)
    assert recorder.failed
    recorder.caller(silence(FRAME_MS, 8000), 0.0)
    assert recorder.finish(20.0) is None


def test_finish_is_idempotent_and_later_audio_is_ignored(tmp_path: Path) -> None:
    recorder = CallRecorder.for_call(tmp_path, "twice", 8000, fmt="wav")
    recorder.caller(tone(CALLER_HZ, FRAME_MS, 8000), 0.0)
    first = recorder.finish(100.0)
    recorder.caller(tone(CALLER_HZ, FRAME_MS, 8000), 120.0)
    assert recorder.finish(200.0) == first
    assert first is not None and first.duration_s == 0.1


def test_file_names_are_safe_and_distinct(tmp_path: Path) -> None:
    assert safe_file_stem("CA0123abc-4567_x.y") == "CA0123abc-4567_x.y"
    unsafe = ["../../etc/passwd", "a/b", "a\\b", "a b", ".hidden", "", "é", "x" * 300]
    stems = [safe_file_stem(call_id) for call_id in unsafe]
    for stem in stems:
        assert stem and "/" not in stem and "\\" not in stem and not stem.startswith(".")
        assert len(stem) <= 120
        assert all(c.isascii() and (c.isalnum() or c in "._-") for c in stem)
    assert len(set(stems)) == len(stems)
    assert safe_file_stem("a/b") != safe_file_stem("a_b")  # "a_b" is safe and kept as it is
    path = recording_path(recordings_dir(tmp_path), "../x", "opus")
    assert path.parent == tmp_path / "recordings"


def test_find_prune_and_audit_fields(tmp_path: Path) -> None:
    recorder = CallRecorder.for_call(tmp_path, "CA/9", 8000, fmt="wav")
    result = recorder.finish(1000.0)
    assert result is not None
    assert find_recording(recordings_dir(tmp_path), "CA/9") == (result.path, "wav")
    assert find_recording(recordings_dir(tmp_path), "other") is None
    audit = result.as_audit(relative_to=tmp_path)
    assert audit == {
        "path": f"recordings/{safe_file_stem('CA/9')}.wav",
        "format": "wav/mulaw",
        "media_type": "audio/wav",
        "duration_s": 1.0,
        "bytes": 58 + 8000 * 2,
    }
    old = time.time() - 3 * 86400
    os.utime(result.path, (old, old))
    assert prune_recordings(recordings_dir(tmp_path), 7) == 0
    assert prune_recordings(recordings_dir(tmp_path), 2) == 1
    assert not result.path.exists()
    assert prune_recordings(tmp_path / "missing", 1) == 0


async def test_a_recorded_call_is_referenced_from_its_record_and_served(tmp_path: Path) -> None:
    import httpx

    from tests.support.configs import default_config_with
    from voice_agent.agents.registry import AgentRegistry
    from voice_agent.callers import NativeClient
    from voice_agent.server.app import VoiceServer

    config = default_config_with(
        tmp_path, server={"recording": True, "data_dir": str(tmp_path / "data")}
    )
    registry = AgentRegistry.from_file(config)
    server = VoiceServer(registry, port=0)
    await server.start()
    try:
        caller = NativeClient(f"ws://127.0.0.1:{server.port}/ws", timeout=30)
        await caller.connect()
        await caller.wait_silence_after_audio(300)
        await caller.stop()
        pipeline = server.pipelines.get(caller.call_id or "")
        if pipeline is not None:
            await pipeline.finished.wait()
        async with httpx.AsyncClient() as http:
            base = f"http://127.0.0.1:{server.port}/calls/{caller.call_id}"
            call = (await http.get(base)).json()
            audio = await http.get(f"{base}/recording")
            missing = await http.get(f"http://127.0.0.1:{server.port}/calls/nope/recording")
    finally:
        await server.shutdown(1)
        await registry.aclose()
    (event,) = [e for e in call["audit"] if e["type"] == "recording"]
    assert event["path"].startswith("recordings/") and event["duration_s"] > 4
    assert audio.status_code == 200
    assert audio.headers["content-type"].startswith("audio/ogg")
    assert audio.content[:4] == b"OggS" and len(audio.content) == event["bytes"]
    assert missing.status_code == 404

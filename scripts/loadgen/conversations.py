"""What callers say and do: the audio fixtures as `Line`s (with where their speech starts and
ends), the scripted conversations of the fixture voice, and each call's `Plan` (which
conversation, and where it barges in, backchannels, stays silent, pauses or coughs), decided up
front from --seed so that a run can be repeated."""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass, field

import numpy as np

from voice_agent.audio.wav import read_wav

from .paths import AUDIO

VOICE = "joe"  # the fixture voice the embedded STT recognises best
# Half the calls book: change and cancel then find a booking to work on.
CONVERSATION_CYCLE = ("book", "change", "book", "cancel")
SPEECH_DBFS = -45.0  # where a fixture's speech starts and ends, for its lead and tail


@dataclass(frozen=True)
class Line:
    """One fixture as the caller sends it, with where its speech starts and ends."""

    name: str
    audio: bytes
    seconds: float
    lead_s: float  # silence before the speech
    trail_s: float  # silence after it


def _speech_bounds(pcm16k: bytes) -> tuple[float, float]:
    samples = np.frombuffer(pcm16k, dtype="<i2").astype(np.float64) / 32768.0
    frames = len(samples) // 160  # 10 ms
    power = (samples[: frames * 160].reshape(frames, 160) ** 2).mean(axis=1)
    loud = np.nonzero(10 * np.log10(power + 1e-12) > SPEECH_DBFS)[0]
    if not len(loud):
        return 0.0, 0.0
    return loud[0] * 0.01, (frames - loud[-1] - 1) * 0.01


def load_lines(transport: str) -> dict[str, Line]:
    """Every fixture of VOICE plus the cough, in the transport's audio format."""
    manifest = json.loads((AUDIO / "manifest.json").read_text())
    lines = {}
    for item in manifest["files"]:
        if item["voice"] != VOICE and item["name"] != "cough":
            continue
        pcm, _ = read_wav(AUDIO / item["wav"])
        lead, trail = _speech_bounds(pcm)
        # Twilio: the 8 kHz mu-law file as it is; native /ws: 16 kHz PCM16, the protocol's default.
        audio = (AUDIO / item["ulaw"]).read_bytes() if transport == "twilio" else pcm
        lines[item["name"]] = Line(item["name"], audio, item["seconds"], lead, trail)
    return lines


def conversations() -> dict[str, list[str]]:
    manifest = json.loads((AUDIO / "manifest.json").read_text())
    return {kind: list(steps) for kind, steps in manifest["conversations"][VOICE].items()}


def _spread(number: int, share: float, phase: float) -> bool:
    """True for `share` of consecutive numbers, evenly spread: a small run gets its share too."""
    return math.floor((number + 1) * share + phase) > math.floor(number * share + phase)


@dataclass
class Plan:
    """What one call does besides saying its lines: decided up front, reproducible by --seed."""

    kind: str
    steps: list[str]
    barge_in_at: int | None = None  # this step's line interrupts the reply before it
    backchannel_at: int | None = None  # a backchannel during the reply before this step
    long_silence_at: int | None = None  # silence past the no-input timeout before this step
    pauses: set[int] = field(default_factory=set)
    coughs: set[int] = field(default_factory=set)


def make_plan(number: int, args: argparse.Namespace, lines: dict[str, Line]) -> Plan:
    rng = random.Random(args.seed * 1_000_003 + number)
    kind = CONVERSATION_CYCLE[number % len(CONVERSATION_CYCLE)]
    steps = conversations()[kind]
    spoken = [i for i, step in enumerate(steps) if not step.startswith("/")]
    # A barge-in needs a line long enough to still be speaking when the clear comes.
    long_lines = [i for i in spoken if lines[steps[i]].seconds >= 1.4]
    plan = Plan(kind, steps)
    taken: set[int] = set()

    def pick(candidates: list[int]) -> int | None:
        free = [i for i in candidates if i not in taken]
        if not free:
            return None
        choice = rng.choice(free)
        taken.add(choice)
        return choice

    # Different phases, so that at small shares the behaviours fall on different calls.
    if _spread(number, args.barge_in_share, 0.5):
        # Callers cut into the long greeting most of all: half the barge-ins go there.
        first = spoken[0]
        if first in long_lines and rng.random() < 0.5:
            plan.barge_in_at = pick([first])
        else:
            plan.barge_in_at = pick(long_lines)
    if _spread(number, args.backchannel_share, 0.25):
        plan.backchannel_at = pick(spoken)
    if _spread(number, args.long_silence_share, 0.75):
        plan.long_silence_at = pick(spoken)
    for index in spoken:
        if index not in taken and rng.random() < args.pause_share:
            plan.pauses.add(index)
            if rng.random() < 0.3:
                plan.coughs.add(index)
    return plan

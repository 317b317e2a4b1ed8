"""Finding a sustained single-frequency tone (an answering machine's beep) in PCM16 mono frames.

Each 20 ms frame goes through a bank of Goertzel filters spaced 25 Hz apart over 400-2200 Hz.
A frame is *tonal* when it is loud enough and one filter holds most of the frame's energy; a
*tone* is a run of tonal frames at one frequency lasting long enough. Why these parameters:

- Band 400-2200 Hz. There is no standard beep; vendors' detectors cover 440-2000 Hz (FreeSWITCH
  mod_avmd), 600-1100 Hz (its older mod_vmd) or 70 Hz-4 kHz (LumenVox), and the beeps met in
  practice are 1000 and 1400 Hz, 440/850/950 Hz and Asterisk's own 700 Hz `beep.wav`. Below
  400 Hz lie the voice's fundamental and first harmonics, where a held vowel's energy sits in
  one or two of them; beeps above 2 kHz are rare, and every hertz of band left out is one where
  speech cannot pass for a tone.
- Dominance 0.7: the share of the frame's energy (Parseval: the sum of squares) in the best
  filter, normalised so a steady sine at a filter's frequency scores 1.0 and one 12.5 Hz off,
  halfway between two filters, 0.92 (Hann window). Speech spreads its energy over harmonics and
  formants: on the tune half of the voicemail fixtures (tests/test_voicemail.py) the median
  speech frame scored 0.15 and 2% of them passed 0.7, in runs of at most four frames. DTMF and
  the busy and dial tones are two frequencies of equal level and score about 0.5 (the dial
  tone's 350+440 Hz, too close for a 20 ms frame to separate fully, reaches 0.64). 0.7 leaves a
  10 dB margin for line noise under a -30 dBFS beep.
- Level -40 dBFS: below LumenVox's minimum beep energy (RMS 387 of 32767, -38.5 dBFS), so quiet
  beeps still count, yet above line noise (the fixtures' is -60 to -45 dBFS), so that
  noise alone never makes a frame tonal.
- Frequency stability 40 Hz: a frame's frequency (interpolated between filters, a few Hz of
  error) must stay within this of the run's mean. Genesys' CPD documents beeps as a frequency
  +-50 Hz, LumenVox allows +-10 Hz of tone-generator drift; speech harmonics glide with the
  intonation, which ends most of speech's tonal runs.
- Minimum duration 120 ms (six frames). Beeps last 150-1500 ms (LumenVox accepts 70 ms and
  up); the longest run of tonal frames at one frequency in the tune half's speech was 80 ms
  (180 ms had dominance been 0.5), and Asterisk's TONE_DETECT warns that under 50 ms nothing
  is reliable.
- One frame of gap is bridged: a click or a lost packet in the middle of a beep (LumenVox
  tolerates artefacts of up to 20% of the beep) does not split it; it also means a tone's end
  is known 40 ms after it ends, about when LumenVox reports (96 ms on average). Only one:
  the US ringback's 440+480 Hz beat at 40 Hz, two frames tonal and two not, and stay apart.

The filters are evaluated as one matrix product (`GoertzelBank`): a Goertzel filter's output
after N samples is exactly that DFT term, and a product computes all 75 of them in a few
microseconds, where the recursion would loop over samples in Python. `goertzel_power` keeps the
recursion as the reference the tests compare against. Works at any rate whose 20 ms frame is a
whole number of samples (8 and 16 kHz on the phone and browser paths).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["FrameTone", "GoertzelBank", "Tone", "ToneDetector", "goertzel_power"]

FRAME_MS = 20
BAND_HZ = (400.0, 2200.0)
STEP_HZ = 25.0  # half the 50 Hz resolution of a 20 ms frame: under 0.4 dB lost between filters
MIN_DOMINANCE = 0.7
MIN_LEVEL_DBFS = -40.0
MAX_DRIFT_HZ = 40.0
MIN_TONE_MS = 120
MAX_GAP_FRAMES = 1


def goertzel_power(samples: npt.ArrayLike, frequency_hz: float, sample_rate: int) -> float:
    """|X(f)|^2 of `samples` at `frequency_hz` by the Goertzel recursion (unwindowed)."""
    omega = 2.0 * math.pi * frequency_hz / sample_rate
    coeff = 2.0 * math.cos(omega)
    s1 = s2 = 0.0
    for x in np.asarray(samples, dtype=np.float64):
        s1, s2 = float(x) + coeff * s1 - s2, s1
    return s1 * s1 + s2 * s2 - coeff * s1 * s2


@dataclass(frozen=True)
class FrameTone:
    """One frame's strongest in-band component."""

    frequency_hz: float
    dominance: float  # share of the frame's energy at that frequency, 0-1
    level_dbfs: float  # the whole frame's RMS level


class GoertzelBank:
    """Goertzel filters at `STEP_HZ` intervals across `band_hz` for frames of `frame_samples`."""

    def __init__(
        self,
        sample_rate: int,
        frame_samples: int,
        band_hz: tuple[float, float] = BAND_HZ,
        step_hz: float = STEP_HZ,
    ) -> None:
        low, high = band_hz
        if not 0 < low < high < sample_rate / 2:
            raise ValueError(f"band {band_hz} Hz does not fit below {sample_rate / 2} Hz")
        self.sample_rate = sample_rate
        self.frame_samples = frame_samples
        self.step_hz = step_hz
        # One filter beyond each edge, so a tone at the edge still peaks inside the bank.
        self.frequencies = np.arange(low - step_hz, high + step_hz * 1.5, step_hz)
        n = np.arange(frame_samples)
        # Hann: its sidelobes fall fast, so a strong harmonic 150 Hz away cannot leak into the
        # filter of a weaker one and make it look dominant.
        window = np.hanning(frame_samples + 2)[1:-1]
        phase = 2.0 * np.pi * np.outer(n, self.frequencies) / sample_rate
        # Real and imaginary parts side by side: one real matrix product gives every filter.
        self._basis = np.ascontiguousarray(
            np.concatenate([window[:, None] * np.cos(phase), window[:, None] * np.sin(phase)], 1)
        )
        self._count = len(self.frequencies)
        # 2N / (sum w)^2 turns |X|^2 / energy into 1.0 for a sine at a filter's frequency.
        self._scale = 2.0 * frame_samples / float(window.sum()) ** 2

    def powers(self, samples: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """|X(f)|^2 of the windowed frame at every filter frequency."""
        parts = samples @ self._basis
        parts *= parts
        return np.asarray(parts[: self._count] + parts[self._count :], dtype=np.float64)

    def analyze(self, pcm: bytes) -> FrameTone:
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
        if samples.size != self.frame_samples:
            raise ValueError(f"expected {self.frame_samples} samples, got {samples.size}")
        samples -= samples.mean()  # a DC offset is energy that is not in the band
        energy = float(samples @ samples)
        if energy <= 0.0:
            return FrameTone(0.0, 0.0, -math.inf)
        level = 10.0 * math.log10(energy / samples.size / (32768.0 * 32768.0))
        powers = self.powers(samples)
        k = int(powers.argmax())
        frequency = float(self.frequencies[k])
        if not 0 < k < self._count - 1:
            # At the bank's edge the peak may belong to energy outside it: not a tone here.
            return FrameTone(frequency, 0.0, level)
        peak = float(powers[k])
        # Parabola through the log powers of the peak and its neighbours: the sine's frequency
        # to a few Hz, since a Hann main lobe is close to a Gaussian.
        left = math.log(float(powers[k - 1]) + 1e-12)
        mid = math.log(peak + 1e-12)
        right = math.log(float(powers[k + 1]) + 1e-12)
        denom = left - 2.0 * mid + right
        if denom < 0.0:
            frequency += 0.5 * (left - right) / denom * self.step_hz
        return FrameTone(frequency, min(1.0, peak * self._scale / energy), level)


@dataclass(frozen=True)
class Tone:
    """A tone heard from `start_ms` to `end_ms` (the caller's clock), at `frequency_hz`."""

    frequency_hz: float
    start_ms: float
    end_ms: float

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms


class ToneDetector:
    """Reports each sustained in-band tone once it ends; sans-I/O, fed 20 ms frames in order.

    `feed(pcm, now_ms)` takes one frame and the time at its end, and returns the `Tone` that has
    just ended (the frame after its last one, plus the bridged gap), else None. `active` is the
    tone under way once it has lasted `min_duration_ms`, for deciding before it ends.
    """

    def __init__(
        self,
        sample_rate: int,
        *,
        frame_ms: int = FRAME_MS,
        min_duration_ms: float = MIN_TONE_MS,
        min_dominance: float = MIN_DOMINANCE,
        min_level_dbfs: float = MIN_LEVEL_DBFS,
        max_drift_hz: float = MAX_DRIFT_HZ,
        max_gap_frames: int = MAX_GAP_FRAMES,
        band_hz: tuple[float, float] = BAND_HZ,
    ) -> None:
        samples, remainder = divmod(sample_rate * frame_ms, 1000)
        if remainder or samples <= 0:
            raise ValueError(f"{frame_ms} ms at {sample_rate} Hz is not a whole number of samples")
        self.sample_rate = sample_rate
        self.frame_ms = frame_ms
        self.frame_bytes = 2 * samples
        self.min_duration_ms = min_duration_ms
        self.min_dominance = min_dominance
        self.min_level_dbfs = min_level_dbfs
        self.max_drift_hz = max_drift_hz
        self.max_gap_frames = max_gap_frames
        self.bank = GoertzelBank(sample_rate, samples, band_hz)
        self.last: FrameTone | None = None  # the latest frame's analysis, for diagnostics
        self._reset_run()

    def _reset_run(self) -> None:
        self._start_ms: float | None = None
        self._end_ms = 0.0
        self._sum_hz = 0.0
        self._frames = 0
        self._gap = 0

    @property
    def in_tone(self) -> bool:
        """A run of tonal frames is under way (however short so far)."""
        return self._start_ms is not None

    @property
    def active(self) -> Tone | None:
        if self._start_ms is None or self._end_ms - self._start_ms < self.min_duration_ms:
            return None
        return Tone(self._sum_hz / self._frames, self._start_ms, self._end_ms)

    def feed(self, pcm: bytes, now_ms: float) -> Tone | None:
        if len(pcm) != self.frame_bytes:
            raise ValueError(
                f"tone detection at {self.sample_rate} Hz needs {self.frame_ms} ms frames of "
                f"{self.frame_bytes} bytes, got {len(pcm)}"
            )
        frame = self.last = self.bank.analyze(pcm)
        tonal = frame.level_dbfs >= self.min_level_dbfs and frame.dominance >= self.min_dominance
        ended: Tone | None = None
        if self._start_ms is not None:
            mean_hz = self._sum_hz / self._frames
            if tonal and abs(frame.frequency_hz - mean_hz) <= self.max_drift_hz:
                self._extend(frame, now_ms)
                return None
            if tonal or self._gap >= self.max_gap_frames:
                ended = self.active
                self._reset_run()
            else:
                self._gap += 1
                return None
        if tonal:
            self._start_ms = now_ms - self.frame_ms
            self._extend(frame, now_ms)
        return ended

    def _extend(self, frame: FrameTone, now_ms: float) -> None:
        self._end_ms = now_ms
        self._sum_hz += frame.frequency_hz
        self._frames += 1
        self._gap = 0

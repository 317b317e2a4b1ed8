"""Call recording: both directions of a call, on one timeline, to one compressed stereo file.

Left channel: the caller, as their audio arrived. Right channel: the agent, as the caller heard
it: each burst of agent audio plays from max(the time it was sent, the end of the audio before
it), and a clear at time t drops whatever agent audio was still to play after t (the caller's
playback clock, as `voice_agent.callers` models it).

The recorder is plain code: it is told the time (ms, on the pipeline's clock) with each call and
never awaits. Audio is kept in two bytearrays from the oldest sample not yet written; everything
that can no longer change (older than the clock, less a little jitter room for the caller) is
encoded and written in batches of about a quarter of a second. What stays in memory is that
batch plus the agent audio already scheduled ahead of the clock (a sentence or a few), so a long
call costs no more memory than a short one. The clock starts at `start_ms` (the file's 0).

The file is Ogg/Opus through PyAV (`av`, which comes with the `webrtc` extra): coupled stereo at
24 kbit/s for 8 kHz carriers, 32 kbit/s above, limited to wideband (8 kHz audio bandwidth);
joint coding leaks one channel into the other at about -30 dB. Without `av` it is a stereo WAV
of G.711 mu-law (format tag 7; 8 bits a sample, half of PCM16).
A recorder that cannot write (disk full, directory not writable) logs once, deletes its partial
file and records nothing more; it never raises into the call.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from voice_agent.audio.g711 import ulaw_encode

__all__ = [
    "FORMATS",
    "CallRecorder",
    "Recording",
    "RecordingFormat",
    "find_recording",
    "opus_available",
    "prune_recordings",
    "recording_format",
    "recording_path",
    "recordings_dir",
    "safe_file_stem",
]

log = logging.getLogger("voice_agent.recording")

RecordingFormat = Literal["opus", "wav"]


@dataclass(frozen=True)
class _FormatInfo:
    extension: str
    media_type: str
    description: str


FORMATS: dict[RecordingFormat, _FormatInfo] = {
    "opus": _FormatInfo("opus", "audio/ogg; codecs=opus", "ogg/opus"),
    "wav": _FormatInfo("wav", "audio/wav", "wav/mulaw"),
}

OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # what libopus takes; others are resampled to 48k
OPUS_COMPLEXITY = 0  # 0..10: 0 costs about a third of 10, and voice at these rates barely differs
WAVE_FORMAT_MULAW = 7
RECORDINGS_SUBDIR = "recordings"


# ---- formats and file names -------------------------------------------------------------------


def _import_av() -> Any | None:
    try:
        import av
    except ImportError:
        return None
    return av


def opus_available() -> bool:
    """Whether PyAV (with libopus) can be imported; the first call imports it (~0.2 s)."""
    av = _import_av()
    if av is None:
        return False
    try:
        return "libopus" in av.codecs_available
    except Exception:
        return False


def recording_format(preferred: RecordingFormat | Literal["auto"] = "auto") -> RecordingFormat:
    """The format recordings will use: Opus when PyAV has it, else mu-law WAV."""
    if preferred == "wav":
        return "wav"
    return "opus" if opus_available() else "wav"


def recordings_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / RECORDINGS_SUBDIR


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_file_stem(call_id: str) -> str:
    """A file name stem for a call id: unchanged when it is already safe, else made safe and
    suffixed with a hash of the id, so two ids never share a file."""
    stem = _UNSAFE.sub("_", call_id).lstrip(".")[:100]
    if stem == call_id and stem:
        return stem
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{stem or 'call'}-{digest}"


def recording_path(directory: str | os.PathLike[str], call_id: str, fmt: RecordingFormat) -> Path:
    """`<directory>/<safe call id>.<opus|wav>`; `directory` is usually `recordings_dir(...)`."""
    return Path(directory) / f"{safe_file_stem(call_id)}.{FORMATS[fmt].extension}"


def find_recording(
    directory: str | os.PathLike[str], call_id: str
) -> tuple[Path, RecordingFormat] | None:
    """The recording of a call in `directory`, if there is one, and its format."""
    for fmt in FORMATS:
        path = recording_path(directory, call_id, fmt)
        if path.is_file():
            return path, fmt
    return None


def prune_recordings(
    directory: str | os.PathLike[str], older_than_days: float, *, now: float | None = None
) -> int:
    """Delete recordings last written more than `older_than_days` ago; returns how many."""
    cutoff = (time.time() if now is None else now) - older_than_days * 86400
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    suffixes = tuple(f".{info.extension}" for info in FORMATS.values())
    for entry in entries:
        if not entry.name.endswith(suffixes):
            continue
        try:
            if entry.is_file() and entry.stat().st_mtime < cutoff:
                os.unlink(entry.path)
                removed += 1
        except OSError as exc:
            log.warning("could not delete recording %s: %s", entry.path, exc)
    return removed


# ---- writers ------------------------------------------------------------------------------------


class _Writer(Protocol):
    def write(self, stereo: npt.NDArray[np.int16]) -> None: ...  # shape (n, 2)
    def close(self) -> None: ...
    def abort(self) -> None: ...


class _MulawWavWriter:
    """Stereo G.711 mu-law WAV; the header is rewritten after each batch, so the file stays
    valid up to its last batch even if the process dies."""

    def __init__(self, path: Path, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self._frames = 0
        self._file = open(path, "wb")  # closed by close() or abort()
        self._file.write(self._header())

    def _header(self) -> bytes:
        data = self._frames * 2
        fmt = struct.pack(
            "<HHIIHHH", WAVE_FORMAT_MULAW, 2, self.sample_rate, self.sample_rate * 2, 2, 8, 0
        )
        return b"".join(
            (
                b"RIFF",
                struct.pack("<I", 4 + (8 + len(fmt)) + 12 + 8 + data),
                b"WAVE",
                b"fmt ",
                struct.pack("<I", len(fmt)),
                fmt,
                b"fact",
                struct.pack("<II", 4, self._frames),  # required for non-PCM formats
                b"data",
                struct.pack("<I", data),
            )
        )

    def write(self, stereo: npt.NDArray[np.int16]) -> None:
        self._file.write(ulaw_encode(stereo.tobytes()))
        self._frames += len(stereo)
        self._file.seek(0)
        self._file.write(self._header())
        self._file.seek(0, os.SEEK_END)

    def close(self) -> None:
        self._file.close()

    def abort(self) -> None:
        try:
            self._file.close()
        except Exception:
            pass


class _OggOpusWriter:
    def __init__(self, path: Path, sample_rate: int, bitrate: int, complexity: int) -> None:
        av = _import_av()
        if av is None:
            raise RuntimeError("PyAV is not installed")
        self._av = av
        self.sample_rate = sample_rate
        self._time_base = Fraction(1, sample_rate)
        self._pts = 0
        encoder_rate = sample_rate if sample_rate in OPUS_RATES else 48000
        self._container: Any = av.open(os.fspath(path), mode="w", format="ogg")
        try:
            stream = self._container.add_stream("libopus", rate=encoder_rate)
            codec = stream.codec_context
            codec.layout = "stereo"
            codec.bit_rate = bitrate
            options = {
                "application": "voip",
                "compression_level": str(complexity),
                "frame_duration": "60",  # fewer packets: less overhead in time and bytes
            }
            if encoder_rate > 16000:
                # Wideband is plenty for voice, and at these bitrates a wider band costs the
                # stereo image: fullband 32 kbit/s lets one channel bleed into the other.
                options["cutoff"] = "8000"
            codec.options = options
        except Exception:
            self.abort()
            raise
        self._stream: Any = stream

    def write(self, stereo: npt.NDArray[np.int16]) -> None:
        frame = self._av.AudioFrame.from_ndarray(
            stereo.reshape(1, -1), format="s16", layout="stereo"
        )
        frame.sample_rate = self.sample_rate
        frame.time_base = self._time_base
        frame.pts = self._pts
        self._pts += len(stereo)
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def close(self) -> None:
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()

    def abort(self) -> None:
        try:
            self._container.close()
        except Exception:
            pass


# ---- the recorder -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recording:
    """A finished recording."""

    path: Path
    format: RecordingFormat
    duration_s: float
    bytes: int
    sample_rate: int  # of the audio recorded (the carrier's); Opus files decode at 48 kHz

    @property
    def media_type(self) -> str:
        return FORMATS[self.format].media_type

    @property
    def description(self) -> str:
        return FORMATS[self.format].description

    def as_audit(self, relative_to: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """The fields of a `recording` audit event; the path relative to `relative_to` (the
        data directory) when it is inside it, so the record survives moving the directory."""
        path = self.path
        if relative_to is not None:
            try:
                path = self.path.resolve().relative_to(Path(relative_to).resolve())
            except ValueError:
                pass
        return {
            "path": path.as_posix(),
            "format": self.description,
            "media_type": self.media_type,
            "duration_s": self.duration_s,
            "bytes": self.bytes,
        }


class CallRecorder:
    """Records one call. Feed it PCM16 mono at the carrier's rate with the time it happened:

    - `caller(pcm, now_ms)`: caller audio as it arrives (every transport message or frame);
    - `agent(pcm, now_ms)`: agent audio as it is sent to the transport;
    - `clear(now_ms)`: the transport was told to drop queued agent audio;
    - `finish(now_ms)`: the call is over; writes the rest, closes the file, returns what it made.

    Times are ms on one clock; `start_ms` (the clock at the start of the call) is the file's 0.
    """

    def __init__(
        self,
        call_id: str,
        sample_rate: int,
        directory: str | os.PathLike[str],
        *,
        start_ms: float = 0.0,
        fmt: RecordingFormat | Literal["auto"] = "auto",
        bitrate: int | None = None,
        complexity: int = OPUS_COMPLEXITY,
        batch_ms: float = 250.0,
        jitter_ms: float = 100.0,
        max_ahead_ms: float = 120_000.0,
    ) -> None:
        if sample_rate <= 0:
            raise ValueError(f"sample rate must be positive, got {sample_rate}")
        self.call_id = call_id
        self.sample_rate = sample_rate
        self.format: RecordingFormat = recording_format(fmt)
        self.path = recording_path(directory, call_id, self.format)
        self.bitrate = bitrate if bitrate is not None else (24000 if sample_rate <= 8000 else 32000)
        self.error: str | None = None
        self._start_ms = start_ms
        self._per_ms = sample_rate / 1000
        per_ms = self._per_ms
        self._jitter = max(0, round(jitter_ms * per_ms))
        self._max_ahead = max(1, round(max_ahead_ms * per_ms))
        # Flush once the clock is this far past the oldest unwritten sample: by then at least
        # a batch is final (the caller's end may trail the clock by up to the jitter room).
        self._flush_after = max(1, round(batch_ms * per_ms)) + self._jitter
        # Sample indices from the start of the call.
        self._base = 0  # the first sample not yet written; both buffers start here
        self._now = 0  # the clock, never going back
        self._caller_end = 0  # where the caller's next audio goes, unless it comes late
        self._agent_end = 0  # where the agent's audio scheduled so far ends
        self._left = bytearray()  # caller, PCM16, from _base
        self._right = bytearray()  # agent, PCM16, from _base
        self._off = False  # failed or finished: everything is ignored
        self._dropped_warned = False
        self._result: Recording | None = None
        self._writer: _Writer | None = None
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            if self.format == "opus":
                self._writer = _OggOpusWriter(self.path, sample_rate, self.bitrate, complexity)
            else:
                self._writer = _MulawWavWriter(self.path, sample_rate)
        except Exception as exc:
            self._fail(exc)

    @classmethod
    def for_call(
        cls, data_dir: str | os.PathLike[str], call_id: str, sample_rate: int, **options: Any
    ) -> CallRecorder:
        """A recorder writing to `<data_dir>/recordings/<call id>.<opus|wav>`."""
        return cls(call_id, sample_rate, recordings_dir(data_dir), **options)

    # ---- state --------------------------------------------------------------------------------

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def buffered_bytes(self) -> int:
        """PCM held in memory, not yet encoded."""
        return len(self._left) + len(self._right)

    # ---- inputs -------------------------------------------------------------------------------

    def _clock(self, now_ms: float) -> int:
        at = int((now_ms - self._start_ms) * self._per_ms + 0.5)
        if at > self._now:
            self._now = at
        return self._now

    def caller(self, pcm: bytes, now_ms: float) -> None:
        """Caller audio that arrived at `now_ms`: it follows the caller's previous audio unless
        it comes more than the jitter room later than that would place it (a gap: silence)."""
        if self._off:
            return
        now = self._clock(now_ms)
        start = self._caller_end
        if now > start + self._jitter:
            start = now
        elif start - now > self._max_ahead:
            self._dropping("caller audio is arriving faster than real time")
            return
        self._put(self._left, start, pcm)
        self._caller_end = start + (len(pcm) >> 1)
        if now - self._base >= self._flush_after:
            self._flush(self._final_before(now))

    def agent(self, pcm: bytes, now_ms: float) -> None:
        """Agent audio sent at `now_ms`: plays after what is queued, or at once."""
        if self._off:
            return
        now = self._clock(now_ms)
        start = max(now, self._agent_end)
        end = start + (len(pcm) >> 1)
        if end - now > self._max_ahead:
            self._dropping("agent audio is queued too far ahead")
            return
        self._put(self._right, start, pcm)
        self._agent_end = end
        if now - self._base >= self._flush_after:
            self._flush(self._final_before(now))

    def clear(self, now_ms: float) -> None:
        """Queued agent audio was dropped at `now_ms`: nothing of it after that was heard."""
        if self._off:
            return
        now = self._clock(now_ms)
        if self._agent_end > now:
            del self._right[max(0, now - self._base) * 2 :]
            self._agent_end = now

    def finish(self, now_ms: float) -> Recording | None:
        """The call ended at `now_ms`: agent audio still queued was not heard. Writes the rest
        and closes the file; returns the recording, or None if it failed. Idempotent."""
        if self._off:
            return self._result
        self.clear(now_ms)
        end = max(self._now, self._caller_end)
        self._flush(end)
        writer, self._writer = self._writer, None
        self._off = True
        if writer is None or self.failed:
            return None
        try:
            writer.close()
            size = self.path.stat().st_size
        except Exception as exc:
            self._writer = writer
            self._fail(exc)
            return None
        self._result = Recording(
            self.path, self.format, round(end / self.sample_rate, 3), size, self.sample_rate
        )
        return self._result

    # ---- internals ----------------------------------------------------------------------------

    def _final_before(self, now: int) -> int:
        """Samples before this index can no longer change: the agent's before the clock (a
        clear only cuts after it); the caller's before its end, or before the clock less the
        jitter room when it is further behind than that (its next audio starts a gap)."""
        return min(now, max(self._caller_end, now - self._jitter))

    def _put(self, buffer: bytearray, start: int, pcm: bytes) -> None:
        offset = (start - self._base) * 2
        if len(pcm) & 1:
            pcm = pcm[:-1]
        if offset < 0:  # not expected: writes start at or after _base
            pcm = pcm[-offset:]
            offset = 0
        gap = offset - len(buffer)
        if gap > 0:
            buffer += bytes(gap)
        elif gap < 0:
            del buffer[offset:]
        buffer += pcm

    def _flush(self, upto: int) -> None:
        count = upto - self._base
        if count <= 0 or self._writer is None:
            return
        stereo = np.zeros((count, 2), dtype=np.int16)
        nbytes = count * 2
        for channel, buffer in enumerate((self._left, self._right)):
            if buffer:
                taken = buffer[:nbytes]  # a copy: the bytearray can then shrink
                samples = np.frombuffer(taken, dtype="<i2")
                stereo[: len(samples), channel] = samples
                del buffer[:nbytes]
        self._base = upto
        try:
            self._writer.write(stereo)
        except Exception as exc:
            self._fail(exc)

    def _dropping(self, why: str) -> None:
        if not self._dropped_warned:
            self._dropped_warned = True
            log.warning(
                "call %s: recording: %s; dropping what is over %.0f s ahead",
                self.call_id,
                why,
                self._max_ahead / self.sample_rate,
            )

    def _fail(self, exc: BaseException) -> None:
        if self.error is not None:
            return
        self.error = f"{type(exc).__name__}: {exc}"
        log.warning("call %s: recording stopped: %s", self.call_id, self.error)
        self._off = True
        self._left = bytearray()
        self._right = bytearray()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.abort()
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass

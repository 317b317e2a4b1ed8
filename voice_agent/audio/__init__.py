"""Audio layer: G.711 codecs, resampling, framing and WAV I/O on PCM16 little-endian mono bytes."""

# The one-shot `resample` function is deliberately not re-exported: under the same name as its
# module it would shadow `voice_agent.audio.resample` for `import ... as` and monkeypatch paths.
from voice_agent.audio.frames import Framer, frame_bytes, rms_dbfs, silence
from voice_agent.audio.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from voice_agent.audio.resample import StreamResampler
from voice_agent.audio.wav import read_wav, write_wav

__all__ = [
    "Framer",
    "StreamResampler",
    "alaw_decode",
    "alaw_encode",
    "frame_bytes",
    "read_wav",
    "rms_dbfs",
    "silence",
    "ulaw_decode",
    "ulaw_encode",
    "write_wav",
]

"""The audio a Realtime session takes and gives, chosen from the call's own format.

The protocol offers three: 24 kHz PCM16 (`audio/pcm`) and 8 kHz G.711 (`audio/pcmu`,
`audio/pcma`). A G.711 call (Twilio and most carriers, SIP with PCMU or PCMA) goes to the model
and back as its own bytes: nothing is resampled on either side, and the model's audio is
what the carrier plays. Every other call (the browser's 48 kHz, /ws at 16 kHz, AudioSocket)
speaks 24 kHz PCM16 with the model, resampled here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from voice_agent.audio.codec import CarrierFormat, Encoding
from voice_agent.audio.resample import resample


@dataclass(frozen=True)
class AudioFormat:
    name: str  # the protocol's type: "audio/pcm", "audio/pcmu", "audio/pcma"
    encoding: Encoding
    sample_rate: int

    @property
    def carrier(self) -> CarrierFormat:
        return CarrierFormat(self.encoding, self.sample_rate)

    def wire(self) -> dict[str, Any]:
        """As `session.audio.input.format` / `.output.format` name it."""
        if self.name == "audio/pcm":
            return {"type": self.name, "rate": self.sample_rate}
        return {"type": self.name}

    def from_pcm(self, pcm: bytes, rate: int) -> bytes:
        """PCM16 at `rate` (a caller's turn as the pipeline kept it) in this format."""
        if rate != self.sample_rate:
            pcm = resample(pcm, rate, self.sample_rate)
        return self.carrier.encode(pcm)


PCM24 = AudioFormat("audio/pcm", "pcm16", 24000)
PCMU = AudioFormat("audio/pcmu", "mulaw", 8000)
PCMA = AudioFormat("audio/pcma", "alaw", 8000)


def format_for(encoding: str, sample_rate: int) -> AudioFormat:
    """The model's format for a call whose carrier speaks `encoding` at `sample_rate`."""
    if sample_rate == 8000 and encoding == "mulaw":
        return PCMU
    if sample_rate == 8000 and encoding == "alaw":
        return PCMA
    return PCM24

"""The agent's voice as Opus packets for aiortc's RTP sender, encoded here instead of by aiortc.

Handed raw frames, aiortc's sender measures each frame's level in pure Python (for RFC
6464's audio-level header extension, a loop over every sample), resamples it to 48 kHz stereo
and encodes it at 96 kbit/s on the loop's default executor, whose thread hop per frame cost
more than the encoding itself; and it does all of that every 20 ms while the agent is silent
too. Handed an `av.Packet`, it only packetizes it. So the track encodes here, on the loop
(PyAV's encoder holds the GIL, so the executor's thread bought no parallelism): 16 kHz mono,
the pipeline's own rate, at 32 kbit/s, which Opus's wideband speech needs and no more; and
once the agent has been quiet for a few frames it repeats the encoder's own packet for
digital silence instead of encoding silence again (docs/performance.md, "WebRTC calls").
"""

from __future__ import annotations

from fractions import Fraction

import av

BITRATE = 32_000
# Quiet frames still run through the encoder after speech, so the packets the browser decodes
# fade out from the encoder's own state; the last of them is the silence packet repeated after.
SETTLE_FRAMES = 5
EMPTY = bytes([9 << 3])  # RFC 6716's TOC for 20 ms of SILK wideband, mono, one frame: no data


class OpusVoice:
    """Encodes 20 ms PCM16 mono frames at `sample_rate` into Opus packets with RTP timing."""

    def __init__(self, sample_rate: int, bitrate: int = BITRATE) -> None:
        self.time_base = Fraction(1, sample_rate)
        codec = av.CodecContext.create("libopus", "w")
        codec.bit_rate = bitrate
        codec.format = "s16"
        codec.layout = "mono"
        codec.sample_rate = sample_rate
        codec.time_base = self.time_base
        codec.options = {"application": "voip"}
        self._codec = codec
        self._sample_rate = sample_rate
        # A new encoder's first packets differ from its steady silence: the call's first
        # frames go through it like the fade-out after speech.
        self._quiet = 0
        self._silence: bytes | None = None
        self.encoded = 0  # frames that went through the encoder (the rest were the silence packet)

    def packet(self, pcm: bytes, pts: int, *, speech: bool) -> av.Packet:
        """The packet for one frame starting at sample `pts`; `speech` False for the silence the
        playout fills in when it has nothing to send."""
        if speech:
            self._quiet = 0
        elif self._quiet >= SETTLE_FRAMES and self._silence is not None:
            return self._timed(av.Packet(self._silence), pts)
        payload = self._encode(pcm, pts)
        if not speech:
            self._quiet += 1
            if self._quiet >= SETTLE_FRAMES:
                self._silence = payload
        return self._timed(av.Packet(payload), pts)

    def _encode(self, pcm: bytes, pts: int) -> bytes:
        samples = len(pcm) // 2
        frame = av.AudioFrame(format="s16", layout="mono", samples=samples)
        frame.planes[0].update(pcm)
        frame.pts = pts
        frame.sample_rate = self._sample_rate
        frame.time_base = self.time_base
        self.encoded += 1
        # libopus returns one packet per 20 ms frame at once (no look-ahead held back); its
        # own pts run 6.5 ms early (the encoder's delay), which RTP does not need. Should it
        # ever hold one back, a TOC byte alone (a frame of no data) has the browser conceal.
        packets = self._codec.encode(frame)
        return bytes(packets[0]) if packets else EMPTY

    def _timed(self, packet: av.Packet, pts: int) -> av.Packet:
        packet.pts = pts
        packet.time_base = self.time_base
        return packet

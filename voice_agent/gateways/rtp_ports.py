"""The RTP ports a SIP call's media may use: the configured range (`sip.rtp_port_min` ..
`rtp_port_max`), even numbers only (RFC 3550 section 11), a port another process holds skipped.
"""

from __future__ import annotations

import socket

from voice_agent.errors import VoiceAgentError


class RtpPorts:
    """The RTP ports of the configured range, even numbers only (RFC 3550 section 11)."""

    def __init__(self, low: int, high: int) -> None:
        self._free = list(range(low + low % 2, high + 1, 2))
        self._used: set[int] = set()

    def bind(self, host: str) -> socket.socket:
        """A UDP socket on a free port of the range; VoiceAgentError when none is free."""
        for port in list(self._free):
            sock = socket.socket(
                socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM
            )
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue  # another process holds it: try the next
            self._free.remove(port)
            self._used.add(port)
            sock.setblocking(False)
            return sock
        raise VoiceAgentError("no free RTP port in sip.rtp_port_min..rtp_port_max")

    def release(self, port: int) -> None:
        if port in self._used:
            self._used.discard(port)
            self._free.append(port)

"""The RTP ports a SIP call's media may use: the configured range (`sip.rtp_port_min` ..
`rtp_port_max`), even numbers for RTP and the odd one above each for RTCP (RFC 3550 section
11), a pair another process holds a port of skipped.
"""

from __future__ import annotations

import socket

from voice_agent.errors import VoiceAgentError


class RtpPorts:
    """The RTP ports of the configured range, even numbers only (RFC 3550 section 11); RTCP
    takes each one's odd neighbour, which may lie one past `high`."""

    def __init__(self, low: int, high: int) -> None:
        self._free = list(range(low + low % 2, high + 1, 2))
        self._used: set[int] = set()

    def bind(self, host: str) -> tuple[socket.socket, socket.socket]:
        """UDP sockets on a free even port of the range and the odd one above it, for RTP and
        RTCP (RFC 3550 section 11); VoiceAgentError when no pair is free."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        for port in list(self._free):
            pair = [socket.socket(family, socket.SOCK_DGRAM) for _ in range(2)]
            try:
                pair[0].bind((host, port))
                pair[1].bind((host, port + 1))
            except OSError:
                for sock in pair:
                    sock.close()
                continue  # another process holds one of them: try the next
            self._free.remove(port)
            self._used.add(port)
            for sock in pair:
                sock.setblocking(False)
            return pair[0], pair[1]
        raise VoiceAgentError("no free RTP port in sip.rtp_port_min..rtp_port_max")

    def release(self, port: int) -> None:
        if port in self._used:
            self._used.discard(port)
            self._free.append(port)

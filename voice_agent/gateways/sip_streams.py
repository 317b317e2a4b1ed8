"""SIP over TCP and TLS for the SIP listener: the listening sockets, each connection's framing
(voice_agent.sip.stream), and sending on the connection a peer is known by.

A connection is known by its peer's address: every message it brings is handed to the
listener as a datagram from that address, so the sans-I/O endpoint needs nothing new, and a
response or in-dialog request for that address goes back on the same connection (RFC 3261
section 18.2.2; connection reuse, RFC 5923). An address with no connection is the UDP
socket's.

What a connection may cost is bounded, so a scanner or a broken peer harms nothing else:
- a message must be whole READ_TIMEOUT_S after its first byte, and a new connection must
  bring one that soon (a slow sender, a half-open connection: closed);
- one with no traffic for IDLE_TIMEOUT_S is closed unless a live call came over it;
- its framing has limits (16 KB of header, 48 KB of body), and a peer that stops reading
  what it is sent is closed past MAX_WRITE_BUFFER bytes;
- `max_connections` at most; past it a new connection is closed as it comes;
- a TLS handshake has HANDSHAKE_TIMEOUT_S; one that fails closes its connection (asyncio
  logs it at DEBUG level only).
Each closing for cause is logged at INFO with the peer and the reason, and counted.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
from collections.abc import Callable
from typing import Any

from voice_agent.sip.stream import PING, PONG, StreamFramer
from voice_agent.sip.transaction import Addr

log = logging.getLogger("voice_agent.sip")

READ_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 600.0  # longer than a PBX's qualify interval (Asterisk's is 60 s)
HANDSHAKE_TIMEOUT_S = 10.0
MAX_WRITE_BUFFER = 1024 * 1024

OnMessage = Callable[[bytes, Addr], None]
# File descriptors beside the connections: RTP sockets (one a call), the HTTP side, the store.
OTHER_FILES = 4096


def make_room(max_connections: int) -> None:
    """Raise this process's open-file limit towards what `max_connections` needs, as far as
    the hard limit allows (many systems start a service at a soft limit of 1,024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + OTHER_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        if new > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < wanted:
            log.warning(
                "sip: %d open files at most (ulimit -n); sip.max_connections %d may not fit",
                new,
                max_connections,
            )


class SipConnections:
    """The TCP and TLS connections of one SIP listener."""

    def __init__(
        self,
        on_message: OnMessage,
        *,
        max_connections: int,
        in_use: Callable[[Addr], bool] = lambda peer: False,
        on_closed: Callable[[str], None] | None = None,
    ) -> None:
        self._on_message = on_message
        self._in_use = in_use
        self._on_closed = on_closed
        self.max_connections = max_connections
        self._by_peer: dict[Addr, _Connection] = {}
        self._servers: list[asyncio.Server] = []
        self.closed_for_cause: dict[str, int] = {}  # reason kind -> count, for metrics

    def __len__(self) -> int:
        return len(self._by_peer)

    @property
    def pending_bytes(self) -> int:
        """What the connections hold of messages not yet whole."""
        return sum(connection.framer.pending for connection in self._by_peer.values())

    async def listen(self, host: str, port: int, tls: ssl.SSLContext | None) -> int:
        """Listen on `host:port` (TLS with `tls`); the port bound (a free one for 0)."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Connection(self, "tls" if tls is not None else "tcp"),
            host,
            port,
            ssl=tls,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if tls is not None else None,
            reuse_address=True,
        )
        self._servers.append(server)
        bound: int = server.sockets[0].getsockname()[1]
        return bound

    def send(self, addr: Addr, data: bytes) -> bool:
        """Write `data` on the connection of `addr`; False if there is none (then it is UDP's)."""
        connection = self._by_peer.get(addr)
        if connection is None:
            return False
        connection.write(data)
        return True

    def close(self) -> None:
        for server in self._servers:
            server.close()
        for connection in list(self._by_peer.values()):
            connection.close()

    # ---- for the connections --------------------------------------------------------------

    def _opened(self, connection: _Connection) -> bool:
        if len(self._by_peer) >= self.max_connections:
            self._closed_for_cause(connection, "limit", f"over {self.max_connections} open")
            return False
        self._by_peer[connection.peer] = connection
        return True

    def _lost(self, connection: _Connection) -> None:
        if self._by_peer.get(connection.peer) is connection:
            del self._by_peer[connection.peer]

    def _closed_for_cause(self, connection: _Connection, kind: str, reason: str) -> None:
        self.closed_for_cause[kind] = self.closed_for_cause.get(kind, 0) + 1
        if self._on_closed is not None:
            self._on_closed(kind)
        host, port = connection.peer
        log.info("sip %s %s:%d: connection closed: %s", connection.transport, host, port, reason)


class _Connection(asyncio.Protocol):
    def __init__(self, owner: SipConnections, transport: str) -> None:
        self.owner = owner
        self.transport = transport
        self.framer = StreamFramer()
        self.peer: Addr = ("", 0)
        self._wire: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._read_by = 0.0  # a message under way must be whole by then (0: none under way)
        self._active_at = 0.0

    # ---- asyncio's side -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._wire = transport
        peer: Any = transport.get_extra_info("peername")
        self.peer = (str(peer[0]), int(peer[1]))
        loop = asyncio.get_running_loop()
        if not self.owner._opened(self):
            transport.abort()
            return
        # A new connection must bring a whole message as soon as a message under way must be.
        self._active_at = loop.time()
        self._read_by = self._active_at + READ_TIMEOUT_S
        self._arm(self._read_by)

    def data_received(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._active_at = now
        items = self.framer.feed(data)
        if self.framer.pending:
            if not self._read_by or items:
                self._read_by = now + READ_TIMEOUT_S
                if self._timer is None or self._timer_at > self._read_by:
                    self._arm(self._read_by)
        else:
            self._read_by = 0.0
        for item in items:
            if item == PING:
                self.write(PONG)
            else:
                self.owner._on_message(item, self.peer)
            if self._wire is None or self._wire.is_closing():
                return
        if self.framer.error is not None:
            self.owner._closed_for_cause(self, "framing", self.framer.error)
            self.close()  # after what was answered: close() sends what is queued first

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.owner._lost(self)
        self._wire = None

    # ---- ours -----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        wire = self._wire
        if wire is None or wire.is_closing():
            return
        wire.write(data)
        self._active_at = asyncio.get_running_loop().time()
        if wire.get_write_buffer_size() > MAX_WRITE_BUFFER:
            self.owner._closed_for_cause(self, "not_reading", "the peer reads nothing it is sent")
            wire.abort()

    def close(self) -> None:
        if self._wire is not None and not self._wire.is_closing():
            self._wire.close()

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_at(at, self._check)

    def _check(self) -> None:
        """The connection's one timer: the read deadline, else the idle one. Re-armed at
        whichever is next rather than on every read."""
        self._timer = None
        if self._wire is None or self._wire.is_closing():
            return
        now = asyncio.get_running_loop().time()
        if self._read_by:
            if now >= self._read_by:
                what = "no whole message" if self.framer.pending else "no message"
                self.owner._closed_for_cause(self, "slow", f"{what} in {READ_TIMEOUT_S:g} s")
                self._wire.abort()
                return
            self._arm(self._read_by)
            return
        idle_until = self._active_at + IDLE_TIMEOUT_S
        if now < idle_until:
            self._arm(idle_until)
        elif self.owner._in_use(self.peer):
            self._arm(now + IDLE_TIMEOUT_S)
        else:
            self.owner._closed_for_cause(self, "idle", f"no traffic for {IDLE_TIMEOUT_S:g} s")
            self._wire.abort()

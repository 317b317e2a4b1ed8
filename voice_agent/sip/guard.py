"""Who may reach the SIP port: allowed source networks, and a limit on failed authentications
per source address, so a scanner's password guessing is cut off after a few tries and costs the
server a fixed amount of memory whatever it sends."""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
WINDOW_MS = 60_000.0
MAX_TRACKED_SOURCES = 10_000


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """ "10.0.0.0/8", "192.0.2.7" -> networks; ValueError names the one that is not."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address or network") from None
    return tuple(networks)


def source_allowed(host: str, networks: tuple[Network, ...] | None) -> bool:
    """None allows every source; an address that does not parse is never allowed."""
    if networks is None:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in network for network in networks)


class FailureLimiter:
    """At most `max_failures` failed authentications per source in a minute; past that the
    source is ignored until its minute is over. The table of sources is bounded: when it is full,
    the source seen longest ago is forgotten."""

    def __init__(self, max_failures: int, *, max_sources: int = MAX_TRACKED_SOURCES) -> None:
        self.max_failures = max_failures
        self.max_sources = max_sources
        self._sources: OrderedDict[str, tuple[float, int]] = OrderedDict()  # host: (since, n)

    def __len__(self) -> int:
        return len(self._sources)

    def blocked(self, host: str, now_ms: float) -> bool:
        entry = self._sources.get(host)
        if entry is None:
            return False
        since, count = entry
        if now_ms - since >= WINDOW_MS:
            del self._sources[host]
            return False
        return count >= self.max_failures

    def failed(self, host: str, now_ms: float) -> None:
        since, count = self._sources.pop(host, (now_ms, 0))
        if now_ms - since >= WINDOW_MS:
            since, count = now_ms, 0
        self._sources[host] = (since, count + 1)
        while len(self._sources) > self.max_sources:
            self._sources.popitem(last=False)

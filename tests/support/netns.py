"""Network namespaces on a private bridge, for tests of several hosts: each namespace is a
machine of its own (its own addresses and ports, a veth to the bridge) on a 10.77.N.0/24, with
this process's namespace at 10.77.N.1 reaching them all. Torn down on exit, even on failure.

    with Network() as net:
        host = net.add("host1")              # 10.77.N.2
        subprocess.Popen(host.wrap(["voice-agent", "serve", "--host", host.address]))

Needs root and `ip` (iproute2); `available()` says why not, for a skip.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass
from types import TracebackType

_networks = itertools.count()


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need ip (iproute2)"
    return None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def _used_subnets() -> set[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    out = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    return {
        ipaddress.ip_interface(fields[3]).network
        for fields in (line.split() for line in out.splitlines())
        if len(fields) > 3
    }


@dataclass(frozen=True)
class Namespace:
    name: str  # as `ip netns` knows it
    address: str

    def wrap(self, command: list[str]) -> list[str]:
        """`command` run inside this namespace (same files, users and environment)."""
        return ["ip", "netns", "exec", self.name, *command]


class Network:
    def __init__(self) -> None:
        # Unique per process (test runs side by side, pytest-xdist, each get their own) and
        # per network: the kernel frees a deleted namespace's veth later, in the background,
        # so the next network of this process must not reuse its names.
        self.tag = f"v{os.getpid() % 10000:04d}{next(_networks) % 100:02d}"
        self.bridge = f"{self.tag}br"
        used = _used_subnets()
        # Searched from a point of this process's own, so that two test processes making
        # their networks at the same moment do not both take the first free one.
        start = os.getpid() % 179
        subnet = next(
            (
                net
                for step in range(179)
                if (net := ipaddress.ip_network(f"10.77.{77 + (start + step) % 179}.0/24"))
                not in used
            ),
            None,
        )
        if subnet is None:
            raise RuntimeError("no free 10.77.N.0/24 subnet for the test network")
        self.subnet = subnet
        self.gateway = str(subnet.network_address + 1)
        self.namespaces: list[Namespace] = []
        self._veths: list[str] = []
        self._made_bridge = False

    def __enter__(self) -> Network:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made_bridge = True
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()  # __exit__ is not called when __enter__ fails
            raise
        return self

    def add(self, label: str) -> Namespace:
        index = len(self.namespaces) + 2
        namespace = Namespace(f"{self.tag}-{label}", str(self.subnet.network_address + index))
        outside, inside = f"{self.tag}h{index}", f"{self.tag}n{index}"  # at most 15 characters
        _ip("netns", "add", namespace.name)
        self.namespaces.append(namespace)
        self._veths.append(outside)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", outside, "master", self.bridge, "up")
        _ip("link", "set", inside, "netns", namespace.name)
        _ip("-n", namespace.name, "addr", "add", f"{namespace.address}/24", "dev", inside)
        _ip("-n", namespace.name, "link", "set", inside, "up")
        _ip("-n", namespace.name, "link", "set", "lo", "up")
        return namespace

    def close(self) -> None:
        # Deleting a namespace deletes the veth end inside it, and so the pair.
        for namespace in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", namespace.name], capture_output=True)
        self.namespaces.clear()
        for veth in self._veths:  # one whose other end never reached its namespace
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
        self._veths.clear()
        if self._made_bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            self._made_bridge = False

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

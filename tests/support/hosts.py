"""Several hosts on one machine: `voice-agent serve` processes, each with its own data
directory and log file, in network namespaces of their own (tests/support/netns.py: the ports
of the sample configs, an address each) or on loopback (free ports), and a real HAProxy
(Debian's) in front of them, started with deploy/haproxy.cfg templated only for addresses,
ports, the stats socket and the log."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.configs import QUICK_VOICE, ROOT, default_config_with
from tests.support.netns import Namespace
from tests.support.sipp import free_udp_port

TOKEN = "tok-hosts-1"
SAMPLE_HAPROXY = ROOT / "deploy" / "haproxy.cfg"
# The sample configs' ports: a host in a namespace of its own has them all to itself.
PORT, CONTROL_PORT, AGENT_PORT, SIP_PORT = 8765, 8766, 8767, 5060


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class Host:
    """One host: `voice-agent serve` with its control API and agent port, output to a file;
    in `namespace` when given (the sample's ports, or `ports`: HTTP, control API and agent
    port, for a second server in the namespace), else on loopback."""

    def __init__(
        self,
        folder: Path,
        name: str,
        *,
        namespace: Namespace | None = None,
        server: Mapping[str, Any] | None = None,
        sip: bool = False,
        workers: int = 1,
        ports: tuple[int, int, int] = (PORT, CONTROL_PORT, AGENT_PORT),
    ) -> None:
        self.name = name
        if namespace is not None:
            address = namespace.address
            self.port, self.control_port, self.agent_port = ports
        else:
            address = "127.0.0.1"
            self.port, self.control_port, self.agent_port = (free_port() for _ in range(3))
        self.address = address
        folder.mkdir(parents=True, exist_ok=True)
        settings = {
            "control_listen": f"{address}:{self.control_port}",
            "agent_check_listen": f"{address}:{self.agent_port}",
            # These tests are about routing: a loop slowed by the other tests' load must not
            # refuse their calls (and the weight then follows the calls alone).
            "max_loop_lag_ms": None,
            **(server or {}),
        }
        config = default_config_with(folder / "config", voice=QUICK_VOICE, server=settings)
        command = [sys.executable, "-m", "voice_agent.cli", "serve", "--config", str(config)]
        command += ["--host", address, "--port", str(self.port)]
        self.sip_port = SIP_PORT if namespace is not None else free_udp_port()
        if sip:
            command += ["--sip", f"{address}:{self.sip_port}"]
        self.workers = workers
        if workers > 1:
            command += ["--workers", str(workers)]
        env = {
            **os.environ,
            "VOICE_AGENT_DATA_DIR": str(folder / "data"),  # calls.db: this host's own store
            "VOICE_AGENT_TOKEN": TOKEN,
            "PYTHONPATH": str(ROOT),
        }
        self.data_dir = folder / "data"
        self.log_path = folder / "serve.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                namespace.wrap(command) if namespace is not None else command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a stop signals it alone, never the test's group
            )

    @property
    def http(self) -> str:
        return f"http://{self.address}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def serving_workers(self) -> int:
        """How many worker starts the log shows (each prints its banner once it serves)."""
        return self.log_path.read_text(errors="replace").count(" serving agent ")

    async def wait_ready(self, timeout_s: float = 60) -> None:
        """Until every worker serves: one answering /healthz is not enough, the agent port is
        worker 0's and the kernel hands calls to any of them."""
        async with httpx.AsyncClient() as http:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise AssertionError(f"{self.name} exited before serving:\n{self.log()}")
                try:
                    if (
                        self.serving_workers() >= self.workers
                        and (await http.get(f"{self.http}/healthz")).status_code == 200
                    ):
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError(f"{self.name} did not serve within {timeout_s} s:\n{self.log()}")

    async def drain(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as http:
            response = await http.post(
                f"http://{self.address}:{self.control_port}/admin/drain",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
        assert response.status_code == 202, response.text
        status: dict[str, Any] = response.json()
        return status

    async def call(self, call_id: str) -> dict[str, Any] | None:
        """This host's record of a call (each host here has its own store), or None."""
        async with httpx.AsyncClient() as http:
            response = await http.get(
                f"{self.http}/calls/{call_id}", headers={"Authorization": f"Bearer {TOKEN}"}
            )
        if response.status_code == 404:
            return None
        assert response.status_code == 200, response.text
        record: dict[str, Any] = response.json()
        return record

    async def call_count(self) -> int:
        """How many calls this host's store has a record of."""
        async with httpx.AsyncClient() as http:
            response = await http.get(
                f"{self.http}/calls?limit=1", headers={"Authorization": f"Bearer {TOKEN}"}
            )
        assert response.status_code == 200, response.text
        total: int = response.json()["total"]
        return total

    async def live_calls(self) -> int:
        async with httpx.AsyncClient() as http:
            live: int = (await http.get(f"{self.http}/healthz")).json()["live_calls"]
        return live

    def stored_outcome(self, call_id: str) -> tuple[str | None, str | None]:
        """A call's outcome and end reason as the host's store kept them: readable after the
        host has exited (a drained host exits after its last call)."""
        with contextlib.closing(
            sqlite3.connect(f"file:{self.data_dir / 'calls.db'}?mode=ro", uri=True)
        ) as db:
            row = db.execute(
                "SELECT outcome, end_reason FROM calls WHERE call_id = ?", (call_id,)
            ).fetchone()
        assert row is not None, f"{self.name} has no record of call {call_id}"
        return row[0], row[1]

    def stored_outcomes(self) -> list[tuple[str | None, str | None]]:
        """Every call's outcome and end reason in the host's store, oldest first."""
        with contextlib.closing(
            sqlite3.connect(f"file:{self.data_dir / 'calls.db'}?mode=ro", uri=True)
        ) as db:
            rows = db.execute("SELECT outcome, end_reason FROM calls ORDER BY started_ms")
            return [(row[0], row[1]) for row in rows]

    def stop(self) -> None:
        """As an operator would: SIGTERM (drain), again (end the calls), then wait."""
        for _ in range(2):
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def haproxy_binary() -> str:
    # Debian puts it in /usr/sbin, which a user's PATH may not have.
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
    if found is None:
        pytest.fail("haproxy is not installed: scripts/test installs it (apt-get install haproxy)")
    return found


def haproxy_config(front: tuple[str, int] | None, hosts: list[Host], stats_socket: Path) -> str:
    """deploy/haproxy.cfg with the example addresses and ports replaced by these hosts' (and
    the front's, unless None: the sample's :80, in a namespace of the balancer's own)."""
    text = SAMPLE_HAPROXY.read_text()
    examples = re.findall(r"^    server (\w+) ", text, flags=re.MULTILINE)
    names = list(dict.fromkeys(examples))
    if len(names) != len(hosts):
        raise ValueError(f"the sample config names {len(names)} hosts, not {len(hosts)}")
    if front is not None:
        text = text.replace("bind :80", f"bind {front[0]}:{front[1]}")
    text = text.replace("/run/haproxy/admin.sock", str(stats_socket))
    text = text.replace("log /dev/log local0", "log stdout format raw local0")
    for name, host in zip(names, hosts, strict=True):
        text = re.sub(
            rf"^(    server {name}) \S+:{PORT}",
            rf"\1 {host.address}:{host.port}",
            text,
            flags=re.MULTILINE,
        )
        text = re.sub(
            rf"^(    server {name} \S+) agent-port {AGENT_PORT}",
            rf"\1 agent-port {host.agent_port}",
            text,
            flags=re.MULTILINE,
        )
    return text


class HAProxy:
    """Debian's haproxy in the foreground (-db) on a templated copy of the sample config."""

    def __init__(
        self, folder: Path, hosts: list[Host], *, namespace: Namespace | None = None
    ) -> None:
        self.stats_socket = folder / "haproxy.sock"  # a file: reachable from any namespace
        self.config = folder / "haproxy.cfg"
        if namespace is not None:
            self.address, self.port = namespace.address, 80
            self.config.write_text(haproxy_config(None, hosts, self.stats_socket))
        else:
            self.address, self.port = "127.0.0.1", free_port()
            front = (self.address, self.port)
            self.config.write_text(haproxy_config(front, hosts, self.stats_socket))
        binary = haproxy_binary()
        check = subprocess.run(
            [binary, "-c", "-f", str(self.config)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
        self.log_path = folder / "haproxy.log"
        command = [binary, "-db", "-f", str(self.config)]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                namespace.wrap(command) if namespace is not None else command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def url(self, path: str) -> str:
        return f"ws://{self.address}:{self.port}{path}"

    def command(self, line: str) -> str:
        """One command on the stats socket (`set server ...`, `disable health ...`); its
        answer, empty when it was done."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.stats_socket))
            sock.sendall(line.encode() + b"\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        return data.decode().strip()

    def servers(self, backend: str = "calls") -> dict[str, dict[str, str]]:
        """`show stat` on the stats socket: each server of `backend` by name (status, weight,
        scur: its connections now, stot: in all)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.stats_socket))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
        return {
            row["svname"]: row
            for row in rows
            if row["pxname"] == backend and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    async def wait_servers(self, what: str, check: Any, timeout_s: float = 15) -> None:
        """Poll the stats until `check(servers)` holds (a safety deadline, not a measurement)."""
        deadline = time.monotonic() + timeout_s
        servers: dict[str, dict[str, str]] = {}
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"haproxy exited:\n{self.log_path.read_text()[-2000:]}")
            if self.stats_socket.exists():
                servers = await asyncio.to_thread(self.servers)
                if check(servers):
                    return
            await asyncio.sleep(0.2)
        summary = {name: (row["status"], row["weight"]) for name, row in servers.items()}
        raise AssertionError(f"haproxy never saw {what}: {summary}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


SAMPLE_KAMAILIO = ROOT / "deploy" / "kamailio.cfg"
SAMPLE_DISPATCHER = ROOT / "deploy" / "dispatcher.list"


class Kamailio:
    """Debian's kamailio in the foreground (-DD -E) on templated copies of deploy/kamailio.cfg
    and deploy/dispatcher.list, in `namespace` (the sample's port 5060); `ping_interval_s`
    replaces the sample's OPTIONS probe interval (a long one: hosts are judged by their
    answers to INVITEs alone)."""

    def __init__(
        self,
        folder: Path,
        hosts: list[Host],
        *,
        namespace: Namespace,
        ping_interval_s: int | None = None,
    ) -> None:
        binary = shutil.which("kamailio") or shutil.which("kamailio", path="/usr/sbin")
        if binary is None:
            pytest.fail("kamailio is not installed: scripts/test installs it")
        self.address, self.port = namespace.address, SIP_PORT
        self.control = folder / "kamailio.ctl"
        listed = SAMPLE_DISPATCHER.read_text()
        examples = re.findall(r"^1 sip:(\S+) ", listed, flags=re.MULTILINE)
        if len(examples) != len(hosts):
            raise ValueError(f"the sample list names {len(examples)} hosts, not {len(hosts)}")
        for example, host in zip(examples, hosts, strict=True):
            listed = listed.replace(f"sip:{example} ", f"sip:{host.address}:{host.sip_port} ")
        dispatcher = folder / "dispatcher.list"
        dispatcher.write_text(listed)
        text = SAMPLE_KAMAILIO.read_text()
        text = re.sub(
            r"^listen=udp:\S+", f"listen=udp:{self.address}:{self.port}", text, flags=re.M
        )
        text = text.replace("/etc/kamailio/dispatcher.list", str(dispatcher))
        text = text.replace("unix:/run/kamailio/kamailio_ctl", f"unix:{self.control}")
        if ping_interval_s is not None:
            text, replaced = re.subn(
                r'"ds_ping_interval", \d+\)', f'"ds_ping_interval", {ping_interval_s})', text
            )
            assert replaced == 1, "the sample config sets ds_ping_interval once"
        self.config = folder / "kamailio.cfg"
        self.config.write_text(text)
        check = subprocess.run(
            [binary, "-c", "-f", str(self.config)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
        self.log_path = folder / "kamailio.log"
        command = namespace.wrap([binary, "-DD", "-E", "-f", str(self.config)])
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def target(self) -> str:
        return f"{self.address}:{self.port}"

    def destinations(self) -> dict[str, str]:
        """`kamcmd dispatcher.list`: each host's flags by address (AP: active and probed,
        IP: inactive, probed)."""
        kamcmd = shutil.which("kamcmd") or shutil.which("kamcmd", path="/usr/sbin")
        assert kamcmd is not None, "kamcmd comes with kamailio"
        out = subprocess.run(
            [kamcmd, "-s", f"unix:{self.control}", "dispatcher.list"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout
        uris = re.findall(r"URI: sip:(\S+)", out)
        flags = re.findall(r"FLAGS: (\S+)", out)
        return dict(zip(uris, flags, strict=False))

    async def wait_destinations(self, what: str, check: Any, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        seen: dict[str, str] = {}
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"kamailio exited:\n{self.log_path.read_text()[-2000:]}")
            if self.control.exists():
                seen = await asyncio.to_thread(self.destinations)
                if seen and check(seen):
                    return
            await asyncio.sleep(0.2)
        raise AssertionError(f"kamailio never saw {what}: {seen}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

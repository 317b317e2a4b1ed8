"""A throwaway PostgreSQL cluster for tests: initdb and pg_ctl on a temp dir, on a unix socket,
and for tests of several hosts also on TCP in a network namespace of its own.

Debian's `postgresql` package puts the server in /usr/lib/postgresql/<version>/bin. The server
refuses to run as root, so as root the cluster runs as the `postgres` user (the package
creates it) through runuser, in a temp dir that user owns. Listening on a unix socket in that
dir, not on TCP, no port can collide with another cluster; in a namespace (tests/support/netns.py)
the address is the namespace's own, so the standard port is free too, and the network's subnet
may connect without a password. Anything missing is a test failure
with the reason, not a skip: the Postgres store must not go untested by accident.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.netns import Namespace

PORT = 5432  # names the socket file, and the TCP port in a namespace
SUPERUSER = "postgres"


def _bin_dir() -> Path:
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda path: int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0,
    )
    if candidates:
        return candidates[-1].parent
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(initdb).parent
    pytest.fail(
        "PostgreSQL is not installed (no initdb in /usr/lib/postgresql/*/bin or on PATH): "
        "apt-get install postgresql",
        pytrace=False,
    )


@dataclass
class PostgresCluster:
    root: Path
    bin_dir: Path
    run_as: list[str]  # the command prefix running a server binary as a non-root user
    namespace: Namespace | None = None  # where it also listens on TCP
    clients: str | None = None  # the network (CIDR) trusted to connect over TCP

    @property
    def socket_dir(self) -> Path:
        return self.root

    def url(self, database: str = "postgres") -> str:
        if self.namespace is not None:
            return f"postgresql://{SUPERUSER}@{self.namespace.address}:{PORT}/{database}"
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}&port={PORT}"

    def _run(self, *args: str) -> None:
        command = [*self.run_as, *args]
        if self.namespace is not None:
            command = self.namespace.wrap(command)  # the postmaster stays in it
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            pytest.fail(
                f"PostgreSQL test cluster: {' '.join(args[:2])} failed "
                f"({result.returncode}): {result.stderr.strip() or result.stdout.strip()}\n{tail}",
                pytrace=False,
            )

    def start(self) -> None:
        data = self.root / "data"
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--no-sync",  # a throwaway cluster: skip the fsyncs that make initdb slow
            "--encoding=UTF8",
            "--locale=C",
        )
        listen = ""
        if self.namespace is not None:
            listen = self.namespace.address
            with (data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.clients} trust\n")
        options = (
            f"-k {self.socket_dir} -p {PORT} -c listen_addresses='{listen}' "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(self.root / "server.log"),
            "-w",
            "-t",
            "30",
            "start",
        )

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(
                [
                    *self.run_as,
                    str(self.bin_dir / "pg_ctl"),
                    "-D",
                    str(self.root / "data"),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
                capture_output=True,
                timeout=30,
                check=False,
            )
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def running_cluster(
    namespace: Namespace | None = None, clients: str | None = None
) -> Iterator[PostgresCluster]:
    """A started cluster, stopped and deleted after; in `namespace`, also on TCP at its
    address, where `clients` (a CIDR: the namespaces' network) connect without a password."""
    if (namespace is None) != (clients is None):
        raise ValueError("a cluster in a namespace needs the clients' network, and only then")
    bin_dir = _bin_dir()
    root = Path(tempfile.mkdtemp(prefix="voice-agent-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root, ignore_errors=True)
            pytest.fail(
                "PostgreSQL refuses to run as root and there is no 'postgres' user to run it "
                "as (Debian's postgresql package creates one)",
                pytrace=False,
            )
        os.chown(root, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    cluster = PostgresCluster(root, bin_dir, run_as, namespace, clients)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """One cluster for the test session, started on first use."""
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
async def postgres_url(postgres_cluster: PostgresCluster) -> AsyncIterator[str]:
    """A fresh, empty schema in the session's cluster, first on the URL's search_path.

    A schema rather than a database per test: CREATE DATABASE costs half a second, this
    almost nothing. asyncpg passes unknown URL query parameters on as server settings.
    """
    import asyncpg

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_cluster.url())
    try:
        await admin.execute(f"CREATE SCHEMA {name}")
        yield f"{postgres_cluster.url()}&search_path={name}"
        await admin.execute(f"DROP SCHEMA {name} CASCADE")
    finally:
        await admin.close()

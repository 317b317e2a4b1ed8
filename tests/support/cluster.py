"""The cluster of docs/operations.md "Several hosts", built on network namespaces, and one run of
it: calls spread over two hosts, one host drained while callers keep coming, a worker of the
other killed under calls. tests/test_cluster.py asserts on the run's `Report`;
scripts/cluster_test.py runs it with more callers and prints its figures.

Namespaces (tests/support/netns.py), each a machine of its own on one bridge:

    db      PostgreSQL, on TCP (server.store of every server)
    host1   `serve --workers 2` (WebSocket calls) and `serve --sip` (SIP calls), one store
    host2   the same
    lb      HAProxy (deploy/haproxy.cfg) and Kamailio (deploy/kamailio.cfg)

The callers (Twilio-protocol clients and sipp) run in this process's own namespace, at the
bridge's address. SIP takes one worker (the CLI refuses `--sip` with `--workers`: a call's
datagrams would be split between processes), so each host runs its SIP server as a second
process beside its WebSocket server, as the CLI's refusal advises; draining a host drains both.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import asyncpg
import httpx

from tests.support import netns
from tests.support.hosts import TOKEN, HAProxy, Host, Kamailio
from tests.support.postgres import running_cluster
from tests.support.sipp import run_sipp, scenario
from voice_agent.callers import TwilioClient

AUDIO = Path(__file__).resolve().parent.parent / "fixtures" / "audio"
LINE = AUDIO / "joe_book1.ulaw"  # "I'd like to book a table...": the agent answers it
# The SIP server's HTTP, control API and agent ports, beside the WebSocket server's 8765-8767.
SIP_SERVER_PORTS = (8775, 8776, 8777)
INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Machine:
    """One host: its two servers on one address."""

    name: str
    calls: Host  # WebSocket calls, `--workers 2`, behind HAProxy
    sip: Host  # SIP calls, one worker, behind Kamailio (UDP 5060)


@dataclass(frozen=True)
class Stored:
    """One call as the shared store has it, and which server's process took it."""

    server: str | None  # a Host's name; None while its worker is not yet known
    pid: int | None
    transport: str
    outcome: str | None
    end_reason: str | None

    @property
    def live(self) -> bool:
        return self.outcome is None


def _parent(pid: int) -> int | None:
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return None


class Ledger:
    """Which server took each call. The store records the worker on every call and each live
    worker's pid in its workers table; a pid is a server's (its supervisor's child, or the
    server itself). Workers are remembered once seen: a drained one deletes its row."""

    def __init__(self, url: str, servers: list[Host]) -> None:
        self.url = url
        self.servers = servers
        self.owners: dict[str, tuple[str, int]] = {}  # worker_id -> (server, pid)
        self._db: asyncpg.Connection | None = None

    async def open(self) -> None:
        self._db = await asyncpg.connect(self.url)

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()

    def _server_of(self, pid: int) -> str | None:
        parent = _parent(pid)
        for server in self.servers:
            if server.process.poll() is None and server.process.pid in (pid, parent):
                return server.name
        return None

    async def calls(self) -> dict[str, Stored]:
        assert self._db is not None, "open() first"
        for row in await self._db.fetch("SELECT worker_id, pid FROM call_workers"):
            if row["worker_id"] not in self.owners:
                server = self._server_of(row["pid"])
                if server is not None:
                    self.owners[row["worker_id"]] = (server, row["pid"])
        rows = await self._db.fetch(
            "SELECT call_id, transport, worker_id, outcome, end_reason FROM calls"
        )
        calls = {}
        for row in rows:
            server, pid = self.owners.get(row["worker_id"], (None, None))
            calls[row["call_id"]] = Stored(
                server, pid, row["transport"], row["outcome"], row["end_reason"]
            )
        return calls

    async def until(
        self, check: Callable[[dict[str, Stored]], bool], what: str, timeout_s: float = 30
    ) -> dict[str, Stored]:
        """Polled (the store is other processes' writes); the deadline is a safety net."""
        deadline = time.monotonic() + timeout_s
        while True:
            calls = await self.calls()
            if check(calls):
                return calls
            if time.monotonic() > deadline:
                raise AssertionError(f"the store never showed {what} in {timeout_s} s: {calls}")
            await asyncio.sleep(0.2)


@dataclass
class Caller:
    """A Twilio-protocol call through HAProxy, as its caller saw it."""

    client: TwilioClient
    error: str | None = None  # why the call failed on the caller's side

    @property
    def sid(self) -> str:
        return self.client.call_sid


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Cluster:
    """PostgreSQL, two hosts, HAProxy and Kamailio, each in its namespace; all torn down on
    exit, even when the build fails halfway."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.callers: list[Caller] = []
        self._stack = contextlib.AsyncExitStack()
        self._sids = itertools.count(1)
        self._sipp_runs = itertools.count(1)

    async def __aenter__(self) -> Cluster:
        try:
            await self._build()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _build(self) -> None:
        stack = self._stack
        self.network = stack.enter_context(netns.Network())
        spaces = {label: self.network.add(label) for label in ("db", "host1", "host2", "lb")}
        self.spaces = spaces
        self.postgres = stack.enter_context(running_cluster(spaces["db"], str(self.network.subnet)))
        # The balancer is a trusted proxy: a refused call reaches it as a 503 it retries.
        self.settings = {"store": self.postgres.url(), "trusted_proxies": [spaces["lb"].address]}
        self.machines = [self._machine(name) for name in ("host1", "host2")]
        self.ledger = Ledger(self.postgres.url(), self.servers)
        await asyncio.gather(*(server.wait_ready() for server in self.servers))
        lb = spaces["lb"]
        self.haproxy = HAProxy(self.folder, [m.calls for m in self.machines], namespace=lb)
        stack.callback(self.haproxy.stop)
        self.kamailio = Kamailio(self.folder, [m.sip for m in self.machines], namespace=lb)
        stack.callback(self.kamailio.stop)
        stack.push_async_callback(self._hang_up_all)
        await self.ledger.open()
        stack.push_async_callback(self.ledger.close)
        await self.haproxy.wait_servers(
            "both hosts up at full weight",
            lambda s: all(r["status"] == "UP" and r["weight"] == "100" for r in s.values()),
        )
        await self.kamailio.wait_destinations(
            "both hosts active", lambda d: all(f.startswith("A") for f in d.values())
        )

    def _server(self, folder: str, name: str, **options: Any) -> Host:
        host = Host(self.folder / folder, name, server=self.settings, **options)
        # Stopped before the network and the database go (the stack unwinds in reverse).
        self._stack.callback(host.stop)
        return host

    def _machine(self, name: str) -> Machine:
        space = self.spaces[name]
        calls = self._server(f"{name}/calls", name, namespace=space, workers=2)
        sip = self._server(
            f"{name}/sip", f"{name}-sip", namespace=space, sip=True, ports=SIP_SERVER_PORTS
        )
        return Machine(name, calls, sip)

    @property
    def servers(self) -> list[Host]:
        return [server for m in self.machines for server in (m.calls, m.sip)]

    def restart_calls(self, machine: Machine) -> Host:
        """A new run of the machine's WebSocket server, as its supervisor would start after a
        drain (the new version of a rolling update); not yet waited for."""
        again = self._server(
            f"{machine.name}/calls-again", machine.name, namespace=self.spaces[machine.name],
            workers=2,
        )  # fmt: skip
        self.ledger.servers.append(again)
        return again

    async def _hang_up_all(self) -> None:
        await asyncio.gather(*(c.client.abort() for c in self.callers), return_exceptions=True)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()

    # ---- callers -------------------------------------------------------------------------

    async def place(self) -> Caller:
        """A Twilio-protocol call through HAProxy, held once the greeting has begun."""
        client = TwilioClient(
            f"{self.haproxy.url('/twilio')}?token={TOKEN}",
            call_sid=f"CA{next(self._sids):032d}",
            timeout=30,
        )
        caller = Caller(client)
        self.callers.append(caller)
        try:
            await client.connect()
            await client.wait_audio(100)
        except Exception as exc:  # a failed call, which the report counts
            caller.error = _failure(exc)
        return caller

    async def place_one_by_one(self, count: int) -> list[Caller]:
        """`count` calls, each up before the next: a balancer counting live calls sees each."""
        return [await self.place() for _ in range(count)]

    async def sip_calls(self, count: int, hold_ms: int) -> tuple[set[str], str | None]:
        """`count` sipp calls at once through Kamailio, each hanging up after `hold_ms`: their
        Call-IDs (the store's call ids) and why sipp failed, if it did."""
        folder = self.folder / f"sipp-{next(self._sipp_runs)}"
        await asyncio.to_thread(folder.mkdir)
        result = await run_sipp(
            self.kamailio.target,
            folder,
            scenario_file=await asyncio.to_thread(scenario, "routed_call", folder),
            calls=count,
            address=self.network.gateway,
            extra=["-l", str(count), "-r", "20", "-d", str(hold_ms)],
        )
        ids = set(re.findall(r"^\s*Call-ID: (\S+)", result.messages, flags=re.MULTILINE))
        failure = None
        if not result.ok or len(ids) != count:
            failure = f"sipp ({len(ids)} calls): {result.stdout[-800:]} {result.stderr[-400:]}"
        return ids, failure

    def sip_records(self, call_ids: Iterable[str]) -> dict[str, str]:
        """The store's id of each SIP call (by its SIP Call-ID), from the SIP servers' logs:
        "sip call <Call-ID> from <caller> is call <id>", which is how an operator traces a
        SIP call to its record."""
        found: dict[str, str] = {}
        for server in self.servers:
            text = server.log_path.read_text(errors="replace")
            found.update(re.findall(r"sip call (\S+) (?:from|to) \S+ is call (\w+)", text))
        return {call_id: found[call_id] for call_id in call_ids if call_id in found}

    async def listed(self, server: Host) -> set[str]:
        """Every call id `GET /calls` on `server` lists, page by page."""
        ids: set[str] = set()
        offset: int | None = 0
        async with httpx.AsyncClient() as http:
            while offset is not None:
                response = await http.get(
                    f"{server.http}/calls?limit=500&offset={offset}",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                )
                assert response.status_code == 200, response.text
                page = response.json()
                ids.update(call["call_id"] for call in page["calls"])
                offset = page["next_offset"]
        return ids


async def talk_and_hang_up(caller: Caller) -> None:
    """The caller says its line, hears the agent answer, and hangs up."""
    if caller.error is not None:
        return
    try:
        heard = caller.client.received_ms
        await caller.client.send_audio(LINE.read_bytes())
        await caller.client.wait_audio(heard + 1000)
        await caller.client.stop()
    except Exception as exc:
        caller.error = _failure(exc)


@dataclass(frozen=True)
class Load:
    """How many callers each step has; the test's are few, the script's many."""

    spread_calls: int = 6  # Twilio-protocol callers placed one by one, held
    spread_sip_calls: int = 4  # sipp calls at once, held past the drain's start
    spread_sip_hold_ms: int = 6000
    drain_calls: int = 6  # placed one by one once host1 drains, held
    drain_sip_calls: int = 3
    after_kill_calls: int = 3
    most_extra_calls: int = 10  # placed to give both of host2's workers a call, at most


@dataclass
class Report:
    """What the run saw; `failures` are calls that failed on the callers' side, anywhere but
    on the killed worker."""

    spread: Counter[str] = field(default_factory=Counter)  # WebSocket calls per server
    spread_sip: Counter[str] = field(default_factory=Counter)  # SIP calls per server
    live_on_drained: int = 0  # calls live on host1 when its drain began
    during_drain: Counter[str] = field(default_factory=Counter)  # new calls (both kinds)
    drain_s: float = 0.0  # from the drain request to host1's last server exiting
    drain_exit_codes: list[int] = field(default_factory=list)
    retried_elsewhere: int = 0  # HAProxy's redispatches away from host1
    extra_calls: int = 0  # placed so that both of host2's workers had a call
    victim_pid: int = 0
    victims: set[str] = field(default_factory=set)  # the killed worker's calls
    survivors: set[str] = field(default_factory=set)  # host2's other worker's, at the kill
    survivor_pid: int = 0
    dropped: set[str] = field(default_factory=set)  # calls that ended on the callers' side
    interrupted_after_s: float = 0.0  # from the kill to the victims all marked interrupted
    after_kill: Counter[str] = field(default_factory=Counter)
    after_kill_pids: list[int | None] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    placed: set[str] = field(default_factory=set)  # their ids in the store
    sip_calls_unrecorded: list[str] = field(default_factory=list)  # SIP Call-IDs
    listed: dict[str, set[str]] = field(default_factory=dict)  # by host: GET /calls there
    outcomes: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)

    def fail(self, callers: Iterable[Caller], step: str) -> None:
        self.failures += [f"{step} {c.sid}: {c.error}" for c in callers if c.error is not None]


async def run(cluster: Cluster, load: Load) -> Report:
    """The scenario, step by step; assertions are the caller's, on the report."""
    report = Report()
    host1, host2 = cluster.machines
    ledger = cluster.ledger

    def count(ids: Iterable[str], calls: dict[str, Stored]) -> Counter[str]:
        return Counter((calls[i].server or "unknown") if i in calls else "no record" for i in ids)

    # 1. Calls reach both hosts through both balancers.
    first = await cluster.place_one_by_one(load.spread_calls)
    report.fail(first, "before the drain")
    spread_sip = asyncio.ensure_future(
        cluster.sip_calls(load.spread_sip_calls, load.spread_sip_hold_ms)
    )
    calls = await ledger.until(
        lambda calls: (
            sum(c.transport == "sip" and c.live for c in calls.values()) == load.spread_sip_calls
            and all(c.server is not None for c in calls.values())
            # The store writes in batches: every answered caller's record is in too.
            and all(c.sid in calls for c in first if c.error is None)
        ),
        f"{load.spread_sip_calls} SIP calls up",
    )
    report.spread = count([c.sid for c in first], calls)
    report.spread_sip = Counter(
        c.server or "unknown" for c in calls.values() if c.transport == "sip"
    )
    on_host1 = [c for c in first if c.error is None and calls[c.sid].server == host1.name]
    report.live_on_drained = len(on_host1) + report.spread_sip[host1.sip.name]

    # 2. Drain host1 while callers keep coming: its live calls go on to their end (each
    # caller talks, hears the answer and hangs up; the SIP calls hang up at their time), new
    # calls all go to host2, and host1's servers exit once their last call has ended.
    drain_started = time.monotonic()
    await asyncio.gather(host1.calls.drain(), host1.sip.drain())
    finishing = asyncio.gather(*(talk_and_hang_up(c) for c in on_host1))
    during_sip = asyncio.ensure_future(cluster.sip_calls(load.drain_sip_calls, 2000))
    during = await cluster.place_one_by_one(load.drain_calls)
    await finishing
    report.fail(on_host1, "live on host1 during its drain")
    report.fail(during, "placed during the drain")
    sip_ids: set[str] = set()
    for ids, failure in (await spread_sip, await during_sip):
        sip_ids |= ids
        if failure is not None:
            report.failures.append(failure)
    during_sip_ids = set(cluster.sip_records((await during_sip)[0]).values())
    exits = await asyncio.gather(
        asyncio.to_thread(host1.calls.process.wait, 60),
        asyncio.to_thread(host1.sip.process.wait, 60),
    )
    report.drain_s = time.monotonic() - drain_started
    report.drain_exit_codes = list(exits)
    report.retried_elsewhere = int(cluster.haproxy.servers()["host1"]["wredis"])
    calls = await ledger.calls()
    report.during_drain = count([c.sid for c in during], calls) + count(during_sip_ids, calls)

    # 3. Kill one of host2's workers under calls (kill -9, as the OOM killer would): its
    # calls end on the callers' side and are marked interrupted in the store; the other
    # worker's calls go on, and new calls keep being taken.
    held = [c for c in first + during if c.error is None and not c.client.closed]
    extra: list[Caller] = []

    def by_worker(calls: dict[str, Stored]) -> dict[int, list[Caller]]:
        workers: dict[int, list[Caller]] = {}
        for caller in held + extra:
            stored = calls.get(caller.sid)
            if stored is not None and stored.server == host2.calls.name and stored.pid:
                workers.setdefault(stored.pid, []).append(caller)
        return workers

    async def recorded() -> dict[str, Stored]:
        # A call's start reaches the store within half a second: until then its worker is
        # unknown, and a kill would take the call with its record.
        return await ledger.until(
            lambda calls: all(
                c.sid in calls and calls[c.sid].server is not None
                for c in held + extra
                if c.error is None
            ),
            "the held calls recorded",
        )

    # The kernel hands each connection to either worker: place calls until both have one.
    workers = by_worker(await recorded())
    while len(workers) < 2 and len(extra) < load.most_extra_calls:
        extra += await cluster.place_one_by_one(1)
        workers = by_worker(await recorded())
    report.extra_calls = len(extra)
    report.fail(extra, "placed to reach both of host2's workers")
    report.victim_pid = max(workers, key=lambda pid: len(workers[pid]))
    victims = workers.pop(report.victim_pid)
    survivors = [c for group in workers.values() for c in group]
    report.survivor_pid = next(iter(workers), 0)
    report.victims = {c.sid for c in victims}
    report.survivors = {c.sid for c in survivors}
    killed_at = time.monotonic()
    os.kill(report.victim_pid, signal.SIGKILL)
    for caller in victims:
        with contextlib.suppress(TimeoutError):
            await caller.client.wait_closed()
    after = await cluster.place_one_by_one(load.after_kill_calls)
    report.fail(after, "placed after the kill")
    report.dropped = {c.sid for c in held + extra + after if c.client.closed}
    await asyncio.gather(*(talk_and_hang_up(c) for c in survivors))
    report.fail(survivors, "on host2's other worker after the kill")
    calls = await ledger.until(
        lambda calls: all(calls[sid].outcome == INTERRUPTED for sid in report.victims),
        "the killed worker's calls interrupted",
        timeout_s=60,
    )
    report.interrupted_after_s = time.monotonic() - killed_at
    report.after_kill = count([c.sid for c in after], calls)
    report.after_kill_pids = [calls[c.sid].pid if c.sid in calls else None for c in after]

    # 4. Every call, of either host and the killed worker's, is in GET /calls of either host
    # (host1 as its next run, back after the drain).
    host1_again = cluster.restart_calls(host1)
    await asyncio.gather(*(talk_and_hang_up(c) for c in after))
    report.fail(after, "placed after the kill, hanging up")
    for caller in extra:
        if caller.error is None and not caller.client.closed:
            await caller.client.stop()
    await host1_again.wait_ready()
    calls = await ledger.until(
        lambda calls: not any(c.live for c in calls.values()), "every call ended"
    )
    sip_records = cluster.sip_records(sip_ids)
    report.placed = {c.sid for c in cluster.callers} | set(sip_records.values())
    report.sip_calls_unrecorded = sorted(sip_ids - set(sip_records))
    report.outcomes = {i: (c.outcome, c.end_reason) for i, c in calls.items()}
    for server in (host1_again, host2.calls):
        report.listed[server.name] = await cluster.listed(server)
    return report

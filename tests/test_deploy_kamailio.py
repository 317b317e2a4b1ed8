"""deploy/kamailio.cfg with Debian's real kamailio (the dispatcher module, call load
algorithm) in front of two `voice-agent serve --sip` hosts, with sipp as the callers, each in a
network namespace of its own (tests/support/netns.py): calls are spread by load; a drained
host answers the dispatcher's OPTIONS probe with 503 and gets no new call while its live call
goes on to its end; then it exits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support import netns
from tests.support.hosts import Host, Kamailio
from tests.support.sipp import run_sipp, scenario

pytestmark = pytest.mark.skipif(netns.available() is not None, reason=netns.available() or "")


@pytest_asyncio.fixture
async def cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Kamailio, Host, Host, str]]:
    ping_interval_s: int | None = getattr(request, "param", None)
    with netns.Network() as network:
        spaces = [network.add(label) for label in ("host1", "host2", "sip")]
        one = Host(tmp_path / "host1", "host1", namespace=spaces[0], sip=True)
        two = Host(tmp_path / "host2", "host2", namespace=spaces[1], sip=True)
        proxy: Kamailio | None = None
        try:
            await asyncio.gather(one.wait_ready(), two.wait_ready())
            proxy = Kamailio(
                tmp_path, [one, two], namespace=spaces[2], ping_interval_s=ping_interval_s
            )
            await proxy.wait_destinations(
                "both hosts active", lambda d: all(f.startswith("A") for f in d.values())
            )
            yield proxy, one, two, network.gateway
        finally:
            if proxy is not None:
                proxy.stop()
            await asyncio.gather(asyncio.to_thread(one.stop), asyncio.to_thread(two.stop))


async def calls(proxy: Kamailio, folder: Path, caller: str, count: int, ms: int) -> None:
    """`count` calls at once from sipp on `caller`, each hanging up after `ms`."""
    await asyncio.to_thread(folder.mkdir)
    result = await run_sipp(
        proxy.target,
        folder,
        scenario_file=await asyncio.to_thread(scenario, "routed_call", folder),
        calls=count,
        address=caller,
        extra=["-l", str(count), "-r", "20", "-d", str(ms)],
    )
    assert result.ok, result.stdout[-1500:] + result.stderr + result.messages[-3000:]


async def host_with_a_call(hosts: list[Host]) -> Host:
    """The host the call just placed reached (polled: the state of another process)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for host in hosts:
            if await host.live_calls() == 1:
                return host
        await asyncio.sleep(0.1)
    raise AssertionError("no host took the call")


async def test_sip_calls_spread_by_load_and_leave_a_draining_host(
    cluster: tuple[Kamailio, Host, Host, str], tmp_path: Path
) -> None:
    proxy, one, two, caller = cluster
    hosts = [one, two]

    # Four calls at once: the host with the fewest calls takes each, two and two.
    await calls(proxy, tmp_path / "spread", caller, 4, 3000)
    assert [await host.call_count() for host in hosts] == [2, 2]

    # A long call, then its host drains: the probe's 503 takes it out of the dispatcher's
    # rotation, new calls all go to the other host, and the long call goes on to its BYE.
    long_call = asyncio.ensure_future(calls(proxy, tmp_path / "long", caller, 1, 12000))
    draining = await host_with_a_call(hosts)
    (other,) = [host for host in hosts if host is not draining]
    await draining.drain()
    key = f"{draining.address}:{draining.sip_port}"
    await proxy.wait_destinations(f"{key} inactive", lambda d: d[key].startswith("I"))
    before = other.call_count(), draining.call_count()
    counts = [await count for count in before]
    await calls(proxy, tmp_path / "after", caller, 3, 1000)
    assert await other.call_count() == counts[0] + 3
    assert await draining.call_count() == counts[1]
    await long_call  # sipp's caller hung up after 12 s, its BYE answered
    assert await asyncio.to_thread(draining.process.wait, 20) == 0
    assert draining.stored_outcomes()[-1] == ("caller_hung_up", "caller hung up")


# No probe for an hour: the dispatcher learns of the drain from the INVITE's 503 alone, as it
# does when a call comes in before its next probe.
@pytest.mark.parametrize("cluster", [3600], indirect=True)
async def test_an_invite_refused_by_a_draining_host_goes_to_the_other(
    cluster: tuple[Kamailio, Host, Host, str], tmp_path: Path
) -> None:
    proxy, one, two, caller = cluster
    hosts = [one, two]
    # A call through the proxy: the host it reached counts one call there, the other none.
    long_call = asyncio.ensure_future(calls(proxy, tmp_path / "long", caller, 1, 8000))
    busy = await host_with_a_call(hosts)
    (draining,) = [host for host in hosts if host is not busy]
    # A call straight to the other host keeps it up while it drains; the proxy does not
    # count it, so the other host stays the one with the fewest calls.
    direct_folder = tmp_path / "direct"
    await asyncio.to_thread(direct_folder.mkdir)
    direct = asyncio.ensure_future(
        run_sipp(
            f"{draining.address}:{draining.sip_port}",
            direct_folder,
            scenario_file=await asyncio.to_thread(scenario, "routed_call", direct_folder),
            address=caller,
            extra=["-d", "8000"],
        )
    )
    deadline = time.monotonic() + 10
    while await draining.live_calls() != 1:  # another process's state: polled
        assert time.monotonic() < deadline, "the direct call never came up"
        await asyncio.sleep(0.1)
    await draining.drain()
    key = f"{draining.address}:{draining.sip_port}"
    assert proxy.destinations()[key].startswith("A")  # the proxy has not heard of the drain
    # The next call goes to the draining host, is refused with 503, and goes to the other.
    await calls(proxy, tmp_path / "refused", caller, 1, 1000)
    assert await busy.call_count() == 2 and await draining.call_count() == 1
    assert proxy.destinations()[key].startswith("I")  # marked inactive by the refusal
    await long_call
    assert (await direct).ok

"""deploy/haproxy.cfg with Debian's real haproxy in front of two `voice-agent serve` hosts: calls
reach both; a host reporting a low agent weight takes fewer new calls; a drained host leaves
rotation within seconds while its live call goes on to its end, then exits.

As root, each host and the balancer run in a network namespace of their own on a private
bridge (tests/support/netns.py), with the sample config's own ports; otherwise on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.support import netns
from tests.support.hosts import TOKEN, HAProxy, Host
from voice_agent.callers import TwilioClient

AUDIO = Path(__file__).parent / "fixtures" / "audio"
_sids = itertools.count(1)


def sid() -> str:
    return f"CA{next(_sids):032d}"


@pytest_asyncio.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[HAProxy, Host, Host]]:
    with contextlib.ExitStack() as stack:
        spaces: list[netns.Namespace | None] = [None, None, None]
        if netns.available() is None:
            network = stack.enter_context(netns.Network())
            spaces = [network.add(label) for label in ("host1", "host2", "lb")]
        # As deploy/haproxy.cfg asks: the balancer is a trusted proxy, so a refusal reaches it
        # as an HTTP 503 it can retry on the other host.
        balancer_address = spaces[2].address if spaces[2] is not None else "127.0.0.1"
        trusted = {"trusted_proxies": [balancer_address]}
        # host2's limit is low so that a few calls held on it lower its weight a lot.
        one = Host(tmp_path / "host1", "host1", namespace=spaces[0], server=trusted)
        two = Host(
            tmp_path / "host2", "host2", namespace=spaces[1], server={**trusted, "max_calls": 10}
        )
        balancer: HAProxy | None = None
        try:
            await asyncio.gather(one.wait_ready(), two.wait_ready())
            balancer = HAProxy(tmp_path, [one, two], namespace=spaces[2])
            await balancer.wait_servers(
                "both hosts up at full weight",
                lambda s: all(r["status"] == "UP" and r["weight"] == "100" for r in s.values()),
            )
            yield balancer, one, two
        finally:
            # Before the network goes: nothing may still run inside its namespaces.
            if balancer is not None:
                balancer.stop()
            await asyncio.gather(asyncio.to_thread(one.stop), asyncio.to_thread(two.stop))


def caller(url: str) -> TwilioClient:
    return TwilioClient(f"{url}?token={TOKEN}", call_sid=sid(), timeout=30)


async def short_calls(url: str, count: int) -> list[str]:
    """`count` callers at once, each hanging up once the greeting has begun; their call ids."""

    async def one() -> str:
        call = caller(url)
        await call.connect()
        await call.wait_audio(100)
        await call.stop()
        return call.call_sid

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def where(call_ids: list[str], hosts: list[Host]) -> dict[str, int]:
    """How many of the calls each host has a record of."""
    counts = {host.name: 0 for host in hosts}
    for call_id in call_ids:
        found = [host.name for host in hosts if await host.call(call_id) is not None]
        assert len(found) == 1, f"call {call_id} recorded on {found}"
        counts[found[0]] += 1
    return counts


async def test_calls_spread_follow_the_agent_weight_and_leave_a_draining_host(
    cluster: tuple[HAProxy, Host, Host],
) -> None:
    balancer, one, two = cluster
    url = balancer.url("/twilio")
    hosts = [one, two]

    # Calls through the balancer reach both hosts.
    spread = await where(await short_calls(url, 4), hosts)
    assert spread["host1"] >= 1 and spread["host2"] >= 1, spread

    # Eight calls held on host2 directly (its max_calls is 10): its agent port reports 20%,
    # and of eight new calls through the balancer it gets at most two (equal weights would
    # give it four).
    held = [caller(f"ws://{two.address}:{two.port}/twilio") for _ in range(8)]
    await asyncio.gather(*(call.connect() for call in held))
    await asyncio.gather(*(call.wait_audio(100) for call in held))
    await balancer.wait_servers("host2's weight fall to 20", lambda s: s["host2"]["weight"] == "20")
    weighted = await where(await short_calls(url, 8), hosts)
    assert weighted["host2"] <= 2 and weighted["host1"] >= 6, weighted
    await asyncio.gather(*(call.stop() for call in held))
    await balancer.wait_servers(
        "both hosts back at full weight",
        lambda s: all(r["weight"] == "100" for r in s.values()),
    )

    # Drain the host a live call reached: it leaves rotation within seconds, every new call
    # goes to the other, and the live call goes on to its end.
    live = caller(url)
    await live.connect()
    await live.wait_silence_after_audio(300)  # the greeting
    (draining,) = [host for host in hosts if await host.call(live.call_sid) is not None]
    (other,) = [host for host in hosts if host is not draining]
    status = await draining.drain()
    assert status["status"] == "draining" and status["live_calls"] == 1
    await balancer.wait_servers(
        f"{draining.name} out of rotation",
        lambda s: (
            s[draining.name]["status"] in ("DRAIN", "NOLB", "DOWN", "MAINT")
            or s[draining.name]["weight"] == "0"
        ),
        timeout_s=10,
    )
    after = await where(await short_calls(url, 4), hosts)
    assert after == {other.name: 4, draining.name: 0}, after
    heard = live.received_ms
    await live.send_audio((AUDIO / "joe_book1.ulaw").read_bytes())
    await live.wait_audio(heard + 1000)  # the agent answers the booking
    await live.stop()
    # Its last call over, the drained host exits on its own; the call's record says the
    # caller hung up (it was not cut by the drain).
    assert await asyncio.to_thread(draining.process.wait, 20) == 0
    assert draining.stored_outcome(live.call_sid) == ("caller_hung_up", "caller hung up")


async def test_a_call_sent_to_a_host_that_refuses_it_is_tried_on_the_other(
    cluster: tuple[HAProxy, Host, Host],
) -> None:
    balancer, one, two = cluster
    # The checks of host1 switched off: the balancer keeps picking it, as it does in the
    # seconds before a check sees a drain start.
    for command in ("disable health calls/host1", "disable agent calls/host1"):
        assert await asyncio.to_thread(balancer.command, command) == ""
    # A call straight to host1 (the balancer does not count it) keeps it up while it drains.
    held = caller(f"ws://{one.address}:{one.port}/twilio")
    await held.connect()
    await held.wait_audio(100)
    await one.drain()
    # leastconn picks host1 (no calls) for every call after the first: each is refused there
    # with a 503 and sent on to host2, and none fails.
    calls = [caller(balancer.url("/twilio")) for _ in range(4)]
    for call in calls:  # one at a time, each held: host2 always has the more calls
        await call.connect()
        await call.wait_audio(100)
    assert await where([call.call_sid for call in calls], [one, two]) == {"host1": 0, "host2": 4}
    assert int(balancer.servers()["host1"]["wredis"]) >= 3
    await asyncio.gather(*(call.stop() for call in [*calls, held]))

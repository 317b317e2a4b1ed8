"""The whole cluster of docs/operations.md "Several hosts" on network namespaces (the pieces and
the run: tests/support/cluster.py): PostgreSQL in a namespace of its own; two hosts, each a
`serve --workers 2` for WebSocket calls and, beside it, a `serve --sip` for SIP calls (SIP takes
one worker: the CLI refuses `--sip` with `--workers`, since a call's datagrams would be split
between processes), all on the one store; HAProxy and Kamailio in a balancer namespace; the
callers, Twilio-protocol clients and sipp, in the test's own namespace at the bridge's address.

One run: calls through both balancers reach both hosts; host1 drains while new callers keep
coming (none fails: each lands on host2, each of host1's live calls ends as its caller hangs
up); one of host2's workers is killed under calls (its calls end on the callers' side and are
marked interrupted, the other worker's go on, new calls are taken); every call is listed by
`GET /calls` on either host. Needs root (namespaces); haproxy, kamailio, sipp and PostgreSQL
are installed by scripts/test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import netns
from tests.support.cluster import INTERRUPTED, Cluster, Load, run
from tests.support.sipp import SIPP
from voice_agent.store.base import INTERRUPTED_REASON

pytestmark = pytest.mark.skipif(netns.available() is not None, reason=netns.available() or "")

HUNG_UP = ("caller_hung_up", "caller hung up")


async def test_a_drain_fails_no_call_and_a_killed_workers_calls_are_marked_interrupted(
    tmp_path: Path,
) -> None:
    assert SIPP is not None, "sipp is missing: scripts/test installs sip-tester"
    async with Cluster(tmp_path) as cluster:
        report = await run(cluster, Load())

    # Zero failed calls on the callers' side, but the killed worker's.
    assert report.failures == []

    # Spread: six calls placed one by one, each held: leastconn gives each new one to the
    # host with fewer, so they alternate. Four SIP calls at once: algorithm 10 sends each to
    # the host with the fewest calls, two and two.
    assert report.spread == {"host1": 3, "host2": 3}, report.spread
    assert report.spread_sip == {"host1-sip": 2, "host2-sip": 2}, report.spread_sip

    # The drain: every new call reached host2; host1's servers exited 0 after their calls.
    assert report.live_on_drained == 5
    assert set(report.during_drain) == {"host2", "host2-sip"}, report.during_drain
    assert report.during_drain == {"host2": 6, "host2-sip": 3}
    assert report.drain_exit_codes == [0, 0]

    # The kill: exactly the killed worker's calls ended on the callers' side, each marked
    # interrupted; the other worker had calls, which went on; new calls went to host2.
    assert report.victims and report.survivors, (report.victims, report.survivors)
    assert report.dropped == report.victims
    assert report.after_kill == {"host2": 3}, report.after_kill
    for sid in report.victims:
        assert report.outcomes[sid] == (INTERRUPTED, INTERRUPTED_REASON), sid

    # Every other call ended as its caller hung up, and every call is listed on either host.
    assert report.sip_calls_unrecorded == []
    assert len(report.placed) == 6 + 4 + 6 + 3 + report.extra_calls + 3
    for call_id in report.placed - report.victims:
        assert report.outcomes.get(call_id) == HUNG_UP, (call_id, report.outcomes.get(call_id))
    assert set(report.outcomes) == report.placed
    assert report.listed == {"host1": report.placed, "host2": report.placed}

#!/usr/bin/env python3
"""The cluster run of tests/test_cluster.py with more callers, and its figures: calls per host
at each step, failed calls, how long the drain took, how soon the killed worker's calls were
marked interrupted. Needs root (network namespaces), haproxy, kamailio, sipp and PostgreSQL
(scripts/test installs them).

    .venv/bin/python scripts/cluster_test.py                   # 20 + 8 calls, then 30 + 10 ...
    .venv/bin/python scripts/cluster_test.py --scale 0.5 --keep

Exit status 1 if a call failed on the callers' side (the killed worker's aside), a killed
call was not marked interrupted, or a call is missing from a host's GET /calls.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import netns  # noqa: E402
from tests.support.cluster import INTERRUPTED, Cluster, Load, Report, run  # noqa: E402

BASE = Load(
    spread_calls=20,
    spread_sip_calls=8,
    drain_calls=30,
    drain_sip_calls=10,
    after_kill_calls=10,
)


def scaled(scale: float) -> Load:
    def n(value: int) -> int:
        return max(2, round(value * scale))

    return Load(
        spread_calls=n(BASE.spread_calls),
        spread_sip_calls=n(BASE.spread_sip_calls),
        drain_calls=n(BASE.drain_calls),
        drain_sip_calls=n(BASE.drain_sip_calls),
        after_kill_calls=n(BASE.after_kill_calls),
    )


def spread(counts: Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counts.items())) or "none"


def problems(report: Report) -> list[str]:
    found = list(report.failures)
    if report.dropped != report.victims:
        found.append(
            f"calls ended by the kill {sorted(report.dropped)} != {sorted(report.victims)}"
        )
    found += [
        f"killed call {sid} ended {report.outcomes.get(sid)}"
        for sid in sorted(report.victims)
        if (report.outcomes.get(sid) or (None,))[0] != INTERRUPTED
    ]
    found += [
        f"call {call_id} ended {report.outcomes.get(call_id)}"
        for call_id in sorted(report.placed - report.victims)
        if (report.outcomes.get(call_id) or (None,))[0] != "caller_hung_up"
    ]
    found += [f"SIP call {call_id} has no record" for call_id in report.sip_calls_unrecorded]
    for host, listed in report.listed.items():
        if missing := report.placed - listed:
            found.append(f"{host}'s GET /calls misses {len(missing)} calls")
    if any(name.startswith("host1") for name in report.during_drain):
        found.append(f"new calls reached the draining host: {spread(report.during_drain)}")
    return found


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="callers per step x this")
    parser.add_argument("--keep", action="store_true", help="keep the logs' folder")
    args = parser.parse_args()
    if (why := netns.available()) is not None:
        print(f"cluster_test: {why}", file=sys.stderr)
        return 2
    load = scaled(args.scale)
    folder = Path(tempfile.mkdtemp(prefix="voice-agent-cluster-"))
    started = time.monotonic()
    async with Cluster(folder) as cluster:
        built_s = time.monotonic() - started
        report = await run(cluster, load)
    total_s = time.monotonic() - started
    on_survivor = sum(pid == report.survivor_pid for pid in report.after_kill_pids)
    print(f"cluster built in {built_s:.1f} s, run in {total_s - built_s:.1f} s; load: {load}")
    print(f"1. spread, Twilio one by one (leastconn): {spread(report.spread)}")
    print(f"   spread, SIP at once (algorithm 10):     {spread(report.spread_sip)}")
    print(
        f"2. drain of host1 with {report.live_on_drained} live calls: new calls "
        f"{spread(report.during_drain)}; HAProxy sent {report.retried_elsewhere} on from "
        f"host1's 503; host1 exited {report.drain_exit_codes} after {report.drain_s:.1f} s"
    )
    print(
        f"3. kill -9 of host2's worker {report.victim_pid} with {len(report.victims)} calls "
        f"(the other had {len(report.survivors)}; {report.extra_calls} extra placed): "
        f"{len(report.dropped)} ended on the callers' side, all marked interrupted after "
        f"{report.interrupted_after_s:.1f} s; new calls {spread(report.after_kill)} "
        f"({on_survivor} on the other worker, the rest on the restarted one)"
    )
    listed = ", ".join(f"{host} {len(ids)}" for host, ids in sorted(report.listed.items()))
    print(f"4. {len(report.placed)} calls placed; GET /calls lists {listed}")
    found = problems(report)
    print(f"failed: {len(found)}" + "".join(f"\n  {line}" for line in found))
    if args.keep:
        print(f"logs: {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

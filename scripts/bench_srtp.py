#!/usr/bin/env python3
"""SRTP's CPU per SIP call: libsrtp (through pylibsrtp) protecting one 20 ms G.711 packet out
and checking one in, as voice_agent.sip.media does 50 times a second each way.

    .venv/bin/python scripts/bench_srtp.py [--packets 50000] [--repeats 5]

Prints microseconds of CPU per packet each way and per call-second (both ways), the median of
`--repeats` runs, for each suite; the figures go into docs/performance.md.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import struct
import time

from voice_agent.sip.sdes import SUITES, SrtpKeys, SrtpTransform, choose


def _rtp(sequence: int) -> bytes:
    return struct.pack("!BBHII", 0x80, 0, sequence & 0xFFFF, sequence * 160, 0xFEED) + bytes(160)


def measure(suite: str, packets: int) -> tuple[float, float]:
    _, key_length, salt_length = SUITES[suite]
    offered = base64.b64encode(os.urandom(key_length + salt_length)).decode()
    keys = choose([f"1 {suite} inline:{offered}"])
    assert keys is not None
    ours = SrtpTransform(keys)
    theirs = SrtpTransform(SrtpKeys(suite, 1, remote=keys.local, local=keys.remote))
    plain = [_rtp(n) for n in range(1, packets + 1)]
    started = time.process_time_ns()
    sealed = [ours.protect(packet) for packet in plain]
    protect_us = (time.process_time_ns() - started) / packets / 1000
    started = time.process_time_ns()
    for packet in sealed:
        theirs.unprotect(packet)
    unprotect_us = (time.process_time_ns() - started) / packets / 1000
    return protect_us, unprotect_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packets", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for suite in SUITES:
        runs = [measure(suite, args.packets) for _ in range(args.repeats)]
        protect = statistics.median(r[0] for r in runs)
        unprotect = statistics.median(r[1] for r in runs)
        per_second = 50 * (protect + unprotect)
        print(
            f"{suite:26s} protect {protect:5.2f} us  unprotect {unprotect:5.2f} us  "
            f"per call-second {per_second:6.1f} us ({per_second / 10_000:.3f}% of a core)"
        )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A Realtime-protocol stand-in for a speech-to-speech model, so a load test measures the server.

    .venv/bin/python scripts/standin_realtime.py --delay-ms 0 --speed 4

`scripts/loadtest.py --mode realtime` starts it by itself; run it alone to point a server of
your own at it (`llm: {provider: openai_realtime, base_url: http://127.0.0.1:PORT/v1}`, any
api_key). Once listening it prints one line, `standin listening on http://127.0.0.1:PORT/v1`,
as scripts/standin_engines.py does.

It is the tests' stand-in, tests/support/realtime_server.py (`RealtimeStandIn`), run with
`record=False` (no copy of the events received: a load run's memory) and no scripted replies:
every `response.create` of every session gets `--reply`, after `--delay-ms`, its audio (eSpeak
NG, synthesised once per text and format, here before the port is printed) sent in 100 ms
pieces at `--speed` times real time. Every few seconds it writes to stderr how many sessions are
open and any error events it sent, which name what the server asked that the protocol refuses.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.realtime_server import ModelReply, RealtimeStandIn  # noqa: E402

# About as long as the default flow's lines, and the hosted stand-in's LLM reply.
DEFAULT_REPLY = "Sure, I can help with that. What day and time would you like?"
# The output formats a server asks for: G.711 on Twilio-protocol calls, 24 kHz PCM16 on /ws.
FORMATS = ("audio/pcmu", "audio/pcm")


async def report(model: RealtimeStandIn, interval_s: float) -> None:
    """Sessions and errors to stderr now and then: the run's log says whether the server kept
    to the protocol under load, without recording every event."""
    errors_seen = 0
    while True:
        await asyncio.sleep(interval_s)
        new = model.errors[errors_seen:]
        errors_seen = len(model.errors)
        print(f"open sessions {model.open_sessions}, errors {errors_seen}", file=sys.stderr)
        for error in new[:20]:
            print(f"  error sent: {error}", file=sys.stderr)
        sys.stderr.flush()


async def serve(args: argparse.Namespace) -> None:
    model = RealtimeStandIn(record=False, realtime_factor=args.speed)
    model.default_reply = ModelReply(text=args.reply, delay_s=args.delay_ms / 1000)
    await model.start()
    # Synthesised before the first call, so no call waits for eSpeak NG and concurrent first
    # replies do not each synthesise it. RealtimeStandIn has no public way to do this; its
    # per-text cache is filled by `_speak`, which every reply calls.
    for fmt in FORMATS:
        await model._speak(args.reply, fmt)
    # What is loaded now stays: out of the collector's way, as the server does.
    gc.freeze()
    print(f"standin listening on {model.base_url}", flush=True)
    reporter = asyncio.ensure_future(report(model, args.report_interval))
    try:
        await asyncio.Event().wait()
    finally:
        reporter.cancel()
        await model.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--reply", default=DEFAULT_REPLY, help="what every response says")
    parser.add_argument(
        "--delay-ms", type=float, default=0.0, help="response.created -> the reply's first item"
    )
    parser.add_argument("--speed", type=float, default=4.0, help="audio sent, times real time")
    parser.add_argument("--report-interval", type=float, default=5.0, help="seconds (stderr)")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
    else:
        uvloop.run(serve(args))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass

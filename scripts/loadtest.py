#!/usr/bin/env python3
"""Load test: N concurrent Twilio-like callers hold real conversations with the voice server.

    .venv/bin/python scripts/loadtest.py --calls 20,50,100 --mode hosted   # starts what it needs
    .venv/bin/python scripts/loadtest.py --calls 20,50,100 --mode realtime # speech-to-speech
    .venv/bin/python scripts/loadtest.py --calls 5 --mode embedded
    .venv/bin/python scripts/loadtest.py --url ws://127.0.0.1:8765 --calls 10   # a running server

Each caller is `voice_agent.callers.TwilioClient` (`NativeClient` with `--transport ws`): 20 ms
frames in real time, the agent's audio played out on a clock, marks echoed once played, the
queue flushed on `clear`. It plays the booking, change and cancel conversations of the audio
fixtures (voice joe), a new call after each, until `--duration` is over; with think times and
pauses (some with a cough), and in a share of calls a barge-in, a backchannel while the agent
speaks, or a silence long enough for the agent's no-input prompt. Calls start spread over
`--ramp` and each line of callers runs `--duration` from its start, so hang-ups at the end are
spread as widely (a level takes `--duration` + `--ramp`); with a list (`--calls 10,50,100`)
the levels run one after the other. One unmeasured call warms the server up first
(`--no-warm-up` skips it).

Measured per level:
- per turn, caller speech end -> first agent audio received (client side), and the server's
  own breakdown from GET /calls/{id} (`turns`): end of turn, STT, agent, TTS, send; in hosted
  and realtime modes the server-added latency both ways: caller side, and at the server (its
  end of turn -> first audio sent, which leaves this script's own lateness out);
- per barge-in, caller speech start -> `clear` received (min_interruption_ms is part of it),
  and how much agent audio the caller still heard over its own speech after the clear;
- late frames: agent audio that arrived more than 40 ms after the audio before it, in the same
  utterance, had finished playing (the caller heard a gap);
- failed, dropped and refused calls, unanswered turns;
- every second from /proc: CPU (100% = one core), time spent waiting for a CPU, RSS and open
  files of the server's process tree, the stand-in and this script, and the machine's CPU; the
  server's event-loop lag (/healthz), this script's own and how late it sent its frames. The
  load generator shares the machine: when it falls behind, the level's numbers say so.

`--mode hosted` (the script starts the server): STT and TTS go through their `openai` providers
to scripts/standin_engines.py, started here too, which answers with the fixtures' transcripts
and speech-like audio after fixed delays: the latency beyond those delays is the server's own.
The default agent is a flow and needs no LLM; with `--agent concierge` the LLM goes to the
stand-in too.

`--mode realtime`: the same engines stand-in does the STT (the server's own turn-taking needs
it) and the first message's TTS, and the concierge (or `--agent`) is made a speech-to-speech
agent (`llm.provider: openai_realtime`) talking to scripts/standin_realtime.py, also started
here: the tests' Realtime stand-in, which answers every turn with `--model-reply` after
`--model-delay-ms` (default 0), its audio at `--model-speed` times real time. The latency beyond
the STT stand-in's delay and the model's is the server's own.

`--mode embedded`: the config's own engines (pocketsphinx, eSpeak NG). With `--url` the
running server's config decides; /proc figures then need it on this machine (its pid comes from
/healthz, or `--server-pid`).

Results: a JSON file and a PNG plot (latency percentiles and CPU against concurrent calls;
needs matplotlib) in loadtest-results/, or where `--out` says.

This file is the command line only; the load generator itself is the package scripts/loadgen/
(callers, levels, the run, /proc sampling, statistics, the report).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from loadgen.paths import DEFAULT_CONFIG
from loadgen.run import main_async


def _cpus(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--calls",
        default="10",
        type=lambda text: [int(n) for n in text.split(",") if n.strip()],
        help="concurrent calls; a comma-separated list runs each level in turn",
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per level")
    parser.add_argument(
        "--ramp", type=float, default=10.0, help="seconds to start all calls (and to end them)"
    )
    parser.add_argument("--transport", choices=("twilio", "ws"), default="twilio")
    parser.add_argument("--url", help="ws://HOST:PORT of a running server (default: start one)")
    parser.add_argument("--token", help="API token of a server that requires one")
    parser.add_argument("--server-pid", type=int, help="pid to sample with --url")
    parser.add_argument("--mode", choices=("embedded", "hosted", "realtime"), default="embedded")
    parser.add_argument(
        "--workers", type=int, default=1, help="server worker processes (voice-agent serve)"
    )
    parser.add_argument(
        "--max-calls",
        type=int,
        help="server.max_calls of the server it starts: calls beyond it are refused (1013)",
    )
    parser.add_argument(
        "--server-cpus",
        type=_cpus,
        help="Linux: CPUs (e.g. 0 or 0-1) for the server it starts; the load generator and the "
        "engine stand-in then keep to the others, so neither takes the server's CPU time",
    )
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="config the server runs")
    parser.add_argument("--agent", help="agent to call (default: the server's default)")
    parser.add_argument("--out", help="result JSON path (the PNG goes next to it)")
    parser.add_argument("--reply-timeout", type=float, default=6.0, help="seconds per reply")
    parser.add_argument("--barge-in-share", type=float, default=0.2)
    parser.add_argument("--backchannel-share", type=float, default=0.2)
    parser.add_argument(
        "--long-silence-share", type=float, default=0.1, help="calls that hear a no-input prompt"
    )
    parser.add_argument("--pause-share", type=float, default=0.2, help="lines after a pause")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stt-delay-ms", type=float, default=150.0, help="hosted mode")
    parser.add_argument("--tts-delay-ms", type=float, default=150.0, help="hosted mode")
    parser.add_argument(
        "--tts-speed", type=float, default=4.0, help="hosted TTS, times real time (0: unpaced)"
    )
    parser.add_argument("--llm-delay-ms", type=float, default=300.0, help="hosted mode")
    parser.add_argument(
        "--model-delay-ms",
        type=float,
        default=0.0,
        help="realtime mode: the model's response.created -> its reply",
    )
    parser.add_argument(
        "--model-speed", type=float, default=4.0, help="realtime mode: its audio, times real time"
    )
    parser.add_argument(
        "--model-reply",
        help="realtime mode: what the model says to every turn (default: the stand-in's, a "
        "sentence as long as the flow's lines)",
    )
    parser.add_argument("--sample-interval", type=float, default=1.0)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between levels")
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="skip the unmeasured first call that warms the server up",
    )
    parser.add_argument(
        "--log-interval", type=float, default=5.0, help="progress lines when not a terminal"
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 if any call failed or was dropped"
    )
    args = parser.parse_args(argv)
    if not args.calls or min(args.calls) < 1:
        parser.error("--calls needs one or more positive numbers")
    return args


def main() -> int:
    args = parse_args()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main_async(args))
    return uvloop.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())

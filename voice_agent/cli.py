"""The `voice-agent` command: chat (text simulator), check (validate a config) and secrets."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from voice_agent import __version__
from voice_agent.agents.registry import AgentRegistry
from voice_agent.errors import VoiceAgentError
from voice_agent.observability import add_log_secrets, configure_logging
from voice_agent.runtime.secrets import SecretStore
from voice_agent.secrets_cli import add_secrets_parser
from voice_agent.simulator import chat

DEFAULT_CONFIG = "config/agents.yaml"
WORKERS_ENV = "VOICE_AGENT_WORKERS"  # tells each worker how many share the machine


def _variables(pairs: Sequence[str]) -> dict[str, str]:
    variables: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise VoiceAgentError(f"--var takes key=value, not {pair!r}")
        variables[key] = value
    return variables


def _registry(args: argparse.Namespace) -> AgentRegistry:
    secrets = SecretStore.in_data_dir(Path(args.data_dir) if args.data_dir else None).load()
    add_log_secrets(secrets)  # no log line can print one, whatever code path logs it
    return AgentRegistry.from_file(args.config, secrets)


async def _chat(args: argparse.Namespace) -> int:
    registry = _registry(args)
    try:
        script = None
        if args.script:
            text = await asyncio.to_thread(Path(args.script).read_text, encoding="utf-8")
            script = text.splitlines()
        await chat(registry, agent=args.agent, variables=_variables(args.var), script=script)
    finally:
        await registry.aclose()
    return 0


async def _call(args: argparse.Namespace) -> int:
    from voice_agent.client import main_call

    return await main_call(
        args.url, Path(args.wav), Path(args.out) if args.out else None, args.agent
    )


def _serve_workers(args: argparse.Namespace) -> int:
    """`--workers N`: N server processes share the port (SO_REUSEPORT), kept running."""
    from voice_agent.server.workers import supervise

    if args.port == 0:
        raise VoiceAgentError("--workers needs a fixed --port: the workers must share it")
    from voice_agent.config import load_config

    # SO_REUSEPORT would hand one call's datagrams to different workers; without it the
    # second worker cannot bind the port at all and the supervisor restarts it forever.
    where = "--sip" if args.sip else None
    if where is None and load_config(args.config).config.sip.listen:
        where = f"sip.listen in {args.config}"
    if where is not None:
        raise VoiceAgentError(
            f"{where}: SIP takes one worker, several would split a call's SIP messages between "
            "them; run one SIP server per host and spread calls with a SIP proxy "
            "(docs/telephony.md)"
        )
    command = [sys.executable, "-m", "voice_agent.cli", "serve", "--config", args.config]
    command += ["--host", args.host, "--port", str(args.port), "--reuse-port"]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    return supervise(command, args.workers, {**os.environ, WORKERS_ENV: str(args.workers)})


async def _serve(args: argparse.Namespace) -> int:
    from voice_agent.server.app import VoiceServer
    from voice_agent.server.binding import check_bind, startup_notices
    from voice_agent.server.workers import mark_ready

    logging.getLogger("websockets.server").setLevel(logging.WARNING)  # one line per HTTP request
    # httpx (under the openai SDK) logs every engine request at INFO: one line per sentence
    # spoken. Failures still reach the log, as the call's audited errors.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    registry = _registry(args)
    server = VoiceServer(
        registry,
        host=args.host,
        port=args.port,
        reuse_port=args.reuse_port,
        worker_id=args.worker_id,
        sip_listen=args.sip.split(",") if args.sip else None,
    )
    settings = registry.loaded.config.server
    try:
        problem = check_bind(
            args.host, server.access.has_tokens, settings.allow_public_without_token
        )
        if problem:
            raise VoiceAgentError(problem)
        for line in startup_notices(
            args.host,
            has_tokens=server.access.has_tokens,
            allow_public=settings.allow_public_without_token,
            twilio_configured=server.access.twilio_configured,
            public_url=server.access.public_url,
        ):
            print(line, file=sys.stderr, flush=True)
        await server.start()
        mark_ready()
        # Everything loaded so far (modules, config, models, engines) lives as long as the
        # process: out of the collector's way, a full collection no longer walks it while
        # calls wait (a full collection paused the loop for ~55 ms at 100 calls before).
        gc.freeze()
        agent = registry.default_agent
        ws = f"ws://{server.host}:{server.port}"
        token_hint = "?token=YOUR-TOKEN" if server.access.has_tokens else ""
        worker = f" (worker {args.worker_id})" if args.reuse_port else ""
        sip = "off (--sip HOST:PORT)"
        if server.sip is not None:
            sip = f"sip:{server.sip.public}:{server.sip.port}"
        print(
            f"voice_agent {__version__} serving agent {agent!r} on {server.url}{worker}\n"
            f"  call it in a browser: {server.url}/{token_hint}\n"
            f'  Twilio Media Streams: <Connect><Stream url="{ws}/twilio"> (via a tunnel)\n'
            f"  native WebSocket:     {ws}/ws\n"
            f"  SIP over UDP:         {sip}\n"
            f"  call records:         {server.url}/calls/view (API: {server.url}/calls)\n"
            f"  talk to it:           .venv/bin/voice-agent call --url {ws}/ws "
            "--wav tests/fixtures/audio/joe_book1.wav\n"
            "  or type to it:        scripts/run chat",
            flush=True,
        )
        await server.serve_until_signal()
    finally:
        await registry.aclose()
    return 0


async def _check(args: argparse.Namespace) -> int:
    registry = _registry(args)
    try:
        for name, agent in registry.agents.items():
            tools = ", ".join(t["function"]["name"] for t in agent.llm_tools()) or "-"
            print(f"{name}: brain={agent.config.brain} tools: {tools}")
    finally:
        await registry.aclose()
    print(f"{args.config}: OK")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voice-agent", description=__doc__)
    parser.add_argument("--version", action="version", version=f"voice_agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    def with_config(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--config", default=DEFAULT_CONFIG, help="agents YAML file")
        sub.add_argument(
            "--data-dir", help="where secrets live (default: $VOICE_AGENT_DATA_DIR or ./data)"
        )

    chat_parser = commands.add_parser("chat", help="talk to an agent in the terminal")
    with_config(chat_parser)
    chat_parser.add_argument("--agent", help="agent name (default: the config's default_agent)")
    chat_parser.add_argument(
        "--var", action="append", default=[], metavar="KEY=VALUE", help="initial state value"
    )
    chat_parser.add_argument("--script", help="play user lines from this file and exit")
    chat_parser.set_defaults(run=_chat)

    call_parser = commands.add_parser("call", help="play a WAV file to a running server")
    call_parser.add_argument("--wav", required=True, help="the caller's audio (mono PCM16 WAV)")
    call_parser.add_argument("--out", help="write the agent's audio, as heard, to this WAV")
    call_parser.add_argument("--url", default="ws://127.0.0.1:8765/ws")
    call_parser.add_argument("--agent", help="agent name (default: the server's default)")
    call_parser.set_defaults(run=_call)

    serve_parser = commands.add_parser("serve", help="run the voice server")
    with_config(serve_parser)
    serve_parser.add_argument("--host", default="127.0.0.1")
    serve_parser.add_argument("--port", type=int, default=8765)
    serve_parser.add_argument(
        "--workers", type=int, default=1, help="server processes sharing the port (Linux)"
    )
    serve_parser.add_argument(
        "--sip",
        metavar="[tcp:|tls:]HOST:PORT,...",
        help="also take SIP calls here: UDP, or the transports named, comma-separated (sip: in"
        " the config; tls: needs sip.tls)",
    )
    serve_parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    serve_parser.add_argument("--worker-id", type=int, default=0, help=argparse.SUPPRESS)
    serve_parser.set_defaults(run=_serve)

    check_parser = commands.add_parser("check", help="validate a config and list its agents")
    with_config(check_parser)
    check_parser.set_defaults(run=_check)

    add_secrets_parser(commands)
    return parser


def _run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # not on every platform; the stdlib loop works, a little slower
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(level=logging.INFO)
    try:
        if getattr(args, "workers", 1) > 1:
            return _serve_workers(args)
        if hasattr(args, "run"):
            return int(_run(args.run(args)))
        return int(args.func(args))
    except VoiceAgentError as exc:
        # One line, so scripts and log collectors see one error.
        print(f"voice-agent: error: {' | '.join(str(exc).splitlines())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The `voice-agent` command: chat (text simulator), check (validate a config) and secrets."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from voice_agent import __version__
from voice_agent.errors import VoiceAgentError
from voice_agent.runtime.registry import AgentRegistry
from voice_agent.runtime.secrets import SecretStore
from voice_agent.secrets_cli import add_secrets_parser
from voice_agent.simulator import chat

DEFAULT_CONFIG = "config/agents.yaml"


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

    check_parser = commands.add_parser("check", help="validate a config and list its agents")
    with_config(check_parser)
    check_parser.set_defaults(run=_check)

    add_secrets_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if hasattr(args, "run"):
            return int(asyncio.run(args.run(args)))
        return int(args.func(args))
    except VoiceAgentError as exc:
        # One line, so scripts and log collectors see one error.
        print(f"voice-agent: error: {' | '.join(str(exc).splitlines())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

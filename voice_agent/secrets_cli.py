"""The `voice-agent secrets set|list|delete` commands; no command ever prints a secret value."""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path

from voice_agent.errors import SecretError
from voice_agent.runtime.secrets import SecretStore, validate_name


def add_secrets_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `secrets` with subcommands `set NAME`, `list`, `delete NAME` to `subparsers`."""
    parser = subparsers.add_parser(
        "secrets",
        help="set, list or delete the secrets user functions read",
        description=(
            "Manage the encrypted secret store read by user functions via secrets.get(NAME). "
            "Values are never printed."
        ),
    )
    _add_data_dir(parser)
    commands = parser.add_subparsers(dest="secrets_command", metavar="COMMAND", required=True)

    set_parser = commands.add_parser(
        "set",
        help="store a secret; the value is read from stdin",
        description=(
            "Store a secret. The value is read from stdin: typed without echo on a terminal, "
            "else the whole input with one trailing newline removed."
        ),
    )
    set_parser.add_argument("name", metavar="NAME")
    _add_data_dir(set_parser)
    set_parser.set_defaults(func=_cmd_set)

    list_parser = commands.add_parser("list", help="list secret names, one per line")
    _add_data_dir(list_parser)
    list_parser.set_defaults(func=_cmd_list)

    delete_parser = commands.add_parser("delete", help="delete a secret")
    delete_parser.add_argument("name", metavar="NAME")
    _add_data_dir(delete_parser)
    delete_parser.set_defaults(func=_cmd_delete)


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    # Accepted before or after the subcommand; SUPPRESS keeps the subcommand's absent
    # option from overwriting one given before it.
    parser.add_argument(
        "--data-dir",
        type=Path,
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="folder holding secrets.enc (default: $VOICE_AGENT_DATA_DIR, else ./data)",
    )


def _store(args: argparse.Namespace) -> SecretStore:
    return SecretStore.in_data_dir(getattr(args, "data_dir", None))


def _fail(message: str) -> int:
    print(f"voice-agent secrets: error: {message}", file=sys.stderr)
    return 2


def _read_value(name: str) -> str:
    if sys.stdin.isatty():
        return getpass.getpass(f"value for {name}: ")
    value = sys.stdin.read()
    if value.endswith("\r\n"):
        return value[:-2]
    if value.endswith("\n"):
        return value[:-1]
    return value


def _cmd_set(args: argparse.Namespace) -> int:
    name: str = args.name
    try:
        validate_name(name)  # before prompting, so a typo does not cost typing the value
        try:
            value = _read_value(name)
        except (EOFError, KeyboardInterrupt):
            return _fail(f"no value read for secret {name!r}; nothing was stored")
        if value == "":
            return _fail(f"empty value for secret {name!r}; nothing was stored")
        _store(args).set(name, value)
    except SecretError as exc:
        return _fail(str(exc))
    print(f"secret {name} set")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    try:
        names = _store(args).names()
    except SecretError as exc:
        return _fail(str(exc))
    if not names:
        print("no secrets", file=sys.stderr)
    for name in names:
        print(name)
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    name: str = args.name
    try:
        deleted = _store(args).delete(name)
    except SecretError as exc:
        return _fail(str(exc))
    if not deleted:
        print(f"no secret named {name}; nothing deleted", file=sys.stderr)
        return 1
    print(f"secret {name} deleted")
    return 0

"""The house's direction of imports (docs/architecture.md): a lower part never imports a higher
one, lazily or for type checking only. Read from the source with `ast`, so the test names the
module and the line that breaks the rule."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "voice_agent"

# Each part, and the parts above it that it must not import.
PROCESS = {"voice_agent.server"}
GATEWAYS = {"voice_agent.gateways"} | PROCESS
ABOVE_A_CALL = {"voice_agent.pipeline", "voice_agent.callcontrol"} | GATEWAYS
FORBIDDEN: dict[str, set[str]] = {
    "voice_agent.gateways": PROCESS,
    "voice_agent.pipeline": GATEWAYS | {"voice_agent.callcontrol"},
    "voice_agent.callcontrol": GATEWAYS | {"voice_agent.pipeline"},
    # The sans-I/O protocol and call logic, the codecs, audio and the engines: below every
    # part that does I/O for a call.
    "voice_agent.core": ABOVE_A_CALL,
    "voice_agent.sip": ABOVE_A_CALL,
    "voice_agent.transports": ABOVE_A_CALL,
    "voice_agent.audio": ABOVE_A_CALL | {"voice_agent.core"},
    "voice_agent.engines": ABOVE_A_CALL,
    # An agent's runtime (session, tools, expressions) under the brains that drive it, and
    # both under the registry that compiles a config into agents with their brains.
    "voice_agent.runtime": ABOVE_A_CALL | {"voice_agent.brains", "voice_agent.agents"},
    "voice_agent.brains": ABOVE_A_CALL | {"voice_agent.agents"},
    "voice_agent.agents": ABOVE_A_CALL,
}
# The config's schema and what it stands on, read by every layer: it may check a model's or a
# file's path with the engines' and audio's own readers (lazily), and uses nothing of an agent
# or a call.
BASE = {
    "voice_agent.config",
    "voice_agent.errors",
    "voice_agent.public_url",
    "voice_agent.destination",
}
BASE_MAY_USE = BASE | {"voice_agent.engines", "voice_agent.audio"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """Every project module `path` imports, anywhere in it: (line, module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.startswith("voice_agent")]


def part_of(name: str, parts: set[str]) -> str | None:
    return next((p for p in parts if name == p or name.startswith(p + ".")), None)


def test_no_part_imports_one_above_it() -> None:
    broken = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mine = module_name(path)
        part = part_of(mine, set(FORBIDDEN))
        if part is None:
            continue
        for line, name in imports(path):
            above = part_of(name, FORBIDDEN[part])
            if above is not None:
                broken.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    assert broken == []


def test_an_upward_import_is_seen_wherever_it_is_written(tmp_path: Path) -> None:
    """Lazily inside a function, for type checking only, or as a package's member."""
    path = tmp_path / "gateway.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import voice_agent.server.auth\n"
        "def f():\n"
        "    from voice_agent.server.app import VoiceServer\n"
        "from voice_agent import server\n"
    )
    above = [(line, part_of(name, PROCESS)) for line, name in imports(path)]
    assert sorted(line for line, part in above if part == "voice_agent.server") == [3, 5, 5, 6]
    assert part_of("voice_agent.serverless", PROCESS) is None


def test_the_config_schema_imports_no_agent_or_call_part() -> None:
    """The config schema (voice_agent/config/) and what it stands on reach no runtime, brain,
    registry or call part, so no import of the config by one of them comes round to itself."""
    broken = []
    for name in sorted(BASE):
        module = PACKAGE.parent / name.replace(".", "/")
        # A module, or a package and every module in it (voice_agent/config/).
        paths = sorted(module.rglob("*.py")) if module.is_dir() else [module.with_suffix(".py")]
        for path in paths:
            for line, imported in imports(path):
                if part_of(imported, BASE_MAY_USE) is None:
                    where = path.relative_to(PACKAGE.parent)
                    broken.append(f"{where}:{line} imports {imported}")
    assert broken == []

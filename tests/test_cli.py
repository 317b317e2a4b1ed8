"""The `voice-agent` command: secrets set/list feed the agent's functions; --var seeds state."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from tests.support.configs import default_config_with
from voice_agent.cli import main

ROOT = Path(__file__).parent.parent
CONFIG = ROOT / "config" / "agents.yaml"
BOOK = ROOT / "tests" / "fixtures" / "scripts" / "book.txt"


def confirmation_code(capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["chat", "--config", str(CONFIG), "--script", str(BOOK)]) == 0
    out = capsys.readouterr().out
    found = re.search(r"confirmation code is ((?:[A-Z] ){5}[A-Z])", out)
    assert found, out
    return found.group(1)


def test_a_secret_set_on_the_command_line_reaches_the_function_only(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    demo_code = confirmation_code(capsys)
    monkeypatch.setattr("sys.stdin", io.StringIO("correct-horse-battery\n"))
    assert main(["secrets", "set", "booking_code_key"]) == 0
    assert main(["secrets", "list"]) == 0
    listed = capsys.readouterr()
    assert "booking_code_key" in listed.out and "correct-horse-battery" not in listed.out
    # The signing key changed, so the same booking gets another code; the value is never shown.
    secret_code = confirmation_code(capsys)
    assert secret_code != demo_code


def test_var_seeds_the_state_and_unknown_agent_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    script = tmp_path / "s.txt"
    script.write_text("/end\n")
    assert main(["chat", "--script", str(script), "--var", "restaurant=Chez Nous"]) == 0
    assert "Hello, thanks for calling Chez Nous!" in capsys.readouterr().out
    assert main(["chat", "--script", str(script), "--agent", "nobody"]) == 2
    assert "no agent named 'nobody'" in capsys.readouterr().err


def test_sip_with_several_workers_is_refused_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    command = ["serve", "--workers", "2", "--port", "8799", "--sip", "127.0.0.1:5060"]
    assert main(command) == 2
    assert "split a call's SIP messages" in capsys.readouterr().err


def test_sip_in_the_config_with_several_workers_is_refused_naming_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = default_config_with(tmp_path, sip={"listen": "127.0.0.1:5060"})
    command = ["serve", "--config", str(config), "--workers", "2", "--port", "8799"]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert f"sip.listen in {config}" in err and "split a call's SIP messages" in err

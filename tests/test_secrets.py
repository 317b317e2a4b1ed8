"""Tests for the secret store, the read-only Secrets view, redaction and `voice-agent secrets`."""

from __future__ import annotations

import argparse
import copy
import io
import json
import logging
import pickle
import stat
import sys
from collections import namedtuple
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from voice_agent.errors import SecretError
from voice_agent.runtime.secrets import Redactor, Secrets, SecretStore
from voice_agent.secrets_cli import add_secrets_parser

VALUE = "sk-live-Zq8v93kfP0x"
OTHER = "hunter2-topsecret"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VOICE_AGENT_SECRET_KEY", raising=False)
    monkeypatch.delenv("VOICE_AGENT_DATA_DIR", raising=False)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- store ------------------------------------------------------------------------------------


def test_round_trip(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "secrets.enc")
    store.set("api_key", VALUE)
    store.set("DB_PASSWORD", OTHER)
    again = SecretStore(tmp_path / "secrets.enc")
    assert again.names() == ["DB_PASSWORD", "api_key"]
    loaded = again.load()
    assert loaded.get("api_key") == VALUE
    assert loaded["DB_PASSWORD"] == OTHER


def test_overwrite_keeps_one_entry(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "secrets.enc")
    store.set("api_key", "first-value")
    store.set("api_key", VALUE)
    assert store.names() == ["api_key"]
    assert store.load()["api_key"] == VALUE


def test_missing_store_is_empty_and_creates_nothing(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "secrets.enc")
    assert store.names() == []
    assert len(store.load()) == 0
    assert not store.delete("nothing")
    assert list(tmp_path.iterdir()) == []


def test_file_on_disk_holds_no_value_in_clear(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "secrets.enc")
    store.set("api_key", VALUE)
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        assert VALUE.encode() not in data
        assert json.dumps(VALUE).encode() not in data
    # The names are encrypted too.
    assert b"api_key" not in (tmp_path / "secrets.enc").read_bytes()


def test_store_and_key_file_modes(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "secrets.enc")
    store.set("api_key", VALUE)
    assert _mode(tmp_path / "secrets.enc") == 0o600
    assert _mode(tmp_path / "secrets.key") == 0o600
    store.set("other", OTHER)  # a rewrite keeps the mode
    assert _mode(tmp_path / "secrets.enc") == 0o600
    # No temp file is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secrets.enc", "secrets.key"]


def test_explicit_key_writes_no_key_file(tmp_path: Path) -> None:
    key = Fernet.generate_key()
    SecretStore(tmp_path / "secrets.enc", key=key).set("api_key", VALUE)
    assert not (tmp_path / "secrets.key").exists()
    assert SecretStore(tmp_path / "secrets.enc", key=key).load()["api_key"] == VALUE


def test_key_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = Fernet.generate_key()
    monkeypatch.setenv("VOICE_AGENT_SECRET_KEY", key.decode())
    SecretStore(tmp_path / "secrets.enc").set("api_key", VALUE)
    assert not (tmp_path / "secrets.key").exists()
    assert SecretStore(tmp_path / "secrets.enc", key=key).load()["api_key"] == VALUE


def test_invalid_key_names_its_source_not_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOICE_AGENT_SECRET_KEY", "not-a-key-abc123")
    with pytest.raises(SecretError) as info:
        SecretStore(tmp_path / "secrets.enc").set("api_key", VALUE)
    assert "VOICE_AGENT_SECRET_KEY" in str(info.value)
    assert "not-a-key-abc123" not in str(info.value)


def test_wrong_key(tmp_path: Path) -> None:
    path = tmp_path / "secrets.enc"
    SecretStore(path, key=Fernet.generate_key()).set("api_key", VALUE)
    with pytest.raises(SecretError) as info:
        SecretStore(path, key=Fernet.generate_key()).load()
    message = str(info.value)
    assert str(path) in message
    assert "key" in message
    assert VALUE not in message
    assert info.value.__cause__ is None


def test_wrong_key_does_not_overwrite_store(tmp_path: Path) -> None:
    path = tmp_path / "secrets.enc"
    good = Fernet.generate_key()
    SecretStore(path, key=good).set("api_key", VALUE)
    with pytest.raises(SecretError):
        SecretStore(path, key=Fernet.generate_key()).set("other", OTHER)
    assert SecretStore(path, key=good).names() == ["api_key"]


def test_missing_key_file_for_existing_store(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "secrets.enc")
    store.set("api_key", VALUE)
    (tmp_path / "secrets.key").unlink()
    with pytest.raises(SecretError, match=r"secrets\.key"):
        SecretStore(tmp_path / "secrets.enc").names()
    assert not (tmp_path / "secrets.key").exists()  # no fresh, useless key was made


def test_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "secrets.enc"
    store = SecretStore(path)
    store.set("api_key", VALUE)
    path.write_bytes(path.read_bytes()[:-10] + b"garbage!!!")
    with pytest.raises(SecretError) as info:
        SecretStore(path).load()
    assert str(path) in str(info.value)
    assert VALUE not in str(info.value)


def test_decrypts_but_not_a_table(tmp_path: Path) -> None:
    key = Fernet.generate_key()
    path = tmp_path / "secrets.enc"
    path.write_bytes(Fernet(key).encrypt(b'{"secrets": ["' + VALUE.encode() + b'"]}'))
    with pytest.raises(SecretError) as info:
        SecretStore(path, key=key).load()
    assert str(path) in str(info.value)
    assert VALUE not in str(info.value)
    # The decrypted text must not travel along as a chained exception either.
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__ or info.value.__context__ is None


@pytest.mark.parametrize("name", ["", "1abc", "api-key", "api key", "ключ", "a.b", "x\n"])
def test_bad_names(tmp_path: Path, name: str) -> None:
    store = SecretStore(tmp_path / "secrets.enc")
    with pytest.raises(SecretError) as info:
        store.set(name, VALUE)
    assert repr(name) in str(info.value)
    with pytest.raises(SecretError):
        store.delete(name)


def test_empty_value_refused(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match="empty"):
        SecretStore(tmp_path / "secrets.enc").set("api_key", "")


def test_delete(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "secrets.enc")
    store.set("api_key", VALUE)
    store.set("other", OTHER)
    assert store.delete("api_key") is True
    assert store.delete("api_key") is False
    assert store.names() == ["other"]
    assert "api_key" not in store.load()


def test_in_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert SecretStore.in_data_dir(tmp_path).path == tmp_path / "secrets.enc"
    monkeypatch.setenv("VOICE_AGENT_DATA_DIR", str(tmp_path / "env"))
    assert SecretStore.in_data_dir().path == tmp_path / "env" / "secrets.enc"
    monkeypatch.delenv("VOICE_AGENT_DATA_DIR")
    monkeypatch.chdir(tmp_path)
    assert SecretStore.in_data_dir().path == Path("data") / "secrets.enc"


# -- Secrets view -----------------------------------------------------------------------------


def test_secrets_mapping_behaviour() -> None:
    secrets = Secrets({"b": OTHER, "a": VALUE})
    assert secrets.get("a") == VALUE
    assert secrets.get("missing") is None
    assert secrets.get("missing", "dflt") == "dflt"
    assert "a" in secrets and "missing" not in secrets
    assert len(secrets) == 2
    assert list(secrets) == ["a", "b"]
    with pytest.raises(KeyError, match="voice-agent secrets set missing"):
        secrets["missing"]


def test_secrets_is_read_only() -> None:
    secrets = Secrets({"api_key": VALUE})
    with pytest.raises(TypeError):
        secrets["api_key"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        del secrets["api_key"]  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        secrets._values = {}
    for method in ("update", "pop", "clear", "setdefault", "popitem"):
        assert not hasattr(secrets, method)
    assert secrets["api_key"] == VALUE


def test_secrets_copied_from_source() -> None:
    source = {"api_key": VALUE}
    secrets = Secrets(source)
    source["api_key"] = "changed"
    assert secrets["api_key"] == VALUE


def test_secrets_repr_shows_names_only() -> None:
    secrets = Secrets({"api_key": VALUE, "other": OTHER})
    for text in (repr(secrets), str(secrets), f"{secrets}", f"{secrets!r}"):
        assert "api_key" in text and "other" in text
        assert VALUE not in text and OTHER not in text


def test_secrets_not_picklable_but_copyable() -> None:
    secrets = Secrets({"api_key": VALUE})
    with pytest.raises(TypeError):
        pickle.dumps(secrets)
    assert copy.copy(secrets) is secrets
    assert copy.deepcopy({"s": secrets})["s"] is secrets


# -- redaction --------------------------------------------------------------------------------


def test_redact_text() -> None:
    redactor = Redactor({"api_key": VALUE})
    assert redactor.text(f"key={VALUE}; again {VALUE}.") == (
        "key=[secret:api_key]; again [secret:api_key]."
    )
    assert redactor.text("nothing here") == "nothing here"
    assert redactor.text("") == ""


def test_redact_nested_structures() -> None:
    redactor = Redactor({"api_key": VALUE, "pw": OTHER})
    Pair = namedtuple("Pair", "left right")
    data = {
        "headers": {"Authorization": f"Bearer {VALUE}"},
        VALUE: [1, 2.5, None, True, (OTHER, f"x{OTHER}x"), Pair(VALUE, 3)],
        "raw": b"bytes " + VALUE.encode(),
    }
    out = redactor.value(data)
    assert out["headers"] == {"Authorization": "Bearer [secret:api_key]"}
    assert out["[secret:api_key]"][:4] == [1, 2.5, None, True]
    assert out["[secret:api_key]"][4] == ("[secret:pw]", "x[secret:pw]x")
    pair = out["[secret:api_key]"][5]
    assert isinstance(pair, Pair) and pair == Pair("[secret:api_key]", 3)
    # Other objects are returned as they are.
    assert out["raw"] is data["raw"]
    assert data["headers"] == {"Authorization": f"Bearer {VALUE}"}  # input untouched


def test_redact_longer_value_first() -> None:
    redactor = Redactor({"short": "abc123", "long": "xxabc123yy"})
    assert redactor.text("[xxabc123yy] [abc123]") == "[[secret:long]] [[secret:short]]"


def test_redact_overlapping_values() -> None:
    # Neither contains the other, yet they overlap: no fragment of either may remain.
    redactor = Redactor({"a": "hello-wor", "b": "-world!"})
    out = redactor.text("say hello-world! now")
    assert out == "say [secret:a][secret:b] now"
    assert "wor" not in out and "hello" not in out


def test_redact_json_escaped_value() -> None:
    value = 'pa"ss\\word/\n\tx'
    redactor = Redactor({"pw": value})
    doc = json.dumps({"password": value})
    out = redactor.text(doc)
    assert out == '{"password": "[secret:pw]"}'
    assert json.loads(out) == {"password": "[secret:pw]"}
    assert redactor.text(value) == "[secret:pw]"


def test_redact_json_ascii_escaped_value() -> None:
    value = "пароль-é-1"
    redactor = Redactor({"pw": value})
    assert redactor.text(json.dumps({"p": value})) == '{"p": "[secret:pw]"}'
    assert redactor.text(json.dumps({"p": value}, ensure_ascii=False)) == '{"p": "[secret:pw]"}'


def test_redact_regex_metacharacters_and_empty_values() -> None:
    redactor = Redactor({"re": "a.*b(c)?[x]", "empty": ""})
    assert redactor.text("aXXb a.*b(c)?[x]") == "aXXb [secret:re]"
    assert Redactor({"empty": ""}).text("anything") == "anything"
    assert Redactor({}).value({"k": ["v"]}) == {"k": ["v"]}


def test_redact_from_secrets_view() -> None:
    redactor = Redactor(Secrets({"api_key": VALUE}))
    assert redactor.text(VALUE) == "[secret:api_key]"


def _capturing_logger(name: str, redactor: Redactor) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(redactor.logging_filter())
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return logger, stream


def test_logging_filter_redacts_msg_and_args() -> None:
    redactor = Redactor({"api_key": VALUE, "pw": OTHER})
    logger, stream = _capturing_logger("test_secrets.msg_args", redactor)
    logger.info(f"calling with {VALUE}")
    logger.warning("user %s sent %r", "bob", OTHER)
    logger.error("mapping %(k)s", {"k": VALUE})
    logger.info({"payload": VALUE})
    text = stream.getvalue()
    assert VALUE not in text and OTHER not in text
    assert "calling with [secret:api_key]" in text
    assert "user bob sent '[secret:pw]'" in text
    assert "mapping [secret:api_key]" in text
    assert "{'payload': '[secret:api_key]'}" in text


def test_logging_filter_value_split_across_args() -> None:
    redactor = Redactor({"api_key": VALUE})
    logger, stream = _capturing_logger("test_secrets.split", redactor)
    logger.info("%s%s", VALUE[:5], VALUE[5:])
    assert VALUE not in stream.getvalue()
    assert "[secret:api_key]" in stream.getvalue()


def test_logging_filter_redacts_tracebacks() -> None:
    redactor = Redactor({"api_key": VALUE})
    logger, stream = _capturing_logger("test_secrets.exc", redactor)
    try:
        raise RuntimeError(f"bad key {VALUE}")
    except RuntimeError:
        logger.exception("failed")
    text = stream.getvalue()
    assert VALUE not in text
    assert "RuntimeError: bad key [secret:api_key]" in text


def test_logging_filter_on_two_handlers_redacts_once() -> None:
    # A value that also appears inside the label text must not be rewritten twice.
    redactor = Redactor({"s": "secret"})
    logger, first = _capturing_logger("test_secrets.twice", redactor)
    second = io.StringIO()
    handler = logging.StreamHandler(second)
    handler.addFilter(redactor.logging_filter())
    logger.addHandler(handler)
    logger.info("the secret is out")
    assert "the [secret:s] is out" in first.getvalue()
    assert second.getvalue() == "the [secret:s] is out\n"


def test_logging_filter_bad_format_args_still_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    redactor = Redactor({"api_key": VALUE})
    logger, stream = _capturing_logger("test_secrets.badfmt", redactor)
    logger.info("%d items", VALUE)  # handleError reports the record on stderr
    assert VALUE not in stream.getvalue()
    assert VALUE not in capsys.readouterr().err


# -- CLI --------------------------------------------------------------------------------------


def _run(
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stdin: str = "",
) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="voice-agent")
    add_secrets_parser(parser.add_subparsers())
    args = parser.parse_args(argv)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_set_list_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(tmp_path)
    outputs: list[str] = []

    code, out, err = _run(["secrets", "list", "--data-dir", d], monkeypatch, capsys)
    assert (code, out, err) == (0, "", "no secrets\n")

    code, out, err = _run(
        ["secrets", "--data-dir", d, "set", "api_key"], monkeypatch, capsys, VALUE + "\n"
    )
    assert code == 0 and out == "secret api_key set\n"
    outputs += [out, err]

    code, out, err = _run(["secrets", "set", "pw", "--data-dir", d], monkeypatch, capsys, OTHER)
    assert code == 0
    outputs += [out, err]

    # Exactly one trailing newline is removed; inner newlines stay.
    code, out, err = _run(
        ["secrets", "set", "multi", "--data-dir", d], monkeypatch, capsys, "l1\nl2\n\n"
    )
    assert code == 0

    store = SecretStore.in_data_dir(tmp_path)
    assert store.load()["api_key"] == VALUE
    assert store.load()["pw"] == OTHER
    assert store.load()["multi"] == "l1\nl2\n"

    code, out, err = _run(["secrets", "list", "--data-dir", d], monkeypatch, capsys)
    assert (code, out, err) == (0, "api_key\nmulti\npw\n", "")
    outputs += [out, err]

    code, out, err = _run(["secrets", "delete", "api_key", "--data-dir", d], monkeypatch, capsys)
    assert code == 0 and "api_key" in out and "deleted" in out
    outputs += [out, err]

    code, out, err = _run(["secrets", "delete", "api_key", "--data-dir", d], monkeypatch, capsys)
    assert code == 1 and out == "" and "api_key" in err
    outputs += [out, err]

    for text in outputs:
        assert VALUE not in text and OTHER not in text


def test_cli_data_dir_from_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VOICE_AGENT_DATA_DIR", str(tmp_path))
    code, _, _ = _run(["secrets", "set", "api_key"], monkeypatch, capsys, VALUE)
    assert code == 0
    assert (tmp_path / "secrets.enc").exists()


def test_cli_set_from_tty_uses_getpass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    prompts: list[str] = []

    def fake_getpass(prompt: str = "") -> str:
        prompts.append(prompt)
        return VALUE

    parser = argparse.ArgumentParser()
    add_secrets_parser(parser.add_subparsers())
    args = parser.parse_args(["secrets", "set", "api_key", "--data-dir", str(tmp_path)])
    monkeypatch.setattr(sys, "stdin", Tty())
    monkeypatch.setattr("getpass.getpass", fake_getpass)
    assert args.func(args) == 0
    out, err = capsys.readouterr()
    assert out == "secret api_key set\n"
    assert VALUE not in out + err and VALUE not in "".join(prompts)
    assert prompts and "api_key" in prompts[0]
    assert SecretStore.in_data_dir(tmp_path).load()["api_key"] == VALUE


def test_cli_errors_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(tmp_path)
    code, out, err = _run(["secrets", "set", "bad-name", "--data-dir", d], monkeypatch, capsys, "v")
    assert code == 2 and out == "" and "bad-name" in err and err.count("\n") == 1

    code, out, err = _run(["secrets", "set", "empty", "--data-dir", d], monkeypatch, capsys, "\n")
    assert code == 2 and "empty" in err

    # A store written with another key: a one-line error naming the file, no value.
    SecretStore(tmp_path / "secrets.enc", key=Fernet.generate_key()).set("api_key", VALUE)
    monkeypatch.setenv("VOICE_AGENT_SECRET_KEY", Fernet.generate_key().decode())
    for argv, stdin in (
        (["secrets", "list", "--data-dir", d], ""),
        (["secrets", "set", "x", "--data-dir", d], OTHER),
        (["secrets", "delete", "api_key", "--data-dir", d], ""),
    ):
        code, out, err = _run(argv, monkeypatch, capsys, stdin)
        assert code == 2 and out == ""
        assert "secrets.enc" in err and err.count("\n") == 1
        assert VALUE not in err and OTHER not in err


def test_cli_requires_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_secrets_parser(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["secrets"])

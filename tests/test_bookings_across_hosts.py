"""The bookings example across hosts: with VOICE_AGENT_BOOKINGS_URL naming a PostgreSQL
database, a booking made by one server process is found, changed and cancelled by another
(each host of a deployment runs its own process and data directory), on a real PostgreSQL."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psycopg
import pytest

from tests.support.configs import ROOT
from tests.support.postgres import PostgresCluster, postgres_cluster  # noqa: F401  (fixture)

BOOKINGS_DB = ROOT / "config" / "functions" / "bookings_db.py"
WHEN = "2026-12-04T19:30:00"


def load_bookings_db() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bookings_db_under_test", BOOKINGS_DB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bookings_url(postgres_cluster: PostgresCluster) -> Iterator[str]:  # noqa: F811
    """A fresh schema of the cluster, as a libpq URL whose search_path starts there."""
    schema = f"b_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_cluster.url(), autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    yield f"{postgres_cluster.url()}&options=-csearch_path%3D{schema}"
    with psycopg.connect(postgres_cluster.url(), autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")


def other_host(url: str, data_dir: Path, code: str) -> dict[str, object]:
    """Another server process, with a data directory of its own: it finds the caller's
    booking by phone, moves it to eight, then cancels it."""
    script = f"""
import importlib.util, json
spec = importlib.util.spec_from_file_location("bookings_db", {str(BOOKINGS_DB)!r})
db = importlib.util.module_from_spec(spec); spec.loader.exec_module(db)
found = db.find_by_phone("+14155550123")
db.update({code!r}, at="2026-12-04T20:00:00")
moved = db.find_by_phone("+14155550123")
db.cancel({code!r})
print(json.dumps({{"found": found, "moved": moved, "after": db.find_by_phone("+14155550123")}}))
"""
    env = {**os.environ, "VOICE_AGENT_BOOKINGS_URL": url, "VOICE_AGENT_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_booking_made_on_one_host_is_found_and_cancelled_on_another(
    bookings_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOICE_AGENT_BOOKINGS_URL", bookings_url)
    monkeypatch.setenv("VOICE_AGENT_DATA_DIR", str(tmp_path / "host1"))
    db = load_bookings_db()
    code = db.book("key", 2, WHEN, "Ada", "+14155550123", "inside")
    result = other_host(bookings_url, tmp_path / "host2", code)
    found, moved = result["found"], result["moved"]
    assert isinstance(found, dict) and isinstance(moved, dict)
    assert found["code"] == code and found["name"] == "Ada" and found["at"] == WHEN
    assert moved["at"] == "2026-12-04T20:00:00"
    assert result["after"] is None  # cancelled there: no live booking for that phone
    assert db.find_by_phone("+14155550123") is None  # and so here
    # Nothing went to either host's own SQLite file.
    assert not (tmp_path / "host1" / "bookings.sqlite3").exists()
    assert not (tmp_path / "host2" / "bookings.sqlite3").exists()


def test_without_the_url_each_host_keeps_its_own_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VOICE_AGENT_BOOKINGS_URL", raising=False)
    monkeypatch.setenv("VOICE_AGENT_DATA_DIR", str(tmp_path))
    db = load_bookings_db()
    code = db.book("key", 4, WHEN, "Grace", "+14155550124", "outside")
    db.book("key", 4, WHEN, "Grace Hopper", "+14155550124", "outside")  # the same: replaced
    found = db.find_by_phone("+14155550124")
    assert found is not None and found["code"] == code and found["name"] == "Grace Hopper"
    assert (tmp_path / "bookings.sqlite3").exists()

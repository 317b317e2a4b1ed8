"""Table bookings, shared by the booking agents: in SQLite under the data directory, or, for
several hosts, in PostgreSQL (`VOICE_AGENT_BOOKINGS_URL=postgresql://...`, with `psycopg`
installed: `pip install "psycopg[binary]"`), so that a booking made through one host is found
by a call to another.

The functions that use it are synchronous, so the runtime calls them in its executor, off the
event loop: a blocking database call here delays no other call. Every statement is written once,
in SQL both databases take (an upsert with ON CONFLICT, `%(name)s` parameters turned into
SQLite's `:name`)."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS bookings (
    code TEXT PRIMARY KEY,
    phone TEXT NOT NULL,
    name TEXT NOT NULL,
    party_size INTEGER NOT NULL,
    at TEXT NOT NULL,
    seating TEXT NOT NULL,
    cancelled INTEGER NOT NULL DEFAULT 0
)
"""


BOOKINGS_URL_ENV = "VOICE_AGENT_BOOKINGS_URL"
_PARAMETER = re.compile(r"%\((\w+)\)s")


class _Database:
    """One transaction's connection, SQLite's or PostgreSQL's, behind one `execute`."""

    def __init__(self, connection: Any, postgres: bool) -> None:
        self.connection = connection
        self.postgres = postgres

    def execute(self, sql: str, params: dict[str, Any]) -> Any:
        if not self.postgres:
            sql = _PARAMETER.sub(r":\1", sql)
        return self.connection.execute(sql, params)


@contextmanager
def _connect() -> Iterator[_Database]:
    """One transaction on the bookings database, committed on success, and the connection
    closed at once: `with sqlite3.connect(...)` alone commits but leaves the connection (and
    its file descriptor) open until the garbage collector finds it."""
    url = os.environ.get(BOOKINGS_URL_ENV, "")
    if url.startswith(("postgresql://", "postgres://")):
        import psycopg  # only the deployments on several hosts need it
        from psycopg.rows import dict_row

        with psycopg.connect(url, row_factory=dict_row, connect_timeout=5) as connection:
            connection.execute(_SCHEMA)
            yield _Database(connection, postgres=True)
        return
    data_dir = Path(os.environ.get("VOICE_AGENT_DATA_DIR", "data"))
    data_dir.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(data_dir / "bookings.sqlite3", timeout=5)) as connection:
        connection.row_factory = sqlite3.Row
        with connection:
            connection.execute(_SCHEMA)
            yield _Database(connection, postgres=False)


def confirmation_code(key: str, phone: str, at: str, party_size: int) -> str:
    """Six letters a caller can read back; HMAC so codes cannot be guessed without the key."""
    digest = hmac.new(key.encode(), f"{phone}|{at}|{party_size}".encode(), hashlib.sha256)
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    number = int.from_bytes(digest.digest()[:8], "big")
    return "".join(letters[(number >> (5 * i)) % len(letters)] for i in range(6))


def spoken_datetime(at: str) -> str:
    moment = datetime.fromisoformat(at)
    hour = moment.strftime("%I").lstrip("0")
    minutes = "" if moment.minute == 0 else moment.strftime(":%M")
    return f"{moment.strftime('%A, %B')} {moment.day} at {hour}{minutes} {moment.strftime('%p')}"


def book(key: str, party_size: int, when: str, name: str, phone: str, seating: str) -> str:
    """Save a booking; returns its confirmation code. ValueError for a party we cannot seat."""
    if not 1 <= party_size <= 12:
        raise ValueError("we can seat parties of one to twelve people")
    code = confirmation_code(key, phone, when, party_size)
    save(
        {"code": code, "phone": phone, "name": name, "party_size": party_size, "at": when,
         "seating": seating}
    )
    return code


def save(row: dict[str, Any]) -> None:
    with _connect() as db:
        db.execute(
            "INSERT INTO bookings (code, phone, name, party_size, at, seating)"
            " VALUES (%(code)s, %(phone)s, %(name)s, %(party_size)s, %(at)s, %(seating)s)"
            " ON CONFLICT (code) DO UPDATE SET phone = excluded.phone, name = excluded.name,"
            " party_size = excluded.party_size, at = excluded.at, seating = excluded.seating,"
            " cancelled = 0",
            row,
        )


def find_by_phone(phone: str) -> dict[str, Any] | None:
    with _connect() as db:
        row = db.execute(
            "SELECT * FROM bookings WHERE phone = %(phone)s AND cancelled = 0"
            " ORDER BY at DESC LIMIT 1",
            {"phone": phone},
        ).fetchone()
    return dict(row) if row else None


def update(code: str, **changes: Any) -> None:
    assignments = ", ".join(f"{column} = %({column})s" for column in changes)
    with _connect() as db:
        db.execute(
            f"UPDATE bookings SET {assignments} WHERE code = %(code)s", {**changes, "code": code}
        )


def cancel(code: str) -> None:
    with _connect() as db:
        db.execute("UPDATE bookings SET cancelled = 1 WHERE code = %(code)s", {"code": code})

"""Opening the store: WAL mode, foreign keys, named migrations."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from servelab.errors import StoreError
from servelab.paths import db_path
from servelab.store.migrations import MIGRATIONS


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Store:
    """A thin handle on the SQLite database; repositories take it and do the SQL."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def applied_migrations(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT name FROM migrations ORDER BY applied_at, name")]


def _migrate(conn: sqlite3.Connection, migrations: list[tuple[str, str]]) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    done = {r[0] for r in conn.execute("SELECT name FROM migrations")}
    for name, sql in migrations:
        if name in done:
            continue
        try:
            conn.execute("BEGIN")
            for statement in _split_sql(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO migrations (name, applied_at) VALUES (?, ?)", (name, utcnow()))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            raise StoreError(f"migration {name} failed: {exc}") from exc


def _split_sql(sql: str) -> list[str]:
    """Split a migration into statements (executescript would commit our transaction)."""
    out, buf = [], []
    for line in sql.splitlines():
        stripped = line.split("--", 1)[0]
        buf.append(stripped)
        if stripped.rstrip().endswith(";"):
            stmt = "\n".join(buf).strip()
            if stmt.strip(";").strip():
                out.append(stmt)
            buf = []
    rest = "\n".join(buf).strip()
    if rest:
        out.append(rest)
    return out


def open_store(path: Path | None = None, migrations: list[tuple[str, str]] | None = None) -> Store:
    """Open (creating if needed) the store and bring its schema up to date."""
    path = path or db_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=30000")
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open the store at {path}: {exc}") from exc
    _migrate(conn, migrations if migrations is not None else MIGRATIONS)
    return Store(conn, path)

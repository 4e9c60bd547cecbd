"""Opening the store: SQLite (WAL, foreign keys) or PostgreSQL (psycopg 3), with the same named migrations.

Where: `open_store(location)`, else `$SERVELAB_DB` (the CLI's `--db` sets it), else `servelab.db` under
`$SERVELAB_HOME`. Repositories talk to `Store.execute` with `?` placeholders and never to a driver: the
dialect (servelab.store.dialect) is this module's business. Every statement outside `transaction()`
commits at once, on both.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from servelab.errors import StoreError
from servelab.paths import db_path
from servelab.redact import redact_text
from servelab.store.dialect import ENV, Location, parse_location, pg_ddl, pg_sql
from servelab.store.migrations import MIGRATIONS

if TYPE_CHECKING:
    import psycopg

# pg_advisory_(xact_)lock keys: one for migrations, one for the write transactions (what SQLite's
# BEGIN IMMEDIATE is: one writer at a time for a read-then-write section).
_MIGRATE_LOCK = 0x5E12_0001
_WRITE_LOCK = 0x5E12_0002
PG_HINT = (
    "check the PostgreSQL URL (host, port, database, user) and that the server runs; a password comes from"
    " PGPASSWORD, PGPASSFILE or ~/.pgpass"
)


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Row(Protocol):
    """A result row, by column name or index (sqlite3.Row, and `_PgRow` on PostgreSQL)."""

    def __getitem__(self, key: int | str, /) -> Any: ...
    def keys(self) -> list[str]: ...


class _PgRow:
    __slots__ = ("_index", "_names", "_values")

    def __init__(self, names: list[str], index: dict[str, int], values: Sequence[Any]) -> None:
        self._names, self._index, self._values = names, index, values

    def __getitem__(self, key: int | str, /) -> Any:
        return self._values[key if isinstance(key, int) else self._index[key]]

    def keys(self) -> list[str]:
        return list(self._names)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def _pg_rows(cursor: Any) -> Any:
    """psycopg's row factory: rows addressable like sqlite3.Row."""
    names = [c.name for c in cursor.description or ()]
    index = {n: i for i, n in enumerate(names)}
    return lambda values: _PgRow(names, index, values)


class Result:
    """What `Store.execute` returns, on either driver."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    def fetchone(self) -> Row | None:
        row: Row | None = self._cursor.fetchone()
        return row

    def fetchall(self) -> list[Row]:
        return list(self._cursor.fetchall())

    def __iter__(self) -> Iterator[Row]:
        return iter(self.fetchall())


class Store:
    """A handle on the store; repositories take it and do the SQL through `execute`."""

    def __init__(self, conn: Any, location: Location) -> None:
        self.conn = conn  # the driver's connection: the store's business (and SQLite-only tests')
        self.location = location
        self.kind = location.kind

    @property
    def path(self) -> Path | None:
        """The SQLite file (None on PostgreSQL)."""
        return self.location.path

    @property
    def shown(self) -> str:
        """Where the store is, as output may show it (a PostgreSQL password masked)."""
        return self.location.shown

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        if self.kind == "sqlite":
            return Result(self.conn.execute(sql, tuple(params)))
        return Result(self._pg(lambda: self.conn.execute(pg_sql(sql), tuple(params))))

    def executemany(self, sql: str, seq: Sequence[Sequence[Any]]) -> None:
        if self.kind == "sqlite":
            self.conn.executemany(sql, seq)
        else:
            q = pg_sql(sql)
            self._pg(lambda: self.conn.cursor().executemany(q, seq))

    def insert(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run an INSERT and return the new row's id (`RETURNING id`, on both)."""
        # every row fetched: SQLite commits an INSERT .. RETURNING when its statement is done, not before
        [row] = self.execute(sql + " RETURNING id", params).fetchall()
        return int(row[0])

    def _pg(self, call: Any) -> Any:
        import psycopg

        try:
            return call()
        except psycopg.OperationalError as exc:
            detail = " ".join(redact_text(str(exc)).split())
            raise StoreError(f"the store at {self.shown} failed: {detail}", PG_HINT) from exc

    @property
    def in_transaction(self) -> bool:
        if self.kind == "sqlite":
            return bool(self.conn.in_transaction)
        import psycopg

        return bool(self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE)

    @contextlib.contextmanager
    def transaction(self, what: str = "store") -> Iterator[None]:
        """Several statements as one: a kill leaves all of them or none, and two processes' transactions
        never interleave (SQLite: BEGIN IMMEDIATE; PostgreSQL: a transaction holding one advisory lock), so
        a read-then-write section (a plan change, a lease) stays atomic across processes."""
        if self.kind == "sqlite":
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"cannot start a {what} transaction: {exc}") from exc
            try:
                yield
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            return
        tx = self._pg(lambda: self.conn.transaction())
        with tx:
            self._pg(lambda: self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,)))
            yield

    def read_only(self) -> None:
        """From now on this connection cannot write (the UI's connections)."""
        if self.kind == "sqlite":
            self.conn.execute("PRAGMA query_only = ON")
        else:
            self.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")

    def applied_migrations(self) -> list[str]:
        return [r[0] for r in self.execute("SELECT name FROM migrations ORDER BY applied_at, name")]

    def tables(self) -> list[str]:
        """The store's tables (its own `migrations` included), by name."""
        if self.kind == "sqlite":
            sql = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        else:
            sql = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"
        return [str(r[0]) for r in self.execute(sql)]


def _migrate(store: Store, migrations: list[tuple[str, str]]) -> list[str]:
    """Apply the migrations not applied yet, each in its own transaction; returns their names. On
    PostgreSQL a session advisory lock makes two processes opening a fresh store at once take turns."""
    pg = store.kind == "postgresql"
    if pg:
        store.execute("SELECT pg_advisory_lock(?)", (_MIGRATE_LOCK,))
    try:
        store.execute(
            "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        done = {r[0] for r in store.execute("SELECT name FROM migrations")}
        applied = []
        for name, sql in migrations:
            if name in done:
                continue
            try:
                _apply(store, name, sql)
            except driver_errors() as exc:
                raise StoreError(f"migration {name} failed: {redact_text(str(exc)).strip()}") from exc
            applied.append(name)
        return applied
    finally:
        if pg:
            store.execute("SELECT pg_advisory_unlock(?)", (_MIGRATE_LOCK,))


def _apply(store: Store, name: str, sql: str) -> None:
    statements = _split_sql(sql)
    if store.kind == "sqlite":
        conn = store.conn
        try:
            conn.execute("BEGIN")
            for statement in statements:
                conn.execute(statement)
            conn.execute("INSERT INTO migrations (name, applied_at) VALUES (?, ?)", (name, utcnow()))
            conn.execute("COMMIT")
        except sqlite3.Error:
            conn.execute("ROLLBACK")
            raise
        return
    with store.conn.transaction():
        for statement in statements:
            store.conn.execute(pg_ddl(statement))
        store.conn.execute("INSERT INTO migrations (name, applied_at) VALUES (%s, %s)", (name, utcnow()))


def driver_errors() -> tuple[type[Exception], ...]:
    """The drivers' error classes (psycopg's when it is installed)."""
    try:
        import psycopg
    except ImportError:
        return (sqlite3.Error,)
    return (sqlite3.Error, psycopg.Error)


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


def resolve(location: Path | str | None = None) -> Location:
    """Which store: the one given, else $SERVELAB_DB (the CLI's `--db` sets it), else the SQLite file
    under $SERVELAB_HOME."""
    if isinstance(location, Path):
        return Location("sqlite", location, None)
    text = location if location is not None else os.environ.get(ENV, "")
    return parse_location(text) if text.strip() else Location("sqlite", db_path(), None)


def store_exists(location: Path | str | None = None) -> bool:
    """Whether the store was created already (observing never creates one): a PostgreSQL store is the
    server's, and counts as there."""
    where = resolve(location)
    return where.path.exists() if where.path is not None else True


def open_store(location: Path | str | None = None, migrations: list[tuple[str, str]] | None = None) -> Store:
    """Open (creating if needed) the store and bring its schema up to date."""
    store = connect(location)
    try:
        _migrate(store, migrations if migrations is not None else MIGRATIONS)
    except BaseException:
        store.close()
        raise
    return store


def open_store_migrated(location: Path | str | None = None) -> tuple[Store, list[str]]:
    """Open the store as `open_store` does, and say which migrations this opening applied."""
    store = connect(location)
    try:
        applied = _migrate(store, MIGRATIONS)
    except BaseException:
        store.close()
        raise
    return store, applied


def connect(location: Path | str | None = None) -> Store:
    """The store, unmigrated."""
    where = resolve(location)
    if where.path is not None:
        return _sqlite(where, where.path)
    return _postgres(where)


def _sqlite(where: Location, path: Path) -> Store:
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
    return Store(conn, where)


def _postgres(where: Location) -> Store:
    try:
        import psycopg
    except ImportError as exc:
        raise StoreError(
            f"the store {where.shown} is PostgreSQL, and psycopg is not installed",
            hint="pip install 'servelab[postgres]'",
        ) from exc
    try:
        conn: psycopg.Connection[Any] = psycopg.connect(
            where.url or "", autocommit=True, row_factory=_pg_rows, connect_timeout=10
        )
    except psycopg.Error as exc:
        detail = " ".join(redact_text(str(exc)).split())
        raise StoreError(f"cannot open the store at {where.shown}: {detail}", hint=PG_HINT) from exc
    return Store(conn, where)

"""Where the store lives and how its SQL is spoken there: SQLite (the default, a file) or PostgreSQL.

The repositories write one SQL text for both: `?` placeholders, `INSERT .. RETURNING id`, `ON CONFLICT`.
This module parses a store location (`sqlite:///abs/path.db`, a plain path, `postgresql://…`) and
translates SQL and migration DDL for PostgreSQL; nothing else in servelab knows a second dialect exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from servelab.errors import ConfigError

PG_SCHEMES = ("postgresql", "postgres")
ENV = "SERVELAB_DB"  # the store location, when --db does not give one


@dataclass(frozen=True)
class Location:
    """A parsed store location. `url` is what the driver is given (a PostgreSQL URL, secrets included
    when the environment had them); `shown` is what any output may print."""

    kind: str  # sqlite | postgresql
    path: Path | None  # the SQLite file
    url: str | None  # the PostgreSQL conninfo URL

    @property
    def shown(self) -> str:
        return str(self.path) if self.path is not None else redacted_url(self.url or "")


def parse_location(text: str) -> Location:
    """`sqlite:///abs/path.db`, a plain path, or `postgresql://…`/`postgres://…`."""
    value = text.strip()
    if not value:
        raise ConfigError("the store location is empty", hint="give a path, sqlite:///PATH or postgresql://…")
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if scheme in PG_SCHEMES:
        parts = urlsplit(value)
        if not (parts.path.strip("/") or parts.hostname):
            raise ConfigError(
                f"the PostgreSQL URL {redacted_url(value)!r} names no host and no database",
                hint="postgresql://USER@HOST:PORT/DBNAME",
            )
        return Location("postgresql", None, value)
    if scheme == "sqlite":
        rest = value[len("sqlite://") :]
        if not rest.startswith("/"):
            raise ConfigError(
                f"the SQLite URL {value!r} is not absolute", hint="sqlite:///ABSOLUTE/PATH.db (three slashes)"
            )
        return Location("sqlite", Path(rest), None)
    if scheme:
        raise ConfigError(
            f"unknown store scheme {scheme!r} in {redacted_url(value)!r}",
            hint="the store is a path, sqlite:///PATH or postgresql://USER@HOST:PORT/DBNAME",
        )
    return Location("sqlite", Path(value).expanduser(), None)


def command_line_location(text: str, option: str) -> Location:
    """A store location given on a command line (`--db`, `--from`, `--to`): parsed, and refused when it
    carries a password, which a command line would show to every user of the machine (`ps`)."""
    where = parse_location(text)
    if where.url is not None and url_password(where.url):
        raise ConfigError(
            f"{option} {where.shown}: a password does not belong on the command line",
            hint="leave it out of the URL and give it in PGPASSWORD, PGPASSFILE or ~/.pgpass (or put the whole"
            " URL in $SERVELAB_DB)",
        )
    return where


def url_password(url: str) -> bool:
    """Whether a PostgreSQL URL carries a password (in its user part or a `password=` parameter)."""
    parts = urlsplit(url)
    return bool(parts.password) or any(k == "password" for k, _ in parse_qsl(parts.query))


def redacted_url(url: str) -> str:
    """The URL with any password masked: what output may show."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            user, _, host = netloc.rpartition("@")
            netloc = f"{user.split(':', 1)[0]}:***@{host}"
        query = urlencode([(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)], safe="*")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:  # an unparsable URL: show its scheme only
        return url.split("://", 1)[0] + "://***"


# -- SQL for PostgreSQL --------------------------------------------------------------------------------
def pg_sql(sql: str) -> str:
    """`?` placeholders become `%s`; a literal `%` becomes `%%` (psycopg's placeholders); text inside
    single quotes keeps its `?`."""
    out: list[str] = []
    quoted = False
    for ch in sql:
        if ch == "'":
            quoted = not quoted
            out.append(ch)
        elif ch == "%":
            out.append("%%")
        elif ch == "?" and not quoted:
            out.append("%s")
        else:
            out.append(ch)
    return "".join(out)


_ID_PK = re.compile(r"\bid\s+INTEGER\s+PRIMARY\s+KEY\b", re.IGNORECASE)
_INTEGER = re.compile(r"\bINTEGER\b", re.IGNORECASE)
_REAL = re.compile(r"\bREAL\b", re.IGNORECASE)
_AUTOINCREMENT = re.compile(r"\s+AUTOINCREMENT\b", re.IGNORECASE)


def pg_ddl(statement: str) -> str:
    """One migration statement for PostgreSQL: an `id INTEGER PRIMARY KEY` (SQLite's rowid) becomes an
    identity column; INTEGER becomes BIGINT (SQLite's integers are 64-bit); REAL becomes DOUBLE PRECISION
    (PostgreSQL's REAL is 4 bytes: it would lose precision)."""
    s = _AUTOINCREMENT.sub("", statement)
    s = _ID_PK.sub("id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", s)
    s = _INTEGER.sub("BIGINT", s)
    return _REAL.sub("DOUBLE PRECISION", s)

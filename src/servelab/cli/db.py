"""`servelab db`: the store itself: bring its schema up to date, or copy it into another store."""

from __future__ import annotations

from typing import TypedDict

import click

from servelab.cli.output import emit, stdout
from servelab.errors import ConfigError, NotFoundError
from servelab.store.copy import copy_store
from servelab.store.db import Store, open_store, open_store_migrated
from servelab.store.dialect import command_line_location


class Migrated(TypedDict):
    """`db migrate --json`: the store, its kind, the migrations applied now and every one it has had."""

    store: str
    kind: str
    applied: list[str]
    migrations: list[str]


# `from` is a keyword: the functional form keeps the document's own key
Copied = TypedDict("Copied", {"from": str, "to": str, "tables": dict[str, int], "rows": int})


@click.group("db")
def db() -> None:
    """The store: migrate it, or copy it into another one (SQLite to PostgreSQL)."""


@db.command("migrate")
@click.option(
    "--db", "location", metavar="URL", help="The store (default: --db of servelab, $SERVELAB_DB, the file)."
)
@click.option("--json", "as_json", is_flag=True, help="What was applied, as JSON.")
def migrate(location: str | None, as_json: bool) -> None:
    """Apply the named migrations the store has not had yet (opening it does the same); prints them."""
    if location is not None:
        command_line_location(location, "--db")
    store, applied = open_store_migrated(location)
    with store:
        data: Migrated = {
            "store": store.shown,
            "kind": store.kind,
            "applied": applied,
            "migrations": store.applied_migrations(),
        }
    emit(data, as_json, _render_migrate)


def _render_migrate(d: Migrated) -> None:
    if d["applied"]:
        stdout.print(f"applied to {d['store']}: {', '.join(d['applied'])}")
    else:
        stdout.print(f"{d['store']} is up to date ({len(d['migrations'])} migrations)")


@db.command("copy")
@click.option("--from", "source", metavar="URL", required=True, help="The store to read (left as it was).")
@click.option(
    "--to", "target", metavar="URL", required=True, help="An empty store to write (created if a file)."
)
@click.option("--json", "as_json", is_flag=True, help="Rows copied per table, as JSON.")
def copy(source: str, target: str, as_json: bool) -> None:
    """Copy every table of one store into another, in one transaction, ids kept (a SQLite file outgrown:
    `--to postgresql://…`). The target must hold no rows."""
    src_where = command_line_location(source, "--from")
    dst_where = command_line_location(target, "--to")
    if src_where.path is not None and not src_where.path.is_file():
        raise NotFoundError(
            f"--from {src_where.shown}: no such store file", hint="give the path of an existing servelab.db"
        )
    if src_where == dst_where:
        raise ConfigError("--from and --to name the same store", hint="copy into another, empty store")
    with open_store(source) as src, open_store(target) as dst:
        counts = copy_store(src, dst)
        data = _copied(src, dst, counts)
    emit(data, as_json, _render_copy)


def _copied(src: Store, dst: Store, counts: dict[str, int]) -> Copied:
    return {"from": src.shown, "to": dst.shown, "tables": counts, "rows": sum(counts.values())}


def _render_copy(d: Copied) -> None:
    stdout.print(f"copied {d['rows']} rows from {d['from']} to {d['to']}")
    for table, n in d["tables"].items():
        stdout.print(f"  {table:<20} {n:>8}")

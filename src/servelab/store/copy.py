"""`servelab db copy`: every row of one store into another, once (a SQLite file outgrown for PostgreSQL).

Tables go in foreign-key order with their ids kept, all in one transaction on the target, so a failure
leaves the target as it was; on PostgreSQL the identity sequences are then moved past the largest id, so
the next insert does not collide with a copied row. A target that holds any row is refused: a copy never
merges two stores.
"""

from __future__ import annotations

from servelab.errors import UserError
from servelab.store.db import Store

# Every table but `migrations` (each store keeps its own), parents before children.
TABLES: tuple[str, ...] = (
    "bench_runs",
    "bench_levels",
    "bench_requests",
    "calibrations",
    "studies",
    "study_candidates",
    "study_trials",
    "study_leases",
    "plans",
    "plan_items",
    "plan_events",
    "deployments",
    "deployment_checks",
)
_BATCH = 2000


class TargetNotEmpty(UserError):
    """`db copy` into a store that already holds rows: the target must change (exit 2)."""


def columns(store: Store, table: str) -> list[str]:
    """A table's columns, in order."""
    if store.kind == "sqlite":
        return [str(r["name"]) for r in store.execute(f"PRAGMA table_info({table})")]
    rows = store.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND table_name = ? ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def copy_store(src: Store, dst: Store) -> dict[str, int]:
    """Copy every row of `src` into the empty `dst` (both migrated); returns rows copied per table."""
    unknown = sorted(set(src.tables()) - set(TABLES) - {"migrations"})
    assert not unknown, f"db copy does not know the tables {unknown}: add them to TABLES"
    full = [t for t in TABLES if dst.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() is not None]
    if full:
        raise TargetNotEmpty(
            f"the target store {dst.shown} is not empty (rows in {', '.join(full)})",
            hint="copy into a new, empty store (`createdb NAME` for PostgreSQL); a copy never merges two stores",
        )
    counts: dict[str, int] = {}
    with dst.transaction("copy"):
        for table in TABLES:
            cols = columns(src, table)
            names = ", ".join(cols)
            insert = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(cols))})"
            rows = src.execute(f"SELECT {names} FROM {table} ORDER BY 1").fetchall()
            for start in range(0, len(rows), _BATCH):
                batch = [tuple(r[i] for i in range(len(cols))) for r in rows[start : start + _BATCH]]
                dst.executemany(insert, batch)
            counts[table] = len(rows)
            if dst.kind == "postgresql" and "id" in cols:
                dst.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), COALESCE(MAX(id), 0) + 1, false)"
                    f" FROM {table}"
                )
    return counts

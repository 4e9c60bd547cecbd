from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from servelab.errors import NotFoundError, StoreError
from servelab.results import RequestRecord
from servelab.store import open_store
from servelab.store.bench import BenchRepo
from servelab.store.db import connect
from servelab.store.migrations import MIGRATIONS


def test_store_lives_in_servelab_home_with_wal(servelab_home: Path) -> None:
    with open_store() as store:
        assert store.path == servelab_home / "servelab.db"
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store.applied_migrations() == [name for name, _ in MIGRATIONS]


def test_migrations_apply_once_and_new_ones_later(where: Path | str) -> None:
    db = where
    open_store(db, MIGRATIONS[:1]).close()
    extra = [*MIGRATIONS, ("9999_test", "CREATE TABLE t_extra (x INTEGER, y REAL);")]
    with open_store(db, extra) as store:
        assert "9999_test" in store.applied_migrations()
        store.execute("INSERT INTO t_extra VALUES (?, ?)", (2**40, 0.1 + 0.2))  # 64-bit, double precision
    with open_store(db, extra) as store:  # re-opening does not re-run anything
        assert store.execute("SELECT count(*) FROM t_extra").fetchone()[0] == 1
        row = store.execute("SELECT x, y FROM t_extra").fetchone()
        assert row is not None and (row["x"], row[1]) == (2**40, 0.1 + 0.2) and row.keys() == ["x", "y"]
        assert store.applied_migrations() == [name for name, _ in extra]


def test_failed_migration_rolls_back(where: Path | str) -> None:
    bad = [
        ("0001_ok", "CREATE TABLE a (x INTEGER);"),
        ("0002_bad", "CREATE TABLE b (x INTEGER); SELEC nonsense;"),
    ]
    with pytest.raises(StoreError, match="0002_bad"):
        open_store(where, bad)
    if isinstance(where, Path):
        conn = sqlite3.connect(where)
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert [r[0] for r in conn.execute("SELECT name FROM migrations")] == ["0001_ok"]
    with connect(where) as store:
        names = set(store.tables())
        assert [r[0] for r in store.execute("SELECT name FROM migrations")] == ["0001_ok"]
    assert "a" in names and "b" not in names


def test_unwritable_home_is_a_store_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    monkeypatch.setenv("SERVELAB_HOME", str(f / "sub"))
    with pytest.raises(StoreError):
        open_store()


def test_requests_are_visible_to_another_connection_immediately(where: Path | str) -> None:
    with open_store(where) as store:
        repo = BenchRepo(store)
        run_id, uid = repo.create_run("http://x", "m", "completions", {"api_key": "sk-abcdefgh123"}, "h")
        level = repo.create_level(run_id, 0, "concurrency", 4, None)
        repo.add_request(
            level,
            RequestRecord(
                idx=0,
                prompt_idx=0,
                start_s=0.0,
                ok=True,
                ttft_s=0.1,
                e2e_s=0.5,
                itl_s=[0.1, 0.1],
                output_tokens=3,
                token_source="usage",
            ),
        )
        with open_store(where) as other:  # a second process would see exactly this
            got = BenchRepo(other).requests(level)
            assert len(got) == 1 and got[0].itl_s == [0.1, 0.1]
            run = BenchRepo(other).load(uid)
            assert run.config["api_key"] == "***"  # secrets never reach the store
            assert BenchRepo(other).load("last").uid == uid
            assert BenchRepo(other).load(uid[:6]).uid == uid  # a unique prefix
    with open_store(where) as store, pytest.raises(NotFoundError):
        BenchRepo(store).load("b-nope")

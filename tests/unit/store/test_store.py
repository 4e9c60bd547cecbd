from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from servelab.errors import NotFoundError, StoreError
from servelab.results import RequestRecord
from servelab.store import open_store
from servelab.store.bench import BenchRepo
from servelab.store.migrations import MIGRATIONS


def test_store_lives_in_servelab_home_with_wal(servelab_home: Path) -> None:
    with open_store() as store:
        assert store.path == servelab_home / "servelab.db"
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store.applied_migrations() == [name for name, _ in MIGRATIONS]


def test_migrations_apply_once_and_new_ones_later(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    open_store(db, MIGRATIONS[:1]).close()
    extra = [*MIGRATIONS, ("9999_test", "CREATE TABLE t_extra (x INTEGER);")]
    with open_store(db, extra) as store:
        assert "9999_test" in store.applied_migrations()
        store.conn.execute("INSERT INTO t_extra VALUES (1)")
    with open_store(db, extra) as store:  # re-opening does not re-run anything
        assert store.conn.execute("SELECT count(*) FROM t_extra").fetchone()[0] == 1


def test_failed_migration_rolls_back(tmp_path: Path) -> None:
    bad = [
        ("0001_ok", "CREATE TABLE a (x INTEGER);"),
        ("0002_bad", "CREATE TABLE b (x INTEGER); SELEC nonsense;"),
    ]
    with pytest.raises(StoreError, match="0002_bad"):
        open_store(tmp_path / "y.db", bad)
    conn = sqlite3.connect(tmp_path / "y.db")
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "a" in names and "b" not in names
    assert [r[0] for r in conn.execute("SELECT name FROM migrations")] == ["0001_ok"]


def test_unwritable_home_is_a_store_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    monkeypatch.setenv("SERVELAB_HOME", str(f / "sub"))
    with pytest.raises(StoreError):
        open_store()


def test_requests_are_visible_to_another_connection_immediately() -> None:
    with open_store() as store:
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
        with open_store() as other:  # a second process would see exactly this
            got = BenchRepo(other).requests(level)
            assert len(got) == 1 and got[0].itl_s == [0.1, 0.1]
            run = BenchRepo(other).load(uid)
            assert run.config["api_key"] == "***"  # secrets never reach the store
            assert BenchRepo(other).load("last").uid == uid
            assert BenchRepo(other).load(uid[:6]).uid == uid  # a unique prefix
    with open_store() as store, pytest.raises(NotFoundError):
        BenchRepo(store).load("b-nope")

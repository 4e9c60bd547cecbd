"""The store on PostgreSQL, through real servelab processes against the session's throwaway cluster
(tests/support/postgres.py): `servelab db migrate`, concurrent writers and a reader in separate processes
(no row lost or duplicated), a lease two processes race for, a study killed and resumed, `servelab db copy`
from a store real commands wrote (readers print the same from the copy), and the refusals (exit 2, no
traceback, no password). The password is only ever in PGPASSWORD: no output may contain it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import SimBenchRuns
from tests.integration.test_tune_crash import CANDIDATES, TOP
from tests.integration.test_tune_sim import ROOT, markers_alive, write_study
from tests.support import simruns
from tests.support.postgres import PgCluster

from servelab.store import open_store
from servelab.store.copy import TABLES
from servelab.store.migrations import MIGRATIONS
from servelab.store.studies import StudyRepo

pytestmark = pytest.mark.integration
ALL = [name for name, _ in MIGRATIONS]


def cli(
    *args: str, home: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "SERVELAB_HOME": str(home), "COLUMNS": "160", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "servelab", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )


def clean(res: subprocess.CompletedProcess[str], pg: PgCluster) -> None:
    """No traceback and no password in what a command printed."""
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-3000:]
    assert pg.password not in out


@contextlib.contextmanager
def reaped(procs: list[subprocess.Popen[str]]) -> Iterator[None]:
    """Whatever happens, no process of the test outlives it."""
    try:
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    with open_store(url) as store:
        return [tuple(r[i] for i in range(len(r.keys()))) for r in store.execute(sql).fetchall()]


def test_db_migrate_applies_the_named_migrations_once(pg_url: str, pg: PgCluster, tmp_path: Path) -> None:
    first = cli("--db", pg_url, "db", "migrate", "--json", home=tmp_path)
    assert first.returncode == 0, first.stderr
    clean(first, pg)
    doc = json.loads(first.stdout)
    assert doc["kind"] == "postgresql" and doc["store"] == pg_url
    assert doc["applied"] == ALL and doc["migrations"] == ALL
    again = cli("db", "migrate", "--db", pg_url, home=tmp_path)
    assert again.returncode == 0 and f"{pg_url} is up to date ({len(ALL)} migrations)" in again.stdout
    assert rows(pg_url, "SELECT count(*) FROM migrations") == [(len(ALL),)]
    # the SQLite default stays: nothing named, the file under SERVELAB_HOME
    local = cli("db", "migrate", "--json", home=tmp_path, env={"SERVELAB_DB": ""})
    assert json.loads(local.stdout)["store"] == str(tmp_path / "servelab.db")


def test_refusals_exit_2_without_traceback_or_password(pg_url: str, pg: PgCluster, tmp_path: Path) -> None:
    with_pw = pg_url.replace("servelab@", f"servelab:{pg.password}@")
    for argv in (
        ["--db", with_pw, "runs"],
        ["db", "migrate", "--db", with_pw],
        ["db", "copy", "--from", str(tmp_path / "a.db"), "--to", with_pw],
        ["db", "copy", "--from", str(tmp_path / "a.db"), "--to", pg_url + f"?password={pg.password}"],
    ):
        res = cli(*argv, home=tmp_path)
        assert res.returncode == 2, (argv, res.stderr)
        clean(res, pg)
        assert "a password does not belong on the command line" in res.stderr and "PGPASSWORD" in res.stderr
    missing = cli("db", "copy", "--from", str(tmp_path / "nope.db"), "--to", pg_url, home=tmp_path)
    assert missing.returncode == 2 and "no such store file" in missing.stderr
    assert not (tmp_path / "nope.db").exists()
    bad = cli("--db", "mysql://h/x", "runs", home=tmp_path)
    assert bad.returncode == 2 and "unknown store scheme 'mysql'" in bad.stderr, bad.stderr
    # the password in the environment is fine, and never shown; a server that is not there is exit 1
    gone = cli("runs", home=tmp_path, env={"SERVELAB_DB": with_pw.replace(str(pg.port), "1")})
    assert gone.returncode == 1 and "cannot open the store at postgresql://servelab:***@" in gone.stderr
    clean(gone, pg)
    # a target that holds rows is refused, and keeps them
    added = cli("--db", pg_url, "plan", "add", "check the box", home=tmp_path)
    assert added.returncode == 0, added.stderr
    src = tmp_path / "src.db"
    open_store(src).close()
    full = cli("db", "copy", "--from", f"sqlite://{src}", "--to", pg_url, "--json", home=tmp_path)
    assert full.returncode == 2 and json.loads(full.stdout)["error"] == "TargetNotEmpty", full.stderr
    assert "(rows in plans, plan_items, plan_events)" in full.stderr
    clean(full, pg)
    assert rows(pg_url, "SELECT content FROM plan_items") == [("check the box",)]


WRITER = """
import sys
from servelab.plan.machine import add
from servelab.results import RequestRecord
from servelab.store import open_store
from servelab.store.bench import BenchRepo
from servelab.store.plans import PlanRepo
w, n = sys.argv[1], int(sys.argv[2])
with open_store() as store:
    bench, plans = BenchRepo(store), PlanRepo(store)
    run_id, uid = bench.create_run("http://x", "m", "completions", {}, None)
    level = bench.create_level(run_id, 0, "concurrency", 1, None)
    for i in range(n):
        bench.add_request(level, RequestRecord(idx=i, prompt_idx=i, start_s=0.0, ok=True, ttft_s=0.1, e2e_s=0.2))
        if i % 5 == 0:  # read the plan, then write the next id: only a serialized transaction keeps them apart
            plans.apply("workspace", lambda p: add(p, f"{w}-{i}", now="2026-01-01T00:00:00", actor=w))
    bench.finish_run(run_id, "completed", [])
print(uid)
"""

READER = """
import sys, time
from servelab.store import open_store
from servelab.store.bench import BenchRepo
from servelab.store.plans import PlanRepo
seen = 0
with open_store() as store:
    store.read_only()
    while True:
        runs = BenchRepo(store).list_runs()
        PlanRepo(store).load()
        seen += 1
        if len(runs) == int(sys.argv[1]) and all(r.status == "completed" for r in runs):
            break
        time.sleep(0.01)
print(seen)
"""


def test_concurrent_writers_and_a_reader_lose_and_duplicate_nothing(pg_url: str, tmp_path: Path) -> None:
    writers, n = 4, 60  # and the fresh database is migrated by all five at once: they take turns
    env = {**os.environ, "SERVELAB_DB": pg_url, "SERVELAB_HOME": str(tmp_path)}
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(writers)], env=env, stdout=subprocess.PIPE, text=True
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, f"w{k}", str(n)], env=env, stdout=subprocess.PIPE, text=True
        )
        for k in range(writers)
    ]
    with reaped([reader, *procs]):
        uids = [p.communicate(timeout=120)[0].strip() for p in procs]
        out, _ = reader.communicate(timeout=60)
    assert [p.returncode for p in procs] == [0] * writers
    assert reader.returncode == 0 and int(out) >= 1
    assert sorted(r[0] for r in rows(pg_url, "SELECT uid FROM bench_runs")) == sorted(uids)
    assert rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM bench_requests") == [
        (writers * n, writers * n)
    ]
    per_level = rows(
        pg_url, "SELECT level_id, count(*), count(DISTINCT idx) FROM bench_requests GROUP BY level_id"
    )
    assert sorted(c for _, c, _ in per_level) == [n] * writers and all(c == d for _, c, d in per_level)
    items = rows(pg_url, "SELECT key, content FROM plan_items ORDER BY id")
    assert [k for k, _ in items] == [str(i) for i in range(1, writers * n // 5 + 1)]  # ids 1..N, none twice
    assert len({c for _, c in items}) == writers * n // 5
    assert rows(pg_url, "SELECT count(*) FROM plan_events") == [(writers * n // 5,)]


RACER = """
import pathlib, sys, time
from servelab.errors import StudyBusy
from servelab.store import leases, open_store
go = pathlib.Path(sys.argv[1])
with open_store() as store:
    pathlib.Path(sys.argv[4]).touch()  # connected
    while not go.exists():
        time.sleep(0.005)
    try:
        me = leases.acquire(store, int(sys.argv[2]), sys.argv[3])
    except StudyBusy as exc:
        print("busy", exc.message)
    else:
        print("won")
        time.sleep(1.5)
        leases.release(store, int(sys.argv[2]), me)
"""


def test_two_processes_race_for_a_lease_and_one_wins(pg_url: str, tmp_path: Path) -> None:
    with open_store(pg_url) as store:
        sid, uid = StudyRepo(store).create_study("race", None, {}, "h")
    env = {**os.environ, "SERVELAB_DB": pg_url}
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{k}" for k in range(3)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(go), str(sid), uid, str(r)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in ready
    ]
    with reaped(procs):
        end = time.monotonic() + 60
        while not all(r.exists() for r in ready):  # every racer connected, waiting for the start
            assert time.monotonic() < end and all(p.poll() is None for p in procs)
            time.sleep(0.01)
        go.touch()
        outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert outs[2] == "won" and all(
        o.startswith(f"busy study {uid} is being driven by pid ") for o in outs[:2]
    )
    assert rows(pg_url, "SELECT * FROM study_leases") == []  # the winner released it


def test_tune_killed_then_resumed_on_postgresql_and_copied_back(
    pg_url: str, pg: PgCluster, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    study = write_study(tmp_path / "crash.toml", "crash", CANDIDATES, levels=[1, 4], speed=5, top=TOP)
    env = {"SERVELAB_DB": pg_url}
    killed = cli(
        "tune", str(study), "--quiet", home=home, env={**env, "SERVELAB_TEST_CRASH_AT": "level-done"}
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (home / "servelab.db").exists()  # everything went to PostgreSQL
    [(uid, status)] = rows(pg_url, "SELECT uid, status FROM studies")
    assert status == "running"
    res = cli("tune", str(study), "--resume", "--json", home=home, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    clean(res, pg)
    got = json.loads(res.stdout)
    assert got["study"] == uid and got["status"] == "completed" and got["ranking"]["winner"] == "a"
    assert {c["label"]: [lv["level"] for lv in c["levels"]] for c in got["candidates"]} == {
        "a": [1.0, 4.0],
        "b": [1.0, 4.0],
    }
    assert rows(pg_url, "SELECT uid FROM bench_runs WHERE status = 'running'") == []
    assert len(rows(pg_url, "SELECT resumed_from FROM study_trials WHERE resumed_from IS NOT NULL")) == 1
    assert rows(pg_url, "SELECT * FROM study_leases") == []
    assert markers_alive(f"servelab-study:{uid}:") == []
    # and back into a SQLite file: the readers print the same from either
    back = tmp_path / "back.db"
    copied = cli(
        "db",
        "copy",
        "--from",
        pg_url,
        "--to",
        f"sqlite://{back}",
        "--json",
        home=home,
        env={"SERVELAB_DB": ""},
    )
    assert copied.returncode == 0, copied.stderr
    for argv in (["runs"], ["runs", "study", uid], ["report", uid]):
        a = cli(*argv, home=home, env=env)
        b = cli("--db", str(back), *argv, home=home)
        assert a.returncode == b.returncode == 0 and a.stdout == b.stdout, (argv, a.stderr, b.stderr)


def test_db_copy_of_real_bench_runs_reads_the_same(
    sim_bench_home: SimBenchRuns, pg_url: str, pg: PgCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    simruns.copy_store(sim_bench_home.home, home)
    src = home / "servelab.db"
    res = cli("db", "copy", "--from", f"sqlite://{src}", "--to", pg_url, "--json", home=home)
    assert res.returncode == 0, res.stderr
    clean(res, pg)
    doc = json.loads(res.stdout)
    assert list(doc["tables"]) == list(TABLES) and doc["to"] == pg_url and doc["from"] == str(src)
    with open_store(src) as s:
        want = {t: int(s.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in TABLES}
    assert doc["tables"] == want and want["bench_requests"] > 0
    for argv in (
        ["runs", "list"],
        *[["runs", "show", run] for run in sim_bench_home.runs],
        ["runs", "list", "--json"],
    ):
        a = cli(*argv, home=home)
        b = cli("--db", pg_url, *argv, home=home)
        assert a.returncode == b.returncode == 0 and a.stdout == b.stdout, (argv, a.stderr, b.stderr)
    # the copy's identity sequences were moved on: a new run gets the next id, not a copied one's
    sim = simruns.start_sim(tmp_path / "logs", *simruns.SIM_ARGS)
    try:
        monkeypatch.setenv("SERVELAB_DB", pg_url)
        new = simruns.bench(home, sim.url, simruns.MODEL, "--concurrency", "1", "--num-requests", "2")
    finally:
        sim.stop()
    [(new_id,)] = rows(pg_url, f"SELECT id FROM bench_runs WHERE uid = '{new['run']}'")
    assert new_id == max(r[0] for r in rows(pg_url, "SELECT id FROM bench_runs")) and new_id > len(
        sim_bench_home.runs
    )

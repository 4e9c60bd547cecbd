"""Test-wide fixtures: every test gets its own empty servelab data directory; and the run fails when a process
it started is still running at its end (tests/support/leftovers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support import simruns
from tests.support.leftovers import pytest_sessionfinish  # noqa: F401  (the hook: pytest finds it here)
from tests.support.postgres import PgCluster, pg_cluster


@pytest.fixture(autouse=True)
def servelab_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "servelab-home"
    monkeypatch.setenv("SERVELAB_HOME", str(home))
    monkeypatch.delenv("SERVELAB_DB", raising=False)  # the store is the file in that home unless a test says
    return home


@pytest.fixture(scope="session")
def pg() -> Iterator[PgCluster]:
    """One throwaway PostgreSQL 15 cluster per session (~1.5 s to start), for the tests that need one."""
    with pg_cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg: PgCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this test (dropped after): its URL, without the password,
    which is in PGPASSWORD for this process and the servelab processes it starts."""
    for k, v in pg.env().items():
        monkeypatch.setenv(k, v)
    with pg.fresh_db() as url:
        yield url


@pytest.fixture(scope="session")
def sim_bench_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimBenchRuns]:
    """Two real `servelab bench` runs against one live `servelab sim --speed 20` (GLM-5 NVFP4, TP8 on eight
    simulated RTX PRO 6000), written once per session: the readers' tests copy this store (`copy_store`)."""
    root = tmp_path_factory.mktemp("sim-bench")
    home = root / "home"
    sim = simruns.start_sim(root / "logs", *simruns.SIM_ARGS)
    try:
        plain = simruns.bench(
            home,
            sim.url,
            simruns.MODEL,
            "--concurrency",
            "1,4,16",
            "--requests-per-stream",
            "6",
            "--input-len",
            str(simruns.ISL),
            "--output-len",
            str(simruns.OSL),
        )
        slo = simruns.bench(
            home,
            sim.url,
            simruns.MODEL,
            "--concurrency",
            "1,4",
            "--num-requests",
            "16",
            "--input-len",
            str(simruns.ISL),
            "--output-len",
            str(simruns.OSL),
            "--slo",
            "ttft_ms<=2000,tpot_ms<=50",
        )
    finally:
        sim.stop()
    yield SimBenchRuns(home=home, runs=[plain["run"], slo["run"]], sim_args=simruns.SIM_ARGS)


@dataclass(frozen=True)
class SimBenchRuns:
    home: Path
    runs: list[str]
    sim_args: list[str]

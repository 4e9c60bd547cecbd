"""Test-wide fixtures: every test gets its own empty servelab data directory; and the run fails when a process
it started is still running at its end (tests/support/leftovers.py)."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support import simruns
from tests.support.leftovers import (  # noqa: F401  (the hooks: pytest finds them here)
    pytest_configure,
    pytest_configure_node,
    pytest_sessionfinish,
)
from tests.support.postgres import PgCluster, pg_cluster
from tests.support.shared import shared_dir

# pytest-xdist (`scripts/test.sh` runs `-n 2 --dist loadgroup`): the tests that use one of these
# session-scoped servers go to one worker together, so each starts once per run, not once per worker.
# A test that starts vLLM itself joins the "vllm" group with `@pytest.mark.xdist_group("vllm")`:
# two vLLM servers on two cores would each run at half speed. docs/testing.md says why each is shared.
SHARED_SERVERS = {
    "vllm_server": "vllm",
    "tiny_qwen3_moe": "vllm",
    "transformers_server": "transformers",
    "ray_nodes": "ray",
}

# A module whose tests share a module-scoped fixture runs on one worker (the fixture is made once), except:
SPLIT = {
    # ~300 commands: both workers take a share, each making its own `world` (one small study, ~30 s)
    "tests/integration/test_docs_commands.py",
}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        group = next((g for fx, g in SHARED_SERVERS.items() if fx in getattr(item, "fixturenames", ())), None)
        if group is None and _uses_a_module_fixture(item) and item.nodeid.split("::", 1)[0] not in SPLIT:
            group = item.nodeid.split("::", 1)[0]  # its module's tests share what the fixture made, once
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d and d[-1].scope == "module" for d in defs)


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
def sim_bench_home(tmp_path_factory: pytest.TempPathFactory) -> SimBenchRuns:
    """Two real `servelab bench` runs against one live `servelab sim --speed 20` (GLM-5 NVFP4, TP8 on eight
    simulated RTX PRO 6000), written once per run (every xdist worker's: tests/support/shared.py): the
    readers' tests copy this store (`copy_store`)."""
    root = shared_dir(tmp_path_factory, "sim-bench-home")
    root.mkdir(parents=True, exist_ok=True)
    home, done = root / "home", root / "runs.json"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            done.write_text(json.dumps(_two_sim_bench_runs(root, home)))
    return SimBenchRuns(home=home, runs=json.loads(done.read_text()), sim_args=simruns.SIM_ARGS)


def _two_sim_bench_runs(root: Path, home: Path) -> list[str]:
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
    return [plain["run"], slo["run"]]


@dataclass(frozen=True)
class SimBenchRuns:
    home: Path
    runs: list[str]
    sim_args: list[str]

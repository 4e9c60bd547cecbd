"""One real `servelab bench` run against the simulator, shared by the time-series, export and run-report
tests (tests/integration/test_bench_series.py, test_report_browser.py): GLM-5 NVFP4 on eight simulated RTX
PRO 6000 (SGLang personality) at --speed 20, two open-loop levels of 2,048-token prompts — 10 requests/s,
which the server keeps up with, and 150/s, which it does not (its queue grows) — 1.5 s each, /metrics
sampled every 0.1 s, every request exported as JSON Lines. Made once per session (a file lock lets every
module that asks share it)."""

from __future__ import annotations

import fcntl
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support import simruns
from tests.support.shared import shared_dir

INTERVAL_S = 0.1
DURATION_S = 1.5
RATES = (10, 150)


@dataclass(frozen=True)
class SimBench:
    home: Path
    uid: str
    result: dict[str, Any]  # what `servelab bench --json` printed
    export: Path  # its --export-requests file (JSON Lines)


def make(root: Path) -> SimBench:
    root.mkdir(parents=True, exist_ok=True)
    home, export = root / "home", root / "requests.jsonl"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / "bench.json"
        if not done.exists():
            sim = simruns.start_sim(root / "logs", *simruns.SIM_ARGS, speed=simruns.SPEED)
            try:
                out = simruns.bench(
                    home,
                    sim.url,
                    simruns.MODEL,
                    "--rate",
                    ",".join(map(str, RATES)),
                    "--duration",
                    str(DURATION_S),
                    "--scrape-interval",
                    str(INTERVAL_S),
                    "--input-len",
                    str(simruns.ISL),
                    "--output-len",
                    "32",
                    "--export-requests",
                    str(export),
                )
            finally:
                sim.stop()
            done.write_text(json.dumps(out))
        result = json.loads(done.read_text())
    return SimBench(home=home, uid=result["run"], result=result, export=export)


@pytest.fixture(scope="session")
def sim_bench(tmp_path_factory: pytest.TempPathFactory) -> SimBench:
    return make(shared_dir(tmp_path_factory, "shared-sim-bench"))

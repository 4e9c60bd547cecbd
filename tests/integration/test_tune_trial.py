"""The trial pipeline (`servelab.trial`) run directly against a real `servelab sim` process: the steps in
order, each reported before the next; a start that fails; a cancellation (twice) in the middle of the
benchmark; and `attach` to a server someone else runs. Real processes, real HTTP, the real store."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from servelab.config.loading import parse_study
from servelab.config.study import Study
from servelab.engines import registry
from servelab.engines.base import LaunchSpec
from servelab.host import processes
from servelab.host.ports import free_port
from servelab.lifecycle.handle import ServerHandle, TeardownReport
from servelab.lifecycle.ready import Endpoint, wait_url_ready
from servelab.store import open_store
from servelab.store.db import Store
from servelab.trial.outcome import AppliedCheck, Finding, LevelResult, Target, TrialObserver, TrialOutcome
from servelab.trial.pipeline import Trial
from servelab.trial.prepare import level_digest, settings_for

pytestmark = pytest.mark.integration

MODEL = "Qwen3-30B-A3B"


def study(faults: list[str] | None = None, levels: list[int] | None = None, speed: float = 50) -> Study:
    options: dict[str, Any] = {
        "python": sys.executable,
        "speed": speed,
        "fast_start": True,
        "cpus": [0],
        "verify": {"timeout_s": 10.0},
    }
    cand: dict[str, Any] = {"name": "c", "tp": 1}
    if faults:
        cand["options"] = {"faults": faults}
    return parse_study(
        {
            "study": {"name": "trial-seam"},
            "model": {"path": MODEL},
            "host": {"gpu": "h100-sxm", "num_gpus": 1},
            "engine": {"name": "sim", "options": options},
            "candidates": [cand],
            "workload": {"input_len": 64, "output_len": 16, "requests_per_stream": 2, "timeout_s": 20},
            "load": {"concurrency": levels or [1, 4]},
        }
    )


class Steps(TrialObserver):
    """Writes down each step the trial reports, with what the store shows of the trial at that moment."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.outcome: TrialOutcome | None = None
        self.levels: list[list[float]] = []
        self.marker_alive_at_finish: bool | None = None
        self.server: ServerHandle | None = None

    def launching(self, launch: LaunchSpec, log_path: Path) -> None:
        self.steps.append("launching")

    def launched(self, server: ServerHandle) -> None:
        self.server = server
        self.steps.append("launched")

    def ready(self, url: str, ready_s: float) -> None:
        self.steps.append("ready")

    def applied(self, check: AppliedCheck) -> None:
        self.steps.append("applied")

    def verified(self, result: Any) -> None:
        self.steps.append("verified")

    def benchmarking(self) -> None:
        self.steps.append("benchmarking")

    def level_done(self, level: LevelResult, levels: list[LevelResult]) -> None:
        self.levels.append([lv.value for lv in levels])
        self.steps.append("level_done")

    def server_died(self, levels: list[LevelResult], diagnosis: Finding) -> None:
        self.steps.append("server_died")

    def finished(self, outcome: TrialOutcome) -> None:
        self.outcome = outcome
        self.steps.append("finished")
        if self.server is not None:  # reported before the teardown: the server still runs
            self.marker_alive_at_finish = bool(processes.with_marker(self.server.run_marker))

    def torn_down(self, report: TeardownReport) -> None:
        self.steps.append("torn_down")


def marker() -> str:
    return f"servelab-test-trial:{os.getpid()}:{time.monotonic_ns()}"


def run(s: Study, store: Store, obs: TrialObserver, tmp_path: Path, mark: str) -> TrialOutcome:
    trial = Trial(s, registry.get("sim"), store, obs)
    return asyncio.run(trial.run(settings_for(s, s.candidates[0]), mark, tmp_path / "server.log", 30))


def test_a_trial_runs_every_step_in_order_against_the_simulator(tmp_path: Path) -> None:
    s = study()
    obs, mark = Steps(), marker()
    with open_store() as store:
        out = run(s, store, obs, tmp_path, mark)
    assert obs.steps == [
        "launching",
        "launched",
        "ready",
        "applied",
        "verified",
        "benchmarking",
        "level_done",
        "level_done",
        "finished",
        "torn_down",
    ]
    assert obs.marker_alive_at_finish is True
    assert obs.levels == [[1.0], [1.0, 4.0]]
    assert out.status == "measured" and out.stage == "done" and out.record() == {}
    assert out.applied is not None and out.applied.applied and out.applied.effective.effective["tp_size"] == 1
    assert out.verify is not None and out.verify.ok
    # each level: the digest in real-GPU time, the simulator's GPU telemetry, its own stored bench run
    for lv in out.levels:
        assert lv.digest["completed"] > 0 and lv.digest["failed"] == 0 and lv.digest["time_scale"] == 50
        assert lv.telemetry["gpu_power_w"] > 0 and lv.bench_run_id is not None
        stored = lv.stored()
        assert stored["bench_run"] == lv.bench_uid and stored["gpu_power_w"] == lv.telemetry["gpu_power_w"]
        assert "died" not in stored
    assert out.teardown is not None and out.teardown.clean
    assert processes.with_marker(mark) == []


def test_a_start_that_fails_is_reported_before_the_teardown(tmp_path: Path) -> None:
    obs, mark = Steps(), marker()
    with open_store() as store:
        out = run(study(faults=["cuda_init"]), store, obs, tmp_path, mark)
    assert obs.steps == ["launching", "launched", "finished", "torn_down"]
    assert out.status == "failed" and out.stage == "start"
    assert out.diagnosis is not None and out.diagnosis.klass == "cuda_init" and out.diagnosis.message
    rec = out.record()
    assert rec["diagnosis"]["class"] == "cuda_init" and rec["diagnosis"]["advice"]
    assert out.teardown is not None and out.teardown.survivors == []
    assert processes.with_marker(mark) == []


def test_an_invalid_candidate_is_a_finding_and_starts_nothing(tmp_path: Path) -> None:
    s = study()
    base = settings_for(s, s.candidates[0])
    bad = dataclasses.replace(base, options={**base.options, "personality": "nope"})
    obs = Steps()
    with open_store() as store:
        trial = Trial(s, registry.get("sim"), store, obs)
        out = asyncio.run(trial.run(bad, marker(), tmp_path / "server.log", 30))
    assert obs.steps == ["finished"]
    assert out.status == "failed" and out.stage == "command" and out.teardown is None
    assert out.record() == {  # stored flat, as a study always stored it
        "class": "invalid_candidate",
        "evidence": "unknown simulator personality 'nope'",
        "advice": "choose vllm or sglang",
    }


def test_a_cancelled_trial_still_tears_down_even_when_cancelled_again(tmp_path: Path) -> None:
    """Ctrl-C in the middle of the benchmark, then a second Ctrl-C while the teardown runs: the server's
    processes are gone when the trial returns, and the teardown is still reported."""
    s = study(levels=[1, 8, 16], speed=5)
    obs, mark = Steps(), marker()
    during: list[bool] = []

    async def go(store: Store) -> None:
        task = asyncio.ensure_future(
            Trial(s, registry.get("sim"), store, obs).run(
                settings_for(s, s.candidates[0]), mark, tmp_path / "server.log", 30
            )
        )
        while "benchmarking" not in obs.steps:
            assert not task.done()
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        task.cancel()
        # wait until the teardown has begun (our server got its SIGTERM), then the second Ctrl-C
        while obs.server is None or obs.server.exit_code() is None:
            assert obs.server is not None and obs.server.teardown_report is None
            await asyncio.sleep(0.002)
        during.append(obs.server.teardown_report is None)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with open_store() as store:
        asyncio.run(go(store))
    assert during == [True]  # the second cancellation came while the teardown ran
    assert "finished" not in obs.steps and obs.steps[-1] == "torn_down"
    assert obs.server is not None and obs.server.teardown_report is not None
    assert obs.server.teardown_report.survivors == []
    assert processes.with_marker(mark) == []


def test_attach_measures_a_server_someone_else_runs_and_leaves_it_running(tmp_path: Path) -> None:
    s = study(levels=[2])
    port = free_port()
    sim = subprocess.Popen(
        [
            *(sys.executable, "-m", "servelab", "sim", "--model", MODEL, "--gpu", "h100-sxm"),
            *("--num-gpus", "1", "--port", str(port), "--speed", "50", "--cpu", "0", "--fast-start"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        engine = registry.get("sim")
        ep = Endpoint(LaunchSpec([], {}, "127.0.0.1", port, MODEL), time.monotonic(), pid=sim.pid)
        asyncio.run(wait_url_ready(ep, engine.readiness, 60, "sim"))
        obs = Steps()
        with open_store() as store:
            trial = Trial(s, engine, store, obs)
            out = asyncio.run(trial.attach(Target(ep.url, MODEL), settings_for(s, s.candidates[0], port)))
            (lv,) = out.levels
            # the digest is the one `level_digest` builds from the stored bench run's summary
            from servelab.store.bench import BenchRepo

            assert lv.bench_run_id is not None
            run = BenchRepo(store).load(str(lv.bench_run_id))
            (stored_level,) = run.levels
            assert run.clock.speed == 50 and run.context.layout.tp == s.candidates[0].tp
            assert lv.digest == level_digest(stored_level, run.clock)
        assert obs.steps == ["ready", "applied", "verified", "benchmarking", "level_done", "finished"]
        assert out.status == "measured" and out.teardown is None
        assert sim.poll() is None  # not ours to stop
    finally:
        os.killpg(sim.pid, 9)
        sim.wait(10)

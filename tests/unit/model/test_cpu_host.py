"""The CPU host entry of the catalog, predictions for the tests' tiny models on it, and the fit that a
handful of bench levels can support (on Observations the real `observations_from_runs` made from runs the
real `servelab bench` wrote against `servelab sim`)."""

from __future__ import annotations

import math
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import SimBenchRuns
from tests.support import engines

from servelab.model.calibrate import FEW_ROWS, fit_few, fit_observations, predicted_ms, prepare
from servelab.model.factors import FIT_BOUNDS, Factors, default_factors
from servelab.model.hardware import get_gpu, get_interconnect, make_host
from servelab.model.observations import Observation, observations_from_runs
from servelab.model.predict import Workload, predict
from servelab.results import Run
from servelab.store.bench import BenchRepo
from servelab.store.db import open_store


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3"])
def tiny_config(request: pytest.FixtureRequest) -> Path:
    """config.json of a tiny model as the tests' builder writes it (hidden 128, 2 layers)."""
    return engines.build_tiny_model(request.param) / "config.json"


def test_cpu_host_entry_is_a_cpu_with_documented_numbers() -> None:
    cpu = get_gpu("cpu-host")
    assert cpu.is_cpu and cpu.kind == "cpu" and cpu.cores == 2
    assert get_gpu("CPU") == cpu  # alias
    # 2 cores × 2.45 GHz × 32 FP32 FLOP/cycle; no FP8/FP4 units: those fall back to the BF16 rate
    assert cpu.tflops_bf16 == pytest.approx(2 * 2.45e9 * 32 / 1e12, rel=0.01)
    assert cpu.tflops("fp8") == cpu.tflops("fp4") == cpu.tflops_bf16
    assert 1 <= cpu.memory_bw_gbs <= 100 and cpu.memory_gb > 0 and cpu.sm == 0
    assert get_interconnect(cpu.interconnect).name == "cpu-shm"
    assert make_host("cpu", 1).gpu.name == "cpu-host"
    assert not get_gpu("h200-sxm").is_cpu and get_gpu("h200-sxm").cores == 0


def test_predict_prices_the_tiny_models_on_the_cpu_host(tiny_config: Path) -> None:
    for c in (1, 4, 16):
        p = predict(str(tiny_config), "cpu-host", 1, Workload(256, 128, c), tp=1, engine="vllm")
        assert p.feasible, p.reason
        for v in (p.tpot_ms, p.ttft_ms, p.output_throughput, p.decode_step_ms):
            assert v is not None and math.isfinite(v) and v > 0
        assert p.tpot_ms is not None and p.ttft_ms is not None
        # a ~3 MB model read at 8 GB/s: well under a millisecond a step, and no collectives at TP1
        assert p.decode_breakdown_ms["weights"] < 1.0 and p.decode_breakdown_ms["allreduce"] == 0
        e2e_s = (p.ttft_ms + 127 * p.tpot_ms) / 1e3
        assert p.output_throughput == pytest.approx(c * 128 / e2e_s, rel=1e-6)


def test_overhead_factors_carry_a_cpu_engines_step(tiny_config: Path) -> None:
    """On CPU a tiny model's step is the engine's fixed work: the factors express it."""
    base = default_factors("vllm")
    slow = base.merged({"step_overhead_ms": 8.0, "seq_overhead_us": 500.0, "ttft_overhead_ms": 40.0})
    wl = Workload(256, 128, 4)
    a = predict(str(tiny_config), "cpu-host", 1, wl, tp=1, factors=base)
    b = predict(str(tiny_config), "cpu-host", 1, wl, tp=1, factors=slow)
    assert b.decode_step_ms == pytest.approx((a.decode_step_ms or 0) + 8.0 + 4 * 0.5, rel=1e-3)
    assert b.bottleneck == "other" and (b.ttft_ms or 0) > (a.ttft_ms or 0) + 40.0


def test_a_measured_memory_bandwidth_replaces_the_catalogs(tiny_config: Path) -> None:
    wl = Workload(256, 128, 1)
    cat = predict(str(tiny_config), "cpu-host", 1, wl, tp=1, engine="vllm")
    measured = default_factors("vllm").merged({"mem_bw_gbs": 5.0})
    probe = predict(str(tiny_config), "cpu-host", 1, wl, tp=1, factors=measured)
    # 5 GB/s measured against the catalog's 8: the weight reads take 8/5 as long
    assert probe.decode_breakdown_ms["weights"] == pytest.approx(
        cat.decode_breakdown_ms["weights"] * get_gpu("cpu-host").memory_bw_gbs / 5.0, rel=1e-3
    )


# -- the few-observation fit, on runs the real bench wrote against the simulator ---------------------


def _runs(home: Path, uids: list[str]) -> list[Run]:
    with open_store(home / "servelab.db") as store:
        repo = BenchRepo(store)
        return [repo.load(u) for u in uids]


def _on_the_sim_clock(runs: list[Run]) -> list[Observation]:
    """The real observations, their TTFT and TPOT read off the simulator's own step clock (the means bench
    recorded in each level's `server_metrics`) instead of the client's wall clock: a busy box slows the
    client's timer (×20 at the simulator's speed) but never the model timeline, and the fit below is about
    which levers a few levels identify, not about the client (its fidelity is tested against a reference)."""
    clock: dict[str, tuple[float, float]] = {}
    for run in runs:
        for lv in run.levels:
            server = lv.server_metrics["server_mean_ms"]
            assert isinstance(server, dict), lv.server_metrics
            ttft, itl = server["ttft"], server["itl"]
            assert isinstance(ttft, float | int) and isinstance(itl, float | int), server
            clock[f"{run.uid}:{lv.value:g}"] = (float(ttft), float(itl))
    return [
        replace(o, ttft_ms=clock[o.key][0], tpot_ms=clock[o.key][1]) for o in observations_from_runs(runs)
    ]


def test_a_few_levels_free_only_the_factors_they_identify(sim_bench_home: SimBenchRuns) -> None:
    obs = _on_the_sim_clock(_runs(sim_bench_home.home, sim_bench_home.runs[:1]))
    assert sorted(o.concurrency for o in obs) == [1, 4, 16] and len(obs) < FEW_ROWS
    # start from a wrong achieved bandwidth (half the engine's): TPOT is predicted ~2x too slow
    truth = default_factors("sglang")
    start = truth.merged({"bw_eff": truth.bw_eff / 2})
    glob, engines_, report = fit_observations(obs, start, holdout=0.0)
    assert report["mode"] == "few-observations" and engines_ == {}
    fitted = report["fitted"]
    assert 2 <= len(fitted) <= 4 and "gemm_eff" not in fitted and "blackwell_compute" not in fitted
    # the physical lever is found (an overhead cannot make a step faster) and lands near the truth
    assert "bw_eff" in fitted and glob.bw_eff == pytest.approx(truth.bw_eff, rel=0.15)
    # the slope levers' alternatives went to zero; nothing else moved
    off = report["switched_off"]
    assert len(off) == 2 and not set(off) & set(fitted)
    for name in off:
        assert getattr(glob, name) == FIT_BOUNDS[name][0]
    for f in fields(Factors):
        if f.name not in fitted and f.name not in off:
            assert getattr(glob, f.name) == getattr(start, f.name), f.name
    p = prepare(obs, start)
    before, after = predicted_ms(p, start)[0], predicted_ms(p, glob)[0]
    meas = [o.tpot_ms for o in p.obs]

    def err(pred: np.ndarray) -> float:
        return max(abs(float(a) / m - 1) for a, m in zip(pred, meas, strict=True))

    assert err(after) < 0.10 < err(before)


def test_one_level_fits_one_lever_per_quantity(sim_bench_home: SimBenchRuns) -> None:
    obs = [
        o
        for o in observations_from_runs(_runs(sim_bench_home.home, sim_bench_home.runs))
        if o.concurrency == 4
    ]
    assert len(obs) == 2  # c=4 of both runs
    start = default_factors("sglang").merged({"ttft_overhead_ms": 0.0})
    f, report = fit_few(prepare(obs, start), start)
    assert report["levels"] == [4] and len(report["fitted"]) == 2 and report["switched_off"] == []
    tpot_lever, ttft_lever = report["fitted"]
    assert tpot_lever in ("bw_eff", "step_overhead_ms") and ttft_lever in ("prefill_eff", "ttft_overhead_ms")
    assert len(report["candidates"]) == 4  # every pairing was tried and its loss reported
    for name in report["fitted"]:
        lo, hi = FIT_BOUNDS[name]
        assert lo <= getattr(f, name) <= hi

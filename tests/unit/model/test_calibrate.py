from __future__ import annotations

import importlib.resources
from pathlib import Path

import numpy as np
import pytest

from servelab.model.calibrate import error_table, factors_from_probe, fit, predicted_ms, prepare
from servelab.model.factors import Factors, default_factors
from servelab.model.observations import (
    Observation,
    _concurrency,
    _layout,
    holdout_mask,
    is_holdout,
    observations_from_csv,
)

# The published measurements ship as package data (src/servelab/data/serving_measurements.md says whence).
CSV = Path(str(importlib.resources.files("servelab") / "data" / "serving_measurements.csv"))


def _synthetic(truth: Factors) -> list[Observation]:
    rows = []
    for i, (c, tp) in enumerate([(1, 2), (4, 2), (16, 4), (64, 4), (8, 8), (32, 8), (2, 1), (128, 8)]):
        rows.append(
            Observation(
                "Llama-3.1-70B",
                "h200-sxm",
                tp,
                tp,
                1,
                1,
                1,
                "fp8",
                "fp8",
                1024,
                512,
                c,
                "vllm",
                1,
                1,
                f"r{i}",
            )
        )
    p = prepare(rows)
    tpot, ttft = predicted_ms(p, truth)
    return [
        Observation(**{**o.__dict__, "tpot_ms": float(a), "ttft_ms": float(b)})
        for o, a, b in zip(p.obs, tpot, ttft, strict=True)
    ]


def test_fit_recovers_synthetic_factors() -> None:
    truth = Factors(bw_eff=0.6, layer_overhead_us=20.0, step_overhead_ms=1.0)
    obs = _synthetic(truth)
    p = prepare(obs)
    start = Factors(bw_eff=0.9, layer_overhead_us=5.0, step_overhead_ms=1.0)
    fitted = fit(p, start, ["bw_eff", "layer_overhead_us"])
    before = error_table(p, start)[-1]
    after = error_table(p, fitted)[-1]
    assert after.tpot_mape < 2.0 < before.tpot_mape
    assert fitted.bw_eff == pytest.approx(0.6, rel=0.1)


def test_holdout_split_is_stable_and_by_configuration() -> None:
    o = Observation("m", "g", 1, 1, 1, 1, 1, None, None, 1, 1, 1, "e", 1, 1, "row-42")
    assert is_holdout(o) == is_holdout(o)
    # every concurrency level and repeat of one configuration falls on the same side of the split
    same = [Observation(**{**o.__dict__, "key": f"k{i}", "concurrency": 1 + i % 64}) for i in range(200)]
    assert len({is_holdout(k) for k in same}) == 1
    # different configurations are split about 30 / 70
    configs = [Observation(**{**o.__dict__, "isl": 1 + i}) for i in range(1000)]
    assert 200 < sum(is_holdout(k) for k in configs) < 400


def test_single_configuration_is_not_held_out_entirely() -> None:
    """A user's runs of one configuration are one group: rather than hold out everything, fit on all."""
    base = Observation("m", "g", 1, 1, 1, 1, 1, None, None, 1, 1, 1, "e", 1, 1, "k")
    group = next(
        Observation(**{**base.__dict__, "isl": i})
        for i in range(1, 100)
        if is_holdout(Observation(**{**base.__dict__, "isl": i}))
    )
    rows = [Observation(**{**group.__dict__, "concurrency": c}) for c in (1, 2, 4, 8)]
    assert all(is_holdout(o) for o in rows)
    assert not holdout_mask(rows).any()


def test_concurrency_is_per_server_not_per_rank() -> None:
    assert _concurrency({"batch_size": "32", "attention_dp_size": "8"}) == 256
    assert _concurrency({"batch_size": "4", "attention_dp_size": "64"}) == 256
    assert _concurrency({"batch_size": "16", "attention_dp_size": ""}) == 16
    assert _concurrency({"batch_size": "14", "attention_dp_size": "1"}) == 14  # one of 32 replicas


def test_attention_dp_rows_carry_the_total_concurrency() -> None:
    obs = [o for o in observations_from_csv(CSV) if o.dp > 1]
    assert obs
    # the same DeepSeek-R1 run is recorded as (dp 8, batch 32) and (dp 64, batch 4): both are 256 requests
    same_run = {o.concurrency for o in obs if round(o.ttft_ms) == 3316 and round(o.tpot_ms, 1) == 29.7}
    assert same_run == {256}


def test_factors_from_probe() -> None:
    probe = {
        "ranks": 2,
        "allreduce": [
            {"bytes": 2048, "us": 40.0},
            {"bytes": 8192, "us": 42.0},
            {"bytes": 32 * 1024 * 1024, "us": 2000.0},
        ],
        "mem_bw_gbs": 900.0,
    }
    f = factors_from_probe(probe)
    assert f["allreduce_us"] == {"2": 40.0}
    assert f["mem_bw_gbs"] == 900.0
    assert f["bus_gbs"] == pytest.approx(33554432 / 2000e-6 / 1e9, rel=1e-3)


def test_default_factors_accuracy_on_published_rows() -> None:
    obs = observations_from_csv(CSV)
    assert len(obs) > 3000
    p = prepare([o for o in obs if o.engine == "trtllm" and o.gpu == "h100-sxm"])
    tpot, _ = predicted_ms(p, default_factors("trtllm"))
    meas = np.array([o.tpot_ms for o in p.obs])
    assert np.mean(np.abs(tpot - meas) / meas) < 0.25


def test_squared_moe_layouts_are_read_as_one_box() -> None:
    row = {"tp_size": "64", "attention_dp_size": "1", "moe_tp_size": "8", "moe_ep_size": "8"}
    assert _layout(row) == (8, 1, 8)
    row = {"tp_size": "1", "attention_dp_size": "64", "moe_tp_size": "8", "moe_ep_size": "8"}
    assert _layout(row) == (1, 8, 8)
    # consistent layouts are kept as written
    assert _layout({"tp_size": "2", "attention_dp_size": "2", "moe_tp_size": "1", "moe_ep_size": "4"}) == (
        2,
        2,
        4,
    )
    assert _layout({"tp_size": "8", "attention_dp_size": "", "moe_tp_size": "1", "moe_ep_size": "8"}) == (
        8,
        1,
        8,
    )


def test_ttft_queue_grows_linearly_with_the_wave() -> None:
    from servelab.model.predict import Workload, predict

    f = default_factors("vllm").merged({"queue_exp": 1.0, "prefill_queue": 0.5, "ttft_overhead_ms": 0.0})
    t = {
        c: predict("Llama-3.1-70B", "h200-sxm", 4, Workload(4096, 512, c), tp=4, factors=f).ttft_ms
        for c in (33, 65, 129)
    }
    # each extra request in the wave adds the same batched prefill cost
    assert (t[129] - t[65]) == pytest.approx(2 * (t[65] - t[33]), rel=0.05)
    assert t[129] > t[65] > t[33]

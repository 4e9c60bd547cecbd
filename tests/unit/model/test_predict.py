"""The model's behaviour: breakdown sums, allreduce counts, monotonicity, memory rejection, speed."""

from __future__ import annotations

import time

import pytest

from servelab.errors import ConfigError
from servelab.model.factors import default_factors
from servelab.model.layouts import Layout, candidate_layouts
from servelab.model.predict import Workload, compare_layouts, make_setup, predict, sweep
from servelab.model.step import DecodeBatch, build_perf, step_time

GLM = ("GLM-5-NVFP4", "rtx-pro-6000", 8)


def test_glm5_pcie_tp8_single_stream_is_allreduce_bound() -> None:
    p = predict(*GLM, Workload(1024, 1024, 1), tp=8, engine="sglang")
    assert p.feasible
    assert p.allreduces_per_step == 156
    assert 20 <= p.allreduce_us_each <= 120
    assert 0.4 <= p.allreduce_share <= 0.8
    assert 35 <= 1000 / p.tpot_ms <= 90  # measured: 57 tok/s
    assert p.single_stream_ceiling_tok_s > 1.5 * (1000 / p.tpot_ms)
    assert sum(p.decode_breakdown_ms.values()) == pytest.approx(p.decode_step_ms, abs=1e-3)
    for key in ("weights", "kv_cache", "compute", "allreduce", "other"):
        assert key in p.decode_breakdown_ms
    for key in ("weights", "kv_cache", "activations", "reserved"):
        assert key in p.memory_gb_per_gpu


def test_tp4_pp2_halves_allreduce_but_doubles_weight_reads() -> None:
    tp8 = predict(*GLM, Workload(1024, 1024, 1), tp=8)
    tp4pp2 = predict(*GLM, Workload(1024, 1024, 1), tp=4, pp=2)
    assert tp4pp2.decode_breakdown_ms["allreduce"] < 0.6 * tp8.decode_breakdown_ms["allreduce"]
    assert tp4pp2.decode_breakdown_ms["weights"] == pytest.approx(
        2 * tp8.decode_breakdown_ms["weights"], rel=0.1
    )


def test_no_allreduce_on_one_gpu() -> None:
    p = predict("Qwen3-8B", "h100-sxm", 1)
    assert p.allreduces_per_step == 0 and p.decode_breakdown_ms["allreduce"] == 0


def test_throughput_rises_and_tpot_grows_with_concurrency() -> None:
    setup = make_setup("Llama-3.1-70B", "h200-sxm", 4, quant="fp8")
    pts = sweep(setup, Workload(1024, 1024, 1), [1, 4, 16, 64])
    tpots = [p.tpot_ms for p in pts]
    thr = [p.output_throughput for p in pts]
    assert tpots == sorted(tpots)
    assert thr == sorted(thr)


def test_longer_context_costs_more_kv_time() -> None:
    setup = make_setup("Llama-3.1-70B", "h100-sxm", 4)
    perf = build_perf(setup.arch, setup.quant, setup.host, setup.layout, setup.factors)
    short = step_time(perf, [1000] * 8)
    long = step_time(perf, [30000] * 8)
    assert long.kv_cache > 20 * short.kv_cache
    assert long.total > short.total
    # a summary gives the same as the list
    assert step_time(perf, DecodeBatch(8, 8000)).total == pytest.approx(short.total)


def test_dsa_reads_only_topk_context() -> None:
    setup = make_setup("GLM-5-FP8", "h200-sxm", 8)
    perf = build_perf(setup.arch, setup.quant, setup.host, setup.layout, setup.factors)
    a = step_time(perf, [4000] * 16).kv_cache
    b = step_time(perf, [64000] * 16).kv_cache
    assert b < 16 * a * 0.5  # the latent read is capped at top-k 2048; only indexer keys grow


def test_memory_infeasible_layout_is_rejected_with_numbers() -> None:
    p = predict("Llama-3.1-405B", "rtx-pro-6000", 2, tp=2)
    assert not p.feasible
    assert "GB per GPU" in p.reason and "> 86.4 GB" in p.reason


def test_invalid_layout_raises() -> None:
    with pytest.raises(ConfigError, match="does not divide"):
        make_setup("Llama-3.1-70B", "h100-sxm", 8, tp=3)
    with pytest.raises(ConfigError, match="GPUs"):
        make_setup("Llama-3.1-70B", "h100-sxm", 4, tp=8)
    with pytest.raises(ConfigError, match="dense"):
        make_setup("Llama-3.1-70B", "h100-sxm", 8, tp=4, ep=2, dp=2)


def test_candidate_layouts_cover_tp_pp_ep() -> None:
    arch = make_setup(*GLM).arch
    layouts = candidate_layouts(arch, 8)
    assert Layout(tp=8) in layouts and Layout(tp=4, pp=2) in layouts and Layout(tp=8, ep=8) in layouts
    assert all(lay.num_gpus == 8 for lay in layouts)


def test_compare_layouts_ranks_and_explains() -> None:
    res = compare_layouts(make_setup(*GLM), Workload(1024, 1024, 8))
    ranked = [r for r in res if r.rank]
    assert ranked[0].verdict == "best"
    thr = [r.prediction.output_throughput for r in ranked]
    assert thr == sorted(thr, reverse=True)
    assert all(r.verdict for r in ranked[1:])


def test_compare_layouts_respects_tpot_limit() -> None:
    res = compare_layouts(make_setup(*GLM), Workload(1024, 1024, 8), tpot_limit_ms=1.0)
    assert all(r.rank is None and "TPOT" in r.verdict for r in res if r.prediction.feasible)


def test_mtp_speeds_up_decode() -> None:
    base = predict(*GLM, Workload(1024, 1024, 1))
    mtp = predict(*GLM, Workload(1024, 1024, 1, mtp_tokens=2, accept_len=2.4))
    assert mtp.tpot_ms < base.tpot_ms


def test_calibration_overrides_apply() -> None:
    f = default_factors().merged({"allreduce_us": {"8": 10.0}})
    fast = make_setup(*GLM, factors=f)
    from servelab.model.predict import evaluate

    assert (
        evaluate(fast, Workload()).decode_breakdown_ms["allreduce"]
        < predict(*GLM).decode_breakdown_ms["allreduce"]
    )


def test_prediction_speed() -> None:
    predict(*GLM)
    t = time.perf_counter()
    predict(*GLM, Workload(1024, 1024, 32))
    assert time.perf_counter() - t < 0.05
    t = time.perf_counter()
    compare_layouts(make_setup(*GLM), Workload(1024, 1024, 32))
    assert time.perf_counter() - t < 2.0


def test_smaller_layout_runs_as_replicas() -> None:
    """TP4 on 8 GPUs is two TP4 replicas: each serves half the requests, throughput adds up."""
    wl = Workload(1024, 1024, 64)
    two = predict("Llama-3.1-70B", "h100-sxm", 8, wl, tp=4, quant="fp8")
    one = predict("Llama-3.1-70B", "h100-sxm", 4, Workload(1024, 1024, 32), tp=4, quant="fp8")
    assert two.replicas == 2 and one.replicas == 1
    assert two.tpot_ms == pytest.approx(one.tpot_ms) and two.ttft_ms == pytest.approx(one.ttft_ms)
    assert two.output_throughput == pytest.approx(2 * (one.output_throughput or 0))


def test_compare_layouts_includes_feasible_replica_layouts() -> None:
    res = compare_layouts(make_setup("Llama-3.1-8B", "h100-sxm", 8), Workload(1024, 1024, 64))
    labels = {r.label for r in res}
    assert "TP8" in labels and "TP1 ×8" in labels and "TP4 ×2" in labels
    assert all(r.prediction.feasible for r in res if "×" in r.label)

"""Behaviour added in round 3: expert-GEMM floor, per-generation FLOP efficiency, separate exponents."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servelab.model.factors import FIT_BOUNDS, Factors, default_factors
from servelab.model.memory import plan_memory
from servelab.model.predict import Terms, Workload, latencies, make_setup, make_terms
from servelab.model.step import DecodeBatch, build_perf, raw_step, step_time


def _perf(model: str, gpu: str, n: int, f: Factors):
    s = make_setup(model, gpu, n, tp=n, factors=f)
    return build_perf(s.arch, s.quant, s.host, s.layout, s.factors)


def test_expert_floor_only_for_moe_and_only_when_tokens_run() -> None:
    f = Factors(expert_rows=64.0)
    moe = _perf("DeepSeek-R1", "h200-sxm", 8, f)
    dense = _perf("Llama-3.1-70B", "h200-sxm", 8, f)
    assert moe.expert_group_s > 0 and dense.expert_group_s == 0
    assert raw_step(moe, ()).expert_pre_s == 0  # an empty step pays nothing
    # a 1024-token prefill picks every expert (to float precision): the whole floor
    assert raw_step(moe, (), prefill_tokens=1024).expert_pre_s == pytest.approx(moe.expert_group_s, rel=1e-12)


def test_expert_floor_is_paid_by_the_experts_a_token_picked() -> None:
    """One decode token of a top-8-of-256 model runs 8 experts' tiles, not 256 (the physics audit's
    finding: the floor over every expert made single-stream MoE decode compute-bound)."""
    moe = _perf("DeepSeek-R1", "h200-sxm", 8, Factors(expert_rows=64.0))
    arch = moe.arch
    one = raw_step(moe, DecodeBatch(1, 1024)).expert_dec_s
    assert one == pytest.approx(moe.expert_group_s * arch.top_k / arch.num_experts)
    many = raw_step(moe, DecodeBatch(512, 512 * 1024)).expert_dec_s
    assert one < many < moe.expert_group_s * 1.0000001
    cpu = make_setup("Qwen3-30B-A3B", "cpu-host", 1, tp=1, factors=Factors(expert_rows=64.0))
    # CPU GEMMs compute the rows they get: no tile floor at all
    assert build_perf(cpu.arch, cpu.quant, cpu.host, cpu.layout, cpu.factors).expert_group_s == 0


def test_expert_floor_slows_a_small_moe_prefill_but_not_a_dense_one() -> None:
    no, yes = Factors(expert_rows=0.0), Factors(expert_rows=256.0)
    for model, grows in (("DeepSeek-R1", True), ("Llama-3.1-70B", False)):
        a = step_time(_perf(model, "h200-sxm", 8, no), prefill_tokens=1024).total
        b = step_time(_perf(model, "h200-sxm", 8, yes), prefill_tokens=1024).total
        assert (b > a * 1.05) if grows else b == a


def test_blackwell_compute_scales_only_sm100_gpus() -> None:
    slow = Factors(blackwell_compute=0.5)
    for gpu, changes in (("b200", True), ("h200-sxm", False)):
        a = step_time(_perf("Llama-3.1-70B", gpu, 8, Factors()), prefill_tokens=8192).compute
        b = step_time(_perf("Llama-3.1-70B", gpu, 8, slow), prefill_tokens=8192).compute
        assert (b > a) if changes else b == a


def test_interference_exponent_moves_tpot_not_ttft() -> None:
    s = make_setup("Llama-3.1-70B", "h200-sxm", 8, tp=8)
    perf = build_perf(s.arch, s.quant, s.host, s.layout, s.factors)
    mem = plan_memory(s.arch, s.quant, s.host, s.layout, s.mem_fraction)
    t: Terms = make_terms(perf, mem, Workload(1024, 1024, 64))
    f = default_factors()
    _, tpot_a, ttft_a = latencies(t, replace(f, interference_exp=0.5))
    _, tpot_b, ttft_b = latencies(t, replace(f, interference_exp=1.0))
    assert tpot_b > tpot_a and ttft_a == ttft_b


def test_new_factors_are_fitted_within_bounds() -> None:
    for name in ("blackwell_compute", "expert_rows", "interference_exp"):
        lo, hi = FIT_BOUNDS[name]
        assert lo <= getattr(default_factors(), name) <= hi


def test_decode_step_unchanged_shape_for_simulator() -> None:
    perf = _perf("DeepSeek-R1", "b200", 8, default_factors("sglang"))
    small = step_time(perf, DecodeBatch(1, 2048)).total
    big = step_time(perf, DecodeBatch(256, 256 * 2048), prefill_tokens=2048).total
    assert 0 < small < big

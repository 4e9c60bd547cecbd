"""Behaviour added in round 4: expert GEMM efficiency, NVLink-only latency scale, prefill wait, PCIe example."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servelab.model.factors import FIT_BOUNDS, Factors, default_factors
from servelab.model.memory import plan_memory
from servelab.model.predict import Workload, latencies, make_setup, make_terms, predict
from servelab.model.step import build_perf, step_time


def _perf(model: str, gpu: str, n: int, f: Factors, interconnect: str | None = None):
    s = make_setup(model, gpu, n, tp=n, factors=f, interconnect=interconnect)
    return build_perf(s.arch, s.quant, s.host, s.layout, s.factors)


def test_expert_eff_slows_moe_prefill_only() -> None:
    fast, slow = Factors(expert_eff=1.0), Factors(expert_eff=0.25)
    for model, moe in (("DeepSeek-R1", True), ("Llama-3.1-70B", False)):
        a = step_time(_perf(model, "h200-sxm", 8, fast), prefill_tokens=8192).total
        b = step_time(_perf(model, "h200-sxm", 8, slow), prefill_tokens=8192).total
        assert (b > a * 1.2) if moe else b == a


def test_nvlink_latency_scale_never_reaches_pcie() -> None:
    base, scaled = Factors(), Factors(nvlink_lat_scale=3.0)
    nv_a = step_time(_perf("Llama-3.1-70B", "h100-sxm", 8, base), [2048]).allreduce
    nv_b = step_time(_perf("Llama-3.1-70B", "h100-sxm", 8, scaled), [2048]).allreduce
    assert nv_b > nv_a * 2
    pc_a = step_time(_perf("Llama-3.1-70B", "rtx-pro-6000", 8, base), [2048]).allreduce
    pc_b = step_time(_perf("Llama-3.1-70B", "rtx-pro-6000", 8, scaled), [2048]).allreduce
    assert pc_a == pc_b > 0


def test_nvlink_scale_ignored_once_the_host_is_measured() -> None:
    measured = Factors(nvlink_lat_scale=3.0, allreduce_us={"8": 20.0})
    plain = Factors(allreduce_us={"8": 20.0})
    a = step_time(_perf("Llama-3.1-70B", "h100-sxm", 8, measured), [2048]).allreduce
    b = step_time(_perf("Llama-3.1-70B", "h100-sxm", 8, plain), [2048]).allreduce
    assert a == b


def test_prefill_wait_moves_ttft_not_tpot() -> None:
    s = make_setup("Llama-3.1-70B", "h200-sxm", 8, tp=8)
    perf = build_perf(s.arch, s.quant, s.host, s.layout, s.factors)
    mem = plan_memory(s.arch, s.quant, s.host, s.layout, s.mem_fraction)
    t = make_terms(perf, mem, Workload(1024, 1024, 16))
    f = default_factors()
    dec_a, tpot_a, ttft_a = latencies(t, replace(f, prefill_wait=0.0))
    dec_b, tpot_b, ttft_b = latencies(t, replace(f, prefill_wait=2.0))
    assert ttft_b > ttft_a and dec_a == dec_b
    # round 6: a longer wait for the first token moves a little more of the others' prefills into TTFT
    assert tpot_b <= tpot_a and tpot_b == pytest.approx(tpot_a, rel=1e-3)


def test_round4_factors_fitted_within_bounds() -> None:
    for engine in (None, "vllm", "sglang", "trtllm"):
        f = default_factors(engine)
        for name in ("expert_eff", "nvlink_lat_scale", "prefill_wait"):
            lo, hi = FIT_BOUNDS[name]
            assert lo <= getattr(f, name) <= hi


def test_glm5_pcie_example_stays_in_the_published_neighbourhood() -> None:
    """GLM-5 NVFP4 on 8x RTX PRO 6000 PCIe, TP8, one stream: published 57 tok/s, 65-70 % allreduce,
    100-140 tok/s ceiling. The model must stay near it (PCIe latency is catalog physics, not fitted)."""
    p = predict("GLM-5-NVFP4", "rtx-pro-6000", 8, Workload(1024, 1024, 1), tp=8)
    assert p.feasible
    assert 45 <= (p.per_user_tok_s or 0) <= 70
    assert 0.45 <= (p.allreduce_share or 0) <= 0.75
    assert 100 <= (p.single_stream_ceiling_tok_s or 0) <= 140


def test_exclusion_patterns_pinned_to_other_layers_are_ignored() -> None:
    """The one-regex matcher keeps `_matches` semantics and drops patterns the probe layers never hit."""
    from servelab.model.quant import _excluded, _exclusion_matcher, _matches

    assert _excluded("attention", ["model.layers.*.self_attn*"])
    assert _excluded("attention", [f"model.layers.{i}.self_attn.o_proj" for i in range(4, 8)])
    assert not _excluded("attention", [f"model.layers.{i}.self_attn.o_proj" for i in range(10, 60)])
    assert _excluded("lm_head", ["lm_head"]) and not _excluded("lm_head", ["re:.*gate.*"])
    for pattern in ("model.layers.5.mlp", "*.o_proj", "re:.*experts.*", "layers.1", "model.layers.1*"):
        for name in ("model.layers.5.mlp.experts.0.down_proj", "model.layers.5.self_attn.o_proj"):
            assert bool(_exclusion_matcher((pattern,)).search(name)) == _matches(pattern, name)

"""Round 5: how much KV a running request holds depends on the engine's scheduler (`kv_reserve`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servelab.model.calibrate import ENGINE_BEHAVIOUR, prepare
from servelab.model.factors import FIT_BOUNDS, default_factors
from servelab.model.memory import plan_memory
from servelab.model.observations import Observation
from servelab.model.predict import Workload, evaluate, kv_context, make_setup, make_terms
from servelab.model.step import build_perf

# 8,192-token prompts with 1,024 output tokens on Llama-3.1-70B FP8, TP1 on one H200: the KV cache holds
# a few dozen requests, so 64 clients overflow it.
WL = Workload(8192, 1024, 64)


def _running(engine: str) -> int:
    s = make_setup("Llama-3.1-70B", "h200-sxm", 1, tp=1, quant="fp8", engine=engine)
    perf = build_perf(s.arch, s.quant, s.host, s.layout, s.factors)
    mem = plan_memory(s.arch, s.quant, s.host, s.layout, s.mem_fraction)
    return int(make_terms(perf, mem, WL).running)


def test_engines_reserve_kv_as_their_schedulers_do() -> None:
    assert default_factors("trtllm").kv_reserve == 1.0  # GUARANTEED_NO_EVICT: the whole output up front
    assert default_factors("vllm").kv_reserve == default_factors("sglang").kv_reserve == 0.5
    assert default_factors().kv_reserve == 1.0  # no engine named: the KV-safe reading
    assert "kv_reserve" not in FIT_BOUNDS  # documented behaviour, never fitted


def test_allocate_on_demand_engines_run_more_requests_when_kv_is_tight() -> None:
    trt, vllm = _running("trtllm"), _running("vllm")
    assert 0 < trt < vllm < WL.concurrency
    # the running batch holds prompt + output/2 tokens per request instead of prompt + output
    assert vllm / trt == pytest.approx((8192 + 1024) / (8192 + 512), rel=0.05)


def test_reported_max_concurrency_uses_the_same_context() -> None:
    s = make_setup("Llama-3.1-70B", "h200-sxm", 1, tp=1, quant="fp8", engine="vllm")
    p = evaluate(s, WL)
    mem = plan_memory(s.arch, s.quant, s.host, s.layout, s.mem_fraction)
    assert p.max_concurrency == mem.max_concurrency(kv_context(WL, s.factors))
    assert kv_context(WL, replace(s.factors, kv_reserve=1.0)) == 8192 + 1024


def test_fit_terms_apply_each_rows_engine_behaviour() -> None:
    rows = [
        Observation(
            "Llama-3.1-70B", "h200-sxm", 1, 1, 1, 1, 1, "fp8", None, 8192, 1024, 64, eng, 1000.0, 50.0
        )
        for eng in ("trtllm", "vllm")
    ]
    prep = prepare(rows)
    assert [s.factors.kv_reserve for s in prep.setups] == [
        ENGINE_BEHAVIOUR[e]["kv_reserve"] for e in ("trtllm", "vllm")
    ]
    assert prep.terms.running[0] < prep.terms.running[1]

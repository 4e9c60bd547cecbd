"""Round 6: the prefill stall a request's TPOT carries is the share of the closed-loop cycle after its first
token (`decode_time`; the rest of the other requests' prefills fall in its TTFT), and decode-sized NVLink
collectives move at a fitted fraction of the bus bandwidth (`nvlink_bw_eff`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from servelab.model.factors import FIT_BOUNDS, default_factors
from servelab.model.memory import plan_memory
from servelab.model.predict import Workload, decode_time, latencies, make_setup, make_terms, prefill_marginal
from servelab.model.step import DecodeBatch, build_perf, combine, raw_step


def test_no_ttft_gives_the_whole_stall() -> None:
    assert float(decode_time(10.0, 3.0, 0.0)) == pytest.approx(13.0)
    assert float(decode_time(10.0, 0.0, 5.0)) == pytest.approx(10.0)  # nothing to stall: decode steps only


@pytest.mark.parametrize("ttft", [0.01, 1.0, 10.0, 1e4])
def test_decode_time_solves_the_cycle_share(ttft: float) -> None:
    steps, stall = 10.0, 4.0
    d = float(decode_time(steps, stall, ttft))
    assert steps < d < steps + stall
    assert d == pytest.approx(steps + stall * d / (ttft + d), rel=1e-9)


def test_longer_ttft_leaves_less_stall_in_tpot() -> None:
    d = decode_time(np.full(4, 10.0), np.full(4, 4.0), np.array([0.0, 1.0, 10.0, 100.0]))
    assert np.all(np.diff(d) < 0)
    assert np.all(np.isfinite(d))


def test_tpot_stall_is_the_cycle_share_of_the_round5_stall() -> None:
    """8,192-token prompts, 128-token answers, 64 clients: TTFT is long next to the decode phase."""
    s = make_setup("Llama-3.1-70B", "h200-sxm", 8, tp=8, quant="fp8", engine="vllm")
    perf = build_perf(s.arch, s.quant, s.host, s.layout, s.factors)
    mem = plan_memory(s.arch, s.quant, s.host, s.layout, s.mem_fraction)
    t = make_terms(perf, mem, Workload(8192, 128, 64))
    f = s.factors
    dec, tpot, ttft = (float(x) for x in latencies(t, f))
    full = float(
        f.prefill_interference
        * (float(t.per_group) - 1.0) ** f.interference_exp
        * prefill_marginal(t.pre, f, t.isl)
        / t.osl
    )
    stall = tpot - dec * float(t.spec)
    d = tpot * t.osl
    assert 0.0 < stall < full
    assert stall == pytest.approx(full * d / (ttft + d), rel=1e-6)


def _decode_parts(gpu: str, n: int, tp: int, bw_eff: float, prefill: int = 0) -> dict[str, float]:
    s = make_setup("Llama-3.1-70B", gpu, n, tp=tp, quant="fp8", engine="vllm")
    f = replace(s.factors, nvlink_bw_eff=bw_eff)
    perf = build_perf(s.arch, s.quant, s.host, s.layout, f)
    raw = raw_step(perf, DecodeBatch(128, 128 * 2048), prefill_tokens=prefill)
    return {k: float(v) for k, v in combine(raw, f).items()}


def test_nvlink_bandwidth_efficiency_slows_decode_collectives_only() -> None:
    full, slow = _decode_parts("h200-sxm", 8, 8, 1.0), _decode_parts("h200-sxm", 8, 8, 0.25)
    assert slow["allreduce"] > full["allreduce"]
    assert slow["weights"] == full["weights"]
    # a step that carries a prefill chunk moves MB-size messages at the catalog's bus bandwidth
    assert _decode_parts("h200-sxm", 8, 8, 0.25, 2048) == _decode_parts("h200-sxm", 8, 8, 1.0, 2048)


def test_nvlink_bandwidth_efficiency_leaves_pcie_alone() -> None:
    pcie = ("rtx-pro-6000", 8, 8)
    assert _decode_parts(*pcie, 0.25) == _decode_parts(*pcie, 1.0)


def test_nvlink_bandwidth_efficiency_is_fitted_within_physical_bounds() -> None:
    lo, hi = FIT_BOUNDS["nvlink_bw_eff"]
    assert 0.0 < lo <= default_factors().nvlink_bw_eff <= hi <= 1.0

"""Measured operator tables (model/silicon.py) read off aiconfigurator-core's real files, as installed.

Each expected value is read from the package's parquet file here with pyarrow, independently of the
reader under test; nothing is copied or made up."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from servelab.errors import ConfigError
from servelab.model import silicon
from servelab.model.hardware import make_host
from servelab.model.predict import Workload, evaluate, make_setup, perf_of
from servelab.model.silicon import Curve


def _rows(path: Path, **match: object) -> dict[float, float]:
    """message bytes -> seconds of the rows matching `match`, straight from the file."""
    t = pq.read_table(path).to_pylist()
    out: dict[float, float] = {}
    for r in t:
        if all(r.get(k) == v for k, v in match.items()):
            b = float(r["message_size"]) * 2
            out[b] = min(out.get(b, math.inf), float(r["latency"]) * 1e-3)
    return out


def _root() -> Path:
    root = silicon.data_root()
    assert root is not None, "the silicon extra is a test dependency (pyproject [test])"
    return root


def test_the_engines_own_graph_allreduce_is_read_where_it_was_measured() -> None:
    curve = silicon.allreduce_curve("rtx_pro_6000_server", "vllm", 8)
    assert curve is not None and "comm/vllm/" in curve.table and "CUDA graph" in curve.table
    ver = curve.table.split("comm/vllm/")[1].split("/")[0]
    want = _rows(
        _root() / "rtx_pro_6000_server" / "comm" / "vllm" / ver / "custom_allreduce_perf.parquet",
        num_gpus=8,
        backend="vllm_graph",
    )
    assert dict(zip(curve.xs, curve.ys, strict=True)) == want
    look = curve.at(8192.0)  # 4096 BF16 elements: a row of the table
    assert look.source == "measured" and look.seconds == want[8192.0] and look.lo == look.hi == 8192.0


def test_between_two_rows_the_time_is_interpolated_in_log_log() -> None:
    curve = silicon.allreduce_curve("rtx_pro_6000_server", "sglang", 8)
    assert curve is not None
    lo, hi = 8192.0, 16384.0
    t_lo, t_hi = curve.at(lo).seconds, curve.at(hi).seconds
    mid = curve.at(math.sqrt(lo * hi))  # the geometric mean of the keys: the geometric mean of the times
    assert mid.source == "interpolated" and (mid.lo, mid.hi) == (lo, hi)
    assert mid.seconds == pytest.approx(math.sqrt(t_lo * t_hi), rel=1e-12)
    assert min(t_lo, t_hi) <= curve.at(12288.0).seconds <= max(t_lo, t_hi)


def test_past_the_table_is_said_to_be_extrapolated() -> None:
    curve = silicon.allreduce_curve("h200_sxm", "vllm", 8)
    assert curve is not None
    below, above = curve.at(curve.xs[0] / 4), curve.at(curve.xs[-1] * 4)
    assert below.source == above.source == "extrapolated"
    assert below.seconds == curve.ys[0]  # a smaller message costs the latency floor, not less
    assert above.seconds > curve.ys[-1]  # the last segment carried on


def test_nccl_when_the_engine_has_no_table_of_its_own() -> None:
    for engine in (None, "llamacpp", "transformers"):
        curve = silicon.allreduce_curve("rtx_pro_6000_server", engine, 4)
        assert curve is not None and "comm/nccl/" in curve.table and "all_reduce half 4 GPUs" in curve.table
    ver = curve.table.split("comm/nccl/")[1].split("/")[0]
    want = _rows(
        _root() / "rtx_pro_6000_server" / "comm" / "nccl" / ver / "nccl_perf.parquet",
        op_name="all_reduce",
        nccl_dtype="half",
        num_gpus=4,
    )
    assert dict(zip(curve.xs, curve.ys, strict=True)) == want


@pytest.mark.parametrize(
    ("gpu", "num", "ic", "ranks", "why"),
    [
        ("rtx-5090", 8, None, 8, "no measured operator data for rtx-5090"),
        ("rtx-pro-6000", 8, "pcie5-switch", 8, "measured over pcie5-cpu, this host is pcie5-switch"),
        ("h200-sxm", 16, None, 16, "cover one h200_sxm node (8 GPUs)"),
        ("h200-sxm", 8, None, 1, "one GPU: no allreduce"),
    ],
)
def test_the_formula_stays_where_no_table_covers_the_host(
    gpu: str, num: int, ic: str | None, ranks: int, why: str
) -> None:
    curve, reason = silicon.host_allreduce(make_host(gpu, num, ic), "vllm", ranks)
    assert curve is None and why in reason


def test_a_missing_rank_count_or_system_falls_back() -> None:
    assert silicon.allreduce_curve("rtx_pro_6000_server", "vllm", 3) is None  # measured on 2, 4, 8
    assert silicon.allreduce_curve("no_such_system", "vllm", 8) is None


def test_without_the_extra_silicon_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(silicon, "data_root", lambda: None)
    with pytest.raises(ConfigError) as exc:
        make_setup("GLM-5-NVFP4", "rtx-pro-6000", 8, tp=8, silicon=True)
    assert "aiconfigurator-core" in exc.value.message and "servelab[silicon]" in (exc.value.hint or "")
    # and without --silicon nothing asks for it
    assert evaluate(make_setup("GLM-5-NVFP4", "rtx-pro-6000", 8, tp=8), Workload(1024, 256, 1)).feasible


def test_curves_refuse_what_is_not_a_table() -> None:
    with pytest.raises(ValueError):
        Curve("t", (1.0,), (1.0,))
    with pytest.raises(ValueError):
        Curve("t", (2.0, 1.0), (1.0, 2.0))


def test_the_measured_allreduce_is_what_the_prediction_adds() -> None:
    """GLM-5 NVFP4, TP8 on 8× RTX PRO 6000, SGLang, one stream: 156 allreduces of one token's hidden
    state (6144 × 2 bytes), each read off SGLang's measured 8-GPU table, and nothing scales them."""
    setup = make_setup("GLM-5-NVFP4", "rtx-pro-6000", 8, tp=8, engine="sglang", silicon=True)
    p = evaluate(setup, Workload(1024, 1024, 1))
    curve = perf_of(setup).ar_curve
    assert curve is not None and p.allreduces_per_step == 156
    each = curve.at(6144 * 2).seconds
    assert p.decode_breakdown_ms["allreduce"] == pytest.approx(156 * each * 1e3, abs=1e-4)
    assert p.sources["allreduce"].startswith("interpolated: rtx_pro_6000_server comm/sglang/")
    assert {p.sources[k] for k in ("weights", "kv_cache", "compute", "moe_comm", "other")} == {"formula"}
    assert p.sources["routed_experts"].startswith("measured: rtx_pro_6000_server moe/sglang/")
    # the same factors without the tables: the formula's allreduce, the same weight and KV reads
    formula = evaluate(
        make_setup("GLM-5-NVFP4", "rtx-pro-6000", 8, tp=8, engine="sglang", factors=setup.factors),
        Workload(1024, 1024, 1),
    )
    assert formula.sources["allreduce"] == "formula" and formula.sources["routed_experts"] == "formula"
    assert formula.decode_breakdown_ms["allreduce"] != p.decode_breakdown_ms["allreduce"]
    for k in ("weights", "kv_cache"):
        assert p.decode_breakdown_ms[k] == formula.decode_breakdown_ms[k]


def test_the_moe_reader_keeps_the_engines_rows_for_this_shape_and_split() -> None:
    """DeepSeek-V3's routed experts (hidden 7168, 2048 per expert, top 8 of 256), block FP8, EP8."""
    curve = silicon.moe_curve("h200_sxm", "vllm", "fp8", 7168, 2048, 8, 256, 1, 8)
    assert curve is not None and "fp8_block" in curve.table and "tp1 ep8" in curve.table
    ver = curve.table.split("moe/vllm/")[1].split("/")[0]
    rows = pq.read_table(_root() / "h200_sxm" / "moe" / "vllm" / ver / "moe_perf.parquet").to_pylist()
    want = {
        float(r["num_tokens"]): float(r["latency"]) * 1e-3
        for r in rows
        if (r["moe_dtype"], r["hidden_size"], r["inter_size"], r["topk"], r["num_experts"])
        == ("fp8_block", 7168, 2048, 8, 256)
        and (r["moe_tp_size"], r["moe_ep_size"], r["distribution"]) == (1, 8, silicon.MOE_DISTRIBUTION)
    }
    assert dict(zip(curve.xs, curve.ys, strict=True)) == want
    # a shape nobody measured, or an engine without tables, is no curve
    assert silicon.moe_curve("h200_sxm", "vllm", "fp8", 7168, 2047, 8, 256, 1, 8) is None
    assert silicon.moe_curve("h200_sxm", "llamacpp", "fp8", 7168, 2048, 8, 256, 1, 8) is None
    assert silicon.moe_curve("h200_sxm", "vllm", "q4_k_m", 7168, 2048, 8, 256, 1, 8) is None


def test_measured_routed_experts_replace_their_reads_flops_and_floor() -> None:
    from servelab.model.step import DecodeBatch, combine, measured_moe_parts, raw_step

    measured = make_setup("DeepSeek-V3", "h200-sxm", 8, tp=8, ep=8, quant="fp8", engine="vllm", silicon=True)
    formula = make_setup(
        "DeepSeek-V3", "h200-sxm", 8, tp=8, ep=8, quant="fp8", engine="vllm", factors=measured.factors
    )
    pm, pf = perf_of(measured), perf_of(formula)
    assert pm.moe_curve is not None and pf.moe_curve is None
    batch = DecodeBatch(16, 16 * 1536)
    rm, rf = raw_step(pm, batch), raw_step(pf, batch)
    layers = measured.arch.n_moe_layers
    assert rm.moe_meas_s == pytest.approx(layers * pm.moe_curve.at(16).seconds, rel=1e-12)
    assert rf.moe_meas_s == 0 and rm.expert_dec_s == 0 < rf.expert_dec_s  # no tile floor beside a measurement
    assert rm.gemm_dec_s == pytest.approx(rf.gemm_dec_s - 16 * pm.routed_s_per_token, rel=1e-9)
    assert rm.weights_s < rf.weights_s and rm.weights_s + rm.moe_meas_mem_s == pytest.approx(rf.weights_s)
    # the measurement is split three ways, and the three add up to it
    mem, flops, fixed = measured_moe_parts(rm, measured.factors)
    assert min(mem, flops, fixed) >= 0 and mem + flops + fixed == pytest.approx(rm.moe_meas_s, rel=1e-12)
    parts = combine(rm, measured.factors)
    assert parts["other"] >= fixed
    p = evaluate(measured, Workload(1024, 1024, 16))
    assert (
        p.sources["routed_experts"].startswith("measured: h200_sxm moe/vllm/")
        and "(16 tokens)" in p.sources["routed_experts"]
    )
    assert abs(sum(p.decode_breakdown_ms.values()) - (p.decode_step_ms or 0)) <= 3e-4


def test_routed_experts_say_why_the_formula_stays() -> None:
    no_engine = evaluate(
        make_setup("DeepSeek-V3", "h200-sxm", 8, tp=8, ep=8, quant="fp8", silicon=True),
        Workload(1024, 1024, 4),
    )
    assert (
        no_engine.sources["routed_experts"]
        == "formula (name --engine (vllm, sglang or trtllm) to read its MoE kernels)"
    )
    gguf = evaluate(
        make_setup("Qwen3-30B-A3B", "h200-sxm", 1, tp=1, quant="q4_k_m", engine="vllm", silicon=True),
        Workload(1024, 1024, 4),
    )
    assert gguf.sources["routed_experts"].startswith("formula (no vllm MoE table for q4_k_m experts")
    dense = evaluate(make_setup("Llama-3.1-8B", "h200-sxm", 1, tp=1, engine="vllm", silicon=True), Workload())
    assert "routed_experts" not in dense.sources

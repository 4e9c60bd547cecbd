"""Time of one engine step (a decode batch plus an optional prefill chunk), with where it goes.

`build_perf()` does the per-(model, host, layout) work once; `step_time()` is then a few dozen float
operations, cheap enough for the simulator to call every scheduler step. Times are for one token's trip
through every pipeline stage (the TPOT of a micro-batch).

The step is a roofline per part: GEMMs cost max(weight bytes / bandwidth, FLOPs / peak), attention costs
max(KV bytes / bandwidth, FLOPs / peak); collectives cost latency × count + bytes / bus bandwidth; the
engine adds a per-step and a per-layer overhead. `raw_step()` returns the terms at unit efficiency so a
fit can rescale them with numpy arrays (see `combine()`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, TypedDict

import numpy as np

from servelab.model.architecture import Architecture
from servelab.model.comm import Fabric, allreduce_bw_s, gather_bw_s, make_fabric
from servelab.model.factors import Factors
from servelab.model.hardware import Host
from servelab.model.layouts import Layout
from servelab.model.quant import QuantScheme
from servelab.model.silicon import Curve

ACT_BYTES = 2.0  # activations on the wire are BF16
INDEX_KEY_BYTES = 1.0 + 4.0 / 128  # DSA indexer keys: FP8 + one FP32 scale per 128


@dataclass(frozen=True)
class DecodeBatch:
    """A summary of the sequences in a decode step: how many, and their total context."""

    n: int
    total_context: int


@dataclass(frozen=True)
class ModelPerf:
    """Per-GPU constants of one (model, quantization, host, layout, factors), built once."""

    arch: Architecture
    quant: QuantScheme
    host: Host
    layout: Layout
    factors: Factors
    fabric: Fabric
    mem_bw: float  # bytes/s, peak or measured
    fixed_weight_bytes: float  # read every step regardless of batch (attention, dense, shared, lm_head)
    expert_bytes: float  # one local expert shard, one layer
    local_experts: int
    dense_s_per_token: float  # GEMM seconds per token at unit efficiency, parts split over tp
    moe_s_per_token: float  # GEMM seconds per token at unit efficiency, parts split over the stage
    kv_full_bytes: float  # per context token, all full-attention layers, this GPU
    kv_sliding_bytes: float
    index_bytes: float  # DSA indexer keys per context token
    linear_state_bytes: float  # per sequence (read + written)
    attn_s_per_ctx: float  # decode attention seconds per (query, context token) at unit efficiency
    attn_pre_s_per_ctx: float
    index_s_per_ctx: float
    allreduces: int  # per token, whole pipeline
    ar_latency_s: float
    moe_collectives: int
    moe_latency_s: float
    p2p_latency_s: float
    expert_group_s: float = 0.0  # routed experts' GEMM seconds per row of every expert (per GPU)
    ar_curve: Curve | None = None  # one TP allreduce measured against its bytes (model/silicon.py), if any
    moe_curve: Curve | None = None  # one MoE layer's routed experts measured against its tokens, if any
    routed_s_per_token: float = 0.0  # the routed experts' part of moe_s_per_token


@dataclass(frozen=True)
class StepRaw:
    """Step terms at unit efficiency (floats, or numpy arrays when many steps are fitted at once)."""

    weights_s: Any
    kv_s: Any
    gemm_dec_s: Any
    gemm_pre_s: Any
    attn_dec_s: Any
    attn_pre_s: Any
    ar_n: Any
    ar_lat_s: Any
    ar_bw_s: Any
    moe_n: Any
    moe_lat_s: Any
    moe_bw_s: Any
    n_layers: Any
    expert_dec_s: Any = 0.0  # one row for every expert's grouped GEMM (decode tokens present), unit eff.
    expert_pre_s: Any = 0.0  # the same when a prefill chunk runs
    blackwell: Any = 0.0  # 1.0 on SM >= 100 GPUs (their FLOP efficiency is `blackwell_compute` × Hopper's)
    a2a_lat_s: Any = 0.0  # the MoE dispatch/combine share of moe_n × moe_lat_s (scaled by a2a_scale)
    n_seqs: Any = 0.0  # decode sequences per attention-DP rank (each costs seq_overhead_us of CPU work)
    n_moe_layers: Any = 0.0  # MoE layers in the pipeline (each adds moe_layer_us: routing, permutation)
    nvlink: Any = 0.0  # 1.0 when the collectives run over NVLink with catalog latencies (nvlink_lat_scale)
    moe_gemm_s: Any = 0.0  # the routed/shared experts' part of gemm_dec_s + gemm_pre_s (runs at expert_eff)
    ar_msg_bytes: Any = 0.0  # bytes one allreduce of this step reduces (tokens on the group × hidden × 2)
    ar_measured: Any = 0.0  # 1.0 when the allreduces are read off a measured table (no factor applies)
    ar_meas_lat_s: Any = 0.0  # measured: the table's smallest-message time × count (the latency floor)
    ar_meas_bw_s: Any = 0.0  # measured: the rest of the measured time (what the bytes add), all calls
    moe_meas_s: Any = 0.0  # measured routed-expert time, every MoE layer (then not in the terms above)
    moe_meas_mem_s: Any = 0.0  # the routed expert weights that step reads, at unit bandwidth efficiency
    moe_meas_flops_s: Any = 0.0  # the routed experts' FLOPs of that step, at unit efficiency

    @staticmethod
    def stack(items: Sequence[StepRaw]) -> StepRaw:
        return StepRaw(**{f.name: np.array([getattr(r, f.name) for r in items]) for f in fields(StepRaw)})


@dataclass(frozen=True)
class StepBreakdown:
    """Where a step's time goes, seconds; the parts sum to `total`."""

    weights: float
    kv_cache: float
    compute: float
    allreduce: float
    moe_comm: float
    other: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.compute + self.allreduce + self.moe_comm + self.other

    @property
    def comm(self) -> float:
        return self.allreduce + self.moe_comm

    def as_ms(self) -> dict[str, float]:
        return {
            "weights": self.weights * 1e3,
            "kv_cache": self.kv_cache * 1e3,
            "compute": self.compute * 1e3,
            "allreduce": self.allreduce * 1e3,
            "moe_comm": self.moe_comm * 1e3,
            "other": self.other * 1e3,
        }


def build_perf(
    arch: Architecture,
    quant: QuantScheme,
    host: Host,
    layout: Layout,
    factors: Factors,
    ar_curve: Curve | None = None,
    moe_curve: Curve | None = None,
) -> ModelPerf:
    """Everything that does not depend on the batch, per GPU, summed over the pipeline; `ar_curve`, a
    measured allreduce for this TP group, replaces the allreduce formula, and `moe_curve`, the measured
    routed experts of one MoE layer, replaces their weight reads, FLOPs and tile floor."""
    gpu = host.gpu
    tp, dp, ep, moe_tp = layout.tp, layout.dp, layout.ep, layout.moe_tp
    stage = tp * dp
    p = arch.layer_params()
    attn_b = p["attention"] * quant.bytes("attention") / tp
    dense_b = p["dense_mlp"] * quant.bytes("dense_mlp") / tp
    shared_b = arch.shared_params * arch.n_moe_layers * quant.bytes("shared_experts") / stage
    router_b = arch.router_params * arch.n_moe_layers * 2.0
    lm_b = arch.lm_head_params * quant.bytes("lm_head") / tp
    if arch.tie_embeddings:
        lm_b = arch.embed_params * quant.bytes("lm_head") / tp
    fixed = attn_b + dense_b + shared_b + router_b + lm_b

    def gemm_s(params: float, part: str) -> float:
        return 2.0 * params / (gpu.tflops(quant.compute(part)) * 1e12)

    lm_params = arch.embed_params if arch.tie_embeddings else arch.lm_head_params
    dense_s = (
        gemm_s(p["attention"], "attention")
        + gemm_s(p["dense_mlp"], "dense_mlp")
        + gemm_s(lm_params, "lm_head")
    ) / tp
    routed_s = gemm_s(arch.expert_params * arch.top_k * arch.n_moe_layers, "experts") / stage
    moe_s = gemm_s(arch.shared_params * arch.n_moe_layers, "shared_experts") / stage + routed_s

    # A grouped expert GEMM runs every local expert's tile even when few tokens pick it: the floor is
    # `expert_rows` rows of every expert's weights (all experts over the stage), fitted.
    expert_group = gemm_s(arch.expert_params * arch.num_experts * arch.n_moe_layers, "experts") / stage
    if gpu.is_cpu:
        expert_group = 0.0  # the floor is tensor-core tile padding; CPU GEMMs compute the rows they get
    kv_shard = max(1.0 / tp, 1.0 / arch.num_kv_heads)
    per_layer_kv = arch.kv_elems_per_token * quant.kv_bytes * kv_shard
    bf16 = gpu.tflops_bf16 * 1e12
    fabric = make_fabric(host.interconnect, factors)
    n_layers = arch.num_layers
    if dp == 1:
        allreduces = 2 * n_layers if tp > 1 else 0
        moe_coll = 0
    else:
        allreduces = (n_layers if tp > 1 else 0) + (2 * arch.n_dense_layers if tp > 1 else 0)
        moe_coll = 2 * arch.n_moe_layers
    return ModelPerf(
        arch=arch,
        quant=quant,
        host=host,
        layout=layout,
        factors=factors,
        fabric=fabric,
        mem_bw=(factors.mem_bw_gbs or gpu.memory_bw_gbs) * 1e9,
        fixed_weight_bytes=fixed,
        expert_bytes=arch.expert_params * quant.bytes("experts") / moe_tp * arch.n_moe_layers,
        local_experts=max(1, arch.num_experts // ep) if arch.is_moe else 0,
        dense_s_per_token=dense_s,
        moe_s_per_token=moe_s,
        expert_group_s=expert_group if arch.is_moe else 0.0,
        kv_full_bytes=arch.n_full_layers * per_layer_kv,
        kv_sliding_bytes=arch.n_sliding_layers * per_layer_kv,
        index_bytes=arch.n_full_layers * arch.index_elems_per_token * INDEX_KEY_BYTES,
        linear_state_bytes=arch.n_linear_layers * arch.linear_state_bytes / tp * 2.0,
        attn_s_per_ctx=arch.n_full_layers * arch.attn_flops_per_ctx / tp / bf16,
        attn_pre_s_per_ctx=arch.n_full_layers * arch.attn_prefill_flops_per_ctx / tp / bf16,
        index_s_per_ctx=arch.n_full_layers * arch.index_flops_per_ctx / tp / (gpu.tflops("fp8") * 1e12),
        allreduces=allreduces,
        ar_latency_s=fabric.latency_us(tp) * 1e-6,
        moe_collectives=moe_coll,
        moe_latency_s=fabric.latency_us(stage) * 1e-6,
        p2p_latency_s=(fabric.base_us * 1e-6) if layout.pp > 1 else 0.0,
        ar_curve=ar_curve if allreduces else None,
        moe_curve=moe_curve if arch.is_moe else None,
        routed_s_per_token=routed_s if arch.is_moe else 0.0,
    )


def _summarize(perf: ModelPerf, decode: DecodeBatch | Sequence[int]) -> tuple[int, float, float, float]:
    """n, total context, context the attention reads (DSA top-k), context in sliding windows."""
    topk, window = perf.arch.index_topk, perf.arch.sliding_window
    if isinstance(decode, DecodeBatch):
        n, tot = decode.n, float(decode.total_context)
        mean = tot / n if n else 0.0
        attended = n * min(mean, topk) if topk else tot
        windowed = n * min(mean, window) if window else 0.0
        return n, tot, attended, windowed
    ctx = list(decode)
    tot = float(sum(ctx))
    attended = float(sum(min(c, topk) for c in ctx)) if topk else tot
    windowed = float(sum(min(c, window) for c in ctx)) if window else 0.0
    return len(ctx), tot, attended, windowed


def raw_step(
    perf: ModelPerf,
    decode: DecodeBatch | Sequence[int] = (),
    prefill_tokens: int = 0,
    prefill_context: int = 0,
    tokens_per_seq: int = 1,
) -> StepRaw:
    """Step terms at unit efficiency for `decode` sequences (each adding `tokens_per_seq` tokens, >1 when
    verifying speculative drafts) plus a prefill chunk of `prefill_tokens` after `prefill_context` cached ones."""
    arch, dp = perf.arch, perf.layout.dp
    n, tot, attended, windowed = _summarize(perf, decode)
    dec_tokens = n * tokens_per_seq
    tokens = dec_tokens + prefill_tokens
    # Weights: every fixed part once; each local expert once if any token in the stage picks it.
    moe_read = 0.0
    if arch.is_moe and tokens > 0:
        moe_read = perf.local_experts * _picked(arch, tokens) * perf.expert_bytes
    # measured routed experts: the table's time replaces their reads, FLOPs and floor (kept apart below)
    routed = perf.moe_curve is not None and tokens > 0
    moe_meas = perf.moe_curve.at(tokens).seconds * arch.n_moe_layers if routed and perf.moe_curve else 0.0
    moe_meas_mem = moe_read / perf.mem_bw if routed else 0.0
    if routed:
        moe_read = 0.0
    weight_bytes = perf.fixed_weight_bytes + moe_read if tokens > 0 else 0.0
    # KV: decode sequences are spread over the dp groups; a prefill chunk lives on one group.
    dec_kv = (
        attended * perf.kv_full_bytes
        + windowed * perf.kv_sliding_bytes
        + tot * perf.index_bytes
        + n * perf.linear_state_bytes
    ) / dp
    pre_ctx = prefill_context + prefill_tokens / 2.0
    pre_att = min(pre_ctx, arch.index_topk) if arch.index_topk else pre_ctx
    pre_kv = prefill_context * (perf.kv_full_bytes + perf.index_bytes) if prefill_tokens else 0.0
    # GEMMs: attention/dense per dp group, experts over the whole stage.
    moe_tok = perf.moe_s_per_token - (perf.routed_s_per_token if routed else 0.0)
    gemm_dec = dec_tokens / dp * perf.dense_s_per_token + dec_tokens * moe_tok
    gemm_pre = prefill_tokens * (perf.dense_s_per_token + moe_tok)
    attn_dec = tokens_per_seq * (attended * perf.attn_s_per_ctx + tot * perf.index_s_per_ctx) / dp
    window_pre = min(pre_ctx, arch.sliding_window) if arch.sliding_window else 0.0
    attn_pre = prefill_tokens * (
        pre_att * perf.attn_pre_s_per_ctx * (arch.n_full_layers and 1)
        + pre_ctx * perf.index_s_per_ctx
        + window_pre * perf.attn_pre_s_per_ctx * arch.n_sliding_layers / max(arch.n_full_layers, 1)
    )
    # Collectives: message = tokens on this group × hidden × 2 bytes.
    group_tokens = dec_tokens / dp + prefill_tokens
    msg = group_tokens * arch.hidden_size * ACT_BYTES
    tp, stage = perf.layout.tp, perf.layout.tp * dp
    ar_bw = perf.allreduces * allreduce_bw_s(perf.fabric, tp, msg)
    moe_msg = tokens * arch.hidden_size * ACT_BYTES
    moe_bw = perf.moe_collectives * gather_bw_s(perf.fabric, stage, moe_msg)
    pp = perf.layout.pp
    p2p_n = pp - 1
    p2p_bw = p2p_n * msg / (perf.fabric.bus_gbs * 1e9)
    measured, meas_lat, meas_bw = 0.0, 0.0, 0.0
    if perf.ar_curve is not None and tokens > 0:
        each = perf.ar_curve.at(msg).seconds
        floor = min(perf.ar_curve.ys[0], each)
        measured, meas_lat, meas_bw = 1.0, perf.allreduces * floor, perf.allreduces * (each - floor)
    return StepRaw(
        weights_s=weight_bytes / perf.mem_bw,
        kv_s=(dec_kv + pre_kv) / perf.mem_bw,
        gemm_dec_s=gemm_dec,
        gemm_pre_s=gemm_pre,
        attn_dec_s=attn_dec,
        attn_pre_s=attn_pre,
        ar_n=perf.allreduces if tokens > 0 else 0,
        ar_lat_s=perf.ar_latency_s,
        ar_bw_s=ar_bw,
        moe_n=(perf.moe_collectives + p2p_n) if tokens > 0 else 0,
        moe_lat_s=(perf.moe_collectives * perf.moe_latency_s + p2p_n * perf.p2p_latency_s)
        / max(perf.moe_collectives + p2p_n, 1),
        a2a_lat_s=perf.moe_collectives * perf.moe_latency_s if tokens > 0 else 0.0,
        moe_bw_s=moe_bw + p2p_bw,
        n_layers=arch.num_layers,
        n_moe_layers=float(arch.n_moe_layers) if arch.is_moe else 0.0,
        n_seqs=n / dp,
        blackwell=1.0 if perf.host.gpu.sm >= 100 else 0.0,
        # the grouped GEMM's row floor is paid by the experts a token picked, not by idle ones: one decode
        # token of a top-8-of-256 model runs 8 experts' tiles, not 256 (the physics audit's finding)
        expert_dec_s=perf.expert_group_s * _picked(arch, dec_tokens)
        if dec_tokens > 0 and not routed
        else 0.0,
        expert_pre_s=(
            perf.expert_group_s * _picked(arch, prefill_tokens) if prefill_tokens > 0 and not routed else 0.0
        ),
        moe_gemm_s=(dec_tokens + prefill_tokens) * moe_tok,
        nvlink=1.0 if _catalog_nvlink(perf) else 0.0,
        ar_msg_bytes=msg if perf.allreduces else 0.0,
        ar_measured=measured,
        ar_meas_lat_s=meas_lat,
        ar_meas_bw_s=meas_bw,
        moe_meas_s=moe_meas,
        moe_meas_mem_s=moe_meas_mem,
        moe_meas_flops_s=tokens * perf.routed_s_per_token if routed else 0.0,
    )


def _picked(arch: Architecture, tokens: float) -> float:
    """The expected share of the experts that at least one of `tokens` routed tokens picks."""
    if not arch.is_moe or arch.num_experts <= 0:
        return 0.0
    return float(1.0 - (1.0 - arch.top_k / arch.num_experts) ** tokens)


def _catalog_nvlink(perf: ModelPerf) -> bool:
    """Collectives over NVLink at the catalog's latency (not a host measurement): `nvlink_lat_scale` applies."""
    return perf.host.interconnect.name.startswith("nvlink") and not perf.factors.allreduce_us


def _excess(mem: Any, flops: Any, p: float) -> Any:
    """The time FLOPs add over a memory read: a soft roofline (mem^p + flops^p)^(1/p) − mem."""
    hi = np.maximum(np.maximum(mem, flops), 1e-30)
    return hi * ((mem / hi) ** p + (flops / hi) ** p) ** (1.0 / p) - mem


def compute_work(raw: StepRaw, f: Factors) -> tuple[Any, Any]:
    """(GEMM, attention) seconds at the fitted efficiencies, before the roofline overlaps them with the
    weight and KV reads: the work the `compute` part is the uncovered excess of."""
    gen = 1.0 + raw.blackwell * (f.blackwell_compute - 1.0)
    # expert GEMM floor: at least `expert_rows` rows for every expert, in decode and in prefill steps
    floor = f.expert_rows * (raw.expert_dec_s + raw.expert_pre_s)
    # grouped expert GEMMs (few rows per expert, token permutation) run at `expert_eff` of a dense GEMM
    moe_extra = raw.moe_gemm_s * (1.0 / f.expert_eff - 1.0)
    gemm = (raw.gemm_dec_s / f.gemm_eff + (raw.gemm_pre_s + moe_extra) / f.prefill_eff + floor) / gen
    attn = (raw.attn_dec_s / f.attn_eff + raw.attn_pre_s / f.prefill_eff) / gen
    return gemm, attn


def allreduce_parts(raw: StepRaw, f: Factors) -> tuple[Any, Any]:
    """(latency, bandwidth) seconds of the step's allreduces, all of them together; they sum to the
    `allreduce` part of `combine()`. A measured allreduce is taken as read (no factor scales a
    measurement); the formula's latency and bus terms are scaled by the fitted factors."""
    lat = f.lat_scale * (1.0 + raw.nvlink * (f.nvlink_lat_scale - 1.0))
    m = raw.ar_measured
    formula_lat, formula_bw = raw.ar_n * raw.ar_lat_s * lat, raw.ar_bw_s / _wire_eff(raw, f)
    return (
        m * raw.ar_meas_lat_s + (1.0 - m) * formula_lat,
        m * raw.ar_meas_bw_s + (1.0 - m) * formula_bw,
    )


def _wire_eff(raw: StepRaw, f: Factors) -> Any:
    # decode-sized messages (tokens × hidden × 2 bytes: KBs to a few MB) move over NVLink at a fraction of
    # the bus bandwidth (NCCL's low-latency protocols); a step carrying a prefill chunk sends MB-size
    # messages at the catalog's bus bandwidth. Catalog NVLink only, like `nvlink_lat_scale`.
    small = raw.nvlink * np.where(np.asarray(raw.gemm_pre_s) > 0, 0.0, 1.0)
    return f.net_eff * (1.0 + small * (f.nvlink_bw_eff - 1.0))


def measured_moe_parts(raw: StepRaw, f: Factors) -> tuple[Any, Any, Any]:
    """(memory, compute, fixed) seconds of the measured routed experts, adding up to the measurement;
    zero where none were measured. Memory: their weight reads at the fitted bandwidth; compute: what
    their FLOPs (at the fitted grouped-GEMM efficiency) add beyond those reads; fixed: the rest."""
    gen = 1.0 + raw.blackwell * (f.blackwell_compute - 1.0)
    mem = np.minimum(raw.moe_meas_mem_s / f.bw_eff, raw.moe_meas_s)
    flops = raw.moe_meas_flops_s / (f.gemm_eff * f.expert_eff * gen)
    compute = np.clip(flops - mem, 0.0, raw.moe_meas_s - mem)
    return mem, compute, raw.moe_meas_s - mem - compute


class StepParts(TypedDict):
    """A step's time by part, in seconds (floats, or numpy arrays as `StepRaw`'s terms are); a dict, in
    this order, so that the parts read as `StepBreakdown`'s fields and add up to the step."""

    weights: Any
    kv_cache: Any
    compute: Any
    allreduce: Any
    moe_comm: Any
    other: Any


def step_total(parts: StepParts) -> Any:
    """The whole step: its parts added in their order (as `sum(parts.values())`)."""
    return sum(
        (
            parts["weights"],
            parts["kv_cache"],
            parts["compute"],
            parts["allreduce"],
            parts["moe_comm"],
            parts["other"],
        )
    )


def breakdown(parts: StepParts) -> StepBreakdown:
    """The parts of one step (floats) as a `StepBreakdown`."""
    return StepBreakdown(
        weights=float(parts["weights"]),
        kv_cache=float(parts["kv_cache"]),
        compute=float(parts["compute"]),
        allreduce=float(parts["allreduce"]),
        moe_comm=float(parts["moe_comm"]),
        other=float(parts["other"]),
    )


def combine(raw: StepRaw, f: Factors, comm: bool = True) -> StepParts:
    """Apply efficiency factors to raw terms; works on floats and on numpy arrays alike."""
    weights = raw.weights_s / f.bw_eff
    kv = raw.kv_s / f.bw_eff
    gemm, attn = compute_work(raw, f)
    compute = _excess(weights, gemm, f.roofline_p) + _excess(kv, attn, f.roofline_p)
    # measured routed experts, taken as measured and split so the parts keep their meaning: their weight
    # reads (at the fitted bandwidth) as weights, the FLOPs beyond those reads as compute, and the kernel's
    # fixed remainder (launch, routing, permutation) as other; the three add up to the measurement
    moe_mem, moe_flops, moe_rest = measured_moe_parts(raw, f)
    weights = weights + moe_mem
    compute = compute + moe_flops
    scale = 1.0 if comm else 0.0
    lat = f.lat_scale * (1.0 + raw.nvlink * (f.nvlink_lat_scale - 1.0))
    bw = _wire_eff(raw, f)
    ar_lat, ar_bw = allreduce_parts(raw, f)
    allreduce = scale * (ar_lat + ar_bw)
    moe_lat = (raw.moe_n * raw.moe_lat_s + (f.a2a_scale - 1.0) * raw.a2a_lat_s) * lat
    moe_comm = scale * (moe_lat + raw.moe_bw_s / bw)
    other = (
        f.step_overhead_ms * 1e-3
        + f.layer_overhead_us * 1e-6 * raw.n_layers
        + f.moe_layer_us * 1e-6 * raw.n_moe_layers
        + f.seq_overhead_us * 1e-6 * raw.n_seqs
        + moe_rest
    )
    return {
        "weights": weights,
        "kv_cache": kv,
        "compute": compute,
        "allreduce": allreduce,
        "moe_comm": moe_comm,
        "other": other,
    }


def step_time(
    perf: ModelPerf,
    decode: DecodeBatch | Sequence[int] = (),
    prefill_tokens: int = 0,
    prefill_context: int = 0,
    tokens_per_seq: int = 1,
    comm: bool = True,
) -> StepBreakdown:
    """The simulator's entry point: time of one step for these decode contexts and prefill chunk."""
    parts = combine(
        raw_step(perf, decode, prefill_tokens, prefill_context, tokens_per_seq), perf.factors, comm
    )
    return breakdown(parts)

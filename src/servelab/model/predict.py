"""The top-level prediction: TTFT, TPOT, throughput, memory and where the decode step goes.

Serving model (aggregated prefill + decode on one server, closed loop of `concurrency` requests that
start together and, with fixed lengths, keep restarting in waves; B: requests per DP group):
  TTFT = overhead + prefill(isl) + queue × (B - 1)^e × marginal_prefill(isl) + decode_step
  TPOT = decode_step(batch, mean context) / accept_len + interference × (B - 1)^i × marginal_prefill / osl
         × D / (TTFT + D)   (D = osl × TPOT: the share of the other requests' prefills after the first token)
`marginal_prefill` is one more request's prefill when batched with the wave's others: its FLOPs and
collective bytes, plus its share (isl / prefill_budget) of a step's weight reads, latencies and
overheads, and the grouped expert GEMM floor. e (`queue_exp`, fitted per engine) and i
(`interference_exp`) are fitted separately.
With PP the batch is split into `pp` micro-batches in flight at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.errors import ConfigError
from servelab.jsontypes import JsonObject
from servelab.model import silicon as _silicon
from servelab.model.architecture import Architecture, load_model
from servelab.model.factors import Factors, default_factors
from servelab.model.hardware import Host, make_host
from servelab.model.layouts import Layout, candidate_layouts, check_layout, replicas, validate
from servelab.model.memory import GB, MemoryPlan, plan_memory
from servelab.model.quant import QuantScheme, normalize_format, normalize_kv
from servelab.model.step import (
    DecodeBatch,
    ModelPerf,
    StepRaw,
    allreduce_parts,
    breakdown,
    build_perf,
    combine,
    compute_work,
    measured_moe_parts,
    raw_step,
    step_time,
    step_total,
)


@dataclass(frozen=True)
class Workload:
    isl: int = 1024
    osl: int = 1024
    concurrency: int = 1
    mtp_tokens: int = 0  # speculative draft tokens per step (MTP / next-n)
    accept_len: float = 1.0  # tokens emitted per verification step

    def __post_init__(self) -> None:
        if self.isl < 1 or self.osl < 1 or self.concurrency < 1:
            raise ConfigError("--isl, --osl and --concurrency must be at least 1")
        if self.accept_len < 1 or self.accept_len > self.mtp_tokens + 1:
            raise ConfigError(
                f"acceptance length {self.accept_len} must lie between 1 and mtp_tokens + 1 = {self.mtp_tokens + 1}"
            )


@dataclass(frozen=True)
class Setup:
    """A resolved (model, quantization, host, layout, factors)."""

    arch: Architecture
    quant: QuantScheme
    host: Host
    layout: Layout
    factors: Factors
    mem_fraction: float = 0.90
    silicon: bool = False  # measured operator tables where they cover this host (model/silicon.py)
    engine: str | None = None  # whose measured collectives apply (its own allreduce), with `silicon`


def perf_of(setup: Setup) -> ModelPerf:
    """The setup's per-GPU constants: with `silicon`, the TP allreduce read off the measured tables where
    they cover this host and engine (the formula elsewhere, and `sources` says which)."""
    curve, moe = None, None
    if setup.silicon:
        curve, _ = _silicon.host_allreduce(setup.host, setup.engine, setup.layout.tp)
        moe, _ = _host_moe(setup)
    return build_perf(setup.arch, setup.quant, setup.host, setup.layout, setup.factors, curve, moe)


def _host_moe(setup: Setup) -> tuple[_silicon.Curve | None, str]:
    """The measured routed-expert curve for this setup, or None with why the formula applies."""
    a, lay = setup.arch, setup.layout
    if not a.is_moe:
        return None, "dense model"
    if setup.engine not in _silicon.ENGINE_COMM:
        return None, "name --engine (vllm, sglang or trtllm) to read its MoE kernels"
    system, why = _silicon.host_system(setup.host)
    if system is None:
        return None, why
    inter = round(a.expert_params / (3.0 * a.hidden_size))
    curve = _silicon.moe_curve(
        system,
        setup.engine,
        setup.quant.experts,
        a.hidden_size,
        inter,
        a.top_k,
        a.num_experts,
        lay.moe_tp,
        lay.ep,
    )
    if curve is None:
        return None, (
            f"no {setup.engine} MoE table for {setup.quant.experts} experts of shape h{a.hidden_size} i{inter} "
            f"top{a.top_k} E{a.num_experts} at tp{lay.moe_tp} ep{lay.ep} on {system}"
        )
    return curve, ""


def sources(setup: Setup, perf: ModelPerf, msg_bytes: float, tokens: float) -> dict[str, str]:
    """Where each term of a prediction's decode step comes from: `formula` (the analytic roofline with
    fitted factors) or the measured table, with how the value was read off it (`tokens`: the step's
    tokens entering each MoE layer; `routed_experts` is part of the weights and compute terms)."""
    out = {k: "formula" for k in ("weights", "kv_cache", "compute", "moe_comm", "other")}
    if perf.allreduces == 0:
        out["allreduce"] = "none (one GPU per TP group)"
    elif perf.ar_curve is not None:
        out["allreduce"] = _lookup_text(perf.ar_curve.at(msg_bytes), msg_bytes, "B")
    else:
        why = _silicon.host_allreduce(setup.host, setup.engine, setup.layout.tp)[1] if setup.silicon else ""
        out["allreduce"] = "formula" + (f" ({why})" if why else "")
    if setup.arch.is_moe:
        if perf.moe_curve is not None:
            out["routed_experts"] = _lookup_text(perf.moe_curve.at(tokens), tokens, "tokens")
        else:
            why = _host_moe(setup)[1] if setup.silicon else ""
            out["routed_experts"] = "formula" + (f" ({why})" if why else "")
    return out


def _lookup_text(look: _silicon.Lookup, key: float, unit: str) -> str:
    where = (
        f" ({key:g} {unit} between {look.lo:g} and {look.hi:g})"
        if look.source == "interpolated"
        else f" ({key:g} {unit}, table ends at {look.lo:g})"
        if look.source == "extrapolated"
        else f" ({key:g} {unit})"
    )
    return f"{look.source}: {look.table}{where}"


def resolve_quant(arch: Architecture, quant: str | None, kv_dtype: str | None) -> QuantScheme:
    q = arch.native_quant
    if quant:
        q = q.with_weights(normalize_format(quant))
    if kv_dtype:
        from dataclasses import replace

        q = replace(q, kv_dtype=normalize_kv(kv_dtype))
    return q


def make_setup(
    model: str | Architecture,
    gpu: str,
    num_gpus: int,
    tp: int | None = None,
    pp: int = 1,
    ep: int = 1,
    dp: int = 1,
    quant: str | None = None,
    kv_dtype: str | None = None,
    interconnect: str | None = None,
    factors: Factors | None = None,
    engine: str | None = None,
    mem_fraction: float = 0.90,
    silicon: bool = False,
) -> Setup:
    """Resolve names to a setup; `silicon` asks for measured operator tables (the extra must be
    installed: a clear error otherwise)."""
    if silicon:
        _silicon.require()
    arch = load_model(model) if isinstance(model, str) else model
    host = make_host(gpu, num_gpus, interconnect)
    if tp is None:
        tp = max(1, num_gpus // (pp * dp))
    layout = Layout(tp=tp, pp=pp, ep=ep, dp=dp)
    validate(arch, layout, num_gpus)
    return Setup(
        arch,
        resolve_quant(arch, quant, kv_dtype),
        host,
        layout,
        factors or default_factors(engine, silicon),
        mem_fraction,
        silicon,
        engine,
    )


@dataclass(frozen=True)
class Terms:
    """The factor-independent inputs of `latencies()`; numpy arrays when fitting many rows at once."""

    dec: StepRaw
    pre: StepRaw
    per_group: Any  # running requests per attention-DP group
    running: Any
    osl: Any
    spec: Any  # (1 + draft cost) / accept_len
    isl: Any = 1024.0


def prefill_marginal(pre: StepRaw, f: Factors, isl: Any) -> Any:
    """Cost of one more request's prefill when the engine batches it with others (seconds).

    Batched prefills share a step's fixed costs: weights, collective latency and per-step overhead are
    paid once per `prefill_budget` tokens (the engine's max-batched-tokens), while FLOPs and the
    collectives' bytes grow with every token."""
    parts = combine(pre, f)
    gen = 1.0 + pre.blackwell * (f.blackwell_compute - 1.0)
    moe_extra = pre.moe_gemm_s * (1.0 / f.expert_eff - 1.0)
    flops = (pre.gemm_pre_s + moe_extra + pre.attn_pre_s) / f.prefill_eff / gen
    ar_lat, ar_bw = allreduce_parts(pre, f)
    comm_bw = ar_bw + pre.moe_bw_s / f.net_eff
    # the measured routed experts' FLOP share grows with the tokens (their reads and fixed part are in
    # `parts`, paid once per batched step)
    flops = flops + measured_moe_parts(pre, f)[1]
    lat = f.lat_scale * (1.0 + pre.nvlink * (f.nvlink_lat_scale - 1.0))
    fixed = parts["weights"] + parts["kv_cache"] + ar_lat
    moe_lat = (pre.moe_n * pre.moe_lat_s + (f.a2a_scale - 1.0) * pre.a2a_lat_s) * lat
    # the grouped expert GEMM's floor (rows of every expert) is paid once per batched step, like weights
    floor = f.expert_rows * pre.expert_pre_s / gen
    fixed = fixed + np.maximum(floor - parts["weights"], 0.0) + moe_lat + parts["other"]
    share = np.minimum(isl / f.prefill_budget, 1.0)
    return np.maximum(flops + comm_bw, 0.0) + fixed * share


def latencies(t: Terms, f: Factors) -> tuple[Any, Any, Any]:
    """(decode step, TPOT, TTFT) in seconds from the terms; floats or arrays.

    The benchmark is a closed loop whose C requests start (and, with fixed lengths, keep restarting)
    together, so each wave's prefills queue: a request waits on average for `prefill_queue` × (B − 1)
    other prefills, each costing its batched (marginal) time, and the requests that finished prefill
    first stall their decodes while the rest of the wave prefills (spread over osl tokens). Of the other
    requests' prefills in one cycle, only those after this request's first token are in its TPOT
    (`decode_time`)."""
    dec = step_total(combine(t.dec, f))
    pre = step_total(combine(t.pre, f))
    marg = prefill_marginal(t.pre, f, t.isl)
    # the queue counts every running request: attention-DP ranks prefill in lockstep through the MoE stage
    others = np.maximum(t.running - 1.0, 0.0) ** f.queue_exp
    stalls = np.maximum(t.per_group - 1.0, 0.0) ** f.interference_exp
    ttft = (
        f.ttft_overhead_ms * 1e-3
        + pre
        + (f.prefill_wait + np.maximum(t.isl / f.prefill_budget, 1.0)) * np.where(t.running > 1, dec, 0.0)
        + f.prefill_queue * others * marg
    )
    tpot = decode_time(dec * t.spec * t.osl, f.prefill_interference * stalls * marg, ttft) / t.osl
    return dec, tpot, ttft


def decode_time(steps: Any, stall: Any, ttft: Any) -> Any:
    """A request's decode phase D (first token to last, seconds) in the closed loop (round 6).

    In one cycle (TTFT + D) each of the other running requests finishes and is replaced once, and its
    prefill stalls the shared steps; the stall is spread over the cycle, so only the share D / (TTFT + D)
    that falls after this request's first token lands in its TPOT (the rest is in its TTFT, the queue):
    D = steps + stall × D / (TTFT + D), the positive root of D² + (TTFT − steps − stall)·D − steps·TTFT = 0.
    With TTFT → 0 it is steps + stall (the round-5 law); short outputs behind long queues stall less.
    """
    b = ttft - steps - stall
    q = np.sqrt(b * b + 4.0 * steps * ttft)
    # the two algebraically equal forms of the root, each free of cancellation on its side of b = 0
    return np.where(b > 0, 2.0 * steps * ttft / np.maximum(q + b, 1e-30), (q - b) / 2.0)


def kv_context(wl: Workload, f: Factors) -> int:
    """Tokens of KV one running request holds for the engine's scheduler (`Factors.kv_reserve`)."""
    return max(1, round(wl.isl + f.kv_reserve * wl.osl))


def make_terms(perf: ModelPerf, mem: MemoryPlan, wl: Workload) -> Terms:
    maxc = mem.max_concurrency(kv_context(wl, perf.factors))
    running = max(1, min(wl.concurrency, maxc)) if maxc > 0 else wl.concurrency
    micro = min(perf.layout.pp, running)
    b = running / micro
    ctx = wl.isl + wl.osl / 2.0
    dec = raw_step(perf, DecodeBatch(b, b * ctx), tokens_per_seq=1 + wl.mtp_tokens)  # type: ignore[arg-type]
    pre = raw_step(perf, (), prefill_tokens=wl.isl)
    draft = wl.mtp_tokens * 2.0 / perf.arch.num_layers  # one MTP layer + lm_head per draft token
    return Terms(
        dec=dec,
        pre=pre,
        per_group=running / perf.layout.dp,
        running=running,
        osl=float(wl.osl),
        spec=(1.0 + draft) / wl.accept_len,
        isl=float(wl.isl),
    )


@dataclass
class Prediction:
    """What `servelab predict --json` returns (see docs/cli/predict.md)."""

    feasible: bool
    reason: str | None
    model: str
    gpu: str
    num_gpus: int
    interconnect: str
    layout: dict[str, int]
    quant: dict[str, str]
    workload: dict[str, float]  # isl, osl, concurrency, mtp_tokens, accept_len
    tpot_ms: float | None = None
    ttft_ms: float | None = None
    output_throughput: float | None = None
    per_user_tok_s: float | None = None
    decode_step_ms: float | None = None
    decode_breakdown_ms: dict[str, float] = field(default_factory=dict)
    prefill_ms: float | None = None
    prefill_breakdown_ms: dict[str, float] = field(default_factory=dict)
    prefill_stall_ms_per_token: float | None = None
    allreduce_share: float | None = None
    allreduces_per_step: int = 0
    allreduce_us_each: float | None = None  # one decode allreduce at this batch: latency + bandwidth
    allreduce_latency_us_each: float | None = None
    allreduce_bytes_each: float | None = None  # the message one decode allreduce reduces, bytes
    decode_compute_work_ms: float | None = None  # GEMM + attention time before the roofline overlap
    bottleneck: str | None = None
    memory_gb_per_gpu: dict[str, float] = field(default_factory=dict)
    kv_cache_tokens: int = 0
    max_concurrency: int = 0
    running_concurrency: int = 0
    single_stream_ceiling_tok_s: float | None = None
    single_stream_tok_s: float | None = None
    replicas: int = 1  # copies of the layout on the host; latencies are one replica's, throughput all of them
    warnings: list[str] = field(default_factory=list)
    # where each decode-step term comes from: "formula", or the measured table and how it was read
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def gpu_s_per_m_output_tokens(self) -> float | None:
        """GPU-seconds a million output tokens take on the GPUs of every replica: what the `energy` and
        `cost` objectives follow (at a fixed power and a fixed price per GPU-hour)."""
        if not self.output_throughput:
            return None
        lay = self.layout
        gpus = (lay.get("tp") or 1) * (lay.get("pp") or 1) * (lay.get("dp_attention") or 1) * self.replicas
        return gpus / self.output_throughput * 1e6

    def to_dict(self) -> JsonObject:
        from dataclasses import asdict

        return asdict(self)


def _infeasible_reason(mem: MemoryPlan, wl: Workload, mem_fraction: float) -> str | None:
    usable = mem.capacity * mem_fraction
    if mem.weights + mem.activations > usable:
        return (
            f"weights {mem.weights / GB:.1f} GB + activations {mem.activations / GB:.1f} GB per GPU "
            f"> {usable / GB:.1f} GB usable ({mem_fraction:.0%} of {mem.capacity / GB:.0f} GB)"
        )
    need = wl.isl + wl.osl
    if mem.max_concurrency(need) < 1:
        return (
            f"KV cache of {mem.kv_cache / GB:.1f} GB per GPU holds {mem.kv_cache_tokens} tokens, "
            f"less than one request of {need} tokens"
        )
    return None


def evaluate(
    setup: Setup, wl: Workload, perf: ModelPerf | None = None, mem: MemoryPlan | None = None
) -> Prediction:
    """Predict one configuration (perf/mem may be passed in when already built)."""
    perf = perf or perf_of(setup)
    mem = mem or plan_memory(
        setup.arch, setup.quant, setup.host, setup.layout, setup.mem_fraction, with_mtp=wl.mtp_tokens > 0
    )
    q = setup.quant
    out = Prediction(
        feasible=False,
        reason=None,
        model=setup.arch.name,
        gpu=setup.host.gpu.name,
        num_gpus=setup.host.num_gpus,
        interconnect=setup.host.interconnect.name,
        layout={
            "tp": setup.layout.tp,
            "pp": setup.layout.pp,
            "ep": setup.layout.ep,
            "dp_attention": setup.layout.dp,
        },
        quant={
            "attention": q.attention,
            "dense_mlp": q.dense_mlp,
            "experts": q.experts,
            "kv_cache": q.kv_dtype,
        },
        workload={
            "isl": wl.isl,
            "osl": wl.osl,
            "concurrency": wl.concurrency,
            "mtp_tokens": wl.mtp_tokens,
            "accept_len": wl.accept_len,
        },
        memory_gb_per_gpu={k: round(v, 3) for k, v in mem.as_gb().items()},
        kv_cache_tokens=mem.kv_cache_tokens,
        max_concurrency=mem.max_concurrency(kv_context(wl, setup.factors)),
        allreduces_per_step=perf.allreduces,
    )
    out.replicas = replicas(setup.layout, setup.host.num_gpus)
    reason = _infeasible_reason(mem, wl, setup.mem_fraction)
    if reason:
        out.reason = reason
        return out
    total = wl.concurrency
    if out.replicas > 1:  # a router spreads the requests evenly; each replica serves its share
        wl = Workload(wl.isl, wl.osl, ceil_div(total, out.replicas), wl.mtp_tokens, wl.accept_len)
    terms = make_terms(perf, mem, wl)
    f = setup.factors
    dec_s, tpot, ttft = (float(x) for x in latencies(terms, f))
    running = int(terms.running)
    if wl.concurrency > running:
        out.warnings.append(
            f"concurrency {wl.concurrency} exceeds the {running} requests the KV cache holds; the rest queue"
        )
        ttft += (wl.concurrency / running - 1.0) * (ttft + wl.osl * tpot)
    dec = breakdown(combine(terms.dec, f))
    pre = breakdown(combine(terms.pre, f))
    e2e = ttft + max(wl.osl - 1, 0) * tpot
    ceiling = step_time(perf, DecodeBatch(1, wl.isl + wl.osl // 2), comm=False).total
    single = step_time(perf, DecodeBatch(1, wl.isl + wl.osl // 2)).total
    parts = dec.as_ms()
    out.feasible = True
    out.tpot_ms = tpot * 1e3
    out.ttft_ms = ttft * 1e3
    out.output_throughput = total * wl.osl / e2e if e2e > 0 else 0.0
    out.per_user_tok_s = 1.0 / tpot if tpot > 0 else 0.0
    out.decode_step_ms = dec_s * 1e3
    out.decode_breakdown_ms = {k: round(v, 4) for k, v in parts.items()}
    out.prefill_ms = pre.total * 1e3
    out.prefill_breakdown_ms = {k: round(v, 4) for k, v in pre.as_ms().items()}
    out.prefill_stall_ms_per_token = max(tpot - dec_s * float(terms.spec), 0.0) * 1e3
    out.allreduce_share = dec.allreduce / dec.total if dec.total > 0 else 0.0
    if perf.allreduces:
        # per allreduce at this batch: the printed count × this is the `allreduce` part exactly
        ar_lat, _ar_bw = (float(x) for x in allreduce_parts(terms.dec, f))
        out.allreduce_us_each = dec.allreduce / perf.allreduces * 1e6
        out.allreduce_latency_us_each = ar_lat / perf.allreduces * 1e6
        out.allreduce_bytes_each = float(terms.dec.ar_msg_bytes)
    out.decode_compute_work_ms = sum(float(x) for x in compute_work(terms.dec, f)) * 1e3
    out.sources = sources(
        setup,
        perf,
        float(terms.dec.ar_msg_bytes),
        float(terms.running) / min(setup.layout.pp, terms.running) * (1 + wl.mtp_tokens),
    )
    out.bottleneck = max(parts, key=lambda k: parts[k])
    out.running_concurrency = running
    out.single_stream_ceiling_tok_s = 1.0 / ceiling if ceiling > 0 else None
    out.single_stream_tok_s = 1.0 / single if single > 0 else None
    return out


def predict(
    model: str | Architecture,
    gpu: str,
    num_gpus: int,
    workload: Workload | None = None,
    **setup_kwargs: Any,
) -> Prediction:
    """One prediction from names: `predict("GLM-5-NVFP4", "rtx-pro-6000", 8, Workload(...), tp=8)`."""
    return evaluate(make_setup(model, gpu, num_gpus, **setup_kwargs), workload or Workload())


def sweep(setup: Setup, wl: Workload, concurrencies: list[int]) -> list[Prediction]:
    """Throughput and TPOT against concurrency (perf and memory built once)."""
    perf = perf_of(setup)
    mem = plan_memory(
        setup.arch, setup.quant, setup.host, setup.layout, setup.mem_fraction, with_mtp=wl.mtp_tokens > 0
    )
    out = []
    for c in concurrencies:
        w = Workload(wl.isl, wl.osl, c, wl.mtp_tokens, wl.accept_len)
        out.append(evaluate(setup, w, perf, mem))
    return out


@dataclass(frozen=True)
class Capacity:
    """The most load a configuration holds under latency limits, as the model predicts it."""

    concurrency: int | None  # None: not even one stream meets the limits
    rate: float | None  # requests/s at that concurrency (Little's law: concurrency / E2E)
    prediction: Prediction | None  # the prediction at that concurrency


def capacity(
    setup: Setup,
    isl: int,
    osl: int,
    tpot_ms: float | None = None,
    ttft_ms: float | None = None,
    highest: int = 4096,
) -> Capacity:
    """The highest closed-loop concurrency whose predicted TPOT and TTFT meet the limits (both rise with
    the load, so a bisection over 1..`highest` finds it), and the request rate that concurrency serves.
    The model predicts each metric once per load (the simulator's TPOT spreads little around it, so a
    percentile limit reads as this value); `bench --find-capacity` against `servelab sim` lands on it."""
    perf = perf_of(setup)
    mem = plan_memory(setup.arch, setup.quant, setup.host, setup.layout, setup.mem_fraction)

    def at(c: int) -> Prediction:
        return evaluate(setup, Workload(isl, osl, c), perf, mem)

    def meets(p: Prediction) -> bool:
        if not p.feasible:
            return False
        return (tpot_ms is None or (p.tpot_ms or 0.0) <= tpot_ms) and (
            ttft_ms is None or (p.ttft_ms or 0.0) <= ttft_ms
        )

    if not meets(at(1)):
        return Capacity(None, None, None)
    lo, hi = 1, highest
    if meets(at(hi)):
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if meets(at(mid)) else (lo, mid)
    best = at(lo)
    e2e_s = ((best.ttft_ms or 0.0) + max(osl - 1, 0) * (best.tpot_ms or 0.0)) / 1000
    return Capacity(lo, lo / e2e_s if e2e_s > 0 else None, best)


@dataclass
class LayoutResult:
    label: str
    layout: dict[str, int]
    rank: int | None
    prediction: Prediction
    verdict: str  # why it wins or loses
    same_as: list[str] = field(default_factory=list)  # layouts folded into this row: identical predictions


def _why_loses(p: Prediction, best: Prediction) -> str:
    if not p.feasible:
        return f"does not fit: {p.reason}"
    ratio = (p.output_throughput or 0) / (best.output_throughput or 1)
    diffs = {
        k: p.decode_breakdown_ms.get(k, 0) - best.decode_breakdown_ms.get(k, 0) for k in p.decode_breakdown_ms
    }
    worst = max(diffs, key=lambda k: diffs[k])
    msg = f"{ratio:.0%} of the best throughput"
    if p.running_concurrency < best.running_concurrency:
        msg += f"; KV cache caps it at {p.running_concurrency} running requests"
    if diffs[worst] > 0:
        msg += f"; {worst} costs {diffs[worst]:+.2f} ms per decode step"
    if (p.prefill_ms or 0) > (best.prefill_ms or 0) * 1.1:
        msg += f"; prefill {p.prefill_ms:.0f} ms vs {best.prefill_ms:.0f} ms"
    return msg


def _label(layout: Layout, p: Prediction) -> str:
    return f"{layout.label} ×{p.replicas}" if p.replicas > 1 else layout.label


EP_SAME = (
    "the model prices an EP split like the TP split of the experts it replaces (each GPU reads the same "
    "expert bytes, the collectives are the same), so EP does not change the prediction"
)


def _signature(p: Prediction) -> tuple[Any, ...]:
    """What a layout's row shows and ranks on, rounded past float noise: equal signatures are one row."""

    def r(v: float | None) -> float | None:
        return None if v is None else float(f"{v:.9g}")

    return (
        p.feasible,
        p.reason,
        p.replicas,
        r(p.output_throughput),
        r(p.tpot_ms),
        r(p.ttft_ms),
        r(p.prefill_ms),
        p.running_concurrency,
        tuple(sorted((k, r(v)) for k, v in p.memory_gb_per_gpu.items())),
        tuple(sorted((k, r(v)) for k, v in p.decode_breakdown_ms.items())),
    )


def compare_layouts(
    setup: Setup,
    wl: Workload,
    tpot_limit_ms: float | None = None,
    ttft_limit_ms: float | None = None,
) -> list[LayoutResult]:
    """Rank every valid layout on this host by output throughput under optional latency limits.

    Layouts that differ only in EP and predict exactly the same are one row (the lowest EP), the others
    named in `same_as`: the model has no term that EP changes (see `EP_SAME`)."""
    results: list[tuple[Layout, Prediction, str | None]] = []
    seen: dict[tuple[Any, ...], list[str]] = {}
    for layout in candidate_layouts(setup.arch, setup.host.num_gpus, with_replicas=True):
        s = Setup(
            setup.arch,
            setup.quant,
            setup.host,
            layout,
            setup.factors,
            setup.mem_fraction,
            setup.silicon,
            setup.engine,
        )
        p = evaluate(s, wl)
        if p.replicas > 1 and not p.feasible:
            continue  # a smaller layout that does not fit is listed once, as the full-host one
        key = (layout.tp, layout.pp, layout.dp, _signature(p))
        if key in seen:
            seen[key].append(_label(layout, p))
            continue
        seen[key] = []
        limit = None
        if p.feasible and tpot_limit_ms and (p.tpot_ms or 0) > tpot_limit_ms:
            limit = f"TPOT {p.tpot_ms:.1f} ms > limit {tpot_limit_ms:g} ms"
        if p.feasible and ttft_limit_ms and (p.ttft_ms or 0) > ttft_limit_ms:
            limit = f"TTFT {p.ttft_ms:.0f} ms > limit {ttft_limit_ms:g} ms"
        results.append((layout, p, limit))
    ok = sorted(
        [r for r in results if r[1].feasible and r[2] is None], key=lambda r: -(r[1].output_throughput or 0)
    )
    rest = [r for r in results if not (r[1].feasible and r[2] is None)]
    rest.sort(key=lambda r: (not r[1].feasible, -(r[1].output_throughput or 0)))
    out: list[LayoutResult] = []
    best = ok[0][1] if ok else None

    def same(layout: Layout, p: Prediction) -> list[str]:
        return seen[(layout.tp, layout.pp, layout.dp, _signature(p))]

    for i, (layout, p, _) in enumerate(ok):
        verdict = "best" if i == 0 else _why_loses(p, best)  # type: ignore[arg-type]
        out.append(LayoutResult(_label(layout, p), p.layout, i + 1, p, verdict, same(layout, p)))
    for layout, p, limit in rest:
        verdict = limit or (f"does not fit: {p.reason}" if not p.feasible else "")
        out.append(LayoutResult(_label(layout, p), p.layout, None, p, verdict, same(layout, p)))
    return out


def layout_is_valid(arch: Architecture, layout: Layout, num_gpus: int) -> bool:
    return check_layout(arch, layout, num_gpus) is None


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b)

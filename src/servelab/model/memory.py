"""GPU memory per rank: weights, activations, reserved, and what is left for the KV cache."""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.model.architecture import Architecture
from servelab.model.hardware import Host
from servelab.model.layouts import Layout
from servelab.model.quant import QuantScheme
from servelab.model.step import INDEX_KEY_BYTES

GB = 1e9


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory (bytes) of the fullest pipeline stage, and the KV capacity it leaves."""

    weights: float
    activations: float
    reserved: float
    kv_cache: float
    capacity: float
    kv_bytes_per_token: float  # one token of context, this GPU (all its layers)
    state_bytes_per_seq: float  # linear-attention state per sequence
    kv_cache_tokens: int  # per attention-DP group
    dp: int

    @property
    def fits(self) -> bool:
        return self.kv_cache > 0

    def max_concurrency(self, context: int) -> int:
        """Sequences of `context` tokens that fit at once, over all attention-DP groups."""
        per_seq = self.kv_bytes_per_token * context + self.state_bytes_per_seq
        if per_seq <= 0 or self.kv_cache <= 0:
            return 0
        return int(self.kv_cache // per_seq) * self.dp

    def as_gb(self) -> dict[str, float]:
        return {
            "weights": self.weights / GB,
            "kv_cache": max(self.kv_cache, 0.0) / GB,
            "activations": self.activations / GB,
            "reserved": self.reserved / GB,
            "total": self.capacity / GB,
        }


def plan_memory(
    arch: Architecture,
    quant: QuantScheme,
    host: Host,
    layout: Layout,
    mem_fraction: float = 0.90,
    chunk_tokens: int = 8192,
    with_mtp: bool = False,
) -> MemoryPlan:
    """Weights of the fullest stage per GPU; the engine's memory fraction bounds weights + KV + activations."""
    tp, pp, stage = layout.tp, layout.pp, layout.tp * layout.dp
    layers = math.ceil(arch.num_layers / pp)
    frac = layers / arch.num_layers
    p = arch.layer_params()
    w = (
        p["attention"] * quant.bytes("attention") / tp
        + p["dense_mlp"] * quant.bytes("dense_mlp") / tp
        + arch.shared_params * arch.n_moe_layers * quant.bytes("shared_experts") / stage
        + arch.router_params * arch.n_moe_layers * 2.0
        + arch.expert_params * arch.num_experts * arch.n_moe_layers * quant.bytes("experts") / stage
    ) * frac
    embed = arch.embed_params * 2.0 / tp
    head = arch.lm_head_params * quant.bytes("lm_head") / tp
    w += embed + head if pp == 1 else max(embed, head)
    if with_mtp and arch.mtp_layers:
        w += arch.mtp_params * quant.bytes("experts" if arch.is_moe else "dense_mlp") / stage
    inter_local = max(arch.dense_mlp_params, arch.expert_params * arch.top_k) / (3 * arch.hidden_size) / tp
    activations = chunk_tokens * (24 * arch.hidden_size + 6 * inter_local) + 256 * arch.vocab_size * 4 / tp
    capacity = host.gpu.memory_gb * GB
    reserved = capacity * (1 - mem_fraction)
    kv = capacity - reserved - w - activations
    kv_shard = max(1.0 / tp, 1.0 / arch.num_kv_heads)
    per_tok = (
        (arch.n_full_layers + arch.n_sliding_layers) * arch.kv_elems_per_token * quant.kv_bytes * kv_shard
        + arch.n_full_layers * arch.index_elems_per_token * INDEX_KEY_BYTES
    ) * frac
    state = arch.n_linear_layers * arch.linear_state_bytes / tp * frac
    tokens = int(kv // per_tok) if kv > 0 and per_tok > 0 else 0
    return MemoryPlan(
        weights=w,
        activations=activations,
        reserved=reserved,
        kv_cache=kv,
        capacity=capacity,
        kv_bytes_per_token=per_tok,
        state_bytes_per_seq=state,
        kv_cache_tokens=tokens,
        dp=layout.dp,
    )

"""Hugging Face `config.json` → a layer inventory: parameter counts per part, KV bytes per token,
attention FLOPs per context token.

Decode time is mostly bytes read per step, so the inventory keeps what each part weighs (attention,
dense MLP, each routed expert, shared experts, lm_head) rather than one total. Families covered: dense
GQA (Llama, Qwen3), MoE with shared experts and first-k-dense layers (Qwen3-MoE, Mixtral, gpt-oss,
MiniMax, Qwen3.5 with linear attention), MLA (DeepSeek-V3, Kimi-K2.5), GLM-5's `glm_moe_dsa` (MLA plus
a top-k sparse-attention indexer), Llama 4 (MoE interleaved with dense layers, a shared expert
per MoE layer), Qwen3-Next (gated DeltaNet linear attention), Gemma 3 (sliding-window layers interleaved
with global ones, `sliding_window_pattern`), and MTP/next-n layers.

Multimodal configs are read through their `text_config`: the counts are the language model's and the
vision tower is excluded (it is under 1 B parameters for every bundled multimodal model; the published
figures these counts are checked against, `data/model_configs/published.toml`, are stated the same way).
Facts about an architecture that its config.json does not state live in `data/model_families.toml`,
among them the fields a publisher leaves to transformers' config class defaults (Gemma 3's vocabulary).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from servelab.errors import ConfigError, NotFoundError
from servelab.model.context import ContextFacts, facts_of
from servelab.model.quant import QuantScheme, scheme_from_config

REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
MLA_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True)
class Architecture:
    """What a transformer weighs and reads, part by part (parameters are counts, not bytes)."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    tie_embeddings: bool
    attention_kind: str  # "gqa" | "mla"
    num_heads: int
    num_kv_heads: int  # heads the KV cache shards over (1 for MLA's shared latent)
    attn_params: float  # per softmax-attention layer (incl. indexer)
    n_full_layers: int  # softmax attention over the whole context
    n_sliding_layers: int  # softmax attention over a window
    sliding_window: int
    n_linear_layers: int  # linear attention (fixed-size recurrent state)
    linear_attn_params: float
    linear_state_bytes: float  # per sequence per linear layer
    kv_elems_per_token: int  # per softmax-attention layer
    attn_flops_per_ctx: float  # decode: FLOPs per (query token, context token) per layer, all heads
    attn_prefill_flops_per_ctx: float
    index_topk: int  # DSA: context tokens the sparse attention reads (0 = dense attention)
    index_elems_per_token: int
    index_flops_per_ctx: float
    n_dense_layers: int
    dense_mlp_params: float  # per dense layer
    n_moe_layers: int
    num_experts: int
    top_k: int
    expert_params: float  # per routed expert
    shared_params: float  # per MoE layer
    router_params: float  # per MoE layer
    mtp_layers: int
    native_quant: QuantScheme
    context: ContextFacts = field(default_factory=ContextFacts)  # its length, as stated (model/context.py)

    @property
    def embed_params(self) -> float:
        return float(self.vocab_size * self.hidden_size)

    @property
    def lm_head_params(self) -> float:
        return 0.0 if self.tie_embeddings else self.embed_params

    @property
    def is_moe(self) -> bool:
        return self.n_moe_layers > 0

    @property
    def n_attn_layers(self) -> int:
        return self.n_full_layers + self.n_sliding_layers

    def layer_params(self) -> dict[str, float]:
        """Parameters by part over the main layers (no MTP, no embeddings)."""
        return {
            "attention": self.attn_params * self.n_attn_layers
            + self.linear_attn_params * self.n_linear_layers,
            "dense_mlp": self.dense_mlp_params * self.n_dense_layers,
            "experts": self.expert_params * self.num_experts * self.n_moe_layers,
            "shared_experts": (self.shared_params + self.router_params) * self.n_moe_layers,
        }

    @property
    def mtp_params(self) -> float:
        """One MTP/next-n module: an MoE (or dense) decoder layer plus the 2h→h projection."""
        if self.mtp_layers == 0:
            return 0.0
        mlp = (
            self.expert_params * self.num_experts + self.shared_params + self.router_params
            if self.is_moe
            else self.dense_mlp_params
        )
        return self.mtp_layers * (self.attn_params + mlp + 2 * self.hidden_size**2)

    def active_params_counting(self, embedding: bool, lm_head: bool = True) -> float:
        """Active parameters the way a publisher counts them: with the input embedding or without it
        (Meta, Qwen and Mistral count it; OpenAI, Z.ai and DeepSeek do not), and with the output head
        or, as a "non-embedding" count, without it either (tied or not)."""
        extra = self.embed_params if embedding and not self.tie_embeddings else 0.0
        if not lm_head:
            head = self.lm_head_params + (self.embed_params if self.tie_embeddings else 0.0)
            return self.active_params + extra - head
        return self.active_params + extra

    @property
    def non_embedding_params(self) -> float:
        """The total without the input embedding and the output head (Qwen's "Non-Embedding" figure)."""
        return self.total_params - self.embed_params - self.lm_head_params

    @property
    def total_params(self) -> float:
        """Published-style total: layers + embeddings + lm_head, without MTP modules."""
        return sum(self.layer_params().values()) + self.embed_params + self.lm_head_params

    @property
    def active_params(self) -> float:
        """Parameters one token touches (embedding lookup excluded, as published figures do)."""
        p = self.layer_params()
        routed = self.expert_params * self.top_k * self.n_moe_layers
        return (
            p["attention"]
            + p["dense_mlp"]
            + p["shared_experts"]
            + routed
            + self.lm_head_params
            + (self.embed_params if self.tie_embeddings else 0.0)
        )


@dataclass(frozen=True)
class FamilyFacts:
    """What `data/model_families.toml` says of one model_type (defaults: nothing implicit)."""

    implicit_shared_experts: int = 0
    dense_intermediate_field: str = "intermediate_size"
    attn_output_gate: bool = False
    config_defaults: Mapping[str, Any] = field(default_factory=dict)  # transformers' class defaults


@cache
def _families() -> dict[str, FamilyFacts]:
    text = resources.files("servelab.data").joinpath("model_families.toml").read_text()
    return {k: FamilyFacts(**v) for k, v in tomllib.loads(text).items()}


def family_facts(model_type: str) -> FamilyFacts:
    return _families().get(model_type, FamilyFacts())


def _moe_layer_indices(
    n_layers: int,
    explicit: object,
    freq: object,
    interleave_step: int,
    first_dense: int,
    mlp_only: set[int],
) -> list[int]:
    """Which decoder layers are MoE: an explicit list (`moe_layers`, a `moe_layer_freq` mask), else
    Llama 4's `interleave_moe_layer_step` (every step-th layer, the last of each step), else the
    first-k-dense / `moe_layer_freq` / `decoder_sparse_step` / `mlp_only_layers` rules."""
    if isinstance(explicit, list) and explicit:
        return sorted({int(i) for i in explicit if 0 <= int(i) < n_layers})
    if isinstance(freq, list):
        return [i for i, f in enumerate(freq[:n_layers]) if f]
    if interleave_step > 0:
        return [i for i in range(n_layers) if (i + 1) % interleave_step == 0]
    every = int(freq) if isinstance(freq, (int, float)) and freq else 1
    return [
        i
        for i in range(n_layers)
        if i >= first_dense and i not in mlp_only and (i - first_dense) % every == 0
    ]


def _get(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def parse_config(
    config: dict[str, Any], name: str = "model", hf_quant: dict[str, Any] | None = None
) -> Architecture:
    """Build the inventory; a config this cannot read names the missing fields."""
    cfg = dict(config.get("text_config") or config)
    if "quantization_config" in config and "quantization_config" not in cfg:
        cfg["quantization_config"] = config["quantization_config"]
    model_type = str(cfg.get("model_type") or config.get("model_type") or "unknown")
    facts = family_facts(model_type)
    # what transformers' config class would fill in; a field the config states (at either level) wins
    cfg = {**{k: v for k, v in facts.config_defaults.items() if k not in config}, **cfg}
    missing = [f for f in REQUIRED if cfg.get(f) is None]
    is_mla = cfg.get("kv_lora_rank") is not None
    if is_mla:
        missing += [f for f in MLA_FIELDS if cfg.get(f) is None]
    n_experts = int(_get(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0) or 0)
    if n_experts == 0 and cfg.get("intermediate_size") is None:
        missing.append("intermediate_size")
    if n_experts and _get(cfg, "moe_intermediate_size", "intermediate_size") is None:
        missing.append("moe_intermediate_size")
    if missing:
        raise ConfigError(
            f"cannot model {name!r} (model_type {model_type!r}): missing config fields {', '.join(missing)}",
            hint="servelab reads dense GQA, MoE, MLA and DSA configs; a config.json with these fields "
            "(hidden_size, num_hidden_layers, num_attention_heads, vocab_size, intermediate_size, ...) works.",
        )

    h = int(cfg["hidden_size"])
    n_layers = int(cfg["num_hidden_layers"])
    nh = int(cfg["num_attention_heads"])
    nkv = int(_get(cfg, "num_key_value_heads", default=nh))
    hd = int(_get(cfg, "head_dim", default=h // nh))

    # --- attention ---
    index_topk = index_elems = 0
    index_flops = 0.0
    if is_mla:
        kv_lora, nope = int(cfg["kv_lora_rank"]), int(cfg["qk_nope_head_dim"])
        rope, v = int(cfg["qk_rope_head_dim"]), int(cfg["v_head_dim"])
        q_lora = cfg.get("q_lora_rank")
        qk = nope + rope
        q = h * q_lora + q_lora * nh * qk if q_lora else h * nh * qk
        attn = q + h * (kv_lora + rope) + kv_lora * nh * (nope + v) + nh * v * h
        kv_elems = kv_lora + rope
        attn_flops = 2.0 * nh * (2 * kv_lora + rope)  # absorbed MLA decode: QK over 576, PV over 512
        attn_prefill = 2.0 * nh * (qk + v)
        if cfg.get("index_topk"):
            ih, idim = int(cfg.get("index_n_heads", 64)), int(cfg.get("index_head_dim", 128))
            attn += (q_lora or h) * ih * idim + h * idim + h * ih
            index_topk, index_elems = int(cfg["index_topk"]), idim
            index_flops = 2.0 * ih * idim
        attention_kind, kv_heads = "mla", 1
    else:
        gate = 2 if cfg.get("attn_output_gate", facts.attn_output_gate) else 1
        attn = h * nh * hd * gate + 2 * h * nkv * hd + nh * hd * h
        kv_elems = 2 * nkv * hd
        attn_flops = attn_prefill = 4.0 * nh * hd
        attention_kind, kv_heads = "gqa", nkv

    layer_types = list(cfg.get("layer_types") or [])
    if not layer_types and cfg.get("full_attention_interval"):
        k = int(cfg["full_attention_interval"])
        layer_types = ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n_layers)]
    pattern = int(_get(cfg, "sliding_window_pattern", "_sliding_window_pattern", default=0) or 0)
    if not layer_types and pattern > 1:  # Gemma 3: every pattern-th layer global, the rest windowed
        layer_types = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)
        ]
    n_linear = sum(1 for t in layer_types if "linear" in t)
    n_sliding = sum(1 for t in layer_types if "sliding" in t)
    window = int(cfg.get("sliding_window") or 0)
    if n_sliding == 0 and cfg.get("use_sliding_window") and window:
        n_sliding = n_layers
    if window == 0:
        n_sliding = 0
    n_full = n_layers - n_linear - n_sliding
    lin_params = lin_state = 0.0
    if n_linear:
        nk, dk = int(cfg.get("linear_num_key_heads", 16)), int(cfg.get("linear_key_head_dim", 128))
        nv, dv = int(cfg.get("linear_num_value_heads", 32)), int(cfg.get("linear_value_head_dim", 128))
        lin_params = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + nv * dv * h
        conv = int(cfg.get("linear_conv_kernel_dim", 4)) * (2 * nk * dk + nv * dv)
        lin_state = nv * dk * dv * 4.0 + conv * 2.0

    # --- MLP / MoE ---
    top_k = int(_get(cfg, "num_experts_per_tok", "experts_per_token", default=0) or 0)
    dense_inter = int(_get(cfg, facts.dense_intermediate_field, "intermediate_size", default=0) or 0)
    if n_experts:
        moe_inter = int(_get(cfg, "moe_intermediate_size", "intermediate_size"))
        n_moe = len(
            _moe_layer_indices(
                n_layers,
                cfg.get("moe_layers"),
                _get(cfg, "moe_layer_freq", "decoder_sparse_step", default=1),
                int(cfg.get("interleave_moe_layer_step") or 0),
                int(cfg.get("first_k_dense_replace") or 0),
                {int(i) for i in cfg.get("mlp_only_layers") or []},
            )
        )
        n_dense = n_layers - n_moe
        expert = 3.0 * h * moe_inter
        shared_inter = int(
            _get(cfg, "shared_expert_intermediate_size", "shared_intermediate_size", default=0) or 0
        )
        n_shared = int(cfg.get("n_shared_experts") or 0) or (
            0 if shared_inter else facts.implicit_shared_experts
        )
        shared_inter += n_shared * moe_inter
        shared = 3.0 * h * shared_inter + (h if cfg.get("shared_expert_intermediate_size") else 0)
        router = float(h * n_experts)
        if dense_inter == 0 or n_dense == 0:
            dense_inter = dense_inter or moe_inter
    else:
        n_moe, n_dense, expert, shared, router = 0, n_layers, 0.0, 0.0, 0.0
    dense_mlp = 3.0 * h * dense_inter

    mtp = int(
        _get(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0)
        or (cfg.get("num_mtp_modules") if cfg.get("use_mtp") else 0)
        or 0
    )
    return Architecture(
        name=name,
        model_type=model_type,
        hidden_size=h,
        num_layers=n_layers,
        vocab_size=int(cfg["vocab_size"]),
        tie_embeddings=bool(
            _get(cfg, "tie_word_embeddings", default=config.get("tie_word_embeddings", False))
        ),
        attention_kind=attention_kind,
        num_heads=nh,
        num_kv_heads=kv_heads,
        attn_params=float(attn),
        n_full_layers=n_full,
        n_sliding_layers=n_sliding,
        sliding_window=window,
        n_linear_layers=n_linear,
        linear_attn_params=float(lin_params),
        linear_state_bytes=float(lin_state),
        kv_elems_per_token=int(kv_elems),
        attn_flops_per_ctx=float(attn_flops),
        attn_prefill_flops_per_ctx=float(attn_prefill),
        index_topk=index_topk,
        index_elems_per_token=index_elems,
        index_flops_per_ctx=index_flops,
        n_dense_layers=n_dense,
        dense_mlp_params=float(dense_mlp),
        n_moe_layers=n_moe,
        num_experts=n_experts,
        top_k=top_k,
        expert_params=float(expert),
        shared_params=float(shared),
        router_params=float(router),
        mtp_layers=mtp,
        native_quant=scheme_from_config(cfg, hf_quant),
        context=facts_of(cfg, model_type),
    )


# --- the bundled catalog -------------------------------------------------------------------------


def _configs_dir() -> Any:
    return resources.files("servelab.data").joinpath("model_configs")


@cache
def catalog_names() -> tuple[str, ...]:
    return tuple(
        sorted(
            p.name[: -len(".json")]
            for p in _configs_dir().iterdir()
            if p.name.endswith(".json") and not p.name.endswith(".hf_quant_config.json")
        )
    )


def _read_json(path: Any) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read model config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"model config {path} is not a JSON object")
    return data


@cache
def load_model(model: str) -> Architecture:
    """A catalog name (`GLM-5-NVFP4`), or a path to a `config.json` or to a directory holding one.

    A sibling `hf_quant_config.json` is read too: it is where ModelOpt checkpoints say what they quantized.
    """
    by_lower = {n.lower(): n for n in catalog_names()}
    key = model.split("/")[-1].lower() if not Path(model).exists() else None
    if key is not None and key.removeprefix("meta-") in by_lower:
        name = by_lower[key.removeprefix("meta-")]
        base = _configs_dir()
        cfg = _read_json(base.joinpath(f"{name}.json"))
        quant_path = base.joinpath(f"{name}.hf_quant_config.json")
        hq = _read_json(quant_path) if quant_path.is_file() else None
        return parse_config(cfg, name, hq)
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise NotFoundError(
            f"unknown model {model!r}: not a catalog name and no config.json at that path",
            hint="catalog models: " + ", ".join(catalog_names()),
        )
    cfg = _read_json(path)
    candidates = [
        path.parent / "hf_quant_config.json",
        path.with_name(path.name.replace(".json", ".hf_quant_config.json")),
    ]
    hq = next((_read_json(p) for p in candidates if p.is_file() and p != path), None)
    name = path.parent.name if path.name == "config.json" else path.name.removesuffix(".json")
    return parse_config(cfg, name, hq)

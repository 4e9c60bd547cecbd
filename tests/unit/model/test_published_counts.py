"""Every bundled config.json against its publisher's parameter counts, and `predict`'s fit verdict
on a setup where the published size clearly fits and one where it clearly does not (issue 32).

The published figures, their sources and the two setups are data
(src/servelab/data/model_configs/published.toml); nothing here is hand-built."""

from __future__ import annotations

import tomllib
from decimal import Decimal
from importlib import resources
from typing import Any

import pytest

from servelab.model.architecture import Architecture, catalog_names, load_model, parse_config
from servelab.model.hardware import get_gpu
from servelab.model.predict import Workload, predict

PUBLISHED: dict[str, dict[str, Any]] = tomllib.loads(
    resources.files("servelab.data").joinpath("model_configs/published.toml").read_text()
)
GB = 1e9


def _tolerance(figure: str, rel: float = 0.03) -> float:
    """Billions either side a published figure allows: 3 %, or half a unit of its last written digit
    when that is wider ("10" means 9.5-10.5, "12.9" means 12.85-12.95)."""
    exponent = Decimal(figure).as_tuple().exponent
    assert isinstance(exponent, int)
    return max(rel * float(figure), 0.5 * 10.0**exponent)


def _bytes_per_param(arch: Architecture) -> float:
    """The config's own format, weighted over the parts the weights are made of."""
    q = arch.native_quant
    parts = arch.layer_params()
    weighted = (
        parts["attention"] * q.bytes("attention")
        + parts["dense_mlp"] * q.bytes("dense_mlp")
        + parts["experts"] * q.bytes("experts")
        + parts["shared_experts"] * q.bytes("shared_experts")
        + arch.embed_params * 2.0
        + arch.lm_head_params * q.bytes("lm_head")
    )
    return weighted / arch.total_params


def test_every_bundled_config_has_its_published_counts() -> None:
    assert set(catalog_names()) == set(PUBLISHED)
    for name, entry in PUBLISHED.items():
        assert entry["source"] and entry["published"], name
        assert "fits" in entry and ("no_fit" in entry or "no_fit_reason" in entry), name


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_counts_match_the_published_ones(name: str) -> None:
    entry = PUBLISHED[name]
    arch = load_model(name)
    total = arch.total_params / GB
    assert abs(total - float(entry["total"])) <= _tolerance(entry["total"]), (name, total)
    if "non_embedding" in entry:  # the publisher's own non-embedding total: no embedding, no lm_head
        figure = entry["non_embedding"]
        assert abs(arch.non_embedding_params / GB - float(figure)) <= _tolerance(figure), name
    active = (
        arch.active_params_counting(
            embedding=entry["active_embedding"], lm_head=entry.get("active_lm_head", True)
        )
        / GB
    )
    if "active_tolerance" in entry:
        assert entry["tolerance_reason"]
        allowed = float(entry["active_tolerance"]) * float(entry["active"])
    else:
        allowed = _tolerance(entry["active"])
    assert abs(active - float(entry["active"])) <= allowed, (name, active)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_fit_verdict_on_a_clear_fit_and_a_clear_misfit(name: str) -> None:
    entry = PUBLISHED[name]
    arch = load_model(name)
    published_gb = float(entry["total"]) * _bytes_per_param(arch)
    wl = Workload(1024, 256, 1)

    gpu, n = entry["fits"]
    usable = get_gpu(gpu).memory_gb * n * 0.90
    assert published_gb <= 0.85 * usable, f"{name}: {gpu} x{n} is no clear fit for {published_gb:.0f} GB"
    fit = predict(name, gpu, n, wl, tp=n)
    assert fit.feasible, (name, gpu, n, fit.reason)
    assert fit.memory_gb_per_gpu["weights"] * n == pytest.approx(published_gb, rel=0.12)

    if "no_fit" not in entry:
        return
    gpu, n = entry["no_fit"]
    assert published_gb >= 1.10 * get_gpu(gpu).memory_gb * n, f"{name}: {gpu} x{n} is no clear misfit"
    miss = predict(name, gpu, n, wl, tp=n)
    assert not miss.feasible and miss.reason and "weights" in miss.reason, (name, gpu, n, miss.reason)


def test_maverick_interleaves_moe_with_dense_layers() -> None:
    """The bug issue 32 names: every layer read as MoE gave 778 B and 'does not fit' on 8x H200."""
    maverick = load_model("meta-llama/Llama-4-Maverick-17B-128E-Instruct")
    assert (maverick.n_moe_layers, maverick.n_dense_layers) == (24, 24)
    assert maverick.dense_mlp_params == 3 * 5120 * 16384  # intermediate_size_mlp
    assert maverick.shared_params == 3 * 5120 * 8192  # the implicit shared expert
    scout = load_model("Llama-4-Scout-17B-16E-Instruct")
    assert (scout.n_moe_layers, scout.n_dense_layers) == (48, 0)


def test_layer_rules_each_count() -> None:
    """Each way a config names its MoE layers, read on a real config with that one field changed."""
    import json

    from servelab.model.architecture import _configs_dir

    base = json.loads(_configs_dir().joinpath("Qwen3-30B-A3B.json").read_text())
    assert parse_config(base).n_moe_layers == 48
    assert parse_config({**base, "mlp_only_layers": [0, 1]}).n_moe_layers == 46
    assert parse_config({**base, "decoder_sparse_step": 2}).n_moe_layers == 24
    assert parse_config({**base, "first_k_dense_replace": 3}).n_moe_layers == 45
    assert parse_config({**base, "interleave_moe_layer_step": 4}).n_moe_layers == 12
    assert parse_config({**base, "moe_layers": [5, 7]}).n_moe_layers == 2
    assert parse_config({**base, "moe_layer_freq": [0, 1] * 24}).n_moe_layers == 24


def test_qwen3_next_reads_gated_deltanet_and_gated_attention() -> None:
    arch = load_model("Qwen3-Next-80B-A3B-Thinking")
    assert (arch.n_linear_layers, arch.n_full_layers) == (36, 12)
    h = 2048
    # gated DeltaNet: in_proj_qkvz + in_proj_ba + out_proj (16 key heads, 32 value heads, 128 wide)
    assert arch.linear_attn_params == h * (2 * 16 * 128 + 2 * 32 * 128) + h * 2 * 32 + 32 * 128 * h
    # gated softmax attention: q_proj twice as wide (query and gate), 2 KV heads of 256
    assert arch.attn_params == h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h
    assert arch.linear_state_bytes > 0


def test_multimodal_configs_count_the_language_model() -> None:
    vl = load_model("Qwen3-VL-235B-A22B-Instruct")
    text = load_model("Qwen3-235B-A22B")
    assert vl.total_params == text.total_params
    assert vl.model_type == "qwen3_vl_moe_text"


def test_gemma3_reads_its_local_global_layers_and_the_fields_its_config_leaves_out() -> None:
    """google/gemma-3-27b-it's config.json states no text vocabulary, no tie and no layer pattern:
    transformers' Gemma3TextConfig defaults fill them in, read from data/model_families.toml."""
    import json

    from servelab.model.architecture import _configs_dir, family_facts
    from servelab.model.memory import plan_memory
    from servelab.model.predict import make_setup

    base = json.loads(_configs_dir().joinpath("gemma-3-27b-it.json").read_text())
    text = base["text_config"]
    assert not {"vocab_size", "tie_word_embeddings", "sliding_window_pattern", "layer_types"} & set(text)
    defaults = family_facts("gemma3_text").config_defaults
    arch = load_model("google/gemma-3-27b-it")
    assert arch.model_type == "gemma3_text"
    assert arch.vocab_size == defaults["vocab_size"] == 262208
    assert arch.tie_embeddings and arch.lm_head_params == 0
    # 5 sliding-window layers, then a global one: 52 + 10 over 62 layers
    assert (arch.n_sliding_layers, arch.n_full_layers, arch.sliding_window) == (52, 10, 1024)
    h = 5376
    # the stated head_dim (128), not hidden / heads (168): 32 query heads, 16 KV heads
    assert arch.attn_params == h * 32 * 128 + 2 * h * 16 * 128 + 32 * 128 * h
    assert arch.dense_mlp_params == 3 * h * 21504  # GeGLU: gate, up and down projections
    assert arch.kv_elems_per_token == 2 * 16 * 128
    setup = make_setup("gemma-3-27b-it", "h100-sxm", 1, tp=1)
    mem = plan_memory(setup.arch, setup.quant, setup.host, setup.layout, setup.mem_fraction)
    assert mem.kv_bytes_per_token == 62 * 2 * 16 * 128 * 2  # BF16 K and V, every layer
    # what the config states wins over the defaults, at either level
    assert parse_config({**base, "text_config": {**text, "vocab_size": 262144}}).vocab_size == 262144
    assert not parse_config({**base, "tie_word_embeddings": False}).tie_embeddings
    two = parse_config({**base, "text_config": {**text, "sliding_window_pattern": 2}})
    assert (two.n_sliding_layers, two.n_full_layers) == (31, 31)
    listed = ["sliding_attention"] * 61 + ["full_attention"]
    one = parse_config({**base, "text_config": {**text, "layer_types": listed}})
    assert (one.n_sliding_layers, one.n_full_layers) == (61, 1)

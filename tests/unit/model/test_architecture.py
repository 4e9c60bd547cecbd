"""Parameter counts of real configs against the published totals, and bad-config errors."""

from __future__ import annotations

import pytest

from servelab.errors import ConfigError, NotFoundError
from servelab.model.architecture import catalog_names, load_model, parse_config


@pytest.mark.parametrize(
    ("name", "total_b", "active_b"),
    [
        ("GLM-5", 744, 40),
        ("DeepSeek-V3", 671, 37),
        ("Qwen3-235B-A22B", 235, 22),
        ("Llama-3.1-70B", 70.6, 70),
        ("Llama-3.1-8B", 8.0, 8.0),
        ("Kimi-K2.5", 1030, 32),
        ("gpt-oss-120b", 117, 5.1),
        ("Mixtral-8x7B", 46.7, 12.9),
        ("Qwen3.5-397B-A17B", 397, 17),
    ],
)
def test_parameter_counts_match_published(name: str, total_b: float, active_b: float) -> None:
    arch = load_model(name)
    assert arch.total_params / 1e9 == pytest.approx(total_b, rel=0.03)
    assert arch.active_params / 1e9 == pytest.approx(active_b, rel=0.08)


def test_glm5_is_mla_with_sparse_indexer_and_mtp() -> None:
    arch = load_model("GLM-5")
    assert arch.attention_kind == "mla"
    assert arch.index_topk == 2048
    assert arch.kv_elems_per_token == 512 + 64
    assert (arch.n_dense_layers, arch.n_moe_layers) == (3, 75)
    assert arch.mtp_layers == 1


def test_nvfp4_checkpoint_keeps_attention_in_bf16() -> None:
    q = load_model("GLM-5-NVFP4").native_quant
    assert (q.attention, q.experts, q.kv_dtype) == ("bf16", "nvfp4", "fp8")
    kimi = load_model("Kimi-K2.5").native_quant
    assert (kimi.experts, kimi.attention, kimi.shared_experts) == ("int4", "bf16", "bf16")


def test_every_catalog_model_parses() -> None:
    assert len(catalog_names()) >= 18
    for name in catalog_names():
        assert load_model(name).total_params > 1e9


def test_config_path_is_accepted(tmp_path) -> None:
    import json

    from servelab.model.architecture import _configs_dir

    cfg = json.loads(_configs_dir().joinpath("Qwen3-8B.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert load_model(str(path)).total_params == pytest.approx(8.2e9, rel=0.02)


def test_unknown_architecture_names_missing_fields() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({"model_type": "mystery", "hidden_size": 1024}, "mystery")
    msg = exc.value.message
    assert "num_hidden_layers" in msg and "vocab_size" in msg and "intermediate_size" in msg


def test_unknown_model_lists_catalog() -> None:
    with pytest.raises(NotFoundError) as exc:
        load_model("no-such-model")
    assert "GLM-5" in exc.value.hint

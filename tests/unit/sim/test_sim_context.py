"""The simulator's context length is the engine's: vLLM's `_get_and_verify_max_len` and SGLang's
`get_context_length`, applied to the bundled model configs (personalities.toml [context]); an explicit
--max-model-len / --context-length wins; a too-long request gets the engine's own 400 text
(personalities.toml [refusals])."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import orjson
import pytest
from tests.unit.sim.test_sim_personalities import cfg, serve

from servelab.model.architecture import load_model
from servelab.model.context import facts_of
from servelab.sim.personalities import get_personality
from servelab.sim.server import effective

ENGINES = ("vllm", "sglang")


def bundled(name: str) -> dict[str, Any]:
    text = resources.files("servelab.data").joinpath(f"model_configs/{name}.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data.get("text_config") or data


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "model,expected",
    [
        ("Qwen3-8B", 40960),  # max_position_embeddings, no RoPE scaling
        ("Llama-3.1-8B", 131072),  # llama3 scaling: neither engine multiplies
        ("gpt-oss-20b", 131072),  # YaRN: vLLM 4096 × 32, SGLang the length as stated
        ("DeepSeek-V3", 163840),  # YaRN: vLLM 4096 × 40
        ("Qwen3-VL-30B-A3B-Instruct", 262144),  # read through text_config
    ],
)
def test_the_default_context_is_what_the_engine_derives(engine: str, model: str, expected: int) -> None:
    arch = load_model(model)
    got, how = get_personality(engine).max_model_len(arch.context)
    assert got == expected, how
    # the config states this length: the derivation reads the file, not a constant
    assert bundled(model)["max_position_embeddings"] == expected
    c = cfg(engine, model=model)
    assert effective(c).max_model_len == expected


def test_qwen3_8b_is_no_longer_32768() -> None:
    """The issue: 32,768 whatever the model. Two bundled models, two contexts."""
    a, b = (
        get_personality("vllm").max_model_len(load_model(m).context)[0] for m in ("Qwen3-8B", "Llama-3.1-8B")
    )
    assert (a, b) == (40960, 131072)


@pytest.mark.parametrize("engine,flag", [("vllm", "--max-model-len"), ("sglang", "--context-length")])
def test_an_explicit_flag_wins(engine: str, flag: str) -> None:
    c = cfg(engine, (flag, "2000"))
    assert effective(c).max_model_len == 2000


def test_the_engines_differ_where_their_code_does() -> None:
    # Qwen2.5 with the YaRN override its model card gives: vLLM multiplies, SGLang does not (the scaling
    # names its original length), so SGLang needs --context-length for the long context.
    yarn = {
        "max_position_embeddings": 32768,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    }
    vllm, sglang = (get_personality(e) for e in ENGINES)
    assert vllm.max_model_len(facts_of(yarn))[0] == 131072
    assert sglang.max_model_len(facts_of(yarn))[0] == 32768
    # two length keys: vLLM takes the smallest, SGLang the first in its order (seq_length before
    # max_position_embeddings)
    two = {"seq_length": 65536, "max_position_embeddings": 32768}
    assert vllm.max_model_len(facts_of(two))[0] == 32768
    assert sglang.max_model_len(facts_of(two))[0] == 65536
    # a linear scaling without its original length: both multiply
    linear = {"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert vllm.max_model_len(facts_of(linear))[0] == sglang.max_model_len(facts_of(linear))[0] == 8192
    # no length key at all: both fall back to 2048
    assert vllm.max_model_len(facts_of({}))[0] == sglang.max_model_len(facts_of({}))[0] == 2048
    # Gemma 3's length is already scaled for vLLM
    gemma = {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    assert vllm.max_model_len(facts_of(gemma, "gemma3_text"))[0] == 131072


@pytest.mark.parametrize("engine", ENGINES)
def test_the_refusal_is_the_engines_text(engine: str) -> None:
    r = get_personality(engine).refusals
    exactly = r.refusal(100, 40, 60)  # prompt + max_tokens == the context: vLLM takes it, SGLang does not
    assert (exactly is None) == (engine == "vllm")
    assert r.refusal(100, 40, 59) is None
    prompt = r.refusal(100, 100, 1)
    total = r.refusal(100, 90, 20)
    assert prompt is not None and total is not None
    if engine == "vllm":
        assert prompt == (
            "This model's maximum context length is 100 tokens. However, your request has 100 input "
            "tokens. Please reduce the length of the input messages."
        )
        assert total.startswith("'max_tokens' or 'max_completion_tokens' is too large: 20. ")
        assert total.endswith("your request has 90 input tokens (20 > 100 - 90).")
    else:
        assert prompt == "The input (100 tokens) is longer than the model's context length (100 tokens)."
        assert total.startswith(
            "Requested token count exceeds the model's maximum context length of 100 tokens. You "
            "requested a total of 110 tokens: 90 tokens from the input messages and 20 tokens"
        )


def test_a_served_request_over_the_context_gets_the_text() -> None:
    c = cfg("vllm", ("--max-model-len", "64"))
    body = {"model": "Qwen3-8B", "prompt": " ".join(["word"] * 50), "max_tokens": 20}
    (answer, models), _, _ = serve(
        c, [("POST", "/v1/completions", orjson.dumps(body)), ("GET", "/v1/models", b"")]
    )
    status, data = answer
    assert status == 400
    message = orjson.loads(data)["error"]["message"]
    assert "This model's maximum context length is 64 tokens" in message and "(20 > 64 - " in message
    assert orjson.loads(models[1])["data"][0]["max_model_len"] == 64

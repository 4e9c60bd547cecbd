"""Python-repr and key=value parsing on the shapes engines really print."""

from __future__ import annotations

from servelab.engines import logparse as lp
from servelab.engines.base import EffectiveConfig


def test_split_top_respects_nesting_quotes_and_enum_reprs() -> None:
    text = "a=1, b='x, y', c={'k': [1, 2], 'm': <CUDAGraphMode.NONE: 0>}, d=Foo(e=2, f=(3, 4)), g=<E.X: 1>"
    assert [p.strip() for p in lp.split_top(text)] == [
        "a=1",
        "b='x, y'",
        "c={'k': [1, 2], 'm': <CUDAGraphMode.NONE: 0>}",
        "d=Foo(e=2, f=(3, 4))",
        "g=<E.X: 1>",
    ]


def test_parse_kv_values() -> None:
    parsed = lp.parse_kv(
        "model='/m', dtype=torch.bfloat16, kv_cache_dtype=auto, quantization=None, tp=8, "
        "served_model_name=GLM-5-NVFP4, kernel_config=KernelConfig(moe_backend='auto', x=IrOp(y=['n'])), "
        "compilation_config={'mode': <CompilationMode.NONE: 0>, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>}"
    )
    assert parsed["model"] == "/m"
    assert parsed["dtype"] == "torch.bfloat16"
    assert parsed["kv_cache_dtype"] == "auto"
    assert parsed["quantization"] is None
    assert parsed["tp"] == 8
    assert parsed["served_model_name"] == "GLM-5-NVFP4"
    assert parsed["kernel_config"]["__call__"] == "KernelConfig"
    assert parsed["kernel_config"]["moe_backend"] == "auto"
    assert parsed["kernel_config"]["x"] == {"__call__": "IrOp", "y": ["n"]}
    assert parsed["compilation_config"]["cudagraph_mode"] == "CUDAGraphMode.NONE"


def test_literal_never_evaluates_code() -> None:
    assert lp.literal("__import__('os').system('true')") == "__import__('os').system('true')"


def test_dict_after_and_a_cut_line() -> None:
    line = "INFO [api_utils.py:286] non-default args: {'model': '/m', 'max_num_seqs': 8}"
    assert lp.dict_after(line, "non-default args:") == {"model": "/m", "max_num_seqs": 8}
    assert lp.dict_after("non-default args: {'model': '/m', 'max_n", "non-default args:") is None
    assert lp.dict_after("nothing here", "non-default args:") is None


def test_call_after_tolerates_a_truncated_repr() -> None:
    line = "[2025] server_args=ServerArgs(model_path='/m', tp_size=4, attention_backend='fla"
    parsed = lp.call_after(line, "server_args=")
    assert parsed is not None and parsed["model_path"] == "/m" and parsed["tp_size"] == 4


def test_to_int_and_dtype() -> None:
    assert lp.to_int("2,097,152") == 2097152
    assert lp.to_int("x") is None
    assert lp.dtype_name("torch.float16") == "float16"
    assert lp.dtype_name(None) is None


def test_excerpt_keeps_head_and_the_needle() -> None:
    line = "HEAD " + "x=1, " * 200 + "needle=42, " + "y=2, " * 200
    ex = lp.excerpt(line, "needle=")
    assert ex.startswith("HEAD ") and "needle=42" in ex and len(ex) < len(line)
    assert lp.excerpt("short line") == "short line"


def test_redaction_of_dict_reprs_and_flags() -> None:
    cfg = EffectiveConfig()
    cfg.set("port", 1, "server_args={'api_key': 'sk-secret-value-123', 'port': 1}")
    cfg.set("model", "m", "argv: --api-key abcdef123 --model m")
    lp.finish(cfg)
    assert "sk-secret-value-123" not in cfg.evidence["port"]
    assert "abcdef123" not in cfg.evidence["model"]
    assert "'port': 1" in cfg.evidence["port"]

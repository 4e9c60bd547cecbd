"""llama.cpp adapter: argv and the start-up lines of real llama-server logs."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from servelab.engines.base import Settings
from servelab.engines.llamacpp import ENGINE
from servelab.errors import ConfigError


def test_command() -> None:
    spec = ENGINE.command(
        Settings(
            model="/models/q.gguf",
            served_model_name="q",
            port=8081,
            max_model_len=16384,
            max_concurrency=4,
            kv_cache_dtype="q8_0",
            extra_args=("-fa", "on"),
            options={"binary": "/opt/llama/llama-server"},
        )
    )
    a = spec.argv
    assert a[0] == "/opt/llama/llama-server"
    assert a[a.index("-m") + 1] == "/models/q.gguf"
    assert a[a.index("--alias") + 1] == "q"
    assert a[a.index("--ctx-size") + 1] == "16384"
    assert a[a.index("--parallel") + 1] == "4"
    assert a[a.index("--cache-type-k") + 1] == "q8_0" and a[a.index("--cache-type-v") + 1] == "q8_0"
    assert a[a.index("--n-gpu-layers") + 1] == "999"
    assert "--metrics" in a and a[-2:] == ["-fa", "on"]
    assert spec.served_model == "q"
    cpu = ENGINE.command(Settings(model="/m.gguf", options={"cpu": True}))
    assert cpu.argv[cpu.argv.index("--n-gpu-layers") + 1] == "0" and cpu.argv[0] == "llama-server"


@pytest.mark.parametrize("bad", [{"tp": 2}, {"quantization": "q4"}, {"mem_fraction": 0.9}])
def test_impossible_settings(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ENGINE.command(Settings(model="/m.gguf", **bad))  # type: ignore[arg-type]


def test_requested() -> None:
    req = ENGINE.requested(
        Settings(model="/m.gguf", extra_args=("-c", "8192", "-ngl", "40", "-np", "2", "-ctk", "q8_0"))
    )
    assert req == {
        "model": "/m.gguf",
        "n_ctx": 8192,
        "n_gpu_layers": 40,
        "max_running_requests": 2,
        "kv_cache_dtype": "q8_0",
    }


def test_effective_from_a_real_gpu_log(log: Callable[[str], str]) -> None:
    eff = ENGINE.effective_config(log("llamacpp_qwen36_27b_rtx5090.log"))
    e = eff.effective
    assert e["model"].endswith("/Qwen3.6-27B-UD-Q4_K_XL.gguf")
    assert e["max_model_len"] == 131072
    assert e["max_running_requests"] == 4
    assert e["port"] == 8000
    assert "server is listening on" in eff.evidence["port"]


def test_effective_from_real_cpu_and_offload_logs(log: Callable[[str], str]) -> None:
    e = ENGINE.effective_config(log("llamacpp_cpu_issue15946.log")).effective
    assert e["n_ctx"] == 128000 and e["max_model_len"] == 128000 and e["kv_cache_dtype"] == "f16"
    e = ENGINE.effective_config(log("llamacpp_gpu_offload_issue6787.log")).effective
    assert e["n_gpu_layers"] == 0 and e["n_ctx"] == 512


def test_props_endpoint() -> None:
    props = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2, "model_path": "/m.gguf"}
    eff = ENGINE.effective_config("", props)
    assert eff.effective == {"max_model_len": 4096, "max_running_requests": 2, "model": "/m.gguf"}
    assert ENGINE.readiness.loading_status == (503,)

"""vLLM adapter: argv, requested keys from flags, effective config from real logs."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from servelab.engines.base import Settings
from servelab.engines.vllm import ENGINE
from servelab.errors import ConfigError

# What tests/fixtures/logs/vllm_cpu_startup.log was started with (tests/support/engines.vllm_server).
CPU_SETTINGS = Settings(
    model="/work/main/.cache/tiny-models/qwen3_moe",
    served_model_name="tiny-qwen3-moe",
    max_model_len=4096,
    max_concurrency=8,
    extra_args=("--enforce-eager", "--no-enable-prefix-caching"),
    options={"cpu": True},
)


def test_command_is_the_api_server_module_with_the_chosen_python() -> None:
    spec = ENGINE.command(
        Settings(
            model="/m",
            port=8123,
            tp=2,
            pp=2,
            dp=2,
            ep=4,
            quantization="fp8",
            kv_cache_dtype="fp8_e4m3",
            max_concurrency=64,
            mem_fraction=0.85,
            max_model_len=8192,
            extra_args=("--max-num-seqs", "32"),
            env={"NCCL_DEBUG": "INFO"},
            options={"python": "/opt/venv/bin/python"},
        )
    )
    assert spec.argv[:3] == ["/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    a = spec.argv
    assert a[a.index("--model") + 1] == "/m"
    assert a[a.index("--served-model-name") + 1] == "/m"
    assert a[a.index("--port") + 1] == "8123"
    assert a[a.index("--tensor-parallel-size") + 1] == "2"
    assert a[a.index("--pipeline-parallel-size") + 1] == "2"
    assert a[a.index("--data-parallel-size") + 1] == "2"
    assert "--enable-expert-parallel" in a
    assert a[a.index("--quantization") + 1] == "fp8"
    assert a[a.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert a[a.index("--gpu-memory-utilization") + 1] == "0.85"
    assert a[a.index("--max-model-len") + 1] == "8192"
    assert a[-2:] == ["--max-num-seqs", "32"]  # extra_args verbatim, last (they win in argparse)
    assert spec.env == {"NCCL_DEBUG": "INFO"}
    assert spec.url == "http://127.0.0.1:8123" and spec.served_model == "/m" and not spec.external


def test_cpu_build_gets_its_kv_cache_space() -> None:
    spec = ENGINE.command(Settings(model="/m", options={"cpu": True, "python": "py"}))
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    spec = ENGINE.command(Settings(model="/m", env={"VLLM_CPU_KVCACHE_SPACE": "4"}, options={"cpu": True}))
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "4"  # the user's value wins
    assert "VLLM_CPU_KVCACHE_SPACE" not in ENGINE.command(Settings(model="/m")).env
    assert ENGINE.command(Settings(model="/m")).port == 8000  # port 0: the engine's default


def test_impossible_expert_parallel_size() -> None:
    with pytest.raises(ConfigError, match="expert parallel"):
        ENGINE.command(Settings(model="/m", tp=4, ep=8))


def test_requested_reads_known_flags() -> None:
    req = ENGINE.requested(
        Settings(
            model="/m",
            tp=2,
            extra_args=(
                "--max-num-seqs=16",
                "--enforce-eager",
                "--no-enable-prefix-caching",
                "--kv-cache-dtype",
                "fp8",
                "--enable-expert-parallel",
                "--attention-backend",
                "FLASHINFER",
                "--compilation-config",
                '{"cudagraph_mode": "NONE", "pass_config": {"fuse_allreduce_rms": true}}',
                "--some-flag-we-do-not-know",
                "7",
            ),
        )
    )
    assert req["max_running_requests"] == 16
    assert req["cuda_graph"] is False
    assert req["disable_radix_cache"] is True
    assert req["kv_cache_dtype"] == "fp8"
    assert req["ep_size"] == 2
    assert req["attention_backend"] == "FLASHINFER"
    assert req["enable_allreduce_fusion"] is True
    assert req["tp_size"] == 2 and req["pp_size"] == 1
    assert "_compilation_config" not in req and "_expert_parallel" not in req


def test_bad_flag_value_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--max-num-seqs"):
        ENGINE.requested(Settings(model="/m", extra_args=("--max-num-seqs", "many")))
    with pytest.raises(ConfigError, match="needs a value"):
        ENGINE.requested(Settings(model="/m", extra_args=("--max-num-seqs",)))


def test_effective_config_from_the_real_cpu_log(log: Callable[[str], str]) -> None:
    eff = ENGINE.effective_config(log("vllm_cpu_startup.log"))
    e = eff.effective
    assert e["model"] == "/work/main/.cache/tiny-models/qwen3_moe"
    assert e["served_model_name"] == "tiny-qwen3-moe"
    assert e["version"] == "0.32.0"
    assert e["max_running_requests"] == 8
    assert e["max_model_len"] == 4096
    assert e["cuda_graph"] is False
    assert e["disable_radix_cache"] is True
    assert e["tp_size"] == 1 and e["pp_size"] == 1
    assert e["dtype"] == "bfloat16"
    assert e["kv_cache_dtype"] == "auto"
    assert e["kv_cache_tokens"] == 2097152
    assert e["moe_runner_backend"] == "CPU"  # the selection line wins over kernel_config's 'auto'
    assert "out of potential backends" in eff.evidence["moe_runner_backend"]
    assert "KV cache size: 2,097,152 tokens" in eff.evidence["kv_cache_tokens"]
    assert "non-default args" in eff.evidence["max_running_requests"]
    assert isinstance(e["port"], int) and "Starting vLLM server on" in eff.evidence["port"]
    assert set(e) <= set(__import__("servelab.engines.base", fromlist=["x"]).NORMALIZED_KEYS)


def test_requested_matches_effective_on_the_real_run(log: Callable[[str], str]) -> None:
    req = ENGINE.requested(CPU_SETTINGS)
    eff = ENGINE.effective_config(log("vllm_cpu_startup.log")).effective
    shared = set(req) & set(eff)
    assert {"model", "served_model_name", "max_model_len", "max_running_requests", "cuda_graph"} <= shared
    assert {k: req[k] for k in shared} == {k: eff[k] for k in shared}


def test_sim_vllm_log_and_server_info(log: Callable[[str], str]) -> None:
    eff = ENGINE.effective_config(log("sim_vllm_glm5_tp8.log"), {"version": "0.11.0"})
    assert eff.effective["tp_size"] == 8
    assert eff.effective["max_running_requests"] == 64
    assert eff.effective["cuda_graph"] is False
    assert eff.effective["kv_cache_tokens"] == 538743
    assert eff.effective["max_num_batched_tokens"] == 8192
    assert eff.evidence["version"] == "GET /version"


def test_backend_selection_lines_override_args() -> None:
    text = "\n".join(
        [
            "(APIServer pid=1) INFO 01-01 00:00:00 [api_utils.py:286] non-default args: "
            "{'model': '/m', 'attention_backend': 'TRITON_ATTN', 'moe_backend': 'triton'}",
            "(Worker pid=2) INFO 01-01 00:00:01 [cuda.py:446] Using FLASHINFER backend.",
            "(Worker pid=2) INFO 01-01 00:00:02 [fp8.py:418] Using FLASHINFER_CUTLASS Fp8 MoE backend out of "
            "potential backends: ['FLASHINFER_CUTLASS', 'TRITON'].",
        ]
    )
    e = ENGINE.effective_config(text).effective
    assert e["attention_backend"] == "FLASHINFER"
    assert e["moe_runner_backend"] == "FLASHINFER_CUTLASS"


def test_old_namespace_format() -> None:
    line = (
        "INFO 09-05 20:51:54 api_server.py:441] args: Namespace(model_tag='meta-llama/Meta-Llama-3.1-405B-Instruct', "
        "host='127.0.0.1', port=8000, model='meta-llama/Meta-Llama-3.1-405B-Instruct', kv_cache_dtype='auto', "
        "max_model_len=4096, pipeline_parallel_size=4, tensor_parallel_size=8, enforce_eager=True)"
    )
    e = ENGINE.effective_config(line).effective
    assert e["tp_size"] == 8 and e["pp_size"] == 4 and e["cuda_graph"] is False and e["max_model_len"] == 4096

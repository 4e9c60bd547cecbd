"""SGLang adapter: argv, requested keys, effective config from real and simulated logs."""

from __future__ import annotations

from collections.abc import Callable

from servelab.engines.base import Settings
from servelab.engines.sglang import ENGINE


def test_command() -> None:
    spec = ENGINE.command(
        Settings(
            model="/models/glm",
            served_model_name="glm",
            tp=8,
            ep=8,
            max_concurrency=128,
            mem_fraction=0.9,
            max_model_len=32768,
            extra_args=("--moe-runner-backend", "flashinfer_trtllm", "--disable-radix-cache"),
            options={"python": "/venv/bin/python"},
        )
    )
    a = spec.argv
    assert a[:3] == ["/venv/bin/python", "-m", "sglang.launch_server"]
    assert a[a.index("--model-path") + 1] == "/models/glm"
    assert a[a.index("--tp-size") + 1] == "8"
    assert a[a.index("--ep-size") + 1] == "8"
    assert a[a.index("--max-running-requests") + 1] == "128"
    assert a[a.index("--mem-fraction-static") + 1] == "0.9"
    assert a[a.index("--context-length") + 1] == "32768"
    assert "--enable-metrics" in a
    assert a[-3:] == ["--moe-runner-backend", "flashinfer_trtllm", "--disable-radix-cache"]
    assert spec.port == 30000 and spec.served_model == "glm"
    assert "--pp-size" not in a


def test_requested_with_aliases() -> None:
    req = ENGINE.requested(
        Settings(
            model="/m",
            extra_args=(
                "--tp",
                "4",
                "--moe-runner-backend=flashinfer_cutlass",
                "--disable-radix-cache",
                "--disable-cuda-graph",
                "--enable-dp-attention",
                "--dp-size",
                "4",
                "--chunked-prefill-size",
                "4096",
            ),
        )
    )
    assert req["tp_size"] == 4
    assert req["moe_runner_backend"] == "flashinfer_cutlass"
    assert req["disable_radix_cache"] is True
    assert req["cuda_graph"] is False
    assert req["enable_dp_attention"] is True and req["dp_size"] == 4
    assert req["max_num_batched_tokens"] == 4096


def test_effective_from_a_real_sglang_log(log: Callable[[str], str]) -> None:
    eff = ENGINE.effective_config(log("sglang_qwq32b_tp4_l4.log"))
    e = eff.effective
    assert e["model"] == "/home/model/Qwen/QwQ-32B"
    assert e["tp_size"] == 4
    assert e["attention_backend"] == "flashinfer"
    assert e["mem_fraction"] == 0.85
    assert e["cuda_graph"] is True and e["disable_radix_cache"] is False
    assert e["kv_cache_tokens"] == 46611
    # max_running_requests=None in ServerArgs; the scheduler's summary line says what it really is.
    assert (
        e["max_running_requests"] == 2049
        and "max_total_num_tokens=46611" in eff.evidence["max_running_requests"]
    )
    assert e["max_model_len"] == 131072
    assert e["port"] == 30000


def test_effective_from_the_new_dict_format(log: Callable[[str], str]) -> None:
    eff = ENGINE.effective_config(log("sglang_server_args_dict_dsv4.log"))
    e = eff.effective
    assert e["model"] == "/models/DeepSeek-V4.1-Flash"
    assert e["served_model_name"] == "deepseek-v4.1-flash"
    assert e["tp_size"] == 3 and e["ep_size"] == 3
    assert e["moe_runner_backend"] == "flashinfer_mxfp4"
    assert e["kv_cache_dtype"] == "fp8_e4m3"
    assert e["max_model_len"] == 1048576
    assert e["max_running_requests"] == 4


def test_auto_selection_overrides_the_requested_backend(log: Callable[[str], str]) -> None:
    settings = Settings(
        model="GLM-5-NVFP4",
        tp=8,
        extra_args=(
            "--moe-runner-backend",
            "flashinfer_trtllm",
            "--disable-radix-cache",
            "--max-running-requests",
            "128",
        ),
    )
    req = ENGINE.requested(settings)
    eff = ENGINE.effective_config(log("sim_sglang_glm5_tp8.log"))
    assert req["moe_runner_backend"] == "flashinfer_trtllm"
    assert eff.effective["moe_runner_backend"] == "flashinfer_cutlass"
    assert eff.evidence["moe_runner_backend"].startswith("[")
    assert "Use flashinfer_cutlass as MoE runner backend on SM120" in eff.evidence["moe_runner_backend"]
    mismatched = {k for k in set(req) & set(eff.effective) if req[k] != eff.effective[k]}
    assert mismatched == {"moe_runner_backend"}
    assert eff.effective["kv_cache_tokens"] == 538743
    assert isinstance(eff.effective["port"], int) and eff.effective["port"] != 30000  # the bound port wins


def test_server_info_wins(log: Callable[[str], str]) -> None:
    info = {"model_path": "GLM-5-NVFP4", "tp_size": 8, "max_total_num_tokens": 123, "version": "0.5.5"}
    eff = ENGINE.effective_config(log("sim_sglang_glm5_tp8.log"), info)
    assert eff.effective["kv_cache_tokens"] == 123
    assert eff.effective["version"] == "0.5.5"
    assert eff.evidence["kv_cache_tokens"] == "GET /get_server_info"
    assert ENGINE.info_paths() == ("/get_server_info", "/server_info")

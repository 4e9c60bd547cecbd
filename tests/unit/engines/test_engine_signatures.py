"""The failure knowledge base: every class on at least one real log string, and the matching rules."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from servelab.engines import signatures
from servelab.engines.signatures import diagnose, fatal_in, guess_engine, parse_table, timeout_marker
from servelab.errors import ConfigError

# (fixture, engine passed to diagnose, expected class). Each fixture is a real log or the simulator's output.
CASES = [
    ("sim_fault_oom_init_vllm.log", "vllm", "oom_init"),
    ("sim_fault_oom_init_sglang.log", "sglang", "oom_init"),
    ("sim_sglang_glm5_tp1_oom.log", None, "oom_init"),
    ("fail_oom_sglang_4330.log", "sglang", "oom_init"),
    ("sim_fault_cuda_init_vllm.log", "vllm", "cuda_init"),
    ("sim_fault_cuda_init_sglang.log", "sim", "cuda_init"),
    ("sim_fault_nccl_shm_vllm.log", "vllm", "nccl_shm"),
    ("sim_fault_nccl_shm_sglang.log", None, "nccl_shm"),
    ("sim_fault_port_in_use_vllm.log", "vllm", "port_in_use"),
    ("sim_fault_port_in_use_sglang.log", "sglang", "port_in_use"),
    ("sim_fault_worker_init_vllm.log", "vllm", "nccl_error"),
    ("fail_nccl_error_vllm_7896.log", "vllm", "nccl_error"),
    ("fail_gpu_busy_llamacpp_11841.log", "llamacpp", "gpu_busy_stale_process"),
    ("fail_gpu_busy_vllm_pytorch175666.log", "vllm", "gpu_busy_stale_process"),
    ("fail_nccl_peer_ray_lightning_24.log", None, "nccl_peer"),
    ("fail_nccl_peer_llamacpp_3230.log", "llamacpp", "nccl_peer"),
    ("fail_no_kernel_image_tensorrt_pro_162.log", None, "no_kernel_image"),
    ("fail_compile_cache_vllm_18851.log", "vllm", "compile_cache_corrupt"),
    ("fail_compile_cache_vllm_21858.log", "vllm", "compile_cache_corrupt"),
    ("fail_moe_default_config_vllm_17619.log", "vllm", "moe_autotune"),
    ("fail_moe_autotune_sglang_12306.log", "sglang", "moe_autotune"),
    ("fail_moe_autotune_skip_flashinfer_2800.log", None, "moe_autotune"),
    ("fail_unsupported_argument_vllm_omni_1364.log", "vllm", "unsupported_argument"),
    ("sim_nsa_radix_sglang.log", "sglang", "unsupported_argument"),
    ("fail_model_not_found_vastai_128.log", "vllm", "model_not_found"),
    # the simulator's engine death prints the illegal memory access real engines die of: the root cause wins
    ("sim_dead_after_ready_vllm.log", "vllm", "illegal_memory_access"),
    ("sim_dead_after_ready_sglang.log", "sglang", "illegal_memory_access"),
    ("fail_engine_init_llamafactory_10240.log", "vllm", "engine_init_failed"),
]


@pytest.mark.parametrize(("name", "engine", "klass"), CASES, ids=[c[0] for c in CASES])
def test_each_class_on_a_real_log(
    log: Callable[[str], str], name: str, engine: str | None, klass: str
) -> None:
    d = diagnose(log(name), engine)
    assert d.klass == klass, d
    assert d.evidence.rstrip("…")[:60] in log(name)  # the evidence is a line of the log
    assert d.advice


def test_every_class_is_covered_by_a_real_case() -> None:
    corpus = tomllib.loads(
        (Path(__file__).resolve().parents[2] / "fixtures/logs/real/index.toml").read_text()
    )
    covered = (
        {c[2] for c in CASES}
        | {e["class"] for e in corpus["excerpt"]}
        | {
            "oom_runtime",
            "startup_timeout",
            "unknown",
            "no_failure",  # tests/unit/engines/test_logs_cli.py, tests/integration/test_logs_healthy.py
        }
    )  # the first three: tests below
    assert covered >= set(signatures.classes())


def test_root_cause_beats_the_generic_init_failure(log: Callable[[str], str]) -> None:
    # The worker_init log ends with "Engine core initialization failed"; the NCCL line above it is the cause.
    text = log("sim_fault_worker_init_vllm.log")
    assert "Engine core initialization failed" in text
    assert diagnose(text, "vllm").klass == "nccl_error"
    # nccl_shm's log also holds a generic NCCL error line: the /dev/shm line is more specific.
    assert diagnose(log("sim_fault_nccl_shm_vllm.log"), "vllm").klass == "nccl_shm"


def test_nsa_assertion_gets_its_own_advice(log: Callable[[str], str]) -> None:
    d = diagnose(log("sim_nsa_radix_sglang.log"), "sglang")
    assert "--disable-radix-cache" in d.advice
    assert "AssertionError" in d.evidence


def test_oom_after_ready_is_runtime(log: Callable[[str], str]) -> None:
    # The simulator's ready vLLM log, then the real torch OOM message (faults.toml oom_init) after it.
    ready = log("sim_vllm_glm5_tp8.log")
    oom = log("sim_fault_oom_init_vllm.log").splitlines()
    oom_line = next(line for line in oom if "CUDA out of memory" in line)
    assert diagnose(ready + oom_line + "\n", "vllm").klass == "oom_runtime"
    before = [line for line in ready.splitlines() if "Application startup complete" not in line]
    before = [line for line in before if "Starting vLLM" not in line]
    assert diagnose("\n".join(before) + "\n" + oom_line, "vllm").klass == "oom_init"


def test_startup_timeout_marker_and_vllm_message() -> None:
    text = "INFO loading weights\n" + timeout_marker(900, "port never opened") + "\n"
    d = diagnose(text)
    assert d.klass == "startup_timeout" and "900 s" in d.evidence
    # The string vLLM 0.32 raises (v1/engine/core_client.py).
    vllm_text = (
        "TimeoutError: Timed out waiting for engine core processes to start. This is often caused by slow "
        "weight loading for large models. Waited 600s (configured by VLLM_ENGINE_READY_TIMEOUT_S)."
    )
    d = diagnose(vllm_text, "vllm")
    assert d.klass == "startup_timeout" and "VLLM_ENGINE_READY_TIMEOUT_S" in d.advice


def test_sigterm_shutdown_is_not_an_engine_death(log: Callable[[str], str]) -> None:
    text = log("vllm_cpu_sigterm_shutdown.log")
    assert "EngineDeadError" in text
    d = diagnose(text, "vllm")
    assert d.klass != "engine_died_after_ready"
    assert fatal_in(text, "vllm") is None
    # Its one finding is the (non-fatal) compile-cache reload warning.
    assert d.klass == "compile_cache_corrupt" and d.fatal is False


def test_healthy_log_is_unknown_with_a_tail(log: Callable[[str], str]) -> None:
    d = diagnose(log("vllm_cpu_startup.log"), "vllm")
    assert d.klass == "unknown" and not d.fatal
    assert d.tail and d.evidence == d.tail[-1]
    assert fatal_in(log("vllm_cpu_startup.log"), "vllm") is None


def test_unknown_tail_keeps_the_last_traceback_and_error_lines() -> None:
    text = "\n".join(
        [
            "INFO 01-01 00:00:00 [a.py:1] starting",
            "Traceback (most recent call last):",
            '  File "/x/first.py", line 1, in <module>',
            "    first()",
            '  File "/x/middle.py", line 4, in first',
            "    frob()",
            '  File "/x/deep.py", line 9, in frob',
            "    raise KeyError('layers.7.mlp')",
            "KeyError: 'layers.7.mlp'",
            "ERROR 01-01 00:00:01 [b.py:2] something unrelated broke",
            "INFO 01-01 00:00:02 [c.py:3] bye",
        ]
    )
    d = diagnose(text)
    assert d.klass == "unknown"
    assert "KeyError: 'layers.7.mlp'" in d.tail
    assert any("deep.py" in line for line in d.tail)
    assert "something unrelated broke" in d.tail[-1]
    assert not any("first.py" in line for line in d.tail)  # only the last two frames


def test_fatal_in_ignores_warnings_and_finds_crashes(log: Callable[[str], str]) -> None:
    assert fatal_in(log("fail_moe_default_config_vllm_17619.log"), "vllm") is None
    d = fatal_in(log("sim_fault_oom_init_vllm.log"), "vllm")
    assert d is not None and d.klass == "oom_init" and d.fatal


def test_engine_restriction() -> None:
    line = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    assert diagnose(line, "sglang").klass == "oom_init"
    assert diagnose(line, "vllm").klass == "unknown"  # an SGLang-only signature
    assert diagnose(line, "sim").klass == "oom_init"  # the simulator speaks SGLang too


def test_guess_engine(log: Callable[[str], str]) -> None:
    assert guess_engine(log("vllm_cpu_startup.log")) == "vllm"
    assert guess_engine(log("sglang_qwq32b_tp4_l4.log")) == "sglang"
    assert guess_engine(log("llamacpp_cpu_issue15946.log")) == "llamacpp"
    assert guess_engine("hello") is None


def test_evidence_is_redacted() -> None:
    text = "vllm: error: unrecognized arguments: --api-key sk-abcdefghijklmnop --bogus"
    d = diagnose(text, "vllm")
    assert d.klass == "unsupported_argument"
    assert "sk-abcdefghijklmnop" not in d.evidence


def test_table_validation() -> None:
    base = {"class": {"unknown": {"priority": 0, "fatal": False, "advice": "?"}}}
    assert parse_table(base).signatures == ()
    with pytest.raises(ConfigError, match="unknown class"):
        parse_table({**base, "signature": [{"class": "nope", "pattern": "x"}]})
    with pytest.raises(ConfigError, match="bad regex"):
        parse_table({"class": {**base["class"], "a": {}}, "signature": [{"class": "a", "pattern": "("}]})
    with pytest.raises(ConfigError, match="phase"):
        parse_table(
            {
                "class": {**base["class"], "a": {}},
                "signature": [{"class": "a", "pattern": "x", "phase": "later"}],
            }
        )
    with pytest.raises(ConfigError, match="unknown"):
        parse_table({"class": {}})


def test_packaged_table_is_sane() -> None:
    kb = signatures.knowledge_base()
    assert len(kb.signatures) >= 40
    assert {"vllm", "sglang", "llamacpp", "transformers"} <= set(kb.ready_markers)
    for sig in kb.signatures:
        assert sig.advice, sig
        assert sig.source, sig
    assert kb.classes["unknown"]["fatal"] is False

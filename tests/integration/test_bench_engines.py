"""`servelab bench` against real engines: vLLM on CPU (compared with `vllm bench serve` on the same
server) and `transformers serve` (which rejects the exact-length parameters)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tests.integration.conftest import CLIENT_CPUS
from tests.support import engines

from servelab.bench.scrape import LevelScrape, parse_prometheus, pick

pytestmark = pytest.mark.integration


def _pin() -> None:
    if CLIENT_CPUS:
        os.sched_setaffinity(0, CLIENT_CPUS)


def servelab_bench(url: str, model: str, *args: str) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-m", "servelab", "bench", "--url", url, "--model", model, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=_pin,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def vllm_bench(server: engines.ServerHandle, tmp: Path, name: str, **opts: Any) -> dict[str, Any]:
    cmd = engines.vllm_bench_serve_cmd(server, result_dir=tmp, result_filename=name, **opts)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, preexec_fn=_pin)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((tmp / name).read_text())


def _server_scrape(server: engines.ServerHandle) -> dict[str, float]:
    """What servelab's scraper keeps of one /metrics read (the same code a level's record comes from)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        return pick(parse_prometheus(r.read().decode()))


def _both(
    server: engines.ServerHandle,
    tmp: Path,
    n: int,
    isl: int,
    osl: int,
    conc: int | None = None,
    rate: float | None = None,
    rounds: int = 3,
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Alternate the two tools on the same server. Per round, each tool's `vllm bench serve` keys plus
    `server_ttft_ms`/`server_itl_ms`: the engine's own means over that tool's window (for servelab the
    level's recorded `server_metrics`, for `vllm bench serve` scraped around its run here)."""
    load_theirs: dict[str, Any] = (
        {"max_concurrency": conc} if conc else {"request_rate": rate, "burstiness": 1000}
    )
    load_ours = ["--concurrency", str(conc)] if conc else ["--rate", str(rate), "--arrival", "constant"]
    mine: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for r in range(rounds):
        before = _server_scrape(server)
        t = vllm_bench(
            server,
            tmp,
            f"theirs-{conc}-{rate}-{r}.json",
            num_prompts=n,
            random_input_len=isl,
            random_output_len=osl,
            **load_theirs,
        )
        window = LevelScrape(before=before, after=_server_scrape(server)).summary()["server_mean_ms"]
        theirs.append(t | {"server_ttft_ms": window["ttft"], "server_itl_ms": window["itl"]})
        ours = servelab_bench(
            server.url,
            server.model,
            *load_ours,
            "--num-requests",
            str(n),
            "--input-len",
            str(isl),
            "--output-len",
            str(osl),
            "--tokenizer",
            str(server.model_dir),
            "--warmup",
            "0",
        )
        level = ours["levels"][0]
        own = level["server_metrics"]["server_mean_ms"]
        mine.append(
            level["summary"]["vllm_compatible"] | {"server_ttft_ms": own["ttft"], "server_itl_ms": own["itl"]}
        )
    return mine, theirs


def _median(rounds: list[dict[str, float]], key: str, over: str | None = None) -> float:
    """Median over the rounds of `key`, or of `key / over` (a client's number over the server's)."""
    return statistics.median(r[key] / r[over] if over else r[key] for r in rounds)


# Requests per round (docs/testing.md, "The agreement with vllm bench serve"): the bands below are 5-10 %
# wide and each client read within 3 % of the server's own histograms in every round of 8 spaced and 48
# closed-loop requests; a round's mean over n requests scatters as 1/sqrt(n), so half the requests
# widen that to ~4.3 %, still inside every band, and the median of three rounds drops one bad round.
AGREE_SPACED, AGREE_CLOSED = 4, 24


def test_servelab_and_vllm_bench_serve_agree(vllm_server: engines.ServerHandle, tmp_path: Path) -> None:
    """Same server, same lengths, clients on the core vLLM does not use; three alternating rounds each.

    Each client is compared with what the server itself measured over that client's own window (its
    TTFT and inter-token histograms), then the two clients' ratios with each other. Comparing the two
    clients' raw numbers measured the server instead: on a 2-core EPYC without AVX-512 the one-core
    vLLM's decode speed moved by up to 30 % between rounds seconds apart, and a 15 % limit on raw TPOT
    failed in CI (5.41 vs 4.59 ms) while both clients read within 3 % of the server in every round.

    TTFT is measured with requests spaced so that they never overlap: in a closed loop (or an open
    loop faster than the server) the next request lands while the server is still busy with the
    previous one. The spacing is twice one request's E2E as measured here first (a CPU without AVX-512
    takes over a second to prefill the prompt, a faster one a fraction of it). The prompt is long
    (3,800 tokens) so that TTFT is mostly server time. Throughput is compared in a closed loop.
    """
    vllm_bench(
        vllm_server,
        tmp_path,
        "warm.json",
        num_prompts=8,
        random_input_len=128,
        random_output_len=32,
        max_concurrency=4,
    )  # warm the server for both
    isl, osl, n = 3800, 96, AGREE_SPACED
    alone = servelab_bench(
        vllm_server.url,
        vllm_server.model,
        "--concurrency",
        "1",
        "--num-requests",
        "3",
        "--input-len",
        str(isl),
        "--output-len",
        str(osl),
        "--tokenizer",
        str(vllm_server.model_dir),
    )
    e2e_s = alone["levels"][0]["summary"]["e2e_ms"]["p50"] / 1000
    rate = round(1 / (2 * e2e_s), 3)
    mine, theirs = _both(vllm_server, tmp_path, n=n, isl=isl, osl=osl, rate=rate)
    for who in (mine, theirs):
        assert all(r["completed"] == n and r["total_output_tokens"] == n * osl for r in who)
    ratios = {
        name: {
            "ttft": _median(who, "mean_ttft_ms", "server_ttft_ms"),
            "tpot": _median(who, "mean_tpot_ms", "server_itl_ms"),
        }
        for name, who in (("servelab", mine), ("vllm bench serve", theirs))
    }
    for r in ratios.values():
        # a client sees the server's TTFT plus its own HTTP and tokenization path (3-25 ms of ~500 ms
        # here), never less; every output token after the first at the server's inter-token pace
        assert r["ttft"] >= 0.99, ratios
        assert 0.95 <= r["tpot"] <= 1.06, ratios
    # Its own path adds at most a tenth, or no more than vLLM's own client adds in the same run under the
    # same load (a loaded box slowed both clients' HTTP and tokenization to 1.11 and 1.15 once). Reading
    # closer to the server than vLLM's client is no fault: CI once saw servelab 1.11 beside vLLM's 1.19,
    # and the floor above already bounds it from below.
    assert ratios["servelab"]["ttft"] <= max(1.10, ratios["vllm bench serve"]["ttft"] + 0.02), ratios
    assert abs(ratios["servelab"]["tpot"] - ratios["vllm bench serve"]["tpot"]) <= 0.05, ratios

    # Closed loop, three rounds. In a closed loop each stream's next prompt is prefilled while the other
    # three decode; the server's inter-token histogram sees the same interruptions, so the ratio holds.
    mine, theirs = _both(vllm_server, tmp_path, n=AGREE_CLOSED, isl=256, osl=96, conc=4, rounds=3)
    tpot = {
        name: _median(who, "mean_tpot_ms", "server_itl_ms")
        for name, who in (("ours", mine), ("theirs", theirs))
    }
    assert all(0.95 <= v <= 1.06 for v in tpot.values()), tpot
    assert abs(tpot["ours"] - tpot["theirs"]) <= 0.05, tpot
    # Throughput in the server's own pace: tokens/s times the server's seconds per token is how many
    # streams were decoding on average, which a client's slow turnaround lowers and the server's drift
    # does not: raw tok/s moved from 343 to 626 between rounds, this from 3.62 to 3.68.
    busy = {
        name: [r["output_throughput"] * r["server_itl_ms"] / 1000 for r in who]
        for name, who in (("ours", mine), ("theirs", theirs))
    }
    assert statistics.median(busy["ours"]) == pytest.approx(statistics.median(busy["theirs"]), rel=0.03), busy


def test_vllm_exact_lengths_tokenizer_and_metrics(vllm_server: engines.ServerHandle) -> None:
    data = servelab_bench(
        vllm_server.url,
        vllm_server.model,
        "--concurrency",
        "1,4",
        "--num-requests",
        "12",
        "--input-len",
        "100",
        "--output-len",
        "20",
        "--tokenizer",
        str(vllm_server.model_dir),
    )
    assert data["capabilities"]["exact_length"] and data["capabilities"]["usage_returned"]
    assert data["capabilities"]["engine"] == "vllm"
    assert data["workload"]["token_counting"] == "tokenizer"
    for lv in data["levels"]:
        s = lv["summary"]
        assert s["completed"] == 12 and s["failed"] == 0
        assert s["length_mismatches"] == 0 and s["mean_output_tokens"] == 20
        assert s["token_sources"] == {"usage": 12}
        assert 100 <= s["mean_input_tokens"] <= 102  # the tokenizer cut exactly; BOS at most
        assert s["tokenizer_crosscheck"] == {"checked": 12, "disagree": 0}
        sm = lv["server_metrics"]
        assert sm["available"] and sm["deltas"]["generation_tokens"] == s["total_output_tokens"]
        assert sm["deltas"]["prompt_tokens"] == s["total_input_tokens"]


def test_vllm_usage_calibrated_input_lengths_and_chat(vllm_server: engines.ServerHandle) -> None:
    data = servelab_bench(
        vllm_server.url,
        vllm_server.model,
        "--concurrency",
        "2",
        "--num-requests",
        "8",
        "--input-len",
        "200",
        "--output-len",
        "8",
    )
    assert data["workload"]["token_counting"] == "usage-calibrated"
    assert data["levels"][0]["summary"]["mean_input_tokens"] == pytest.approx(200, rel=0.1)
    chat = servelab_bench(
        vllm_server.url,
        vllm_server.model,
        "--api",
        "chat",
        "--concurrency",
        "2",
        "--num-requests",
        "6",
        "--input-len",
        "80",
        "--output-len",
        "8",
    )
    s = chat["levels"][0]["summary"]
    assert s["completed"] == 6 and s["mean_output_tokens"] == 8
    assert s["mean_input_tokens"] == pytest.approx(80, rel=0.15)  # chat template included in the fit


def test_transformers_serve_falls_back_and_still_measures(transformers_server: engines.ServerHandle) -> None:
    data = servelab_bench(
        transformers_server.url,
        transformers_server.model,
        "--concurrency",
        "2",
        "--num-requests",
        "6",
        "--input-len",
        "32",
        "--output-len",
        "16",
        "--tokenizer",
        str(transformers_server.model_dir),
        "--api",
        "chat",
    )
    assert data["capabilities"]["exact_length"] is False
    assert any("ignore_eos" in w for w in data["warnings"])
    s = data["levels"][0]["summary"]
    assert s["completed"] == 6 and s["failed"] == 0
    assert s["ttft_ms"]["p50"] > 0 and s["e2e_ms"]["p50"] >= s["ttft_ms"]["p50"]
    # transformers serve sends usage on its finish chunk (and no [DONE]); its chunks may hold several
    # tokens, so counting chunks would be wrong: the counts must come from usage
    assert s["token_sources"] == {"usage": 6}
    assert 0 < s["mean_output_tokens"] <= 16
    # transformers serve 5.19 streams the templated prompt back with the reply, so the tokenizer's
    # count of the streamed text disagrees with usage: servelab checks every request and says so
    assert s["tokenizer_crosscheck"]["checked"] == 6
    if s["tokenizer_crosscheck"]["disagree"]:
        assert any("disagrees with the server's usage" in w for w in data["warnings"])

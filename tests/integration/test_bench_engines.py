"""`servelab bench` against real engines: vLLM on CPU (compared with `vllm bench serve` on the same
server) and `transformers serve` (which rejects the exact-length parameters)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.integration.conftest import CLIENT_CPUS
from tests.support import engines

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


def _both(
    server: engines.ServerHandle,
    tmp: Path,
    n: int,
    isl: int,
    osl: int,
    conc: int | None = None,
    rate: float | None = None,
    rounds: int = 3,
) -> tuple[dict[str, float], dict[str, float]]:
    """Alternate the two tools on the same server; per metric, the median over the rounds."""
    keys = ("median_ttft_ms", "median_tpot_ms", "output_throughput", "completed", "total_output_tokens")
    load_theirs: dict[str, Any] = (
        {"max_concurrency": conc} if conc else {"request_rate": rate, "burstiness": 1000}
    )
    load_ours = ["--concurrency", str(conc)] if conc else ["--rate", str(rate), "--arrival", "constant"]
    mine: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for r in range(rounds):
        theirs.append(
            vllm_bench(
                server,
                tmp,
                f"theirs-{conc}-{rate}-{r}.json",
                num_prompts=n,
                random_input_len=isl,
                random_output_len=osl,
                **load_theirs,
            )
        )
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
        mine.append(ours["levels"][0]["summary"]["vllm_compatible"])
    return (
        {k: statistics.median(m[k] for m in mine) for k in keys}
        | {"ttft_rounds": [m["median_ttft_ms"] for m in mine]},
        {k: statistics.median(t[k] for t in theirs) for k in keys}
        | {"ttft_rounds": [t["median_ttft_ms"] for t in theirs]},
    )


def test_servelab_and_vllm_bench_serve_agree(vllm_server: engines.ServerHandle, tmp_path: Path) -> None:
    """Same server, same lengths, clients on the core vLLM does not use; medians of three alternating
    rounds, since a one-core vLLM varies by about ±5 % from run to run.

    TTFT is compared with requests spaced so that they never overlap: in a closed loop (or an open loop
    faster than the server) the next request lands while the server is still busy with the previous one,
    and how long it waits depends on each client's own timing. The spacing is twice one request's E2E as
    measured here first (a CPU without AVX-512 takes over a second to prefill the prompt, a faster one a
    fraction of it: a fixed rate overlapped on one and not the other). Each client's own wake-up and send
    path differs by 1–3 ms on this machine, so the prompt is long enough (3,800 tokens) for TTFT to be
    mostly server time. Throughput is compared in a closed loop.
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
    isl, osl, n = 3800, 96, 8
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
    assert mine["completed"] == theirs["completed"] == n
    assert mine["total_output_tokens"] == theirs["total_output_tokens"] == n * osl
    # TTFT: on this 2-core EPYC the server's own prefill time drifted between rounds by up to half (the
    # two clients' medians differed by 12 % to 48 %, either way). The clients agree when their gap is
    # within 15 % or within the round-to-round spread the same run measured of either tool alone.
    spread = max(max(r["ttft_rounds"]) - min(r["ttft_rounds"]) for r in (mine, theirs))
    gap = abs(mine["median_ttft_ms"] - theirs["median_ttft_ms"])
    assert gap <= max(0.15 * theirs["median_ttft_ms"], spread), (mine["ttft_rounds"], theirs["ttft_rounds"])
    # TPOT: ours read 10-13 % above vllm bench serve's on a 2-core EPYC without AVX-512 (three runs), in
    # both loops, at equal token counts; open question in the notes. 15 % until it is explained.
    assert mine["median_tpot_ms"] == pytest.approx(theirs["median_tpot_ms"], rel=0.15)

    # Five rounds here: a one-core vLLM's throughput drifts by ±5 % between runs, and a 5 % limit on the
    # median of three rounds failed once in CI on drift alone (1,194 vs 1,284 tok/s).
    mine, theirs = _both(vllm_server, tmp_path, n=48, isl=256, osl=96, conc=4, rounds=5)
    # In a closed loop each stream's next prompt is prefilled while the other three decode, and when it
    # lands depends on each client's own turnaround, so TPOT carries some of the client: on a 2-core EPYC
    # without AVX-512 ours read 12.7 % above vllm bench serve's at equal throughput (the client-free TPOT
    # comparison is the spaced one above, at 10 %).
    assert mine["median_tpot_ms"] == pytest.approx(theirs["median_tpot_ms"], rel=0.15)
    assert mine["output_throughput"] == pytest.approx(theirs["output_throughput"], rel=0.05)


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

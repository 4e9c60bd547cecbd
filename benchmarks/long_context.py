"""Long prompts against the simulator: does the benchmark client keep up at 64k tokens?

One published client fell from 486 to 44 tok/s at 50k-token context (a 64 KB read buffer). Here the
simulator (vLLM's personality, GLM-5 NVFP4 on eight PCIe RTX PRO 6000, 140k context, --speed 50) runs
pinned to core 1, each client pinned to core 0, and both `servelab bench` and `vllm bench serve` run
the same load (concurrency 1 and 4, 256 output tokens, random prompts of 1k and 64k tokens) in the same run:

- output tok/s as each client measures it, against the server's own count (the simulator's generation
  counter over the client's wall time): a client that cannot keep up reads less than the server made;
- client CPU per streamed token, as ΔCPU/Δtokens between an N- and a 2N-request run (cancels start-up,
  imports, prompt building), so the two lengths compare what streaming costs.

Usage: .venv/bin/python benchmarks/long_context.py [--quick] [--out benchmarks/results/long_context.json]
Needs the engines venv (scripts/install-engines.sh) for `vllm bench serve` and the tiny tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import client_overhead as co  # noqa: E402
from sim_capacity import start, stop  # noqa: E402
from tests.support.engines import build_tiny_model, engines_python  # noqa: E402

MODEL = "GLM-5-NVFP4"
SIM = ["--model", MODEL, "--gpu", "rtx-pro-6000", "--num-gpus", "8", "--tp", "8", "--personality", "vllm"]
SIM += ["--max-model-len", "140000", "--speed", "50", "--cpu", "1"]
OUT_LEN = 256
CONCURRENCY, LENGTHS = (1, 4), (1024, 65536)


def generated(url: str) -> float:
    """The simulator's own count of generated tokens (vLLM's counter name)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:generation_tokens_total"):
                return float(line.rsplit(" ", 1)[1])
    raise RuntimeError("no vllm:generation_tokens_total in /metrics")


def servelab_run(url: str, n: int, conc: int, input_len: int, home: str) -> tuple[float, dict[str, Any]]:
    argv = [*co.SERVELAB, "bench", "--url", url, "--model", MODEL, "--concurrency", str(conc)]
    argv += ["--num-requests", str(n), "--input-len", str(input_len), "--output-len", str(OUT_LEN)]
    argv += ["--warmup", "0", "--scrape-interval", "0", "--json"]
    before = generated(url)
    cpu_s, out = co.run_pinned(argv, 0, env={**os.environ, "SERVELAB_HOME": home})
    level = json.loads(out)["levels"][0]
    s = level.get("wall_clock_summary") or level["summary"]  # the client's own clock, as vLLM reports
    return cpu_s, {
        "total_output_tokens": s["total_output_tokens"],
        "output_throughput": s["output_throughput"],
        "server_tokens_per_s": (generated(url) - before) / level["client"]["wall_s"],
        "completed": s["completed"],
        "failed": s["failed"],
        "mean_input_tokens": s["total_input_tokens"] / max(1, s["completed"]),
    }


def vllm_run(
    url: str, n: int, conc: int, input_len: int, tokenizer: str, result_dir: str
) -> tuple[float, dict[str, Any]]:
    name = f"vllm-{conc}-{input_len}-{n}.json"
    argv = [str(engines_python()), str(ROOT / "tests" / "support" / "vllm_cli.py"), "bench", "serve"]
    argv += ["--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions", "--model", MODEL]
    argv += ["--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(input_len)]
    argv += ["--random-output-len", str(OUT_LEN), "--num-prompts", str(n), "--max-concurrency", str(conc)]
    argv += ["--ignore-eos", "--save-result", "--result-dir", result_dir, "--result-filename", name]
    argv += ["--num-warmups", "0"]
    before = generated(url)
    cpu_s, _ = co.run_pinned(argv, 0)
    r = json.loads((Path(result_dir) / name).read_text())
    return cpu_s, {
        "total_output_tokens": r["total_output_tokens"],
        "output_throughput": r["output_throughput"],
        "server_tokens_per_s": (generated(url) - before) / r["duration"],
        "completed": r["completed"],
        "failed": r.get("failed", n - r["completed"]),
        "mean_input_tokens": r["total_input_tokens"] / max(1, r["completed"]),
    }


def measure(runner: Any, n: int, repeats: int) -> dict[str, Any]:
    """ΔCPU/Δtokens between N and 2N requests (median of `repeats`), and the 2N run's throughputs."""
    samples, runs = [], []
    for _ in range(repeats):
        c1, r1 = runner(n)
        c2, r2 = runner(2 * n)
        samples.append((c2 - c1) / (r2["total_output_tokens"] - r1["total_output_tokens"]) * 1e6)
        runs.append(r2)
    return {
        "cpu_us_per_token": statistics.median(samples),
        "samples": samples,
        "output_throughput": statistics.median(r["output_throughput"] for r in runs),
        "server_tokens_per_s": statistics.median(r["server_tokens_per_s"] for r in runs),
        "mean_input_tokens": runs[-1]["mean_input_tokens"],
        "failed": sum(r["failed"] for r in runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one repeat, fewer requests")
    ap.add_argument("--repeats", type=int, default=3, help="N/2N pairs per case (median)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "long_context.json"))
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs two cores: the simulator and the client run on separate cores")
    tok = str(build_tiny_model("qwen3_moe"))
    n, repeats = (8, 1) if args.quick else (16, args.repeats)
    home, result_dir = tempfile.mkdtemp(prefix="servelab-lc-"), tempfile.mkdtemp(prefix="vllm-lc-")
    log_dir = Path(tempfile.mkdtemp(prefix="servelab-lc-sim-"))
    proc, url = start(SIM, log_dir)
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "workload": {"output_len": OUT_LEN, "requests": [n, 2 * n], "repeats": repeats},
    }
    cases = [(c, L) for c in CONCURRENCY for L in LENGTHS]
    try:
        for c, L in cases:
            results[f"c{c}_input_{L}"] = {
                "servelab": measure(lambda k, c=c, L=L: servelab_run(url, k, c, L, home), n, repeats),
                "vllm_bench_serve": measure(
                    lambda k, c=c, L=L: vllm_run(url, k, c, L, tok, result_dir), n, repeats
                ),
            }
    finally:
        stop(proc)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    for c, L in cases:
        for tool, r in results[f"c{c}_input_{L}"].items():
            print(
                f"c={c}, {L:>6}-token prompts, {tool}: {r['output_throughput']:.1f} tok/s read "
                f"(server made {r['server_tokens_per_s']:.1f}), {r['cpu_us_per_token']:.1f} µs CPU per token, "
                f"{r['mean_input_tokens']:.0f} input tokens per request, {r['failed']} failed"
            )
    for c in CONCURRENCY:
        for tool in ("servelab", "vllm_bench_serve"):
            a, b = results[f"c{c}_input_1024"][tool], results[f"c{c}_input_65536"][tool]
            ratio = b["cpu_us_per_token"] / a["cpu_us_per_token"]
            print(f"c={c}, {tool}: CPU per token at 64k is {ratio:.2f}× that at 1k")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

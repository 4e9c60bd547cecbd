"""How much CPU does the benchmark client spend per streamed token, compared with `vllm bench serve`?

Setup: the fault-free streaming server of the tests (tests/support/fault_server.py) pinned to one
core, each client pinned to the other. Each client is run twice on the same server, with N and 2N
requests; CPU per token = ΔCPU / Δtokens, which cancels fixed costs (interpreter start, imports,
tokenizer loading) that would otherwise flatter or punish either tool.

Also checked: 1,024 concurrent streams complete, and with the server streaming at exactly 20 ms per
token at concurrency 256 the reported median TPOT is within 2 % of 20 ms.

Usage: .venv/bin/python benchmarks/client_overhead.py [--quick] [--out benchmarks/results/client_overhead.json]
Needs the engines venv (scripts/install-engines.sh) for `vllm bench serve` and the tiny tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.engines import build_tiny_model, engines_python  # noqa: E402

SERVELAB = [str(ROOT / ".venv" / "bin" / "python"), "-m", "servelab"]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_server(interval_ms: float, cpu: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "support" / "fault_server.py"),
            "--port",
            str(port),
            "--token-interval-ms",
            str(interval_ms),
            "--cpu",
            str(cpu),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("fault server did not start")


def run_pinned(argv: list[str], cpu: int, env: dict[str, str] | None = None) -> tuple[float, bytes]:
    """Run a client pinned to `cpu`; returns (its CPU seconds, user + system, and its stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        argv, capture_output=True, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}), timeout=1800, env=env
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed: {proc.stderr.decode()[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout


def servelab_run(
    url: str, n: int, conc: int, out_len: int, cpu: int, home: str
) -> tuple[float, dict[str, Any]]:
    argv = [
        *SERVELAB,
        "bench",
        "--url",
        url,
        "--model",
        "fault-model",
        "--concurrency",
        str(conc),
        "--num-requests",
        str(n),
        "--input-len",
        "32",
        "--output-len",
        str(out_len),
        "--warmup",
        "0",
        "--json",
    ]
    cpu_s, out = run_pinned(argv, cpu, env={**os.environ, "SERVELAB_HOME": home})
    return cpu_s, json.loads(out)["levels"][0]


def vllm_run(
    url: str, n: int, conc: int, out_len: int, cpu: int, tokenizer: str, result_dir: str
) -> tuple[float, dict[str, Any]]:
    name = f"vllm-{n}-{conc}.json"
    argv = [
        engines_python(),
        str(ROOT / "tests" / "support" / "vllm_cli.py"),
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        "fault-model",
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        "32",
        "--random-output-len",
        str(out_len),
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(conc),
        "--ignore-eos",
        "--save-result",
        "--result-dir",
        result_dir,
        "--result-filename",
        name,
        "--num-warmups",
        "0",
    ]
    cpu_s, _ = run_pinned(argv, cpu)
    return cpu_s, json.loads((Path(result_dir) / name).read_text())


FLOOR_CLIENT = r"""
import asyncio, json, sys
import uvloop
url, n, conc, out_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
host, port = url.split("//")[1].split(":")
body = json.dumps({"model": "fault-model", "prompt": "floor " * 32, "max_tokens": out_len, "stream": True,
                   "ignore_eos": True}).encode()
req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(body), body)
class P(asyncio.Protocol):
    def connection_made(self, t): self.t = t
    def data_received(self, d):
        if d.endswith(b"0\r\n\r\n"): self.fut.set_result(None)
async def main():
    loop = asyncio.get_running_loop()
    left = n
    async def worker():
        nonlocal left
        _, p = await loop.create_connection(P, host, int(port))
        while left > 0:
            left -= 1
            p.fut = loop.create_future(); p.t.write(req); await p.fut
    await asyncio.gather(*(worker() for _ in range(conc)))
uvloop.run(main())
print(json.dumps({"total_output_tokens": n * out_len}))
"""


def floor_run(url: str, n: int, conc: int, out_len: int, cpu: int) -> tuple[float, dict[str, Any]]:
    """A client that does nothing but read the bytes: the kernel's and the event loop's share."""
    cpu_s, out = run_pinned([sys.executable, "-c", FLOOR_CLIENT, url, str(n), str(conc), str(out_len)], cpu)
    return cpu_s, json.loads(out)


def per_token(runner: Any, n: int, repeats: int) -> dict[str, Any]:
    """Median over `repeats` of ΔCPU/Δtokens between an N-request and a 2N-request run."""
    samples, whole = [], []
    for _ in range(repeats):
        c1, r1 = runner(n)
        c2, r2 = runner(2 * n)
        t1 = r1["summary"]["total_output_tokens"] if "summary" in r1 else r1["total_output_tokens"]
        t2 = r2["summary"]["total_output_tokens"] if "summary" in r2 else r2["total_output_tokens"]
        samples.append((c2 - c1) / (t2 - t1) * 1e6)
        whole.append(c2 / t2 * 1e6)
    return {
        "cpu_us_per_token": statistics.median(samples),
        "samples": samples,
        "whole_process_us_per_token": statistics.median(whole),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs (for a smoke check)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "client_overhead.json"))
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs two cores: the server and the client run on separate cores")
    tok = str(build_tiny_model("qwen3_moe"))
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    n, conc, out_len, repeats = (200, 32, 200, 1) if args.quick else (1000, 64, 400, 3)
    home = tempfile.mkdtemp(prefix="servelab-bench-")
    result_dir = tempfile.mkdtemp(prefix="vllm-bench-")

    # 1. CPU per streamed token, server on core 1, clients on core 0. Two regimes: the server as fast
    #    as it can (many events per TCP read) and paced at 5 ms/token over 256 streams (about one
    #    event per read, where the kernel's per-read cost dominates for every client).
    regimes = {"as_fast_as_possible": (0.0, n, conc, out_len), "paced_5ms_c256": (5.0, n // 2, 256, 100)}
    for name, (interval, k_n, k_conc, k_out) in regimes.items():
        server, url = start_server(interval, cpu=1)
        try:
            floor = per_token(lambda k, c=k_conc, o=k_out, u=url: floor_run(u, k, c, o, 0), k_n, repeats)
            ours = per_token(
                lambda k, c=k_conc, o=k_out, u=url: servelab_run(u, k, c, o, 0, home), k_n, repeats
            )
            theirs = per_token(
                lambda k, c=k_conc, o=k_out, u=url: vllm_run(u, k, c, o, 0, tok, result_dir), k_n, repeats
            )
        finally:
            server.kill()
        results[f"cpu_per_token_{name}"] = {
            "floor_do_nothing_client": floor,
            "servelab": ours,
            "vllm_bench_serve": theirs,
            "ratio": ours["cpu_us_per_token"] / theirs["cpu_us_per_token"],
            "ratio_whole_process": ours["whole_process_us_per_token"] / theirs["whole_process_us_per_token"],
            "workload": {
                "token_interval_ms": interval,
                "requests": [k_n, 2 * k_n],
                "concurrency": k_conc,
                "output_len": k_out,
                "repeats": repeats,
            },
        }

    # 2. 1,024 concurrent streams.
    server, url = start_server(20, cpu=1)
    try:
        _, lvl = servelab_run(url, 1024 if args.quick else 2048, 1024, 50, 0, home)
        s = lvl["summary"]
        results["streams_1024"] = {
            "completed": s["completed"],
            "failed": s["failed"],
            "max_running_on_server": lvl["server_metrics"]
            .get("gauges", {})
            .get("requests_running", {})
            .get("max"),
            "median_tpot_ms": s["tpot_ms"]["p50"],
            "client": lvl["client"],
        }
        # 3. TPOT accuracy at 20 ms/token, concurrency 256.
        _, lvl = servelab_run(url, 512 if args.quick else 1024, 256, 100, 0, home)
        med = lvl["summary"]["tpot_ms"]["p50"]
        results["tpot_accuracy_20ms_c256"] = {
            "median_tpot_ms": med,
            "error_pct": abs(med - 20.0) / 20.0 * 100,
            "median_itl_ms": lvl["summary"]["itl_ms"]["p50"],
            "client": lvl["client"],
        }
    finally:
        server.kill()

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    r = results
    for name in regimes:
        c = r[f"cpu_per_token_{name}"]
        print(
            f"CPU per streamed token ({name}): servelab {c['servelab']['cpu_us_per_token']:.1f} µs, "
            f"vllm bench serve {c['vllm_bench_serve']['cpu_us_per_token']:.1f} µs, a client that only "
            f"reads {c['floor_do_nothing_client']['cpu_us_per_token']:.1f} µs (marginal ratio "
            f"{c['ratio']:.2f}; whole-process ratio {c['ratio_whole_process']:.2f}; target ≤ 0.33)"
        )
    print(
        f"1,024 streams: {r['streams_1024']['completed']} completed, {r['streams_1024']['failed']} failed, "
        f"server saw up to {r['streams_1024']['max_running_on_server']} running"
    )
    print(
        f"20 ms/token at c=256: median TPOT {r['tpot_accuracy_20ms_c256']['median_tpot_ms']:.3f} ms "
        f"(error {r['tpot_accuracy_20ms_c256']['error_pct']:.2f} %; target ≤ 2 %)"
    )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

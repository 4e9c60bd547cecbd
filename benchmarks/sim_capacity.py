"""Capacity and fidelity of `servelab sim`, measured with `servelab bench`.

    .venv/bin/python benchmarks/sim_capacity.py [--quick] [--skip-fidelity] [--json OUT]

Capacity: the simulator pinned to one core (`--cpu 0`, os.sched_setaffinity), `servelab bench` on the
other cores, 1,024 concurrent streams at a high --speed so the simulator (not the model clock) is the
limit: streams served and streamed tokens/s. Fidelity: bench at speed 1 against `servelab predict`
for the same configuration at concurrency 1, 16 and 64 (median TTFT and TPOT).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PY = sys.executable


def start(args: list[str], log_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    err = log_dir / f"sim-{time.monotonic_ns()}.err"
    with open(err, "wb") as e:
        proc = subprocess.Popen(
            [PY, "-m", "servelab", "sim", "--port", "0", "--fast-start", *args],
            stdout=subprocess.DEVNULL,
            stderr=e,
            start_new_session=True,
        )
    for _ in range(600):
        for line in err.read_text().splitlines():
            if line.startswith("SIM-PORT "):
                url = f"http://127.0.0.1:{line.split()[1]}"
                for _ in range(600):  # bound is not ready: vLLM accepts connections only then
                    with (
                        contextlib.suppress(OSError),
                        urllib.request.urlopen(url + "/health", timeout=2) as r,
                    ):
                        if r.status == 200:
                            return proc, url
                    time.sleep(0.05)
        time.sleep(0.05)
    raise RuntimeError(err.read_text()[-2000:])


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(10)


def bench(url: str, model: str, home: Path, *args: str, cpus: set[int] | None = None) -> dict:
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    cmd = [PY, "-m", "servelab", "bench", "--url", url, "--model", model, "--json", *args]
    pre = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=pre, timeout=1800)
    if res.returncode:
        raise RuntimeError(res.stderr[-3000:])
    return json.loads(res.stdout)


def capacity(tmp: Path, quick: bool) -> dict:
    ncpu = os.cpu_count() or 2
    others = set(range(1, ncpu)) or {0}
    n = 2048 if quick else 4096
    proc, url = start(["--model", "Qwen3-8B", "--gpu", "h100-sxm", "--speed", "200", "--cpu", "0"], tmp)
    try:
        d = bench(
            url,
            "Qwen3-8B",
            tmp / "home",
            "--concurrency",
            "1024",
            "--num-requests",
            str(n),
            "--input-len",
            "32",
            "--output-len",
            "256",
            "--warmup",
            "0",
            cpus=others,
        )
    finally:
        stop(proc)
    s = d["levels"][0]["summary"]
    return {
        "streams": 1024,
        "requests": s["completed"],
        "failed": s["failed"],
        "output_tokens_per_s": s["output_throughput"],
        "wall_s": s["duration_s"],
        "client_cpu_utilization": d["levels"][0]["client"].get("cpu_utilization"),
    }


def fidelity(tmp: Path, quick: bool) -> list[dict]:
    from servelab.model.predict import Workload, evaluate, make_setup

    rows = []
    cases = (
        [("Qwen3-8B", "h100-sxm", "vllm")]
        if quick
        else [("Qwen3-8B", "h100-sxm", "vllm"), ("Qwen3-8B", "h100-sxm", "sglang")]
    )
    isl, osl = 256, 128

    def predict(model: str, gpu: str, personality: str) -> dict[int, tuple[float, float]]:
        setup = make_setup(model, gpu, 1, engine=personality)
        return {
            c: (p.ttft_ms, p.tpot_ms) for c in (1, 16, 64) for p in [evaluate(setup, Workload(isl, osl, c))]
        }

    for model, gpu, personality in cases:
        # The simulator reads the model's factors when it starts: predict with the same factors, and
        # say so when they changed during the run (a refit in progress makes the comparison moot).
        before = predict(model, gpu, personality)
        ncpu = os.cpu_count() or 2
        pin = ["--cpu", "0"] if ncpu > 1 else []
        proc, url = start(
            ["--model", model, "--gpu", gpu, "--personality", personality, "--speed", "1", *pin], tmp
        )
        try:
            d = bench(
                url,
                model,
                tmp / "home",
                "--concurrency",
                "1,16,64",
                "--num-requests",
                "128",
                "--input-len",
                str(isl),
                "--output-len",
                str(osl),
                cpus=set(range(1, ncpu)) or None,
            )
        finally:
            stop(proc)
        changed = predict(model, gpu, personality) != before
        if changed:
            print(f"warning: the model's factors changed during the {personality} run", file=sys.stderr)
        for lv in d["levels"]:
            s = lv["summary"]
            ttft, tpot = before[int(s["value"])]
            rows.append(
                {
                    "config": f"{model} {gpu} {personality}",
                    "concurrency": int(s["value"]),
                    "ttft_ms": s["ttft_ms"]["p50"],
                    "ttft_pred_ms": ttft,
                    "ttft_err": s["ttft_ms"]["p50"] / ttft - 1,
                    "tpot_ms": s["tpot_ms"]["p50"],
                    "tpot_pred_ms": tpot,
                    "tpot_err": s["tpot_ms"]["p50"] / tpot - 1,
                    "factors_changed": changed,
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-fidelity", action="store_true")
    ap.add_argument("--skip-capacity", action="store_true")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    out: dict = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if not a.skip_capacity:
            out["capacity"] = capacity(tmp, a.quick)
            c = out["capacity"]
            print(
                f"capacity: {c['streams']} streams, {c['requests']} requests ({c['failed']} failed), "
                f"{c['output_tokens_per_s']:,.0f} streamed tokens/s with the simulator on one core"
            )
        if not a.skip_fidelity:
            out["fidelity"] = fidelity(tmp, a.quick)
            print(
                f"{'config':28s} {'c':>3s} {'TTFT':>8s} {'pred':>8s} {'err':>7s} {'TPOT':>7s} {'pred':>7s} {'err':>7s}"
            )
            for r in out["fidelity"]:
                print(
                    f"{r['config']:28s} {r['concurrency']:3d} {r['ttft_ms']:8.1f} {r['ttft_pred_ms']:8.1f} "
                    f"{r['ttft_err']:+7.1%} {r['tpot_ms']:7.2f} {r['tpot_pred_ms']:7.2f} {r['tpot_err']:+7.1%}"
                )
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

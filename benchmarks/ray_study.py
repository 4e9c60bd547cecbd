"""A 12-candidate simulator study on a Ray cluster of two nodes against the same study on one node (issue
17: at most 0.6x), and what the Ray driver adds per trial over the local executor (issue 17: under 50 ms).

Every candidate is GLM-5 NVFP4 TP8 on eight simulated RTX PRO 6000 (SGLang personality, levels 1 and 16,
`--speed 3`: a trial waits on its simulated GPU most of the time, as a real one does, instead of on this
2-core machine's CPU), so each trial takes a whole node and costs the same. On a cluster the baseline
runs on `baseline_nodes = 2` nodes, so the cluster runs do 13 trials (the one-node cluster runs the
baseline's second trial on its one node) and the local run 12.

The per-trial cost is the slope between the 12-candidate study and a 6-candidate one (wall = fixed +
per trial × trials), for the local executor and for a one-node cluster: what a study pays once (Ray's
import and join, the first actor, the shutdown) cancels, and is reported apart. The clusters are real
Ray nodes on this machine (tests/support/raycluster.py: raylets in a network namespace of their own, on
127.0.0.1): what is measured is how trials are spread and what the driver costs, not a network. Runs
alternate `--rounds` times each, in fresh stores; medians are compared.

Usage: .venv/bin/python benchmarks/ray_study.py [--rounds 2] [--speed 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.raycluster import RayCluster, ray_cluster  # noqa: E402

N = 12


def study_text(executor: str, speed: float, n: int = N) -> str:
    lines = [
        "[study]",
        'name = "ray-bench"',
        "[model]",
        'path = "GLM-5-NVFP4"',
        "[host]",
        'gpu = "rtx-pro-6000"',
        "num_gpus = 8",
        "[executor]",
        f'kind = "{executor}"',
        "[engine]",
        'name = "sim"',
        "startup_timeout_s = 60",
        'args = ["--disable-radix-cache"]',
        "[engine.options]",
        'personality = "sglang"',
        f"speed = {speed:g}",
        "fast_start = true",
    ]
    for i in range(n):
        lines += [
            "[[candidates]]",
            f'name = "tp8-{i + 1:02d}"',
            "tp = 8",
            'args = ["--moe-runner-backend", "flashinfer_cutlass"]',
        ]
        if i == 0:
            lines.append("baseline = true")
    lines += [
        "[workload]",
        "input_len = 256",
        "output_len = 32",
        "requests_per_stream = 2",
        "timeout_s = 20",
        "[load]",
        "concurrency = [1, 16]",
    ]
    return "\n".join(lines) + "\n"


def run_once(
    kind: str, cluster: RayCluster | None, base: Path, tag: str, speed: float, n: int = N
) -> dict[str, float]:
    d = base / tag
    d.mkdir()
    study = d / "study.toml"
    study.write_text(study_text("ray" if cluster else "local", speed, n))
    env = {**os.environ, "SERVELAB_HOME": str(d / "home")}
    argv = [sys.executable, "-m", "servelab", "tune", str(study), "--json"]
    if cluster is not None:
        env.update(cluster.env)
        argv = cluster.wrap([*argv, "--ray-address", cluster.address])
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800, check=False)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{kind} run failed ({res.returncode}):\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout)
    measured = sum(1 for c in out["candidates"] if c["status"] in ("measured", "anomalous"))
    if measured != n:
        raise SystemExit(f"{kind}: {measured} of {n} candidates measured:\n{res.stderr[-3000:]}")
    import sqlite3

    con = sqlite3.connect(d / "home" / "servelab.db")
    trials = con.execute("SELECT count(*) FROM study_trials WHERE status = 'measured'").fetchone()[0]
    nodes = con.execute("SELECT count(DISTINCT node_json) FROM study_trials").fetchone()[0]
    con.close()
    joined = re.search(r"joined the ray cluster: \d+ GPUs, in ([\d.]+) s", res.stderr)
    connect = float(joined.group(1)) if joined else 0.0
    return {"wall_s": wall, "trials": float(trials), "nodes": float(nodes), "connect_s": connect}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--speed", type=float, default=3.0, help="the simulator's --speed (default 3)")
    args = ap.parse_args()
    half = N // 2
    keys = ("local", "local-half", "ray-1-node", "ray-1-node-half", "ray-2-nodes")
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in keys}
    with tempfile.TemporaryDirectory(prefix="servelab-ray-bench-") as tmp:
        base = Path(tmp)
        with ray_cluster(workers=1, gpus=8) as two:
            for r in range(args.rounds):
                runs["ray-2-nodes"].append(run_once("ray-2-nodes", two, base, f"two-{r}", args.speed))
                runs["local"].append(run_once("local", None, base, f"local-{r}", args.speed))
                runs["local-half"].append(run_once("local", None, base, f"lhalf-{r}", args.speed, half))
        with ray_cluster(workers=0, gpus=8) as one:
            for r in range(args.rounds):
                runs["ray-1-node"].append(run_once("ray-1-node", one, base, f"one-{r}", args.speed))
                runs["ray-1-node-half"].append(
                    run_once("ray-1-node", one, base, f"ohalf-{r}", args.speed, half)
                )
    med = {k: statistics.median(x["wall_s"] for x in v) for k, v in runs.items()}
    trials = {k: v[0]["trials"] for k, v in runs.items()}
    # wall = fixed + per_trial × trials: the slope between the full and the half study cancels what a
    # study pays once (Ray's import and join, the first actor, the shutdown; the CLI's own start).
    slope = {
        "local": (med["local"] - med["local-half"]) / (trials["local"] - trials["local-half"]),
        "ray-1-node": (med["ray-1-node"] - med["ray-1-node-half"])
        / (trials["ray-1-node"] - trials["ray-1-node-half"]),
    }
    fixed = {k: med[k] - slope[k] * trials[k] for k in slope}
    result = {
        "candidates": N,
        "speed": args.speed,
        "rounds": args.rounds,
        "median_wall_s": med,
        "trials": trials,
        "two_over_one": med["ray-2-nodes"] / med["ray-1-node"],
        "per_trial_s": slope,
        "fixed_s": fixed,
        "driver_ms_per_trial": (slope["ray-1-node"] - slope["local"]) * 1000,
        "driver_fixed_s": fixed["ray-1-node"] - fixed["local"],
        "runs": runs,
        "load_avg": os.getloadavg(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()

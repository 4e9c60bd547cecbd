"""How long `servelab tune STUDY --dry-run` takes on a large `[matrix]` (issue 15, item 7).

The study is a simulator study whose matrix is `env` × `args` × `tp` (labels that differ on main too, so
the same file can be timed on a checkout of main): 94,000 candidates at the largest size. Each size is
run as a real `python -m servelab tune FILE --dry-run --json` process, stopped after `--limit` seconds.

Usage: .venv/bin/python benchmarks/study_dry_run.py [--src OTHER_CHECKOUT/src] [--limit 60] [SIZES...]
(`--src` times another checkout, e.g. a worktree of main.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def study_text(n_env: int, n_args: int) -> str:
    env = ", ".join(f'{{X = "{i}"}}' for i in range(n_env))
    args = ", ".join(f'["--max-num-batched-tokens", "{1024 + j}"]' for j in range(n_args))
    return (
        '[study]\nname = "big"\n[model]\npath = "Qwen3-30B-A3B"\n'
        '[engine]\nname = "sim"\n[engine.options]\ngpu = "h100-sxm"\nnum_gpus = 8\nspeed = 50.0\n'
        f"[matrix]\ntp = [1, 2]\nenv = [{env}]\nargs = [{args}]\n"
        "[workload]\nnum_requests = 8\n[load]\nconcurrency = [1]\n"
    )


def time_dry_run(path: Path, src: str | None, limit: float) -> tuple[float | None, int]:
    env = {**os.environ, "SERVELAB_HOME": str(path.parent / "home")}
    if src:
        env["PYTHONPATH"] = src
    t0 = time.perf_counter()
    try:
        res = subprocess.run(
            [sys.executable, "-m", "servelab", "tune", str(path), "--dry-run", "--json"],
            capture_output=True,
            env=env,
            timeout=limit,
        )
    except subprocess.TimeoutExpired:
        return None, -1
    return time.perf_counter() - t0, res.returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=None, help="the src/ directory of another checkout to time")
    ap.add_argument("--limit", type=float, default=60.0)
    ap.add_argument("sizes", nargs="*", type=int, default=[2_000, 8_000, 32_000, 94_000])
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in opts.sizes:
            n_args = 50
            n_env = max(1, n // (2 * n_args))
            path = Path(tmp) / f"big-{n}.toml"
            path.write_text(study_text(n_env, n_args))
            took, rc = time_dry_run(path, opts.src, opts.limit)
            shown = f"{took:.1f} s (exit {rc})" if took is not None else f"> {opts.limit:g} s (stopped)"
            print(f"{2 * n_env * n_args:>7} candidates: {shown}", flush=True)


if __name__ == "__main__":
    main()

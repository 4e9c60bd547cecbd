"""Capacity search against a grid at the same resolution, on the simulator (issue 18: the search finds the
answer in fewer probes than a grid).

The simulator is the tests' box (GLM-5 NVFP4, TP8 on eight simulated RTX PRO 6000, SGLang personality,
2,048-token prompts, 64 output tokens, `--speed 20`), whose capacity under an SLO the performance model
gives (`model.predict.capacity`). For each SLO, in-process on one stored run each (`bench.runner`):

- the search: `find_capacity` with its defaults (from 1 stream, ×4 bracketing, ITP splits, resolution
  10 %, at most 8 probes), or `--resolution`/`--max-probes` given here;
- the grid: every concurrency of the grid at the same resolution (1, 2, …, then ×(1 + resolution)
  rounded) in ascending order, stopped at the first failure (the cheapest a grid can be: a sweep set up
  ahead measures its whole range), each level judged by the same verdict (`capacity.verdict`).

Both use the same probe size (4 requests per stream) and warm-up. Reported: probes, wall time, answer,
and the model's answer.

Usage: .venv/bin/python benchmarks/capacity_search.py [--resolution 0.10] [--max-probes 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import simruns  # noqa: E402

SLOS = {"p99_tpot_ms<=60": 60.0, "p99_tpot_ms<=100": 100.0, "p99_tpot_ms<=150": 150.0}


def grid(resolution: float, highest: int = 256) -> list[int]:
    """Concurrencies whose neighbours are at most `resolution` apart (or one stream)."""
    out = [1]
    while out[-1] < highest:
        out.append(max(out[-1] + 1, int(out[-1] * (1 + resolution))))
    return out


async def one(url: str, slo_text: str, resolution: float, max_probes: int) -> dict[str, object]:
    from servelab.bench import capacity as C
    from servelab.bench.config import BenchConfig
    from servelab.bench.runner import BenchSession, _spec, find_capacity
    from servelab.store import open_store

    cfg = BenchConfig(
        url=url,
        model=simruns.MODEL,
        levels=[1],
        requests_per_stream=4,
        input_len=simruns.ISL,
        output_len=simruns.OSL,
        slo=slo_text,
    )
    slo = C.parse_capacity_slo(slo_text)
    spec = C.SearchSpec(by="concurrency", start=1, resolution=resolution, max_probes=max_probes)
    with open_store() as store:
        t0 = time.perf_counter()
        _, found = await find_capacity(cfg, store, spec, slo)
        search_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        session = BenchSession(cfg, store)
        answer, probes = None, 0
        try:
            await session.start([_spec(cfg, "concurrency", 64)], most=1024)
            speed = session.context.clock.speed

            async def sweep(s: BenchSession) -> None:
                nonlocal answer, probes
                for c in grid(resolution):
                    level = await s.run_level(_spec(cfg, "concurrency", c))
                    records = s.repo.requests(s.repo.level_ids(s.run_id)[level.index])
                    probes += 1
                    if not C.verdict(c, level.index, records, slo, speed).passed:
                        return
                    answer = c

            await session.drive(sweep)
        finally:
            session.close()
        grid_s = time.perf_counter() - t0
    return {
        "search": {
            "probes": len(found.probes),
            "converged": found.converged,
            "wall_s": round(search_s, 1),
            "capacity": found.capacity,
            "bracket": list(found.bracket),
            "loads": [p.load for p in found.probes],
        },
        "grid": {"probes": probes, "wall_s": round(grid_s, 1), "capacity": answer},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/capacity_search.json")
    ap.add_argument("--resolution", type=float, default=0.10)
    ap.add_argument("--max-probes", type=int, default=8)
    args = ap.parse_args()
    from servelab.model.predict import capacity, make_setup

    setup = make_setup(simruns.MODEL, "rtx-pro-6000", 8, tp=8, engine="sglang")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SERVELAB_HOME"] = str(Path(tmp) / "home")
        sim = simruns.start_sim(Path(tmp) / "logs", *simruns.SIM_ARGS)
        try:
            rows = {}
            for text, tpot in SLOS.items():
                row = asyncio.run(one(sim.url, text, args.resolution, args.max_probes))
                row["model"] = capacity(setup, simruns.ISL, simruns.OSL, tpot_ms=tpot).concurrency
                rows[text] = row
                print(text, json.dumps(row), flush=True)
        finally:
            sim.stop()
    result = {
        "config": "GLM-5-NVFP4 TP8 on 8x rtx-pro-6000 (sim, sglang, speed 20), ISL 2048, OSL 64",
        "resolution": args.resolution,
        "max_probes": args.max_probes,
        "requests_per_stream": 4,
        "slos": rows,
    }
    text = json.dumps(result, indent=2)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

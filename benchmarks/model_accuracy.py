"""Accuracy of the performance model against published serving measurements.

    python benchmarks/model_accuracy.py [--csv PATH] [--write] [--json]

Fits the default factors on 70 % of the aggregated rows (a fixed hash split on the row id), reports TPOT
and TTFT MAPE per GPU system and engine on the held-out 30 %, and times predictions. `--write` stores the
fitted factors in src/servelab/data/model_factors.json (the defaults every prediction uses).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from servelab.model.calibrate import evaluate_split, fit_observations, observations_from_csv
from servelab.model.factors import Factors
from servelab.model.predict import Workload, compare_layouts, make_setup, predict

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT.parent / "shared" / "data" / "serving_measurements.csv"
FACTORS = ROOT / "src" / "servelab" / "data" / "model_factors.json"
START = Factors(queue_exp=1.0, expert_rows=64.0, ttft_overhead_ms=30, layer_overhead_us=30, prefill_queue=0.5)


def timings() -> dict[str, float]:
    predict("GLM-5-NVFP4", "rtx-pro-6000", 8, Workload(1024, 1024, 1), tp=8)  # warm the caches
    t = time.perf_counter()
    for _ in range(20):
        predict("GLM-5-NVFP4", "rtx-pro-6000", 8, Workload(1024, 1024, 16), tp=8)
    one = (time.perf_counter() - t) / 20
    t = time.perf_counter()
    compare_layouts(make_setup("GLM-5-NVFP4", "rtx-pro-6000", 8), Workload(1024, 1024, 16))
    return {"predict_ms": one * 1e3, "compare_layouts_8gpu_ms": (time.perf_counter() - t) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--write", action="store_true", help="write the fitted factors as the defaults")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    obs = observations_from_csv(args.csv)
    glob, engines, report = fit_observations(obs, START)
    tables = evaluate_split(obs, glob, engines)
    if args.write:
        d = {k: round(v, 4) for k, v in asdict(glob).items() if isinstance(v, float)}
        FACTORS.write_text(
            json.dumps(
                {
                    "about": "Default efficiency factors, fitted by benchmarks/model_accuracy.py --write on 70% "
                    "of the aggregated rows of serving_measurements.csv (hash split on row id); see docs/model.md.",
                    "default": d,
                    "engines": {e: {k: round(v, 4) for k, v in x.items()} for e, x in engines.items()},
                },
                indent=2,
            )
            + "\n"
        )
    out = {
        "report": report,
        "factors": asdict(glob),
        "engines": engines,
        "tables": {k: [asdict(r) for r in v] for k, v in tables.items()},
        "timings": timings(),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"rows {report['rows']} (train {report['train_rows']}, held out {report['test_rows']}, dropped {report['dropped']})"
    )
    for name, rows in tables.items():
        print(f"\n{name}: MAPE per GPU system and engine")
        print(f"  {'system':10s} {'engine':8s} {'rows':>5s} {'TPOT %':>7s} {'TTFT %':>7s}")
        for r in rows:
            print(f"  {r.system:10s} {r.engine:8s} {r.n:5d} {r.tpot_mape:7.1f} {r.ttft_mape:7.1f}")
    t = out["timings"]
    print(
        f"\none prediction {t['predict_ms']:.2f} ms; --compare-layouts on 8 GPUs {t['compare_layouts_8gpu_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()

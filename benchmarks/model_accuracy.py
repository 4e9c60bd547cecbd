"""Accuracy of the performance model against published serving measurements.

    python benchmarks/model_accuracy.py [--csv PATH] [--write] [--json]

Fits the default factors on 70 % of the configuration groups of the aggregated rows (a fixed hash split on
model, system, engine, layout, quantization and ISL/OSL: every concurrency and repeat of a held-out
configuration is held out together), reports TPOT and TTFT MAPE per GPU system and engine on the held-out
30 %, and times predictions. `--by-model` adds a leave-one-model-out check (unseen models). `--write` stores the
fitted factors in src/servelab/data/model_factors.json (the defaults every prediction uses).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from servelab.model.calibrate import (
    Observation,
    evaluate_split,
    fit_observations,
    observations_from_csv,
    prepare,
)
from servelab.model.calibrate import _engine_table as engine_table
from servelab.model.factors import Factors
from servelab.model.predict import Workload, compare_layouts, make_setup, predict

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT.parent / "shared" / "data" / "serving_measurements.csv"
FACTORS = ROOT / "src" / "servelab" / "data" / "model_factors.json"
START = Factors(
    moe_layer_us=10.0,
    seq_overhead_us=10.0,
    queue_exp=1.0,
    prefill_wait=1.0,
    expert_eff=0.5,
    nvlink_lat_scale=2.0,
    expert_rows=64.0,
    ttft_overhead_ms=30,
    layer_overhead_us=30,
    prefill_queue=0.5,
)


def timings() -> dict[str, float]:
    predict("GLM-5-NVFP4", "rtx-pro-6000", 8, Workload(1024, 1024, 1), tp=8)  # warm the caches
    t = time.perf_counter()
    for _ in range(20):
        predict("GLM-5-NVFP4", "rtx-pro-6000", 8, Workload(1024, 1024, 16), tp=8)
    one = (time.perf_counter() - t) / 20
    t = time.perf_counter()
    compare_layouts(make_setup("GLM-5-NVFP4", "rtx-pro-6000", 8), Workload(1024, 1024, 16))
    return {"predict_ms": one * 1e3, "compare_layouts_8gpu_ms": (time.perf_counter() - t) * 1e3}


def leave_one_model_out(obs: list[Observation]) -> list[dict[str, float | str | int]]:
    """Fit on every model but one (all its rows held out), score that model: the check for unseen models."""
    out: list[dict[str, float | str | int]] = []
    for model in sorted({o.model for o in obs}):
        train = [o for o in obs if o.model != model]
        glob, engines, _ = fit_observations(train, START, holdout=0.0)
        row = engine_table(prepare([o for o in obs if o.model == model], glob), glob, engines)[-1]
        out.append({"model": model, "rows": row.n, "tpot_mape": row.tpot_mape, "ttft_mape": row.ttft_mape})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--write", action="store_true", help="write the fitted factors as the defaults")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--by-model", action="store_true", help="also run the leave-one-model-out check (~1 min)")
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
                    "of the configuration groups of the aggregated rows of serving_measurements.csv (hash split "
                    "on model/system/engine/layout/quantization/ISL/OSL); see docs/model.md.",
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
    if args.by_model:
        out["leave_one_model_out"] = leave_one_model_out(obs)
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
    if args.by_model:
        print("\nleave one model out (fit on the other models, score all rows of this one)")
        for r in out["leave_one_model_out"]:
            print(f"  {r['model']:20s} {r['rows']:5d} {r['tpot_mape']:7.1f} {r['ttft_mape']:7.1f}")
    t = out["timings"]
    print(
        f"\none prediction {t['predict_ms']:.2f} ms; --compare-layouts on 8 GPUs {t['compare_layouts_8gpu_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()

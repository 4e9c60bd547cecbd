"""Our performance model beside aiconfigurator's own estimator, on the same held-out published rows.

    python benchmarks/peer_compare.py [--json] [--write] [--limit N]

Needs the `silicon` extra (`pip install 'servelab[silicon]'`: the `aiconfigurator-core` package, whose
estimator and operator databases are what we compare with). For every aggregated row of
serving_measurements.csv that our catalog knows:

- ours, held out by configuration: the default factors fitted on the 70 % training groups (the split
  `benchmarks/model_accuracy.py` uses), scored on the 30 % held-out groups;
- ours, leave one model out: fitted on every other model, scored on all rows of this one;
- aiconfigurator: its static estimator (`run_static`: the batch prefilled together, then decoded) and its
  aggregated (continuous-batching) estimator (`run_agg`), on the row as the CSV records it (the CSV is
  aiconfigurator's own silicon sample, so its columns are that estimator's inputs), with the newest
  engine version its databases carry. It is not fitted on these rows by us; it may have been tuned on
  them upstream, which can only flatter it.

Both are scored on the rows both can predict (aiconfigurator refuses a model/system/backend it has no
operator data for). Reported: TPOT and TTFT MAPE, and ranking quality: within each (model, GPU, engine,
ISL/OSL) group of held-out rows, the share of pairs of rows that the model orders as the measurements
do (concordance; Kendall's τ = 2·concordance − 1), over all pairs and over pairs at the same concurrency
(the layout choice a tuner makes). `--write` stores the result in benchmarks/results/peer_compare.json.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import itertools
import json
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from benchmarks.model_accuracy import DEFAULT_CSV, START, _row_predictions

from servelab.model.calibrate import fit_observations, prepare
from servelab.model.observations import Observation, holdout_mask, observations_from_csv

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "peer_compare.json"
# CSV model ids that aiconfigurator bundles under another name (its configs are the same checkpoints)
AIC_MODEL = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
    "nvidia/DeepSeek-R1-NVFP4": "nvidia/DeepSeek-V3.1-NVFP4",
}


def _int(v: str | None, default: int | None = None) -> int | None:
    try:
        return int(float(v)) if v not in (None, "") else default
    except ValueError:
        return default


class Peer:
    """aiconfigurator's estimator, one row at a time (results cached per distinct input)."""

    def __init__(self) -> None:
        logging.disable(logging.WARNING)  # its database loader logs every low-fidelity fallback table
        from aiconfigurator_core.sdk import common, config
        from aiconfigurator_core.sdk.backends.factory import get_backend
        from aiconfigurator_core.sdk.models import get_model
        from aiconfigurator_core.sdk.perf_database import get_database

        self.common, self.config = common, config
        self.get_backend, self.get_model, self.get_database = get_backend, get_model, get_database
        self.cache: dict[tuple[Any, ...], tuple[float, float, float, float] | str] = {}

    def _quant(self, row: dict[str, str]) -> dict[str, Any]:
        c = self.common
        out: dict[str, Any] = {}
        g, m = row.get("gemm_quant_mode") or "", row.get("moe_quant_mode") or ""
        if g and g in c.GEMMQuantMode.__members__:
            out["gemm_quant_mode"] = c.GEMMQuantMode[g]
        if m and m in c.MoEQuantMode.__members__:
            out["moe_quant_mode"] = c.MoEQuantMode[m]
        return out

    def estimate(self, row: dict[str, str]) -> tuple[float, float, float, float] | str:
        """(static TTFT, static TPOT, agg TTFT, agg TPOT) in ms, or why it cannot say."""
        tp = _int(row.get("tp_size"), 1) or 1
        pp = _int(row.get("pp_size"), 1) or 1
        dp = _int(row.get("attention_dp_size"), 1) or 1
        moe_tp, moe_ep = _int(row.get("moe_tp_size")), _int(row.get("moe_ep_size"))
        model = AIC_MODEL.get(row["model_path"], row["model_path"])
        key = (
            model,
            row["system"],
            row["backend"],
            tp,
            pp,
            dp,
            moe_tp,
            moe_ep,
            row.get("gemm_quant_mode"),
            row.get("moe_quant_mode"),
            _int(row["batch_size"], 1),
            _int(row["isl"], 1),
            _int(row["osl"], 1),
        )
        if key in self.cache:
            return self.cache[key]
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                mc = self.config.ModelConfig(
                    tp_size=tp,
                    pp_size=pp,
                    attention_dp_size=dp,
                    moe_tp_size=moe_tp,
                    moe_ep_size=moe_ep,
                    **self._quant(row),
                )
                m = self.get_model(model, mc, row["backend"])
                db = self.get_database(row["system"], row["backend"], "current")
                be = self.get_backend(row["backend"])
                rc = self.config.RuntimeConfig(
                    batch_size=_int(row["batch_size"], 1), isl=_int(row["isl"], 1), osl=_int(row["osl"], 1)
                )
                s = be.run_static(m, db, rc, mode="static").get_summary_df().iloc[0]
                a = be.run_agg(m, db, rc, ctx_tokens=_int(row["isl"], 1)).get_summary_df().iloc[0]
            out: tuple[float, float, float, float] | str = (
                float(s["ttft"]),
                float(s["tpot"]),
                float(a["ttft"]),
                float(a["tpot"]),
            )
            if not all(np.isfinite(out)) or min(out) <= 0:
                out = "non-positive or non-finite estimate"
        except Exception as exc:  # the estimator's own refusals (no data for this model/system/backend)
            out = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        self.cache[key] = out
        return out


def concordance(
    groups: Sequence[str], conc: Sequence[int], meas: np.ndarray, pred: np.ndarray
) -> dict[str, Any]:
    """Share of the pairs within a group that `pred` orders as `meas` does (ties in either skipped), over all
    pairs and over pairs at the same concurrency."""
    by: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        by[g].append(i)
    agree = {"all": [0, 0], "same_concurrency": [0, 0]}
    for idx in by.values():
        for i, j in itertools.combinations(idx, 2):
            dm, dp = meas[i] - meas[j], pred[i] - pred[j]
            if dm == 0 or dp == 0:
                continue
            for k in ("all", "same_concurrency") if conc[i] == conc[j] else ("all",):
                agree[k][0] += int((dm > 0) == (dp > 0))
                agree[k][1] += 1
    return {
        k: {"pairs": n, "concordance": a / n if n else None, "kendall_tau": 2 * a / n - 1 if n else None}
        for k, (a, n) in agree.items()
    }


def mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float((np.abs(pred - meas) / meas).mean() * 100)


def leave_one_model_out_rows(obs: list[Observation], silicon: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Our (TPOT, TTFT) per row, each row predicted by factors fitted on the other models only."""
    tpot, ttft = np.zeros(len(obs)), np.zeros(len(obs))
    for model in sorted({o.model for o in obs}):
        mask = np.array([o.model == model for o in obs])
        glob, engines, _ = fit_observations(
            [o for o in obs if o.model != model], START, holdout=0.0, silicon=silicon
        )
        sub = prepare([o for o in obs if o.model == model], glob, silicon)
        tpot[mask], ttft[mask] = _row_predictions(sub, glob, engines)
    return tpot, ttft


def score(
    name: str, rows: np.ndarray, obs: list[Observation], preds: dict[str, tuple[np.ndarray, np.ndarray]]
) -> dict[str, Any]:
    """MAPE and ranking of every predictor in `preds` on the rows in `rows` (a boolean mask)."""
    sub = [o for o, r in zip(obs, rows, strict=True) if r]
    groups = [f"{o.model}|{o.gpu}|{o.engine}|{o.isl}|{o.osl}" for o in sub]
    conc = [o.concurrency for o in sub]
    meas = {"tpot": np.array([o.tpot_ms for o in sub]), "ttft": np.array([o.ttft_ms for o in sub])}
    out: dict[str, Any] = {"split": name, "rows": len(sub), "models": {}}
    for who, (tpot, ttft) in preds.items():
        p = {"tpot": tpot[rows], "ttft": ttft[rows]}
        out["models"][who] = {f"{k}_mape": mape(p[k], meas[k]) for k in ("tpot", "ttft")} | {
            f"{k}_ranking": concordance(groups, conc, meas[k], p[k]) for k in ("tpot", "ttft")
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help=f"store the result in {OUT.relative_to(ROOT)}")
    ap.add_argument("--limit", type=int, default=0, help="only the first N rows (a quick look)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    obs = observations_from_csv(args.csv)
    if args.limit:
        obs = obs[: args.limit]
    obs = prepare(obs, START).obs  # the rows our catalog can place (the rest are dropped with a reason)
    with open(args.csv, newline="") as fh:
        raw = {r["id"]: r for r in csv.DictReader(fh)}
    # ours, by configuration (the default fit's split) and leaving each model out
    glob, engines, _ = fit_observations(obs, START)
    ours_cfg = _row_predictions(prepare(obs, glob), glob, engines)
    ours_lomo = leave_one_model_out_rows(obs)
    # the same model with each row's allreduces read off the measured tables (model/silicon.py), refitted
    sglob, sengines, _ = fit_observations(obs, START, silicon=True)
    sil_cfg = _row_predictions(prepare(obs, sglob, True), sglob, sengines)
    sil_lomo = leave_one_model_out_rows(obs, silicon=True)
    t_ours = time.perf_counter() - t0
    # the peer, row by row
    peer = Peer()
    t1 = time.perf_counter()
    est = [peer.estimate(raw[o.key]) for o in obs]
    t_peer = time.perf_counter() - t1
    ok = np.array([not isinstance(e, str) for e in est])
    nan4 = (np.nan, np.nan, np.nan, np.nan)
    arr = np.array([e if not isinstance(e, str) else nan4 for e in est], float)
    peer_static = (arr[:, 1], arr[:, 0])
    peer_agg = (arr[:, 3], arr[:, 2])
    refusals: dict[str, int] = defaultdict(int)
    for e in est:
        if isinstance(e, str):
            refusals[e.split(":")[0]] += 1
    test = holdout_mask(obs)
    preds_cfg = {
        "servelab": ours_cfg,
        "servelab_silicon": sil_cfg,
        "aiconfigurator_static": peer_static,
        "aiconfigurator_agg": peer_agg,
    }
    preds_lomo = {
        "servelab": ours_lomo,
        "servelab_silicon": sil_lomo,
        "aiconfigurator_static": peer_static,
        "aiconfigurator_agg": peer_agg,
    }
    result = {
        "rows": len(obs),
        "peer_covers": int(ok.sum()),
        "peer_refusals": dict(refusals),
        "by_configuration": score("held out by configuration", test & ok, obs, preds_cfg),
        "leave_one_model_out": score("every row, its model left out of our fit", ok, obs, preds_lomo),
        "servelab_on_every_held_out_row": score(
            "held out by configuration, all rows",
            test,
            obs,
            {"servelab": ours_cfg, "servelab_silicon": sil_cfg},
        ),
        "seconds": {"servelab_fits": round(t_ours, 1), "aiconfigurator_estimates": round(t_peer, 1)},
        "peer_versions": "aiconfigurator-core's `current` database of each backend",
    }
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        result["aiconfigurator_core"] = version("aiconfigurator-core")
    if args.write:
        OUT.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"rows {len(obs)}; aiconfigurator predicts {ok.sum()} ({dict(refusals)})")
    for key in ("by_configuration", "leave_one_model_out", "servelab_on_every_held_out_row"):
        s = result[key]
        print(f"\n{s['split']}: {s['rows']} rows")
        print(
            f"  {'model':24s} {'TPOT %':>7s} {'TTFT %':>7s} {'τ TPOT':>7s} {'τ TTFT':>7s} {'τ TPOT same c':>14s}"
        )
        for who, m in s["models"].items():
            tau = m["tpot_ranking"]["all"]["kendall_tau"]
            tau2 = m["ttft_ranking"]["all"]["kendall_tau"]
            tau3 = m["tpot_ranking"]["same_concurrency"]["kendall_tau"]
            print(
                f"  {who:24s} {m['tpot_mape']:7.1f} {m['ttft_mape']:7.1f} {tau or 0:7.3f} {tau2 or 0:7.3f} {tau3 or 0:14.3f}"
            )
    print(f"\n{result['seconds']}")


if __name__ == "__main__":
    main()

"""A small study built deterministically in a store (fixed numbers, fixed times, a fixed uid), ranked by the
real `Tuner.finish`: the report's golden file, the escaping tests and the UI tests use it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servelab.config.loading import load_study
from servelab.store.db import Store
from servelab.store.studies import StoredCandidate, StudyRepo
from servelab.tune import TuneOptions, Tuner, spec_hash

HOSTILE = "<script>alert('x')</script> \x1b[31mCUDA error\x1b[0m | `rm -rf` **bold** & more"

STUDY_TOML = """
objective = "output_throughput"
repeats = 2
[study]
name = "golden-study"
description = "A fixed study for the report's golden test"
[model]
path = "GLM-5-NVFP4"
[host]
gpu = "rtx-pro-6000"
num_gpus = 8
[engine]
name = "sim"
[engine.options]
personality = "sglang"
[[candidates]]
name = "tp8"
tp = 8
baseline = true
[[candidates]]
name = "tp8-trtllm"
tp = 8
args = ["--moe-runner-backend", "flashinfer_trtllm"]
[[candidates]]
name = "tp4-pp2"
tp = 4
pp = 2
[[candidates]]
name = "arfusion"
tp = 8
args = ["--enable-flashinfer-allreduce-fusion"]
[[candidates]]
name = "broken"
tp = 8
[[candidates]]
name = "later"
tp = 2
[workload]
input_len = 1024
output_len = 128
num_requests = 32
[load]
concurrency = [1, 16, 64]
main = 64
[slo]
tpot_ms = { p50 = 150 }
"""


def digest(
    level: float, thr: float, tpot: float, ttft: float, power: float, run: str, failed: int = 0
) -> dict[str, Any]:
    d: dict[str, Any] = {
        "level": level,
        "completed": 32 - failed,
        "failed": failed,
        "failure_rate": failed / 32,
        "errors": {"timeout": failed} if failed else {},
        "output_throughput": thr,
        "total_token_throughput": thr * 9,
        "request_throughput": thr / 128,
        "goodput": thr * 0.9,
        "gpu_power_w": power,
        "gpu_util": 0.9,
        "bench_run": run,
    }
    for metric, base in (
        ("ttft_ms", ttft),
        ("tpot_ms", tpot),
        ("itl_ms", tpot * 1.01),
        ("e2e_ms", ttft + 127 * tpot),
    ):
        for stat, k in (("mean", 1.0), ("p50", 1.0), ("p90", 1.1), ("p95", 1.15), ("p99", 1.25)):
            d[f"{metric}_{stat}"] = base * k
    return d


CURVES = {  # label -> per repeat: (level, throughput, tpot, ttft, power)
    "tp8": [
        [(1, 45.5, 19.75, 285.0, 450.0), (16, 300.0, 46.0, 990.0, 460.0), (64, 500.0, 105.5, 2800.0, 470.0)],
        [(1, 46.5, 19.65, 281.0, 452.0), (16, 302.0, 45.8, 995.0, 461.0), (64, 506.0, 105.1, 2790.0, 471.0)],
    ],
    "tp4-pp2": [
        [(1, 38.0, 25.1, 310.0, 400.0), (16, 280.0, 50.0, 1000.0, 410.0), (64, 460.0, 115.0, 3000.0, 420.0)],
        [(1, 38.4, 25.0, 312.0, 401.0), (16, 282.0, 49.6, 1004.0, 411.0), (64, 462.0, 114.6, 3010.0, 421.0)],
    ],
    "arfusion": [[(1, 6.5, 157.0, 900.0, 150.0), (16, 20.0, 210.0, 3000.0, 160.0)]],
}
T0 = "2026-01-02T03:04:05.000+00:00"
T1 = "2026-01-02T04:05:06.000+00:00"
GOLDEN_UID = "s-golden0001"


def _trial(repo: StudyRepo, cand: StoredCandidate, repeat: int, **fields: Any) -> None:
    tid = repo.start_trial(cand.id, repeat, f"servelab-study:golden:{cand.label}:{repeat}")
    argv = [
        "python",
        "-m",
        "servelab",
        "sim",
        "--model",
        "GLM-5-NVFP4",
        "--tp",
        str(cand.spec["tp"]),
        *cand.spec["args"],
    ]
    repo.update_trial(
        tid,
        argv=argv,
        env={"NCCL_P2P_LEVEL": "SYS"},
        url="http://127.0.0.1:8000",
        engine_version="0.5.5",
        ready_s=1.25,
        **fields,
    )


def build_study(store: Store, tmp: Path) -> str:
    """The golden study in `store`; returns its uid."""
    src = tmp / "golden.toml"
    src.write_text(STUDY_TOML)
    study = load_study(src)
    repo = StudyRepo(store)
    sid, uid = repo.create_study(
        study.study.name, "golden.toml", study.model_dump(mode="json"), spec_hash(study)
    )
    for idx, cand in enumerate(study.candidates):
        pred = {"known": True, "feasible": True, "output_throughput": 507.0 - 40 * idx, "tpot_ms": 105.0}
        repo.add_candidate(sid, idx, cand.label(), cand.model_dump(mode="json"), pred)
    cands = {c.label: c for c in repo.candidates(sid)}
    for label, repeats in CURVES.items():
        tp = cands[label].spec["tp"]
        line = f"server_args=ServerArgs(tp_size={tp}, moe_runner_backend='flashinfer_cutlass')"
        requested = {"tp_size": tp, "moe_runner_backend": "flashinfer_cutlass"}
        effective = {"effective": dict(requested), "evidence": {k: line for k in requested}}
        for r, curve in enumerate(repeats):
            levels = [
                digest(float(lv), thr, tpot, ttft, pw, f"b-{label}-r{r}-{lv}")
                for lv, thr, tpot, ttft, pw in curve
            ]
            _trial(
                repo,
                cands[label],
                r,
                requested=requested,
                effective=effective,
                not_applied=[],
                levels=levels,
                status="measured",
                teardown={"exit": "terminated", "orphans": 0},
            )
        repo.set_candidate(cands[label].id, "measured", {})
    trt = {"tp_size": 8, "moe_runner_backend": "flashinfer_trtllm"}
    line = "server_args=ServerArgs(tp_size=8, moe_runner_backend='flashinfer_cutlass')"
    effective = {
        "effective": {"tp_size": 8, "moe_runner_backend": "flashinfer_cutlass"},
        "evidence": {"tp_size": line, "moe_runner_backend": line},
    }
    mism = [
        {
            "key": "moe_runner_backend",
            "requested": "flashinfer_trtllm",
            "effective": "flashinfer_cutlass",
            "evidence": line,
        }
    ]
    _trial(
        repo,
        cands["tp8-trtllm"],
        0,
        requested=trt,
        effective=effective,
        not_applied=mism,
        status="not_applied",
    )
    repo.set_candidate(cands["tp8-trtllm"].id, "not_applied", {"not_applied": mism})
    diag = {
        "class": "cuda_init",
        "message": "the server exited before it was ready",
        "evidence": HOSTILE,
        "advice": "check `nvidia-smi`; <b>reboot</b> if the driver is wedged",
    }
    _trial(repo, cands["broken"], 0, diagnosis=diag, status="failed", error="exited with code 1")
    repo.set_candidate(cands["broken"].id, "failed", {"diagnosis": diag})
    tuner = Tuner(study, store, "golden.toml", TuneOptions())
    tuner.swept = []
    tuner.finish(sid, uid)
    # fixed times, so the golden file does not change from run to run
    store.conn.execute(
        "UPDATE studies SET uid = ?, created_at = ?, finished_at = ? WHERE id = ?", (GOLDEN_UID, T0, T1, sid)
    )
    store.conn.execute("UPDATE study_trials SET started_at = ?, finished_at = ?", (T0, T1))
    return GOLDEN_UID

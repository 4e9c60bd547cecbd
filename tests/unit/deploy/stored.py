"""A finished study whose candidates each have one measured trial, stored the way `tune` stores it."""

from __future__ import annotations

import sys
from typing import Any

from servelab.config.loading import parse_study
from servelab.engines import registry
from servelab.store.db import Store
from servelab.store.studies import StudyRepo
from servelab.trial.prepare import settings_for
from servelab.tune import spec_hash

DIGEST = {
    "level": 4.0,
    "completed": 16,
    "failed": 0,
    "output_throughput": 1000.0,
    "tpot_ms_p50": 10.0,
    "ttft_ms_p50": 100.0,
}


def study_data(
    engine: str, env: dict[str, str] | None = None, args: list[str] | None = None
) -> dict[str, Any]:
    options: dict[str, Any] = {"python": sys.executable}
    if engine == "sim":
        options.update(speed=50, fast_start=True)
    return {
        "study": {"name": "demo study"},
        "model": {"path": "Qwen3-30B-A3B", "served_name": "qwen3"},
        "host": {"gpu": "h100-sxm", "num_gpus": 2},
        "engine": {"name": engine, "options": options, "env": env or {}, "args": args or []},
        "candidates": [{"name": "tp2", "tp": 2}, {"name": "tp1", "tp": 1}],
        "workload": {"input_len": 64, "output_len": 16, "num_requests": 8},
        "load": {"concurrency": [1, 4], "main": 4},
    }


def store_study(
    store: Store,
    engine: str = "sim",
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
    port: int = 8123,
    ready_s: float | None = 42.0,
    winner: str | None = "tp2",
    digest: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Store the study; returns its uid, id, trial ids by candidate and the first candidate's argv."""
    study = parse_study(data or study_data(engine, env, args))
    repo = StudyRepo(store)
    sid, uid = repo.create_study(study.study.name, None, study.model_dump(mode="json"), spec_hash(study))
    main = digest or DIGEST
    out: dict[str, Any] = {"uid": uid, "id": sid, "trials": {}}
    for idx, cand in enumerate(study.candidates):
        cid = repo.add_candidate(sid, idx, cand.label(), cand.model_dump(mode="json"), None)
        tid = repo.start_trial(cid, 0, f"servelab-study:{uid}:{cand.label()}:0")
        launch = registry.get(study.engine.name).command(settings_for(study, cand, port))
        repo.update_trial(
            tid,
            argv=launch.argv,
            env=launch.env,
            url=launch.url,
            log_path="/tmp/x.log",
            ready_s=ready_s,
            engine_version="0.32.0",
            effective={
                "effective": {"tp_size": cand.tp, "served_model_name": launch.served_model},
                "evidence": {},
            },
            levels=[{**main, "level": 1.0}, main],
            status="measured",
        )
        repo.set_candidate(cid, "measured", {})
        out["trials"][cand.label()] = tid
        out["argv"] = out.get("argv") or launch.argv
    repo.set_study_status(sid, "completed", {"ranking": {"winner": winner}})
    return out

"""What this store says about now: the last trial (or bench run) and its processes' markers, the unfinished
studies with their live processes, the installed deployments. Observing never creates a store."""

from __future__ import annotations

import contextlib

from servelab import naming
from servelab.errors import ServelabError
from servelab.host import processes
from servelab.jsontypes import JsonObject, JsonValue
from servelab.status.judge import FINISHED


def last_run() -> JsonObject | None:
    """The latest study trial (url, pid, marker, log_path, effective, not_applied, diagnosis), else the
    latest benchmark run's URL; None when the store is empty or absent (observing never creates one).
    Open JSON: the trial as stored, its `markers` ({marker: its trial's status}) beside it."""
    from servelab.store.db import store_exists

    if not store_exists():
        return None
    from servelab.store import leases
    from servelab.store.bench import BenchRepo
    from servelab.store.db import open_store
    from servelab.store.studies import StudyRepo

    try:
        store = open_store()
    except ServelabError:
        return None
    try:
        repo = StudyRepo(store)
        trial: JsonObject | None = None
        trial_id = -1
        markers: JsonObject = {}  # marker -> its trial's status, for the last study's trials
        with contextlib.suppress(ServelabError):
            study = repo.resolve("last")
            owner = leases.holder(store, study.id)
            driven = owner is not None and owner.alive()
            for cand in repo.candidates(study.id):
                for t in repo.trials(cand.id):
                    if t.marker:
                        # an open trial whose driver is gone was killed: its processes are leftovers
                        open_ = t.status not in FINISHED
                        markers[t.marker] = "killed" if open_ and not driven else t.status
                    if trial is None or t.id > trial_id:
                        trial = {**t.model_dump(mode="json"), "study": study.uid, "candidate": cand.label}
                        trial_id = t.id
        if trial is not None:
            trial["markers"] = markers
            return trial
        runs = BenchRepo(store).list_runs(1)
        if runs:
            return {"url": runs[0].url, "bench_run": runs[0].uid, "markers": {}}
        return None
    finally:
        store.close()


def studies(limit: int = 20, marked: list[JsonObject] | None = None) -> list[JsonObject]:
    """The unfinished studies (latest first), each `live` (its driver runs: pid, host, since), `killed`
    (stored as running but its driver is gone) or `interrupted` (stopped cleanly), with the processes
    it started that are still alive (`processes`: what `tune --resume` ends first), picked from `marked`
    (the observed host's marked processes, `leftovers()["marked_processes"]`; None: this host's)."""
    from servelab.store.db import store_exists

    if not store_exists():
        return []
    from servelab.store import leases
    from servelab.store.db import open_store
    from servelab.store.studies import StudyRepo

    out: list[JsonObject] = []
    with open_store() as store:
        for st in StudyRepo(store).list_studies(limit):
            if st.status == "completed":
                continue
            owner = leases.holder(store, st.id)
            alive = owner is not None and owner.alive()
            state = "live" if alive else ("killed" if st.status == "running" else st.status)
            prefix = naming.study_markers(st.uid)
            procs: list[JsonValue] = (
                [
                    {"pid": p.pid, "marker": p.marker, "command": p.cmdline}
                    for p in processes.with_marker(prefix)
                ]
                if marked is None
                else [
                    {"pid": p["pid"], "marker": p["marker"], "command": p["command"]}
                    for p in marked
                    if str(p.get("marker") or "").startswith(prefix)
                ]
            )
            out.append(
                {
                    "uid": st.uid,
                    "name": st.name,
                    "source": st.source,
                    "status": st.status,
                    "state": state,
                    "owner": owner.to_dict() if owner else None,
                    "processes": procs,
                }
            )
    return out


def deployments() -> list[JsonObject]:
    """Installed deployments with their latest check against the tuned result (empty without a store)."""
    from servelab.store.db import store_exists

    if not store_exists():
        return []
    from servelab.deploy.records import installed_units
    from servelab.store.db import open_store

    with open_store() as store:
        return installed_units(store)


def run_summary(run: JsonObject | None) -> JsonObject | None:
    """The last run as the observation's `last_run` (its keys of docs/cli/status.md)."""
    if run is None:
        return None
    keys = (
        "study",
        "candidate",
        "status",
        "url",
        "pid",
        "marker",
        "log_path",
        "started_at",
        "finished_at",
        "engine_version",
        "bench_run",
    )
    d = {k: run.get(k) for k in keys if k in run}
    d["not_applied"] = run.get("not_applied") or []
    d["diagnosis"] = run.get("diagnosis")
    return d

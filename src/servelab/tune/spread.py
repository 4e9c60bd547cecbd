"""What a study's trials say about their candidates beyond the means: the trials that are scored, the
nodes they ran on and the baseline's node-to-node spread (a cluster's), and each candidate's requests as
bootstrap clusters for the ranking's intervals."""

from __future__ import annotations

from typing import Any

from servelab import analyze
from servelab.config.study import Study
from servelab.errors import ServelabError
from servelab.jsontypes import JsonObject
from servelab.results import Node
from servelab.store.bench import BenchRepo
from servelab.store.db import Store
from servelab.store.studies import StoredCandidate, StoredTrial, StudyRepo


def scored_trials(repo: StudyRepo, cand_id: int) -> list[StoredTrial]:
    """A candidate's measured trials at its highest rung (halving's short benchmarks do not mix with
    its full ones; every other study has rung 0 only)."""
    measured = [t for t in repo.trials(cand_id) if t.status == "measured" and t.levels]
    top = max((t.rung or 0 for t in measured), default=0)
    return [t for t in measured if (t.rung or 0) == top]


def node_trials(repo: StudyRepo, cand_id: int) -> list[tuple[StoredTrial, Node]]:
    """A candidate's measured trials that ran on a cluster node, with the node."""
    return [(t, t.node) for t in repo.trials(cand_id) if t.status == "measured" and t.node is not None]


def node_spread(
    repo: StudyRepo,
    objective: str,
    cands: list[StoredCandidate],
    scores: list[analyze.Score],
    base_label: str,
) -> analyze.NodeSpread | None:
    """The baseline's objective per node at its scored level (None: fewer than two nodes ran it)."""
    base = next((c for c in cands if c.label == base_label), None)
    score = next((s for s in scores if s.label == base_label), None)
    if base is None or score is None or score.level is None:
        return None
    values = []
    for t, node in node_trials(repo, base.id):
        d = next((d for d in t.levels or [] if d["level"] == score.level), None)
        if d is not None and isinstance(v := d.get(objective), int | float):
            values.append((node.name, float(v)))
    return analyze.node_spread(score.level, values)


def note_nodes(repo: StudyRepo, cands: list[StoredCandidate], out: list[JsonObject]) -> None:
    """Each candidate's nodes, and a note when its repeats ran on different ones (its interval then
    holds the node-to-node noise too)."""
    for c, o in zip(cands, out, strict=True):
        names = sorted({n.name for _, n in node_trials(repo, c.id)})
        if not names:
            continue
        o["nodes"] = [*names]
        if len(names) > 1:
            o["node_note"] = (
                f"its repeats ran on {len(names)} different nodes ({', '.join(names)}): its interval "
                "includes the node-to-node noise"
            )
        repo.set_candidate(
            c.id,
            str(o["status"]),
            {k: v for k, v in o.items() if k not in ("label", "status", "predicted")},
        )


def samples(
    store: Store, study: Study, cands: list[StoredCandidate], scores: list[analyze.Score]
) -> dict[str, list[analyze.Cluster]]:
    """Each scored candidate's measured trials at its scored level, as bootstrap clusters read from the
    stored per-request records of the bench run that measured the level (a trial without them, e.g. one
    stored before requests were kept, leaves the candidate to the t-interval)."""
    repo, bench = StudyRepo(store), BenchRepo(store)
    out: dict[str, list[analyze.Cluster]] = {}
    for c, s in zip(cands, scores, strict=True):
        if s.level is None:
            continue
        clusters: list[analyze.Cluster] = []
        for t in scored_trials(repo, c.id):
            d = next((d for d in t.levels or [] if d["level"] == s.level), None)
            cl = _cluster(bench, d, study) if d else None
            if cl is None:
                clusters = []
                break
            clusters.append(cl)
        if clusters:
            out[c.label] = clusters
    return out


def _cluster(bench: BenchRepo, d: dict[str, Any], study: Study) -> analyze.Cluster | None:
    uid, value = d.get("bench_run"), d.get(study.objective)
    if not uid or value is None:
        return None
    try:
        run = bench.load(uid)
    except ServelabError:
        return None
    if not run.levels:
        return None
    level_id = bench.level_id(uid, run.levels[0].index)
    if level_id is None:
        return None
    records = bench.requests(level_id)
    return analyze.Cluster.of(records, study.objective, float(value), run.clock.speed, study.slo)

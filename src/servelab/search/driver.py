"""The tuner's adaptive loop: ask the strategy for a point, store it, run it, learn, until the budget is
spent; then give the contenders the study's repeats and report the search.

Every decision is in the store before it is acted on (a proposed candidate is stored `pending` before its
trial starts, a promotion or a contender's extra repeats in its `search` record), so a kill at any point
resumes to the search the uninterrupted run would have made: pending work first, then proposals from the
same stored history.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from servelab import analyze
from servelab import space as sp
from servelab.config.sections import CandidateSpec, LoadSpec, WorkloadSpec
from servelab.config.study import Study
from servelab.events import SearchPromoted, SearchProposed, SearchPruned
from servelab.jsontypes import JsonObject, JsonValue
from servelab.model.factors import Factors
from servelab.search import prior, prune
from servelab.search.base import History, NamedSetting, Origin, Outcome, Proposal, Tried, candidate, point_key
from servelab.search.runner import TrialRunner
from servelab.search.strategies import Budget, make, promoted
from servelab.space import label as point_label
from servelab.store.studies import CandidateSearch, SearchPredicted, StoredCandidate, StoredTrial

# Anomalies that rule a configuration out: throughput collapsed against the baseline, or the server died.
# A power or utilization drop alone is what a smaller batch cap does at the same load: a slower point, not
# a broken region (TPE learns it from the value).
COLLAPSE = ("throughput_collapse", "server_died")
# Pruned proposals stored before the search stops asking (a sampler stuck in ruled-out regions).
MAX_PRUNED = 200


def short_study(study: Study) -> Study:
    """Halving's rung 0: the study's main level only, with a 1/eta share of its requests (at least one per
    stream, or a 1/eta share of its duration)."""
    assert study.search is not None
    eta = study.search.eta
    kind = study.load_kind()
    main = kind.main
    load = study.load.with_levels([main])
    streams = int(main) if kind.closed_loop else 1  # at least one request per stream
    wl = study.workload.model_dump()
    if wl.get("requests_per_stream"):
        wl["requests_per_stream"] = max(1, math.ceil(wl["requests_per_stream"] / eta))
    elif wl.get("num_requests"):
        wl["num_requests"] = max(streams, math.ceil(wl["num_requests"] / eta))
    elif wl.get("duration_s"):
        wl["duration_s"] = wl["duration_s"] / eta
    return study.model_copy(
        update={
            "load": LoadSpec.model_validate(load.model_dump()),
            "workload": WorkloadSpec.model_validate(wl),
        }
    )


def _seconds(start: str | None, end: str | None) -> float:
    if not start or not end:
        return 0.0
    return max(0.0, (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds())


def objectives(study: Study) -> list[str]:
    assert study.search is not None
    return list(study.search.objectives or [study.objective])


class SearchDriver:
    def __init__(self, tuner: TrialRunner, uid: str, sid: int) -> None:
        assert tuner.study.search is not None
        self.t, self.uid, self.sid = tuner, uid, sid
        self.study = tuner.study
        self.spec = tuner.study.search
        self.space = sp.build(self.spec)
        self.objectives = objectives(self.study)
        self.signs = [prior.better(o) for o in self.objectives]
        self.strategy = make(
            self.spec.strategy,
            self.space,
            self.signs,
            self.spec.seed,
            self.spec.prior_trials,
            self.spec.eta,
            self.spec.contenders,
        )
        reserve = self.spec.contenders * max(0, self.study.repeats - 1)
        self.budget = Budget(
            self.spec.budget_trials,
            self.spec.budget_minutes * 60 if self.spec.budget_minutes else None,
            reserve,
        )
        self.factors: Factors | None = None
        self.fitted: list[str] = []
        self._fit_from = -1  # measured runs the factors were fitted on
        self._cache: dict[tuple[object, ...], float | None] = {}

    # -- the history, from the store --------------------------------------------------------------
    def history(self) -> History:
        t = self.t
        cands = t.repo.candidates(self.sid)
        base = t.base_label()
        base_levels = t.baseline_levels("") if base else None
        h = History()
        for c in cands:
            trials = t.repo.trials(c.id)
            # a trial a kill cut short (or a lost node's) is run again, not charged to the budget
            h.trials_used += sum(1 for x in trials if x.status not in ("interrupted", "lost"))
            h.elapsed_s += sum(_seconds(x.started_at, x.finished_at) for x in trials)
            search = c.search or CandidateSearch()
            point: JsonObject | None = search.point
            if point is None:
                spec = CandidateSpec.model_validate(c.spec)
                point = {"layout": _layout(spec)} if "layout" in self.space.keys else {}
            h.tried.append(self._tried(c, trials, search, point, base_levels if c.label != base else None))
        return h

    def _tried(
        self,
        c: StoredCandidate,
        trials: list[StoredTrial],
        search: CandidateSearch,
        point: dict[str, Any],
        base_levels: Sequence[analyze.Digest] | None,
    ) -> Tried:
        status = c.status
        origin = cast(Origin, search.origin or "listed")
        target = search.rung
        measured = self.t.scored_trials(c.id)
        rung = max((x.rung or 0 for x in measured), default=0)
        values: tuple[float | None, ...] = ()
        outcome: Outcome
        reason = ""
        setting: NamedSetting | None = None
        keys: tuple[str, ...] = ()
        if status == "pruned":
            outcome, reason = "pruned", str((search.region or {}).get("reason", ""))
        elif status == "not_applied":
            outcome = "not_applied"
            na = (c.outcome or {}).get("not_applied")
            mism = (trials[-1].not_applied if trials else None) or (
                [m for m in na if isinstance(m, dict)] if isinstance(na, list) else []
            )
            keys = tuple(str(m.get("key")) for m in mism if isinstance(m, dict))
            reason = (
                "; ".join(
                    f"requested {m.get('key')}={m.get('requested')!r}, runs {m.get('effective')!r}"
                    for m in mism
                )
                or "not applied"
            )
        elif status == "failed":
            outcome = "failed"
            out = c.outcome or {}
            found = out.get("diagnosis")
            diag = found if isinstance(found, dict) and found else (out if "class" in out else {})
            setting = NamedSetting.from_stored(diag.get("setting"))
            reason = str(diag.get("class") or "failed")
            if setting is not None and isinstance(stored := diag["setting"], dict):
                reason += f": try {setting.name} = {setting.value!r} ({stored.get('reason', '')})"
        elif measured and (status in ("measured", "anomalous")):
            levels = analyze.combine_repeats([x.levels or [] for x in measured])
            flags = [
                a for a in analyze.anomalies(levels, base_levels, self.study.anomalies) if a.kind in COLLAPSE
            ]
            outcome = "collapsed" if flags else "measured"
            reason = "; ".join(f"{a.kind}: {a.detail}" for a in flags)
            values = tuple(self._value(c.label, levels, o) for o in self.objectives)
            want = search.repeats
            if rung < target or len(measured) < want:
                outcome = "pending"
        else:
            outcome = "pending"
        return Tried(c.label, dict(point), outcome, values, rung, origin, keys, reason, setting)

    def _value(self, label: str, levels: Sequence[analyze.Digest], objective: str) -> float | None:
        """The objective at the level the study's own objective scores (a Pareto pair is one level)."""
        main = analyze.score(label, "measured", levels, self.study.slo, self.objectives[0])
        if main.level is None:
            return None
        if objective == self.objectives[0]:
            return main.value
        d = next((d for d in levels if analyze.level_of(d) == main.level), None)
        v = analyze.number(d, objective) if d else None
        return float(v) if v is not None else None

    # -- the model --------------------------------------------------------------------------------
    def _refit(self, h: History) -> None:
        """Refit the factors from the study's measured runs (when a new one arrived). Collapsed and
        not-applied points are left out: the model has no lever for a fallback or a broken fusion."""
        if not self.spec.refit:
            return
        from servelab.store.bench import BenchRepo

        bench = BenchRepo(self.t.store)
        wanted: list[tuple[str, CandidateSpec]] = []
        good = {x.label for x in h.tried if x.ok}
        for c in self.t.repo.candidates(self.sid):
            if c.label not in good:
                continue
            spec = CandidateSpec.model_validate(c.spec)
            for tr in self.t.scored_trials(c.id):
                wanted += [(str(d["bench_run"]), spec) for d in tr.levels or [] if d.get("bench_run")]
        if len(wanted) == self._fit_from:
            return
        self._fit_from = len(wanted)
        runs = []
        for u, spec in dict(wanted).items():
            try:
                runs.append((bench.load(u), spec))
            except Exception:  # a run the store cannot give back is left out of the fit
                continue
        factors, fitted = prior.refit(self.study, runs)
        if factors is not None:
            self.factors, self.fitted = factors, fitted
            self._cache.clear()

    def rank(self, point: sp.Point) -> float | None:
        key = point_key(point)
        if key not in self._cache:
            self._cache[key] = prior.predict(self.study, candidate(point, self.space), self.factors).value
        return self._cache[key]

    # -- the loop ---------------------------------------------------------------------------------
    async def run(self) -> None:
        t = self.t
        for c in t.repo.candidates(self.sid):  # listed candidates first: the user's seeds
            if c.search is not None and c.search.origin == "listed":
                await t.run_candidate(self.uid, c, CandidateSpec.model_validate(c.spec))
        pruned = 0
        width = self.width()
        while True:
            h = self.history()
            pending = [x for x in h.tried if x.outcome == "pending"]
            prop = None
            if len(pending) < width:  # a cluster: propose until every slot has a trial
                if not pending:
                    self._refit(h)
                prop = self.strategy.propose(h, self.rank, self._budget(pending))
            if prop is None:
                if not pending:
                    break
                # stored before a kill, or just proposed: run them (at once on a cluster)
                await asyncio.gather(*(self._run(x.label) for x in pending))
                continue
            if prop.pruned:
                pruned += 1
                self._store(prop, status="pruned")
                t.notify(
                    SearchPruned(
                        point_label(prop.point, self.space), prop.region.to_dict() if prop.region else None
                    )
                )
                if pruned >= MAX_PRUNED:
                    break
                continue
            if prop.rung > 0:
                self._promote(point_label(prop.point, self.space), prop.rung)
            else:
                self._store(prop)
        await self.confirm()

    def width(self) -> int:
        """How many trials run at once: one on a box; on a cluster as many of the space's largest layout as
        its GPUs hold (so no slot waits for GPUs another proposal holds)."""
        if not self.t.executor.parallel:
            return 1
        biggest = max((c.tp * c.pp * (c.dp or 1) for c in self.study.space_checks()), default=1)
        return max(1, self.t.executor.capacity() // max(1, biggest))

    def _budget(self, pending: list[Tried]) -> Budget:
        """The budget with the pending trials counted as spent (they are about to run)."""
        b = self.budget
        return Budget(None if b.trials is None else b.trials - len(pending), b.seconds, b.reserve_trials)

    async def confirm(self) -> None:
        """The contenders get the study's repeats (at their top rung), so the winner is judged against the
        noise; every other candidate keeps its one trial."""
        if self.study.repeats <= 1:
            return
        while True:
            h = self.history()
            pending = [x for x in h.tried if x.outcome == "pending"]
            if pending:
                await asyncio.gather(*(self._run(x.label) for x in pending))
                continue
            # the top `contenders` by what is measured now: a repeat can move one out and another in,
            # which then gets its repeats too, as long as the budget has room for them
            top = promoted(h, self.signs[0], self.spec.contenders)
            todo = [x for x in top if not self._search_of(x.label).contender]
            extra = (self.study.repeats - 1) * len(todo)
            if not todo or (
                self.spec.budget_trials is not None and h.trials_used + extra > self.spec.budget_trials
            ):
                return
            for x in todo:  # stored first: a resume finishes these repeats
                self._set_search(x.label, repeats=self.study.repeats, contender=True)

    def _store(self, prop: Proposal, status: str = "pending") -> None:
        t = self.t
        name = point_label(prop.point, self.space)
        cand = candidate(prop.point, self.space)
        idx = len(t.repo.candidates(self.sid))
        prior_value = prior.predict(self.study, cand, None).value
        search: JsonObject = {
            "origin": prop.origin,
            "point": dict[str, JsonValue](prop.point),
            "rung": prop.rung,
            "repeats": 1,
            "predicted": {
                "prior": prior_value,
                "refit": prop.predicted if self.factors is not None else None,
                "refit_from_runs": self._fit_from if self.factors is not None else 0,
                "refit_factors": list[JsonValue](self.fitted),
            },
        }
        if prop.region is not None:
            search["region"] = prop.region.to_dict()
        pred = t.predicted(cand) if status != "pruned" else None
        cid = t.repo.add_candidate(self.sid, idx, name, cand.model_dump(mode="json"), pred, search, status)
        if status != "pruned":
            t.fill_plan(self.uid, [c for c in t.repo.candidates(self.sid) if c.id == cid])
            t.notify(SearchProposed(name, prop.origin, prop.predicted))

    def _search_of(self, label: str) -> CandidateSearch:
        c = next(c for c in self.t.repo.candidates(self.sid) if c.label == label)
        return c.search or CandidateSearch()

    def _set_search(self, label: str, **changes: Any) -> None:
        c = next(c for c in self.t.repo.candidates(self.sid) if c.label == label)
        stored = c.search.to_json() if c.search else {"origin": "listed", "point": None}
        self.t.repo.set_search(c.id, {**stored, **changes})

    def _promote(self, label: str, rung: int) -> None:
        self._set_search(label, rung=rung, promoted=True)
        self.t.notify(SearchPromoted(label, rung))

    async def _run(self, label: str) -> None:
        t = self.t
        c = next(c for c in t.repo.candidates(self.sid) if c.label == label)
        search = c.search or CandidateSearch()
        t.set_rung(label, search.rung)
        t.set_repeats(label, search.repeats)
        if c.status in ("measured", "anomalous"):
            t.repo.set_candidate(c.id, "running")
        fresh = next(x for x in t.repo.candidates(self.sid) if x.id == c.id)
        await t.run_candidate(self.uid, fresh, CandidateSpec.model_validate(c.spec))
        after = next(x for x in t.repo.candidates(self.sid) if x.id == c.id)
        if after.status == "running":  # every trial it needed had been measured before
            t.repo.set_candidate(c.id, "measured", {})


def dry_run_view(study: Study) -> JsonObject:
    """What `tune --dry-run` shows of a search: the space, the budget and the model's first points."""
    assert study.search is not None
    spec = study.search
    space = sp.build(spec)
    from servelab.search.strategies import pool, ranked

    points = pool(space, spec.seed)
    sign = prior.better(objectives(study)[0])
    first = ranked(points, lambda p: prior.predict(study, candidate(p, space)).value, sign)
    n = spec.prior_trials if spec.strategy == "optuna" else min(len(first), 10)
    budget = " / ".join(
        x
        for x in (
            f"{spec.budget_trials} trials" if spec.budget_trials else "",
            f"{spec.budget_minutes:g} min" if spec.budget_minutes else "",
        )
        if x
    )
    return {
        "strategy": spec.strategy,
        "seed": spec.seed,
        "space_size": space.size(),
        "feasible": len(points) if space.finite() else None,
        "budget": budget or "none (the whole space)",
        "objectives": list[JsonValue](objectives(study)),
        "first": [
            {"label": sp.label(p, space), "point": dict[str, JsonValue](p), "predicted": v}
            for p, v in first[:n]
        ],
    }


def _layout(spec: CandidateSpec) -> str:
    parts = [f"tp{spec.tp}"] + ([f"pp{spec.pp}"] if spec.pp > 1 else [])
    parts += [f"dp{spec.dp}"] if spec.dp else []
    parts += [f"ep{spec.ep}"] if spec.ep else []
    return "-".join(parts)


ONCE = "ran once, not a contender: no margin of it can be judged against the noise"
SHORT = "eliminated on the short benchmark (halving's rung 0)"


def excluded(tuner: TrialRunner, cands: list[StoredCandidate]) -> dict[str, str]:
    """The candidates the final ranking leaves out, each with why: with contenders (the study's repeats),
    every other one (it ran once); for halving, those that did not reach the top rung (short benchmark)."""
    spec = tuner.study.search
    if spec is None:
        return {}
    contenders = {c.label for c in cands if c.search is not None and c.search.contender}
    out: dict[str, str] = {}
    if spec.strategy == "halving":
        rungs = {c.label: max((x.rung or 0 for x in tuner.scored_trials(c.id)), default=0) for c in cands}
        top = max(rungs.values(), default=0)
        out.update({label: SHORT for label, r in rungs.items() if r < top})
    if contenders:
        out.update({c.label: ONCE for c in cands if c.label not in contenders and c.label not in out})
    return out


def summary(
    tuner: TrialRunner,
    sid: int,
    cands: list[StoredCandidate],
    out: Sequence[Mapping[str, object]],
    ranking: analyze.Ranking,
) -> JsonObject:
    """What the search did: budget used, each candidate's origin and model error, the regions it pruned,
    the contenders, a tie when the winner's margin is within the noise, and the Pareto front."""
    study = tuner.study
    assert study.search is not None
    spec = study.search
    objs = objectives(study)
    main = study.load_kind().main
    trials_used = 0
    redone = 0  # trials a kill or a lost node cut short, run again (not charged to the budget)
    elapsed = 0.0
    rows: list[JsonObject] = []
    errors: dict[str, list[float]] = {"prior": [], "refit": []}  # each row's model error, where there is one
    measured: list[str] = []  # the labels of the rows with a measured score, in order
    regions: dict[str, JsonObject] = {}
    by_label: dict[object, Mapping[str, object]] = {o["label"]: o for o in out}
    for c in cands:
        trials = tuner.repo.trials(c.id)
        trials_used += sum(x.status not in ("interrupted", "lost") for x in trials)
        redone += sum(x.status in ("interrupted", "lost") for x in trials)
        elapsed += sum(_seconds(x.started_at, x.finished_at) for x in trials)
        search = c.search or CandidateSearch()
        o = by_label.get(c.label, {})
        # what was measured, also for a candidate left out of the ranking (one trial, or halving's rung 0)
        levels = analyze.digests(o.get("levels"))
        score = analyze.score(c.label, "measured", levels, study.slo, study.objective).value
        if c.status not in ("measured", "anomalous"):
            score = None
        pred = search.predicted or SearchPredicted()
        row: JsonObject = {
            "label": c.label,
            "origin": search.origin or ("grid" if spec.strategy == "grid" else "listed"),
            "status": c.status,
            "rung": max((x.rung or 0 for x in trials if x.status == "measured"), default=0),
            "trials": len(trials),
            "measured": score,
            "predicted_prior": pred.prior,
            "predicted_refit": pred.refit,
        }
        # the model predicts the main level: its error is judged there (the score may sit at another level)
        at_main = next((d for d in levels if analyze.level_of(d) == main), None)
        m = (
            analyze.number(at_main, study.objective)
            if at_main and c.status in ("measured", "anomalous")
            else None
        )
        row["measured_at_main"] = m
        for k in ("prior", "refit"):
            p = pred.prior if k == "prior" else pred.refit
            err = abs(p / m - 1.0) if (p and m) else None
            row[f"error_{k}"] = err
            if err is not None:
                errors[k].append(err)
        if c.status == "pruned" and search.region:
            reg = search.region
            row["pruned_by"] = reg
            entry = regions.setdefault(str(reg["where"]), {**reg, "pruned": 0})
            n = entry["pruned"]
            entry["pruned"] = (n if isinstance(n, int) else 0) + 1
        rows.append(row)
        if score is not None:
            measured.append(c.label)

    out_d: JsonObject = {
        "strategy": spec.strategy,
        "seed": spec.seed,
        "objectives": list[JsonValue](objs),
        "budget": {"trials": spec.budget_trials, "minutes": spec.budget_minutes},
        "used": {"trials": trials_used, "minutes": round(elapsed / 60, 3), "cut_short": redone},
        "space_size": sp.build(spec).size() if spec.space else None,
        "candidates": list[JsonValue](rows),
        "regions": list[JsonValue](regions.values()),
        "model_error": {
            k: {"median": sorted(v)[len(v) // 2] if v else None, "n": len(v)} for k, v in errors.items()
        },
        "contenders": list[JsonValue](
            [c.label for c in cands if c.search is not None and c.search.contender]
        ),
    }
    if ranking.winner and ranking.significant is False:
        lo_hi = (ranking.noise or {}).get("difference_ci95")
        out_d["tied"] = {
            "labels": [ranking.winner, ranking.runner_up],
            "margin": ranking.margin,
            "margin_pct": ranking.margin_pct,
            "interval": lo_hi,
            "why": "the winner's margin is within the noise: the two are reported as tied",
        }
    if len(objs) == 2:
        pts = [(label, by_label.get(label, {})) for label in measured]
        pairs = []
        for label, o in pts:
            got = o.get("score")
            lvl = got.get("level") if isinstance(got, Mapping) else None
            d = next((d for d in analyze.digests(o.get("levels")) if analyze.level_of(d) == lvl), None)
            if d is not None and (b := analyze.number(d, objs[1])) is not None:
                a = analyze.number(d, objs[0])
                if a is None:
                    raise TypeError(f"{label}'s level {lvl} has no {objs[0]}")
                pairs.append((label, float(a), float(b)))
        front: list[JsonValue] = [
            {"label": label, objs[0]: a, objs[1]: b}
            for label, a, b in analyze.pareto_front(pairs, [prior.better(o) for o in objs])
        ]
        out_d["pareto"] = {"objectives": list[JsonValue](objs), "front": front}
    _ = prune  # the regions above are what prune learned, read back from the stored pruned candidates
    return out_d

"""A study's findings as one typed model (`report.model.StudyReport`): the store is read once (`load`), the
rest is `build`.

Markdown, HTML, the web UI and `servelab report --json` all render this one model, so they cannot
disagree about a number. Strings are kept as stored (the renderers escape them); numbers are not rounded.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from servelab import analyze
from servelab import load as load_kinds
from servelab.config.sections import CostSpec
from servelab.jsontypes import JsonObject
from servelab.model.hardware import default_price
from servelab.report.model import (
    AnomalyNote,
    CandidateReport,
    CandidateScore,
    CandidateSettings,
    ConfigRow,
    CurvePoint,
    Curves,
    DeclaredHost,
    DecodeView,
    EngineInfo,
    Explained,
    ExplainLevel,
    HostReport,
    LoadInfo,
    NoExplain,
    NotApplied,
    PlanView,
    RecordedRun,
    SloLimit,
    StoredRanking,
    StudyInfo,
    StudyReport,
    TrialReport,
)
from servelab.report.pareto import ENERGY_AXES, EnergyPoint, ParetoPoint, layout_gpus, throughput_front
from servelab.report.pareto import front as pareto_front
from servelab.report.pareto import point as pareto_point
from servelab.report.text import as_list
from servelab.report.top import Winner, top_lines
from servelab.results import LevelSummary, RunContext
from servelab.store.db import Store
from servelab.store.studies import StoredCandidate, StoredStudy, StoredTrial, StudyRepo

# a stored candidate with its trials, as the report reads them
CandidateRows = tuple[StoredCandidate, list[StoredTrial]]

OUTCOME_TEXT = {
    "measured": "measured",
    "anomalous": "measured, anomalous",
    "not_applied": "not applied (the engine ran something else)",
    "failed": "failed",
    "pending": "not yet run",
    "running": "running",
    "pruned": "pruned by the search (in a region a failed, not-applied or collapsed trial ruled out)",
}
METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def load(store: Store, ref: str, host: JsonObject | None = None, model: bool = True) -> StudyReport:
    """Everything the report needs about study `ref` (uid, id, name or `last`).

    `host` is what `report.host.gather()` saw on *this* machine (None: not gathered), shown apart from the
    study's host; `model=False` skips the performance model (the decode-step breakdown)."""
    repo = StudyRepo(store)
    st = repo.resolve(ref)
    cands = [(c, repo.trials(c.id)) for c in repo.candidates(st.id)]
    return build(
        st,
        cands,
        plan=load_plan(store, st.uid),
        host=host,
        model=model,
        contexts=load_contexts(store, cands),
    )


@dataclass(frozen=True)
class TrialContext:
    """What one trial's first bench run recorded about what it ran on."""

    candidate: str
    repeat: int
    run: str  # the bench run's uid
    context: RunContext


def load_contexts(store: Store, cands: list[CandidateRows]) -> list[TrialContext]:
    """What each trial's first bench run recorded about what it ran on (`results.RunContext`): one entry per
    trial that has a stored run."""
    from servelab.errors import NotFoundError
    from servelab.store.bench import BenchRepo

    bench = BenchRepo(store)
    out = []
    for c, trials in cands:
        for t in trials:
            uid = next((lv["bench_run"] for lv in t.levels or [] if lv.get("bench_run")), None)
            if not uid:
                continue
            try:
                ctx = bench.load(str(uid)).context
            except NotFoundError:  # a run removed from the store: the study's own facts still stand
                continue
            out.append(TrialContext(c.label, t.repeat, str(uid), ctx))
    return out


def load_plan(store: Store, name: str) -> PlanView:
    """The plan named `name` (a study's plan is named by its uid), when the plan module is installed."""
    try:
        from servelab.store.plans import PlanRepo
    except ImportError:
        return PlanView(available=False, note="plans are not available in this servelab", items=[])
    try:
        plan = PlanRepo(store).load(name)
    except Exception as exc:  # an older store without the plan tables, or a plan module mid-change
        return PlanView(available=False, note=f"the plan could not be read: {exc}", items=[])
    items = [i.to_dict() for i in plan.items]
    note = (
        ""
        if items
        else f"nothing stored in the plan of {name} (`servelab plan --plan {name} add ...` adds items)"
    )
    return PlanView(available=bool(items), note=note, name=name, items=items)


def build(
    st: StoredStudy,
    cands: list[CandidateRows],
    plan: PlanView | None = None,
    host: JsonObject | None = None,
    model: bool = True,
    contexts: list[TrialContext] | None = None,
) -> StudyReport:
    """The report model from a study row and its candidates (each with `trials`); `contexts` are the
    bench runs' recorded contexts (`load_contexts`)."""
    spec = st.spec or {}
    result = st.result or {}
    ranking = StoredRanking.model_validate(result["ranking"]) if result.get("ranking") else None
    baseline = b if isinstance(b := result.get("baseline"), str) and b else _baseline_label(spec)
    slo = _slo(spec)
    candidates = [_readable_score(_candidate(c, trials, ranking, baseline), slo) for c, trials in cands]
    model_view = _explain(spec, candidates, ranking) if model else NoExplain(note="not computed")
    curves = pareto(candidates, slo)
    energy = energy_points(candidates)
    front = throughput_front(curves.per_gpu)
    winner = _winner(ranking, candidates)
    measured = any(
        lv.get(k) is not None
        for c in candidates
        for lv in c.levels
        for k in ("j_per_output_token", "usd_per_m_output_tokens")
    )
    cost = CostSpec.model_validate(spec.get("cost") or {})
    gpu = g if isinstance(sh := spec.get("host"), dict) and isinstance(g := sh.get("gpu"), str) else None
    study = _study(st, spec, baseline, price_note(cost, gpu) if measured else None)
    # every other declared objective at each candidate's ranked level: (candidate, level, value)
    others = {
        o: [
            (c.label, analyze.level_of(lv), float(v))
            for c in candidates
            for lv in c.levels
            if (at := c.ranked_level()) is not None
            and analyze.level_of(lv) == at
            and (v := analyze.number(lv, o)) is not None
        ]
        for o in study.objectives[1:]
        if o
    }
    return StudyReport(
        study=study,
        host=_host(spec, candidates, host, contexts or []),
        candidates=candidates,
        slo=[SloLimit(metric=m, stat=s, limit=v) for m, s, v in slo.limits()] if slo else [],
        max_startup_s=slo.max_startup_s if slo else None,
        pareto=curves,
        pareto_front=front,
        energy_points=energy,
        # fewest joules at the most throughput
        energy_front=pareto_front(
            energy, lambda p: p.output_throughput, lambda p: p.j_per_output_token, maximise=ENERGY_AXES
        ),
        ranking=ranking,
        search=found if isinstance(found := result.get("search"), dict) else None,
        winner=winner,
        top=top_lines(study.objectives, winner, others, front),
        explain=model_view,
        plan_state=plan_state(candidates),
        plan=plan or PlanView(available=False, note="not loaded", items=[]),
    )


def price_note(cost: CostSpec, gpu: str | None) -> str | None:
    """What the report's J/out tok and $/M out tok columns are, and the price the second is at: the
    study's [cost] (or `tune --gpu-hour-usd`), else the GPU kind's dated catalog default, said to be one
    (None: no price)."""
    if cost.gpu_hour_usd is not None:
        price, source = cost.gpu_hour_usd, "the study's [cost] or tune --gpu-hour-usd"
    elif gpu and (found := default_price(gpu)) is not None:
        price, source = found[0], f"{found[1]} — a default; give the study a [cost] gpu_hour_usd"
    else:
        return None
    kwh = f", electricity ${cost.kwh_usd:g}/kWh" if cost.kwh_usd else ""
    return (
        "J/out tok: joules of GPU energy per output token; $/M out tok: dollars per million output tokens "
        f"at ${price:g} per GPU-hour ({source}){kwh}."
    )


def _baseline_label(spec: dict[str, Any]) -> str | None:
    cs = spec.get("candidates") or []
    for c in cs:
        if c.get("baseline"):
            return str(c.get("name") or "")
    return str(cs[0].get("name") or "") if cs else None


def _slo(spec: dict[str, Any]) -> Any:
    from servelab.config.sections import SLOSpec

    try:
        return SLOSpec.model_validate(spec.get("slo") or {})
    except ValueError:
        return None


def _study(st: StoredStudy, spec: dict[str, Any], baseline: str | None, note: str | None) -> StudyInfo:
    eng = spec.get("engine") or {}
    try:
        load = load_kinds.from_spec(spec.get("load") or {}, spec.get("workload")).summary()
    except ValueError:  # a study stored without a load (never written by tune): show what there is
        load = {"mode": "concurrency", "levels": [], "main": None, "unit": load_kinds.ConcurrencyLoad.unit}
    src = st.source
    return StudyInfo(
        uid=st.uid,
        name=st.name,
        status=st.status,
        created_at=st.created_at,
        finished_at=st.finished_at,
        source=src,
        description=(spec.get("study") or {}).get("description") or "",
        objective=spec.get("objective"),
        # every objective the study declared: a search's (the first ranks the winner), else the one
        objectives=list((spec.get("search") or {}).get("objectives") or [spec.get("objective")]),
        repeats=spec.get("repeats", 1),
        baseline=baseline,
        model=(spec.get("model") or {}).get("path"),
        engine=EngineInfo(
            name=eng.get("name"),
            personality=(eng.get("options") or {}).get("personality"),
            args=eng.get("args") or [],
        ),
        workload=spec.get("workload") or {},
        load=LoadInfo.model_validate(load),
        command=shlex.join(["servelab", "tune", src]) if src else None,
        price_note=note,
    )


def _host(
    spec: dict[str, Any],
    cands: list[CandidateReport],
    gathered: JsonObject | None,
    contexts: list[TrialContext],
) -> HostReport:
    """The host the study ran on, from what the study recorded: its bench runs' contexts first (what each run
    was of), the study file's [host] where they are silent. `this_machine` is the machine writing the report,
    which may be another one; the renderers show it apart."""
    h = spec.get("host") or {}
    versions = sorted({t.engine_version for c in cands for t in c.trials if t.engine_version})
    recorded = []
    for item in contexts:
        ctx, hst = item.context, item.context.host
        lay = ctx.layout.model_dump()
        recorded.append(
            RecordedRun(
                candidate=item.candidate,
                repeat=item.repeat,
                run=item.run,
                engine=ctx.engine,
                personality=ctx.personality,
                gpu=hst.gpu,
                num_gpus=hst.num_gpus,
                interconnect=hst.interconnect,
                source=hst.source,
                layout=", ".join(f"{k}={v}" for k, v in lay.items() if v is not None) or None,
                speed=ctx.clock.speed,
                time_base=ctx.clock.time_base,
            )
        )
    first = next((r for r in recorded if r.gpu), None)
    gpu = first.gpu if first else h.get("gpu")
    num = (first.num_gpus if first and first.num_gpus else None) or h.get("num_gpus")
    engine = (spec.get("engine") or {}).get("name")
    speeds = sorted({float(r.speed) for r in recorded if r.speed})
    interconnect = first.interconnect if first else h.get("interconnect")
    gpu_name, memory_gb = None, None
    if gpu:
        try:
            from servelab.model.hardware import make_host

            hs = make_host(str(gpu), int(num or 1), interconnect)
            interconnect = f"{hs.interconnect.name} ({hs.interconnect.description})"
            gpu_name, memory_gb = hs.gpu.description, hs.gpu.memory_gb
        except Exception:  # an unknown GPU kind: the report still shows what was recorded
            pass
    return HostReport(
        gpu=gpu,
        num_gpus=num,
        interconnect=interconnect,
        gpu_name=gpu_name,
        gpu_memory_gb=memory_gb,
        source="the study's bench runs" if first else "the study file" if h.get("gpu") else None,
        declared=DeclaredHost(
            gpu=h.get("gpu"), num_gpus=h.get("num_gpus"), interconnect=h.get("interconnect")
        ),
        recorded=recorded,
        simulated=engine == "sim" or any(s != 1.0 for s in speeds),
        clock_speeds=speeds,
        engine_versions=versions,
        this_machine=gathered,
    )


def _candidate(
    c: StoredCandidate, trials: list[StoredTrial], ranking: StoredRanking | None, baseline: str | None
) -> CandidateReport:
    outcome = c.outcome or {}
    stored = outcome.get("levels")
    levels: list[JsonObject] = [x for x in stored if isinstance(x, dict)] if isinstance(stored, list) else []
    if stored is None:  # a study still running: combine what the trials measured so far
        levels = analyze.combine_repeats([t.levels for t in trials if t.levels])
    # the last trial that recorded each (a later trial may have stopped before it got that far)
    eff = next((t.effective for t in reversed(trials) if t.effective), None) or {}
    last_na = next((t.not_applied for t in reversed(trials) if t.not_applied), None)
    mismatches = {m.get("key"): m for m in (last_na or [])}
    requested = next((t.requested for t in reversed(trials) if t.requested), None) or {}
    effective = e if isinstance(e := eff.get("effective"), dict) else {}
    evidence = e if isinstance(e := eff.get("evidence"), dict) else {}
    config = [
        ConfigRow(
            key=k,
            requested=v,
            effective=effective.get(k, None),
            evidence=ev if isinstance(ev := evidence.get(k), str) else None,
            applied=k not in mismatches,
            confirmed=k in effective,
        )
        for k, v in requested.items()
    ]
    diag = next((t.diagnosis for t in reversed(trials) if t.diagnosis), None)
    anomalies = an if isinstance(an := outcome.get("anomalies"), list) else []
    status = c.status
    return CandidateReport(
        label=c.label,
        idx=c.idx,
        status=status,
        outcome=OUTCOME_TEXT.get(status, status),
        baseline=c.label == baseline,
        winner=bool(ranking and ranking.winner == c.label),
        settings=_settings(c.spec or {}),
        predicted=c.predicted,
        config=config,
        not_applied=[NotApplied.model_validate(m) for m in mismatches.values()],
        diagnosis=diag,
        anomalies=[AnomalyNote.model_validate(a) for a in anomalies],
        score=None if (sc := outcome.get("score")) is None else CandidateScore.model_validate(sc),
        levels=levels,
        command=_command(trials),
        trials=[_trial(t) for t in trials],
    )


def _readable_score(c: CandidateReport, slo: Any) -> CandidateReport:
    """The score's reason in words: where no level met the SLOs, which limit each level missed (the stored
    reason spells it as a Python dict)."""
    if (c.score and c.score.value is not None) or slo is None or not c.measured:
        return c
    if c.score and not (c.score.why or "").startswith("no level meets the SLOs"):
        return c  # another reason (the objective's figure missing at the levels that met them)
    misses = [(lv["level"], analyze.slo_failures(lv, slo)) for lv in c.levels if lv.get("level") is not None]
    if not any(reasons for _, reasons in misses):
        return c
    text = "; ".join(f"at level {level:g}, {', '.join(reasons)}" for level, reasons in misses if reasons)
    stored = c.score.model_dump(mode="json") if c.score else {}
    why = {
        "why": f"no level meets the SLOs: {text}",
        "slo_misses": [{"level": level, "reasons": reasons} for level, reasons in misses],
    }
    return c.model_copy(update={"score": CandidateScore.model_validate(stored | why)})


def _settings(spec: dict[str, Any]) -> CandidateSettings:
    from servelab.space import FIELDS as keys  # the candidate fields a layout or value sets

    d = {k: spec[k] for k in keys if spec.get(k) not in (None, 1) or k == "tp"}
    if spec.get("args"):
        d["args"] = list(spec["args"])
    if spec.get("env"):
        d["env"] = dict(spec["env"])
    return CandidateSettings.model_validate(d)


def _command(trials: list[StoredTrial]) -> str | None:
    """The last launch as one shell line (env first), to start the same server by hand."""
    for t in reversed(trials):
        if t.argv:
            env = [f"{k}={shlex.quote(str(v))}" for k, v in sorted((t.env or {}).items())]
            return " ".join([*env, shlex.join(t.argv)])
    return None


def _trial(t: StoredTrial) -> TrialReport:
    runs = [str(lv["bench_run"]) for lv in t.levels or [] if lv.get("bench_run")]
    verify = t.verify
    return TrialReport(
        repeat=t.repeat,
        status=t.status,
        started_at=t.started_at,
        finished_at=t.finished_at,
        url=t.url,
        log_path=t.log_path,
        engine_version=t.engine_version,
        ready_s=t.ready_s,
        error=t.error,
        bench_runs=runs,
        verify_ok=None if verify is None else bool(verify.get("ok")),
        teardown=_teardown_text(t.teardown),
        levels_done=len(t.levels or []),
        startup=t.startup,
    )


def _teardown_text(td: Any) -> str | None:
    if not isinstance(td, dict):
        return None if td is None else str(td)
    parts = [
        f"{k}={v}" for k, v in td.items() if isinstance(v, str | int | float | bool) and v not in ("", None)
    ]
    return ", ".join(parts[:8]) or None


def pareto(cands: list[CandidateReport], slo: Any = None) -> Curves:
    """Throughput against TPOT p50 over every measured level; the front of the levels that meet the SLOs
    (no other SLO-meeting point has more throughput at a lower TPOT). `per_gpu`: every measured level as a
    `report.pareto.ParetoPoint` (output tok/s per GPU, tok/s per user), each candidate's tok/s divided by
    the GPUs of its layout."""
    points = []
    per_gpu: list[ParetoPoint] = []
    for c in cands:
        if not c.measured:
            continue
        s = c.settings
        gpus = layout_gpus(s.tp, s.pp, s.dp)
        for lv in c.levels:
            x, y = analyze.number(lv, "output_throughput"), analyze.number(lv, "tpot_ms_p50")
            level = analyze.stored_level(lv)
            if (pp := pareto_point(c.label, level, x, y, gpus)) is not None:
                per_gpu.append(pp)
            if x is None or y is None:
                continue
            ok = not analyze.slo_failures(lv, slo) if slo is not None else True
            points.append(
                CurvePoint(label=c.label, level=level, output_throughput=x, tpot_ms_p50=y, meets_slo=ok)
            )
    good = [p for p in points if p.meets_slo]
    front = [
        p
        for p in good
        if not any(
            q is not p
            and q.output_throughput >= p.output_throughput
            and q.tpot_ms_p50 <= p.tpot_ms_p50
            and (q.output_throughput > p.output_throughput or q.tpot_ms_p50 < p.tpot_ms_p50)
            for q in good
        )
    ]
    front.sort(key=lambda p: p.output_throughput)
    # output tok/s per GPU against tok/s per user: every measured level, SLOs or not (the trade-off itself;
    # the TPOT limit is a line on that chart); its front is `build`'s "pareto_front"
    return Curves(points=points, front=front, per_gpu=per_gpu)


def energy_points(cands: list[CandidateReport]) -> list[EnergyPoint]:
    """Every measured level with both its output throughput and its J per output token (the points of the
    report's energy chart, `energy_points`; `energy_front` the levels no other beats on both: more output
    tok/s for fewer J per output token)."""
    return [
        EnergyPoint(c.label, analyze.level_of(lv), float(x), float(j))
        for c in cands
        if c.measured
        for lv in c.levels
        if (x := analyze.number(lv, "output_throughput")) is not None
        and (j := analyze.number(lv, "j_per_output_token")) is not None
    ]


def _winner(ranking: StoredRanking | None, cands: list[CandidateReport]) -> Winner:
    if not ranking:
        return Winner(
            label=None,
            runner_up=None,
            runner_up_value=None,
            node_spread=None,
            margin=None,
            margin_pct=None,
            significant=None,
            noise="",
            noise_method=None,
            objective=None,
            value=None,
            half_width=None,
            level=None,
            why="no ranking yet: the study has not finished",
        )
    w = ranking.winner
    score = next((c.score for c in cands if c.label == w), None) or CandidateScore()
    sig = ranking.significant
    noise = {
        True: "exceeds the noise",
        False: "is within the noise",
        None: "cannot be judged against the noise (one repeat each; set repeats ≥ 2)",
    }[sig]
    judged = ranking.noise or {}
    method = _text(judged.get("method"))
    if sig is None and judged.get("reason") and judged.get("reason") != "one trial each":
        noise = f"cannot be judged against the noise ({judged['reason']})"
    if sig is not None:  # say how: a cluster bootstrap over the trials' requests, or the t-interval
        method = method or analyze.T_METHOD
        ci = as_list(judged.get("difference_ci95"))
        hw, failed = (judged.get(k) for k in ("half_width", "runner_up_failed_at"))
        where = (
            f", 95 % interval of the difference [{ci[0]:+.3g}, {ci[1]:+.3g}]"
            if ci
            else f", 95 % interval of the difference ±{hw:.3g}"
            if hw is not None
            else f", the runner-up failed at {failed:g}"
            if failed is not None
            else ""
        )
        noise = f"{noise} (judged by {method}{where})"
    runner_up = ranking.runner_up
    return Winner(
        label=w,
        runner_up=runner_up,
        runner_up_value=next(
            (c.score.value if c.score else None for c in cands if runner_up and c.label == runner_up), None
        ),
        node_spread=_node_spread(judged.get("node_spread"), ranking.margin),
        margin=ranking.margin,
        margin_pct=ranking.margin_pct,
        significant=sig,
        noise=noise,
        noise_method=method,
        objective=ranking.objective,
        value=score.value,
        half_width=score.half_width,
        level=score.level,
        why=ranking.verdict,
    )


def _text(v: object) -> str | None:
    """A stored text (None where there is none)."""
    return None if v is None else str(v)


def _node_spread(ns: object, margin: float | None) -> str | None:
    """On a cluster, the margin against the node-to-node spread measured on the baseline, in words."""
    if not isinstance(ns, dict):
        return None
    if not ns.get("measured"):
        return "the node-to-node spread was not measured (the baseline ran on one node)"
    spread = float(ns.get("spread") or 0.0)
    pct = f" ({ns['spread_pct']:.1f} %)" if ns.get("spread_pct") is not None else ""
    if margin is not None and abs(float(margin)) <= spread:
        return (
            f"but the margin is not larger than the node-to-node spread {spread:,.4g}{pct} measured on the "
            "baseline: no winner is called on it"
        )
    return f"it exceeds the node-to-node spread {spread:,.4g}{pct} measured on the baseline"


def plan_state(cands: list[CandidateReport]) -> dict[str, list[str]]:
    """The study's own todo list: what was done, what the engine did not apply, what is not done yet."""
    out: dict[str, list[str]] = {"done": [], "not_applied": [], "failed": [], "not_yet_done": []}
    for c in cands:
        if c.status == "pruned":  # never a plan item: the search ruled it out before it ran
            out.setdefault("pruned", []).append(c.label)
            continue
        key = {"measured": "done", "anomalous": "done", "not_applied": "not_applied", "failed": "failed"}.get(
            c.status, "not_yet_done"
        )
        out[key].append(c.label)
    return out


def _explain(
    spec: dict[str, Any], cands: list[CandidateReport], ranking: StoredRanking | None
) -> Explained | NoExplain:
    """`servelab explain` for the winner (or the baseline): measured beside predicted at every level, and
    the predicted decode step at the main level split into its parts."""
    pick = next((c for c in cands if c.winner), None) or next(
        (c for c in cands if c.baseline and c.levels), None
    )
    if pick is None or not pick.levels:
        return NoExplain(note="no measured candidate to set beside the model")
    host = spec.get("host") or {}
    if not host.get("gpu"):
        return NoExplain(note="the study does not name its GPU ([host] gpu), so there is no prediction")
    try:
        from servelab.model.explain import explain_levels
        from servelab.model.factors import default_factors
        from servelab.model.predict import Workload, evaluate, make_setup

        s = pick.settings
        tp, pp, dp = s.tp or 1, s.pp or 1, s.dp or 1
        eng = spec.get("engine") or {}
        personality = (eng.get("options") or {}).get("personality") or eng.get("name")
        model_spec = spec.get("model") or {}
        setup = make_setup(
            str(model_spec.get("config") or model_spec.get("path") or ""),
            host["gpu"],
            min(int(host.get("num_gpus") or tp), tp * pp * dp),
            tp=tp,
            pp=pp,
            ep=s.ep or 1,
            dp=dp,
            quant=s.quantization,
            kv_dtype=s.kv_cache_dtype,
            factors=default_factors(personality),
        )
        w = spec.get("workload") or {}
        isl, osl = int(w.get("input_len") or 1024), int(w.get("output_len") or 128)
        kind = load_kinds.from_spec(spec.get("load") or {}, w)
        runs = [LevelSummary.from_digest(lv, mode=kind.mode) for lv in pick.levels]
        ex = explain_levels(setup, runs, isl, osl)
        main = kind.main
        at = min(range(len(runs)), key=lambda i: abs(runs[i].value - main))
        main_lv, main_run = pick.levels[at], runs[at]
        p = evaluate(setup, Workload(isl, osl, main_run.concurrency))
    except Exception as exc:  # the model's gaps (unknown model, GPU) must not stop the report
        return NoExplain(note=f"the performance model cannot describe this setup: {exc}")
    simulated = (spec.get("engine") or {}).get("name") == "sim"
    return Explained(
        label=pick.label,
        same_model=simulated,
        caveat=(
            "The engine is servelab's simulator, which times every request with this same performance model: "
            "measured against predicted here checks the simulator against its own model, not the model "
            "against a GPU."
            if simulated
            else None
        ),
        largest_gap=ex.largest_gap,
        levels=[
            ExplainLevel(
                mode=lv.mode,
                level=lv.level,
                concurrency=lv.concurrency,
                measured=lv.measured,
                predicted=lv.predicted,
                error_pct=lv.error_pct,
                attribution=lv.attribution,
                gap=lv.largest_gap,
            )
            for lv in ex.levels
        ],
        decode=DecodeView(
            mode=kind.mode,
            level=kind.level_value(main_run.value),
            unit=kind.unit,
            concurrency=main_run.concurrency,
            predicted_step_ms=p.decode_step_ms,
            predicted_tpot_ms=p.tpot_ms,
            predicted_breakdown_ms=dict(p.decode_breakdown_ms),
            measured_tpot_ms=analyze.number(main_lv, "tpot_ms_p50"),
            bottleneck=p.bottleneck,
            allreduce_share=p.allreduce_share,
        ),
    )

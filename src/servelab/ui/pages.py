"""The web UI's pages and JSON endpoints: pure functions of a path, a query and an open store.

Every page is a self-contained document (the report's CSS, inline SVG, no external URL); the study page of a
running study polls `/api/study/UID/progress` and reloads itself when something finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson

from servelab import load as load_kinds
from servelab.errors import NotFoundError, UserError
from servelab.report import data
from servelab.report.figures import run_figures
from servelab.report.html import figures_html, levels_table, page, plan_items, study_body, table
from servelab.report.runreport import load as load_run_report
from servelab.report.text import fmt, h
from servelab.results import Run
from servelab.store.bench import BenchRepo
from servelab.store.db import Store
from servelab.store.studies import StoredStudy, StudyRepo

NAV = (
    '<nav><a href="/">studies</a><a href="/runs">runs</a><a href="/compare">compare two runs</a>'
    '<a href="/plans">plans</a></nav>'
)


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


def _html(title: str, body: str, script: str = "", status: int = 200) -> Response:
    return Response(status, page(title, body, script, NAV).encode())


def _json(obj: Any, status: int = 200) -> Response:
    return Response(
        status,
        orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY),
        "application/json",
    )


def route(store: Store, path: str, query: dict[str, str]) -> Response:
    """Dispatch one GET. Unknown paths are 404; a missing study or run is a 404 page with the hint."""
    parts = [p for p in path.split("/") if p]
    try:
        match parts:
            case []:
                return studies_page(store)
            case ["runs"]:
                return runs_page(store)
            case ["study", ref]:
                return study_page(store, ref)
            case ["run", ref]:
                return run_page(store, ref)
            case ["compare"]:
                return compare_page(store, query.get("a", ""), query.get("b", ""))
            case ["plans"]:
                return plans_page(store)
            case ["plan", name]:
                return plan_page(store, name)
            case ["api", "studies"]:
                return _json({"studies": [_study_row(store, s) for s in StudyRepo(store).list_studies(200)]})
            case ["api", "study", ref]:
                return _json(data.load(store, ref).to_json())
            case ["api", "study", ref, "progress"]:
                return _json(progress(store, ref))
            case ["api", "run", ref]:
                return _json(_run(store, ref))
    except NotFoundError as exc:
        if parts and parts[0] == "api":
            return _json(exc.to_dict(), 404)
        return _html(
            "not found",
            f"<h1>Not found</h1><p>{h(exc.message)}</p><p class=note>{h(exc.hint)}</p>",
            status=404,
        )
    except UserError as exc:
        return _html("bad request", f"<h1>Bad request</h1><p>{h(exc.message)}</p>", status=400)
    return _html("not found", f"<h1>Not found</h1><p>nothing at {h(path)}</p>", status=404)


def _study_row(store: Store, st: StoredStudy) -> dict[str, Any]:
    cands = StudyRepo(store).candidates(st.id)
    ranking = r if isinstance(r := (st.result or {}).get("ranking"), dict) else {}
    return {
        "uid": st.uid,
        "name": st.name,
        "status": st.status,
        "created_at": st.created_at,
        "winner": ranking.get("winner"),
        "candidates": len(cands),
        "finished_candidates": sum(
            c.status in ("measured", "anomalous", "not_applied", "failed") for c in cands
        ),
    }


def studies_page(store: Store) -> Response:
    rows = [_study_row(store, s) for s in StudyRepo(store).list_studies(200)]
    body = "<h1>servelab studies</h1>" + (
        table(
            ["study", "name", "status", "created", "candidates", "winner"],
            [
                [
                    f'<a href="/study/{quote(r["uid"])}">{h(r["uid"])}</a>',
                    h(r["name"]),
                    h(r["status"]),
                    h(r["created_at"][:19]),
                    f"{r['finished_candidates']}/{r['candidates']}",
                    h(r["winner"] or "-"),
                ]
                for r in rows
            ],
            "studies",
        )
        if rows
        else "<p>no studies stored yet; <code>servelab tune STUDY.toml</code> runs one.</p>"
    )
    return _html("servelab studies", body)


def runs_page(store: Store) -> Response:
    runs = BenchRepo(store).list_runs(200)
    body = "<h1>Benchmark runs</h1>" + table(
        ["run", "created", "status", "model", "engine", "url", "levels"],
        [
            [
                f'<a href="/run/{quote(r.uid)}">{h(r.uid)}</a>',
                h(r.created_at[:19]),
                h(r.status),
                h(r.model),
                h(r.engine or "-"),
                h(r.url),
                str(len(r.levels)),
            ]
            for r in runs
        ],
        "runs",
    )
    return _html("servelab runs", body)


def progress(store: Store, ref: str) -> dict[str, Any]:
    """What a running study has done so far: per candidate its status, trials and levels measured."""
    repo = StudyRepo(store)
    st = repo.resolve(ref)
    load, workload = st.spec.get("load"), st.spec.get("workload")
    kind = load_kinds.of_spec(
        load if isinstance(load, dict) else None, workload if isinstance(workload, dict) else None
    )
    levels = [kind.level_value(v) for v in kind.levels] if kind is not None else []
    cands = []
    for c in repo.candidates(st.id):
        trials = repo.trials(c.id)
        last = trials[-1] if trials else None
        done_levels = (last.levels if last is not None else None) or []
        cands.append(
            {
                "label": c.label,
                "status": c.status,
                "trials": len(trials),
                "trial_status": last.status if last is not None else None,
                "levels_done": len(done_levels),
                "last_level": done_levels[-1].get("level") if done_levels else None,
            }
        )
    done = sum(c["status"] in ("measured", "anomalous", "not_applied", "failed") for c in cands)
    return {
        "study": st.uid,
        "status": st.status,
        "candidates": cands,
        "finished": done,
        "total": len(cands),
        "levels_per_candidate": len(levels),
        "measured_levels": sum(c["levels_done"] for c in cands),
    }


# Polls the progress endpoint; reloads when a level or a candidate finished, stops when the study ended.
PROGRESS_JS = """
(function(){
  var box=document.getElementById('progress'); if(!box) return;
  var url=box.getAttribute('data-url'), seen=box.getAttribute('data-seen');
  function tick(){
    fetch(url,{cache:'no-store'}).then(function(r){return r.json();}).then(function(p){
      var lines=p.candidates.map(function(c){return c.label+': '+c.status+(c.trial_status?' ('+c.trial_status+
        ', '+c.levels_done+'/'+p.levels_per_candidate+' levels)':'');});
      box.textContent='study '+p.status+': '+p.finished+'/'+p.total+' candidates finished\\n'+lines.join('\\n');
      var key=p.status+':'+p.finished+':'+p.measured_levels;
      if(key!==seen){location.reload();return;}
      if(p.status==='running') setTimeout(tick,2000);
    }).catch(function(){setTimeout(tick,5000);});
  }
  setTimeout(tick,2000);
})();
"""


def study_page(store: Store, ref: str) -> Response:
    model = data.load(store, ref)
    uid = model.study.uid
    script = ""
    top = ""
    if model.study.status == "running":
        p = progress(store, uid)
        seen = f"{p['status']}:{p['finished']}:{p['measured_levels']}"
        lines = "\n".join(f"{c['label']}: {c['status']}" for c in p["candidates"])
        top = (
            f'<h2>Live progress</h2><pre id="progress" data-url="/api/study/{quote(uid)}/progress" '
            f'data-seen="{h(seen)}">study running: {p["finished"]}/{p["total"]} candidates finished\n'
            f"{h(lines)}</pre>"
        )
        script = PROGRESS_JS
    links = f'<p><a href="/plan/{quote(uid)}">the plan</a> · <a href="/api/study/{quote(uid)}">JSON</a></p>'
    return _html(f"study {model.study.name}", top + study_body(model, ui=True) + links, script)


def _run(store: Store, ref: str) -> dict[str, Any]:
    """A stored run for the pages: its level digests in the time base shown everywhere (a simulator
    run's in the GPU time it simulates), and the study trial that made it, if any."""
    r = BenchRepo(store).load(ref)
    return {
        "uid": r.uid,
        "created_at": r.created_at,
        "status": r.status,
        "url": r.url,
        "model": r.model,
        "engine": r.engine,
        "workload": r.workload.model_dump(exclude_none=True),
        "warnings": r.warnings,
        "levels": [lv.summary.digest() for lv in r.levels],
        "cost_note": _cost_note(r),
        "time_base": r.clock.time_base,
        "clock_speed": r.clock.speed,
        "study": _study_of_run(store, r.uid),
    }


def _cost_note(r: Run) -> str | None:
    """Where a run's J/out tok and $/M out tok came from: the power samples integrated and the price, a
    catalog default said to be one (None: no level has either)."""
    energy = next((lv.summary.energy for lv in r.levels if lv.summary.energy is not None), None)
    cost = next((lv.summary.cost for lv in r.levels if lv.summary.cost is not None), None)
    parts = []
    if energy is not None:
        idle = f"; idle {fmt(energy.idle_w, 0)} W before the first level" if energy.idle_w is not None else ""
        parts.append(
            f"J/out tok: the GPUs' power integrated over each level ({energy.samples} samples over "
            f"{energy.gpus or '?'} GPUs{idle})"
        )
    if cost is not None:
        default = (
            ", a default: give bench --gpu-hour-usd or the study a [cost] gpu_hour_usd"
            if cost.is_default
            else ""
        )
        parts.append(
            f"$/M out tok: at ${cost.gpu_hour_usd:g} per GPU-hour × {cost.gpus} GPUs ({cost.price_source}{default})"
        )
    return "; ".join(parts) + "." if parts else None


def _study_of_run(store: Store, uid: str) -> dict[str, Any] | None:
    """The study trial that made this run."""
    found = StudyRepo(store).study_of_run(uid)
    return None if found is None else dict(found)


def _run_meta(r: dict[str, Any]) -> str:
    w = r["workload"] or {}
    return table(
        ["", ""],
        [
            ["run", f'<a href="/run/{quote(r["uid"])}">{h(r["uid"])}</a>'],
            ["created", h(r["created_at"])],
            ["status", h(r["status"])],
            ["model", h(r["model"])],
            ["engine", h(r["engine"] or "-")],
            ["url", h(r["url"])],
            ["workload", h(", ".join(f"{k}={v}" for k, v in w.items()) or "-")],
        ],
        "meta",
    )


def run_page(store: Store, ref: str) -> Response:
    r = _run(store, ref)
    warn = "".join(f'<p class="bad">{h(w)}</p>' for w in r["warnings"] or [])
    st = r["study"]
    if st:
        warn += (
            f'<p>Measured for candidate {h(st["label"])} of study <a href="/study/{quote(st["uid"])}">'
            f"{h(st['uid'])}</a>.</p>"
        )
    speed = r["clock_speed"]
    if speed != 1:
        warn += (
            f'<p class="note">Simulated GPU time: the simulator ran its clock {fmt(speed, 0)}× faster; '
            "these numbers are the simulated GPU's, as in the study and the report (the client measured "
            f"latencies ÷ {fmt(speed, 0)} and throughputs × {fmt(speed, 0)}; "
            "<code>servelab runs show --json</code> keeps them as wall_clock_summary).</p>"
        )
    note = f'<p class="note" id="cost-note">{h(r["cost_note"])}</p>' if r["cost_note"] else ""
    # the run report's chart of output tok/s per GPU against tok/s per user, its front named
    pareto = [f for f in run_figures(load_run_report(store, ref)) if f.name == "pareto"]
    body = (
        f"<h1>Run {h(r['uid'])}</h1>{_run_meta(r)}{warn}<h2>Every level</h2>{levels_table(r['uid'], r['levels'])}"
        f"{note}{figures_html(pareto)}"
        f'<p><a href="/compare?a={quote(r["uid"])}">compare with another run</a></p>'
    )
    return _html(f"run {r['uid']}", body)


def _run_picker(store: Store, a: str, b: str) -> str:
    runs = BenchRepo(store).list_runs(200)

    def select(name: str, cur: str) -> str:
        opts = "".join(
            f'<option value="{h(r.uid)}"{" selected" if r.uid == cur else ""}>{h(r.uid)} '
            f"{h(r.created_at[:19])} {h(r.model)}</option>"
            for r in runs
        )
        return f'<select name="{name}">{opts}</select>'

    return (
        f'<form method="get" action="/compare">{select("a", a)} against {select("b", b)} '
        '<button type="submit">compare</button></form>'
    )


def compare_page(store: Store, a: str, b: str) -> Response:
    picker = _run_picker(store, a, b)
    if not a or not b:
        return _html("compare runs", f"<h1>Compare two runs</h1>{picker}")
    ra, rb = _run(store, a), _run(store, b)
    by_b = {float(lv["level"]): lv for lv in rb["levels"]}
    rows = []
    for la in ra["levels"]:
        lb = by_b.get(float(la["level"]))
        if lb is None:
            continue
        for key, label, digits in (
            ("output_throughput", "output tok/s", 1),
            ("tpot_ms_p50", "TPOT p50 ms", 2),
            ("ttft_ms_p50", "TTFT p50 ms", 1),
            ("e2e_ms_p99", "E2E p99 ms", 0),
            ("j_per_output_token", "J/out tok", 3),
            ("usd_per_m_output_tokens", "$/M out tok", 3),
        ):
            va, vb = la.get(key), lb.get(key)
            if va is None and vb is None:
                continue  # neither run measured it (no power samples, no price)
            delta = f"{(vb - va) / va * 100:+.1f} %" if va and vb is not None else "-"
            rows.append([h(fmt(la["level"], 0)), h(label), h(fmt(va, digits)), h(fmt(vb, digits)), h(delta)])
    diff = (
        table(["level", "metric", h(ra["uid"]), h(rb["uid"]), "change"], rows, "diff")
        if rows
        else '<p class="note">the two runs share no load level</p>'
    )
    body = (
        f"<h1>Compare {h(ra['uid'])} and {h(rb['uid'])}</h1>{picker}<h2>At the levels both ran</h2>{diff}"
        f'<div class="cols"><div class="run-a"><h2>{h(ra["uid"])}</h2>{_run_meta(ra)}'
        f'{levels_table(ra["uid"], ra["levels"])}</div><div class="run-b"><h2>{h(rb["uid"])}</h2>{_run_meta(rb)}'
        f"{levels_table(rb['uid'], rb['levels'])}</div></div>"
    )
    return _html("compare runs", body)


def plans_page(store: Store) -> Response:
    try:
        from servelab.store.plans import PlanRepo

        plans = PlanRepo(store).plans()
    except Exception as exc:  # no plan module or tables in this servelab
        return _html("plans", f"<h1>Plans</h1><p class=note>not available: {h(exc)}</p>")
    body = "<h1>Plans</h1>" + (
        table(
            ["plan", "items", "open", "study"],
            [
                [
                    f'<a href="/plan/{quote(p.name)}">{h(p.name)}</a>',
                    str(p.items),
                    str(p.open),
                    h(p.study_uid or "-"),
                ]
                for p in plans
            ],
            "plans",
        )
        if plans
        else "<p>no plans stored yet</p>"
    )
    return _html("plans", body)


def plan_page(store: Store, name: str) -> Response:
    plan = data.load_plan(store, name)
    return _html(f"plan {name}", f"<h1>Plan {h(name)}</h1>{plan_items(plan)}")

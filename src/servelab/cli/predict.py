"""`servelab predict` and `servelab explain`: the performance model on the command line."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from servelab import arguments as A
from servelab.cli.args import option
from servelab.cli.output import emit, stdout
from servelab.config.study import Study
from servelab.errors import ConfigError
from servelab.load import in_flight_text
from servelab.model.factors import Factors, default_factors
from servelab.model.layouts import Layout
from servelab.model.predict import (
    EP_SAME,
    Setup,
    Workload,
    compare_layouts,
    evaluate,
    make_setup,
    sweep,
)
from servelab.results import Run


def resolve_factors(engine: str | None, calibration: str | None, silicon: bool = False) -> Factors:
    """Defaults for the engine (the set fitted around the measured tables with `silicon`), overridden by
    a named calibration from the store."""
    f = default_factors(engine, silicon)
    if calibration:
        from servelab.store import open_store
        from servelab.store.calibrations import get

        with open_store() as store:
            f = f.merged(get(store, calibration).factors)
    return f


SILICON_OPTION = option(A.Silicon)


def setup_options(fn: Any) -> Any:
    opts = [
        option(A.SetupModel, "model"),
        option(A.Gpu, default=None),
        option(A.NumGpus, default=None),
        option(A.Tp, default=None),
        option(A.Pp, default=1, show_default=True),
        option(A.Ep, default=1, show_default=True),
        option(A.DpAttention, "dp", default=1, show_default=True),
        option(A.Quant, default=None),
        option(A.KvDtype, default=None),
        option(A.Interconnect, default=None),
        option(A.SetupEngine, default=None),
        option(A.Calibration, default=None),
        click.option(
            "--mem-fraction",
            type=float,
            default=0.90,
            show_default=True,
            help="Share of GPU memory the engine may use.",
        ),
        SILICON_OPTION,
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def build_setup(kw: dict[str, Any]) -> Setup:
    for key, flag in (("model", "--model"), ("gpu", "--gpu"), ("num_gpus", "--num-gpus")):
        if kw[key] is None:
            raise ConfigError(
                f"{flag} is required",
                hint="give --model, --gpu and --num-gpus, or --study STUDY.toml to take them from a study",
            )
    if not 0.1 <= kw["mem_fraction"] <= 1.0:
        raise ConfigError("--mem-fraction must be between 0.1 and 1.0")
    return make_setup(
        kw["model"],
        kw["gpu"],
        kw["num_gpus"],
        tp=kw["tp"],
        pp=kw["pp"],
        ep=kw["ep"],
        dp=kw["dp"],
        quant=kw["quant"],
        kv_dtype=kw["kv_dtype"],
        interconnect=kw["interconnect"],
        factors=resolve_factors(kw["engine"], kw["calibration"], kw["silicon"]),
        mem_fraction=kw["mem_fraction"],
        engine=kw["engine"],
        silicon=kw["silicon"],
    )


def _render_prediction(d: dict[str, Any]) -> None:
    lay = d["layout"]
    title = f"{d['model']} on {d['num_gpus']}× {d['gpu']} ({d['interconnect']}), TP{lay['tp']} PP{lay['pp']} EP{lay['ep']} DP{lay['dp_attention']}"
    if d.get("replicas", 1) > 1:
        title += f" ×{d['replicas']} replicas (latencies per replica, throughput of all)"
    stdout.print(f"[bold]{title}[/bold]")
    mem = d["memory_gb_per_gpu"]
    stdout.print(
        f"memory per GPU: weights {mem['weights']:.1f} GB, KV cache {mem['kv_cache']:.1f} GB, "
        f"activations {mem['activations']:.1f} GB, reserved {mem['reserved']:.1f} GB of {mem['total']:.0f} GB"
    )
    if not d["feasible"]:
        stdout.print(f"[red]does not fit:[/red] {d['reason']}")
        return
    w = d["workload"]
    stdout.print(
        f"isl {w['isl']} osl {w['osl']} concurrency {w['concurrency']}: "
        f"TPOT [bold]{d['tpot_ms']:.2f} ms[/bold] ({d['per_user_tok_s']:.1f} tok/s per stream), "
        f"TTFT [bold]{d['ttft_ms']:.0f} ms[/bold], output [bold]{d['output_throughput']:.0f} tok/s[/bold]"
    )
    t = Table(title=f"decode step {d['decode_step_ms']:.2f} ms")
    t.add_column("component")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    for k, v in d["decode_breakdown_ms"].items():
        # `compute` is what the GEMMs and attention add beyond the reads they overlap (the roofline)
        t.add_row(
            "compute beyond reads" if k == "compute" else k,
            f"{v:.3f}",
            f"{v / d['decode_step_ms']:.0%}" if d["decode_step_ms"] else "",
        )
    stdout.print(t)
    parts = d["decode_breakdown_ms"]
    work = d.get("decode_compute_work_ms") or 0.0
    if work > parts["compute"] + 5e-4:
        stdout.print(
            f"compute: {work:.2f} ms of GEMM and attention work, of which {work - parts['compute']:.2f} ms "
            f"overlaps the {parts['weights'] + parts['kv_cache']:.2f} ms of weight and KV reads "
            f"(roofline); it adds {parts['compute']:.3f} ms"
        )
    if d["allreduces_per_step"]:
        n, each = d["allreduces_per_step"], d["allreduce_us_each"]
        lat = d["allreduce_latency_us_each"]
        stdout.print(
            f"{n} allreduces per step at {each:.1f} µs each ({lat:.1f} µs latency + {each - lat:.1f} µs "
            f"moving {_size(d['allreduce_bytes_each'])}): {n * each / 1e3:.2f} ms, "
            f"{d['allreduce_share']:.0%} of the step"
        )
    stdout.print(
        f"KV cache {d['kv_cache_tokens']:,} tokens; max concurrency at this context {d['max_concurrency']}; "
        f"single-stream {d['single_stream_tok_s']:.1f} tok/s, ceiling without communication "
        f"{d['single_stream_ceiling_tok_s']:.1f} tok/s"
    )
    measured = {k: v for k, v in (d.get("sources") or {}).items() if v != "formula"}
    for term, src in measured.items():
        stdout.print(f"{term}: {src}")
    for warning in d.get("warnings") or []:
        stdout.print(f"[yellow]warning:[/yellow] {warning}")


def _size(nbytes: float) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def _parse_levels(text: str | None) -> list[int]:
    if not text:
        return [1, 2, 4, 8, 16, 32, 64, 128, 256]
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigError(f"--sweep takes comma-separated integers, got {text!r}") from exc
    if not out or min(out) < 1:
        raise ConfigError("--sweep concurrencies must be positive integers")
    return out


@click.command()
@setup_options
@option(A.Isl, default=None)
@option(A.Osl, default=None)
@option(A.PredictConcurrency, default=None)
@option(A.StudyFile, "study_path", type=click.Path(dir_okay=False), default=None)
@click.option(
    "--mtp",
    "mtp_tokens",
    type=int,
    default=0,
    show_default=True,
    help="Speculative (MTP) draft tokens per step.",
)
@click.option(
    "--accept-len",
    type=float,
    default=None,
    help="Mean tokens accepted per step with --mtp (default 1 + 0.7×mtp).",
)
@click.option("--compare-layouts", is_flag=True, help="Rank every TP/PP/EP/DP layout for this host.")
@option(A.TpotLimit, default=None)
@option(A.TtftLimit, default=None)
@option(A.Sweep, "sweep_levels", is_flag=False, flag_value="", default=None)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def predict(**kw: Any) -> None:
    """Predict TTFT, TPOT, throughput and memory, and show where the decode step goes."""
    study = _apply_study(kw)
    setup = build_setup(kw)
    mtp = kw["mtp_tokens"]
    accept = kw["accept_len"] if kw["accept_len"] is not None else 1.0 + 0.7 * mtp
    conc_source = "--concurrency"
    isl = 1024 if kw["isl"] is None else kw["isl"]
    osl = 1024 if kw["osl"] is None else kw["osl"]
    from_study = study is not None and kw.pop("_conc_from_study", False)
    if from_study and kw["concurrency"] is None:
        assert study is not None
        kw["concurrency"] = _study_concurrency(kw, study, setup, isl, osl)
    if kw["concurrency"] is None:
        kw["concurrency"], conc_source = 1, "default"
    elif from_study:
        conc_source = "study"
    load = kw["_load"].describe() if from_study else None
    wl = Workload(isl, osl, kw["concurrency"], mtp, accept)
    if kw["compare_layouts"]:
        results = compare_layouts(setup, wl, kw["tpot_limit"], kw["ttft_limit"])
        data = {
            "model": setup.arch.name,
            "gpu": setup.host.gpu.name,
            "num_gpus": setup.host.num_gpus,
            "workload": {"isl": wl.isl, "osl": wl.osl, "concurrency": wl.concurrency},
            "concurrency_source": conc_source,
            **({"load": load} if load is not None else {}),
            "study": study.study.name if study is not None else None,
            "ep_note": EP_SAME if any(r.same_as for r in results) else None,
            "layouts": [
                {
                    "label": r.label,
                    "rank": r.rank,
                    "layout": r.layout,
                    "verdict": r.verdict,
                    "same_as": r.same_as,
                    "study_candidates": _study_candidates(study, r.layout, r.same_as),
                    "prediction": r.prediction.to_dict(),
                }
                for r in results
            ],
        }
        emit(data, kw["as_json"], _render_compare)
        return
    if kw["sweep_levels"] is not None:
        preds = sweep(setup, wl, _parse_levels(kw["sweep_levels"]))
        data = {
            "model": setup.arch.name,
            "layout": preds[0].layout,
            "points": [
                {
                    "concurrency": p.workload["concurrency"],
                    "feasible": p.feasible,
                    "reason": p.reason,
                    "tpot_ms": p.tpot_ms,
                    "ttft_ms": p.ttft_ms,
                    "output_throughput": p.output_throughput,
                    "per_user_tok_s": p.per_user_tok_s,
                }
                for p in preds
            ],
        }
        emit(data, kw["as_json"], _render_sweep)
        return
    out = evaluate(setup, wl).to_dict()
    if load is not None:  # the study's main level, in its own unit, and the concurrency it stands for
        out |= {"concurrency_source": conc_source, "load": load}
    emit(out, kw["as_json"], _render_prediction)


_CONC_SOURCE = {
    "--concurrency": "--concurrency",
    "study": "the study's main level",
    "default": "the default: one stream",
}


def _apply_study(kw: dict[str, Any]) -> Study | None:
    """Fill what the flags left out from `--study`: model, GPU, GPU count, engine, lengths, and the
    concurrency of the study's main level (the level `tune` predicts and deployment checks use)."""
    if not kw.get("study_path"):
        return None
    from servelab.config.loading import load_study

    study = load_study(kw["study_path"])
    fills = {
        "model": study.model.config or study.model.path,
        "gpu": study.host.gpu,
        "num_gpus": study.host.num_gpus,
        "engine": study.engine.options.get("personality", study.engine.name),
        "isl": study.workload.input_len,
        "osl": study.workload.output_len,
    }
    for key, value in fills.items():
        if kw.get(key) is None:
            kw[key] = value
    if kw["gpu"] is None:
        raise ConfigError(
            f"study {study.study.name} names no GPU (host.gpu)", hint="pass --gpu and --num-gpus"
        )
    if kw["concurrency"] is None:
        # the study's main level, in its own kind: a closed loop's is a concurrency; an open loop's (a rate,
        # a trace's time scale) becomes the model's concurrency once the setup is built (predict())
        kind = study.load_kind(read_trace=True)
        kw["_load"] = kind
        if kind.closed_loop:
            kw["concurrency"] = int(kind.main)
        kw["_conc_from_study"] = True
    return study


def _study_concurrency(kw: dict[str, Any], study: Study, setup: Any, isl: int, osl: int) -> int:
    """An open-loop study's main level as the concurrency the model predicts at (servelab.load)."""
    kind = kw["_load"]

    def rate_at(concurrency: int) -> float | None:
        p = evaluate(setup, Workload(isl, osl, concurrency))
        return float(p.output_throughput) / osl if p.feasible and p.output_throughput else None

    at = kind.as_concurrency_for_model(kind.main, rate_at, study.sim_speed())
    if at.concurrency is None:
        raise ConfigError(
            f"study {study.study.name}: {at.reason}",
            hint="pass --concurrency N (the requests in flight at that load)",
        )
    return int(at.concurrency)


def _study_candidates(study: Study | None, layout: dict[str, int], same_as: list[str]) -> list[str]:
    """Names of the study's candidates that run this row's layout (or one folded into it)."""
    if study is None:
        return []
    labels = {
        Layout(layout["tp"], layout["pp"], layout["ep"], layout["dp_attention"]).label,
        *(s.split(" ×")[0] for s in same_as),
    }
    return [c.label() for c in study.candidates if Layout(c.tp, c.pp, c.ep or 1, c.dp or 1).label in labels]


def _render_compare(d: dict[str, Any]) -> None:
    w = d["workload"]
    t = Table(
        title=f"{d['model']} on {d['num_gpus']}× {d['gpu']}: layouts by output throughput at concurrency "
        f"{w['concurrency']} ({_CONC_SOURCE[d['concurrency_source']]}), isl {w['isl']} osl {w['osl']}"
    )
    cols = ["rank", "layout", "tok/s", "TPOT ms", "TTFT ms", "why"]
    if d.get("study"):
        cols.insert(2, f"in {d['study']}")
    for col in cols:
        t.add_column(col)
    for r in d["layouts"]:
        p = r["prediction"]
        label = r["label"]
        if r["same_as"]:
            label += " (= " + ", ".join(r["same_as"]) + ")"
        row = [str(r["rank"] or "-"), label]
        if d.get("study"):
            row.append(", ".join(r["study_candidates"]))
        t.add_row(
            *row,
            f"{p['output_throughput']:.0f}" if p["feasible"] else "-",
            f"{p['tpot_ms']:.2f}" if p["feasible"] else "-",
            f"{p['ttft_ms']:.0f}" if p["feasible"] else "-",
            r["verdict"],
        )
    stdout.print(t)
    if d.get("ep_note"):
        stdout.print(f"(= ...): layouts that predict the same, one row: {d['ep_note']}")
    if d["concurrency_source"] == "default":
        stdout.print(
            "[yellow]ranked at concurrency 1 (one stream);[/yellow] the order changes with load: pass "
            "--concurrency N or --study STUDY.toml to rank at yours"
        )


def _render_sweep(d: dict[str, Any]) -> None:
    t = Table(title=f"{d['model']}: throughput and TPOT against concurrency")
    for col in ("concurrency", "tok/s", "TPOT ms", "TTFT ms", "tok/s per user"):
        t.add_column(col, justify="right")
    for p in d["points"]:
        if not p["feasible"]:
            t.add_row(str(p["concurrency"]), "-", "-", "-", p["reason"] or "")
            continue
        t.add_row(
            str(p["concurrency"]),
            f"{p['output_throughput']:.0f}",
            f"{p['tpot_ms']:.2f}",
            f"{p['ttft_ms']:.0f}",
            f"{p['per_user_tok_s']:.1f}",
        )
    stdout.print(t)


def load_run(ref: str) -> Run:
    """A bench run from the store: uid, unique uid prefix, numeric id or `last`."""
    from servelab.store import open_store
    from servelab.store.bench import BenchRepo

    with open_store() as store:
        return BenchRepo(store).load(ref)


@click.command()
@option(A.BenchRun, default="last")
@option(A.SetupModel, "model", default=None)
@option(A.Gpu, default=None)
@option(A.NumGpus, default=None)
@option(A.Tp, default=None)
@option(A.Pp, default=None)
@option(A.Ep, default=None)
@option(A.DpAttention, "dp", default=None)
@option(A.Quant, default=None)
@option(A.KvDtype, default=None)
@option(A.Interconnect, default=None)
@option(A.SetupEngine, default=None)
@option(A.Calibration, default=None)
@SILICON_OPTION
@click.option(
    "--isl", type=int, default=1024, show_default=True, help="Used when the run does not record lengths."
)
@option(A.ExplainOsl, default=1024, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def explain(run: str, **kw: Any) -> None:
    """Set a measured bench RUN (uid, id or `last`) beside the prediction, level by level, and name the
    largest gap. Host, layout and formats come from what the run recorded; the flags override them."""
    from servelab.model.explain import explain_levels

    data = load_run(run)
    ctx = data.context
    host, layout = ctx.host, ctx.layout
    gpu = kw["gpu"] or host.gpu
    model = kw["model"] or ctx.model_config_ref or data.model
    if not gpu:
        raise ConfigError(
            f"run {data.uid} does not record its GPU",
            hint="pass --gpu, --num-gpus and the layout (--tp/--pp/--ep) it ran with, or record them when "
            "benchmarking (`servelab bench --gpu ... --tp ...`)",
        )
    tp = kw["tp"] or layout.tp
    pp = kw["pp"] or layout.pp or 1
    dp = kw["dp"] or layout.dp or 1
    num = int(kw["num_gpus"] or host.num_gpus or (tp or 1))
    if tp:  # a bench run measures one server, even on a host with GPUs to spare (no replicas)
        num = min(num, int(tp) * int(pp) * int(dp))
    setup = make_setup(
        model,
        gpu,
        num,
        tp=tp,
        pp=pp,
        ep=kw["ep"] or layout.ep or 1,
        dp=dp,
        quant=kw["quant"] or ctx.quant,
        kv_dtype=kw["kv_dtype"] or ctx.kv_dtype,
        interconnect=kw["interconnect"] or host.interconnect,
        factors=resolve_factors(
            kw["engine"] or ctx.personality or data.engine, kw["calibration"], kw["silicon"]
        ),
        engine=kw["engine"] or ctx.personality or data.engine,
        silicon=kw["silicon"],
    )
    result = explain_levels(setup, [lv.summary for lv in data.levels], kw["isl"], kw["osl"])
    out = {
        "run": data.uid,
        "time_base": data.clock.time_base,
        "model": setup.arch.name,
        "gpu": setup.host.gpu.name,
        "num_gpus": setup.host.num_gpus,
        "layout": {
            "tp": setup.layout.tp,
            "pp": setup.layout.pp,
            "ep": setup.layout.ep,
            "dp_attention": setup.layout.dp,
        },
        "levels": [lv.__dict__ for lv in result.levels],
        "largest_gap": result.largest_gap,
    }
    emit(out, kw["as_json"], _render_explain)


def _render_explain(d: dict[str, Any]) -> None:
    t = Table(title=f"run {d['run']}: measured vs predicted ({d['model']} on {d['num_gpus']}× {d['gpu']})")
    for col in (
        "conc.",
        "TPOT meas",
        "TPOT pred",
        "TTFT meas",
        "TTFT pred",
        "tok/s meas",
        "tok/s pred",
        "gap",
    ):
        t.add_column(col)

    def fmt(v: Any, nd: int = 1) -> str:
        return "-" if v is None else f"{v:.{nd}f}"

    for lv in d["levels"]:
        m, p = lv["measured"], lv["predicted"]
        t.add_row(
            in_flight_text(lv.get("mode"), lv.get("level"), lv["concurrency"]),
            fmt(m["tpot_ms"], 2),
            fmt(p["tpot_ms"], 2),
            fmt(m["ttft_ms"], 0),
            fmt(p["ttft_ms"], 0),
            fmt(m["output_throughput"], 0),
            fmt(p["output_throughput"], 0),
            lv["largest_gap"],
        )
    stdout.print(t)
    if d["largest_gap"]:
        stdout.print(f"largest gap {d['largest_gap']}")
    for lv in d["levels"]:
        for term, src in (lv.get("sources") or {}).items():
            if src != "formula":
                stdout.print(f"c={lv['concurrency']} {term}: {src}")

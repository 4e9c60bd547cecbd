"""`servelab calibrate`: fit efficiency factors from measurements, or measure this host."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

import click
import orjson
from rich.table import Table

from servelab.cli.output import emit, stderr, stdout
from servelab.errors import ConfigError, HostError
from servelab.model.calibrate import MEASURED, evaluate_split, factors_from_probe, fit_observations
from servelab.model.factors import default_factors
from servelab.model.observations import observations_from_csv, observations_from_runs
from servelab.store import calibrations as repo
from servelab.store import open_store


@click.group()
def calibrate() -> None:
    """Fit or measure the performance model's efficiency factors, stored as named calibrations."""


def _render_fit(d: dict[str, Any]) -> None:
    rep = d["report"]
    stdout.print(f"calibration [bold]{d['name']}[/bold] saved ({rep.get('rows', 0)} measurements)")
    if rep.get("mode") == "few-observations":
        fitted = ", ".join(f"{n} = {d['factors'][n]:.4g}" for n in rep["fitted"])
        stdout.print(
            f"few measurements (levels {rep['levels']}): fitted only {fitted}; the rest are defaults"
        )
    for split, rows in d["report"].get("tables", {}).items():
        t = Table(title=f"{split}: MAPE per GPU and engine")
        for c in ("gpu", "engine", "rows", "TPOT %", "TTFT %"):
            t.add_column(c)
        for r in rows:
            t.add_row(r["system"], r["engine"], str(r["n"]), f"{r['tpot_mape']:.1f}", f"{r['ttft_mape']:.1f}")
        stdout.print(t)


# The published measurements (data/README.md says where they come from), shipped as package data.
PUBLISHED_CSV = "serving_measurements.csv"


def _resolve_csv(csv_path: str | None) -> str | None:
    """A path as given; the bare name PUBLISHED_CSV, when no such file is in the working directory, is the
    packaged copy."""
    if csv_path != PUBLISHED_CSV or Path(csv_path).exists():
        return csv_path
    return str(resources.files("servelab").joinpath("data", PUBLISHED_CSV))


@calibrate.command("fit")
@click.option("--name", required=True, help="Name to store the calibration under.")
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="A CSV of measurements (serving_measurements.csv's columns); the bare name "
    f"{PUBLISHED_CSV} names the published measurements shipped with servelab unless the file is here.",
)
@click.option(
    "--run",
    "runs",
    multiple=True,
    help="Bench run(s) from the store (uid, id or `last`; repeatable): each must record its host and layout.",
)
@click.option("--engine", default=None, help="Keep only rows of this engine.")
@click.option(
    "--holdout", type=float, default=0.3, show_default=True, help="Share of rows held out for the report."
)
@click.option(
    "--host-calibration",
    default=None,
    help="Start from a `calibrate host` measurement (memory/bus bandwidth, allreduce latency) of NAME.",
)
@click.option("--json", "as_json", is_flag=True)
def fit_cmd(
    name: str,
    csv_path: str | None,
    runs: tuple[str, ...],
    engine: str | None,
    holdout: float,
    host_calibration: str | None,
    as_json: bool,
) -> None:
    """Fit factors from a CSV of measurements or from bench runs, and save them as NAME.

    Fewer than 30 measurements (a few levels of a bench run) fit only the factors they identify: per
    TPOT and TTFT a level lever and, with two or more concurrency levels, a slope lever; the report's
    `fitted` names them."""
    from servelab.cli.predict import load_run

    if not csv_path and not runs:
        raise ConfigError(
            "give --csv PATH or --run UID", hint=f"e.g. --csv {PUBLISHED_CSV} (the published measurements)"
        )
    csv_path = _resolve_csv(csv_path)
    obs = observations_from_csv(csv_path) if csv_path else []
    if runs:
        loaded = [load_run(r) for r in runs]
        from_runs = observations_from_runs(loaded)
        if not from_runs:
            missing = [r.uid for r in loaded if not r.context.host.gpu]
            raise ConfigError(
                "no usable measurements in "
                + ", ".join(r.uid for r in loaded)
                + (f" (no GPU recorded: {', '.join(missing)})" if missing else " (no level with a TPOT)"),
                hint="record the host when benchmarking: `servelab bench --gpu KIND --num-gpus N --tp T ...` "
                "(the simulator and studies record it themselves)",
            )
        obs += from_runs
    if engine:
        obs = [o for o in obs if o.engine == engine]
    if not obs:
        raise ConfigError(
            "no usable measurements", hint="runs need config keys host.gpu and layout to be fitted"
        )
    # start from the engine's defaults: the one named, or the one every measurement ran on
    seen = {o.engine for o in obs if o.engine}
    start_engine = engine or (next(iter(seen)) if len(seen) == 1 else None)
    start = default_factors(start_engine)
    if host_calibration:
        with open_store() as store:
            host_cal = repo.get(store, host_calibration)
        start = start.merged({k: v for k, v in host_cal.factors.items() if k in MEASURED})
    glob, engines, report = fit_observations(obs, start, holdout=holdout if len(obs) >= 20 else 0.0)
    tables = evaluate_split(obs, glob, engines, holdout if len(obs) >= 20 else 0.0)
    report["start"] = {"engine": start_engine, "host_calibration": host_calibration}
    factors: dict[str, Any] = {k: v for k, v in asdict(glob).items() if isinstance(v, float)}
    # host measurements the fit started from travel with it (None: the catalog's numbers)
    factors.update({k: getattr(glob, k) for k in MEASURED if getattr(glob, k)})
    if engine and engine in engines:
        factors.update(engines[engine])
    report["tables"] = {k: [asdict(r) for r in v] for k, v in tables.items()}
    report["engines"] = {e: dict(fs) for e, fs in engines.items()}
    with open_store() as store:
        cal = repo.save(store, name, "fit", csv_path or ",".join(runs), factors, report)
    emit({"name": cal.name, "kind": cal.kind, "factors": cal.factors, "report": report}, as_json, _render_fit)


def _probe_script() -> Path:
    return Path(str(resources.files("servelab.host").joinpath("commprobe.py")))


def _has_torch(python: str) -> bool:
    try:
        r = subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@calibrate.command("host")
@click.option("--name", required=True, help="Name to store the calibration under.")
@click.option("--gpu", default=None, help="The GPU kind these numbers belong to (catalog name).")
@click.option("--python", "python", default=None, help="Interpreter with torch (default: this one).")
@click.option(
    "--ranks", type=int, default=0, help="Processes/GPUs in the allreduce (default: all GPUs; 2 on CPU)."
)
@click.option(
    "--backend", type=click.Choice(["nccl", "gloo"]), default=None, help="Default: nccl with GPUs, else gloo."
)
@click.option("--iters", type=int, default=50, show_default=True)
@click.option("--timeout", type=float, default=600, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def host_cmd(
    name: str,
    gpu: str | None,
    python: str | None,
    ranks: int,
    backend: str | None,
    iters: int,
    timeout: float,
    as_json: bool,
) -> None:
    """Measure allreduce latency/bandwidth and memory bandwidth here; save them as NAME."""
    candidates = [python] if python else [sys.executable]
    interp = next((p for p in candidates if p and _has_torch(p)), None)
    if interp is None:
        raise HostError(
            f"torch is not importable by {candidates[0]}",
            hint="install torch in this environment, or pass --python /path/to/python of an environment that has it",
        )
    cmd = [interp, str(_probe_script()), "--iters", str(iters)]
    if ranks:
        cmd += ["--ranks", str(ranks)]
    if backend:
        cmd += ["--backend", backend]
    stderr.print(f"measuring with {interp} ...")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise HostError(f"the host probe did not finish within {timeout:.0f} s") from exc
    try:
        probe = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise HostError(f"the host probe failed (exit {r.returncode}): {r.stderr.strip()[-400:]}") from exc
    if "error" in probe:
        raise HostError(probe["error"])
    factors = factors_from_probe(probe)
    nccl_tests = shutil.which("all_reduce_perf")
    report = {"probe": probe, "all_reduce_perf": nccl_tests}
    with open_store() as store:
        cal = repo.save(
            store, name, "host", f"{probe.get('backend')}:{probe.get('device')}", factors, report, gpu
        )
    emit(
        {"name": cal.name, "kind": cal.kind, "gpu": cal.gpu, "factors": cal.factors, "report": report},
        as_json,
        _render_host,
    )


def _render_host(d: dict[str, Any]) -> None:
    p = d["report"]["probe"]
    stdout.print(
        f"calibration [bold]{d['name']}[/bold]: {p['backend']} over {p['ranks']} ranks on {p['device']}"
    )
    t = Table(title="allreduce")
    t.add_column("bytes", justify="right")
    t.add_column("µs", justify="right")
    for pt in p["allreduce"]:
        t.add_row(f"{pt['bytes']:,}", f"{pt['us']:.1f}")
    stdout.print(t)
    f = d["factors"]
    stdout.print(
        f"memory bandwidth {f.get('mem_bw_gbs', 0):.1f} GB/s ({p.get('mem_bw_method', 'device copy')}), "
        f"bus bandwidth {f.get('bus_gbs', 0):.2f} GB/s"
    )
    if "matmul_tflops_fp32" in p:
        stdout.print(
            f"CPU matmul {p['matmul_tflops_fp32'] * 1e3:.1f} GFLOPS FP32, {p['matmul_tflops_bf16'] * 1e3:.1f} "
            f"GFLOPS BF16 on {p.get('cpu_threads')} threads ({p.get('cpu_model') or 'cpu'})"
        )


@calibrate.command("list")
@click.option("--json", "as_json", is_flag=True)
def list_cmd(as_json: bool) -> None:
    """List stored calibrations."""
    with open_store() as store:
        cals = [asdict(c) for c in repo.list_all(store)]

    def render(rows: list[dict[str, Any]]) -> None:
        t = Table(title="calibrations")
        for col in ("name", "kind", "gpu", "source", "created"):
            t.add_column(col)
        for c in rows:
            t.add_row(c["name"], c["kind"], c["gpu"] or "", c["source"], c["created_at"])
        stdout.print(t)

    emit(cals, as_json, render)


@calibrate.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
def show_cmd(name: str, as_json: bool) -> None:
    """Show one calibration's factors."""
    with open_store() as store:
        cal = asdict(repo.get(store, name))
    emit(cal, as_json, lambda d: stdout.print_json(orjson.dumps(d["factors"]).decode()))

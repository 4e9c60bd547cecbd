"""`servelab bench`: load levels against an OpenAI-compatible server; results stored and rendered."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import click
import orjson
from pydantic import ValidationError
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from servelab import arguments as A
from servelab.bench import capacity as C
from servelab.bench import export as request_export
from servelab.bench.config import IDLE_TIMEOUT_S, BenchConfig
from servelab.bench.runner import BenchResult, find_capacity, run_bench
from servelab.bench.traces import formats as trace_formats
from servelab.cli import aio
from servelab.cli.args import option
from servelab.cli.benchviews import render_capacity, render_sessions
from servelab.cli.costs import price_options, render_costs
from servelab.cli.output import emit, printable, progress_enabled, stderr, stdout, warn
from servelab.errors import ConfigError, Interrupted, ServelabError, ServerError
from servelab.events import BenchEvent, LevelFinished, LevelStarted, RequestDone, RunFinished, RunStarted
from servelab.results import CapacityResult, Host, Layout, LevelSummary, RunContext, SessionsSummary
from servelab.store import open_store
from servelab.store.bench import BenchRepo

WorkloadKind = Literal["synthetic", "sharegpt", "shared-prefix", "sessions"]  # BenchConfig.workload


def parse_levels(text: str | None, name: str) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"{name} takes a comma-separated list of numbers, got {text!r}", hint=f"e.g. {name} 1,8,64"
        ) from None
    if not values:
        raise ConfigError(f"{name} is empty", hint=f"e.g. {name} 1,8,64")
    return values


# BenchConfig's fields by the option that sets them, so an error names what the user typed.
_OPTION = {
    "timeout_s": "--timeout",
    "think_time_s": "--think-time",
    "idle_timeout_s": "--idle-timeout",
    "duration_s": "--duration",
    "scrape_interval_s": "--scrape-interval",
    "exact_output_len": "--no-exact-length",
}


def config_error(exc: ValidationError, mode: str = "concurrency") -> ConfigError:
    parts = []
    for err in exc.errors():
        loc = [str(x) for x in err["loc"]]
        if loc and loc[0] == "levels":
            name = f"--{mode}" + (f" (value {int(loc[1]) + 1})" if len(loc) > 1 else "")
        elif loc:
            name = _OPTION.get(loc[0], "--" + loc[0].replace("_", "-"))
        else:
            name = "options"
        parts.append(f"{name}: {err['msg'].removeprefix('Value error, ')}")
    return ConfigError(
        "invalid benchmark options: " + "; ".join(parts), hint="`servelab bench --help` lists the options."
    )


def check_export_dir(export: str) -> Path:
    """`--export-vllm` is written after the last level: find out now, not hours later, that it cannot be."""
    out = Path(export)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".servelab-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--export-vllm {export} is not a writable directory: {exc.strerror or exc}",
            hint="Give a directory you can write to (it is created if missing).",
        ) from None
    return out


class _ProgressObserver:
    """Drives a rich progress bar on stderr (only when stderr is a terminal)."""

    def __init__(self) -> None:
        self.progress: Progress | None = None
        self.task: Any = None

    def __call__(self, event: BenchEvent) -> None:
        match event:
            case RunStarted():
                for w in event.warnings:
                    warn(w)
                if progress_enabled():
                    self.progress = Progress(
                        TextColumn("{task.description}"),
                        BarColumn(),
                        MofNCompleteColumn(),
                        TimeElapsedColumn(),
                        console=stderr,
                        transient=True,
                    )
                    self.progress.start()
            case LevelStarted() if self.progress is not None:
                self.task = self.progress.add_task(f"level {event.label}", total=event.num_requests)
            case RequestDone() if self.progress is not None and self.task is not None:
                self.progress.update(self.task, completed=event.done)
            case LevelFinished():
                if self.progress is not None and self.task is not None:
                    self.progress.remove_task(self.task)
                for note in ws if isinstance(ws := event.client.get("warnings", []), list) else []:
                    warn(f"[{event.label}] {note}")
            case RunFinished() if self.progress is not None:
                self.progress.stop()


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def render(data: dict[str, Any]) -> None:
    table = Table(
        title=f"servelab bench {data['run']} · {data['model']} · {data['status']}", title_justify="left"
    )
    cols = [
        "level",
        "ok/fail",
        "req/s",
        "out tok/s",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "ITL p50",
        "E2E p50",
    ]
    has_slo = any(lv["summary"].get("slo") for lv in data["levels"])
    if has_slo:
        cols.append("goodput tok/s")
    for c in cols:
        table.add_column(c, justify="right" if c != "level" else "left")
    for lv in data["levels"]:
        s = lv["summary"]
        sat = lv.get("saturation") or {}
        row = [
            lv["label"]
            + (" (saturated)" if sat.get("server_saturated") or sat.get("client_saturated") else ""),
            f"{s['completed']}/{s['failed']}",
            _fmt(s["request_throughput"], 2),
            _fmt(s["output_throughput"]),
            _fmt(s["ttft_ms"]["p50"]),
            _fmt(s["ttft_ms"]["p99"]),
            _fmt(s["tpot_ms"]["p50"], 2),
            _fmt(s["tpot_ms"]["p99"], 2),
            _fmt(s["itl_ms"]["p50"], 2),
            _fmt(s["e2e_ms"]["p50"]),
        ]
        if has_slo:
            row.append(_fmt(s.get("goodput"), 2))
        table.add_row(*row)
    stdout.print(table)
    stdout.print("latencies in ms; TTFT/E2E measured from each request's scheduled send time")
    time_base = data.get("time_base", "wall clock")
    if time_base != "wall clock":
        speed = data["context"]["clock"]["speed"]
        stdout.print(
            f"[cyan]{time_base}[/cyan]: the simulator's clock ran {speed:g}× faster; figures are the GPU's "
            "(`--json` keeps the client's own as wall_clock_summary)"
        )
    ctx = data.get("context") or {}
    host, layout = ctx.get("host") or {}, ctx.get("layout") or {}
    if host.get("gpu") or layout.get("tp"):
        lay = "+".join(f"{k.upper()}{v}" for k, v in layout.items() if v and (k == "tp" or v > 1))
        stdout.print(
            f"on {host.get('num_gpus') or '?'}× {host.get('gpu') or '?'}"
            + (f" ({lay})" if lay else "")
            + (f", from the {host['source']}" if host.get("source") else ""),
            markup=False,
        )
    for lv in data["levels"]:
        s = lv["summary"]
        if s["failed"]:
            kinds = ", ".join(f"{k}×{n}" for k, n in s["errors"].items())
            stdout.print(f"[red]{lv['label']}: {s['failure_rate']:.1%} failed ({kinds})[/red]")
            for k, ex in s["error_examples"].items():
                stdout.print(f"  {k}: {printable(ex[:160])}", markup=False)
        if s["length_mismatches"]:
            stdout.print(
                f"[yellow]{lv['label']}: {s['length_mismatches']} requests returned a different number "
                f"of tokens than asked[/yellow]"
            )
        sm = lv["server_metrics"]
        if sm.get("available") and sm.get("deltas"):
            d = sm["deltas"]
            parts = [f"{k}={v:,.0f}" for k, v in d.items()]
            parts += [f"mean {k.upper()} {v:,.1f} ms" for k, v in sm.get("server_mean_ms", {}).items()]
            stdout.print(f"{lv['label']} server: " + ", ".join(parts), markup=False)
    render_costs([(lv["label"], LevelSummary.model_validate(lv["summary"])) for lv in data["levels"]])
    for lv in data["levels"]:
        if lv["summary"].get("sessions"):
            render_sessions(lv["label"], SessionsSummary.model_validate(lv["summary"]["sessions"]))
    for w in data["warnings"]:
        stdout.print(f"[yellow]warning:[/yellow] {escape(printable(w))}")
    if data.get("capacity"):
        render_capacity(CapacityResult.model_validate(data["capacity"]))
    stdout.print(f"stored as run {data['run']} (workload hash {data['workload'].get('dataset_hash')})")


def _search_options(
    opts: dict[str, Any], conc: list[float] | None, rate: list[float] | None
) -> tuple[C.SearchSpec, C.CapacitySLO] | None:
    """`--find-capacity --slo .. [--by] [--resolution] [--max-probes]` (None without --find-capacity).
    Without a sizing option a probe is 5 requests per stream (by concurrency) or 20 s (by rate)."""
    find, by = opts.pop("find_capacity"), opts.pop("by")
    resolution, max_probes = opts.pop("resolution"), opts.pop("max_probes")
    if not find:
        if by is not None:
            raise ConfigError(
                "--by is an option of --find-capacity", hint="add --find-capacity, or drop --by"
            )
        return None
    if conc is not None and rate is not None:
        raise ConfigError("give at most one of --concurrency or --rate with --find-capacity")
    named = "concurrency" if conc is not None else "rate" if rate is not None else None
    if by is not None and named is not None and by != named:
        raise ConfigError(f"--by {by} contradicts --{named}", hint=f"--{by} VALUE gives the first probe")
    chosen: Literal["concurrency", "rate"] = "rate" if (by or named) == "rate" else "concurrency"
    first = conc or rate
    if first is not None and len(first) != 1:
        raise ConfigError(
            f"--find-capacity takes one --{chosen} value (the first probe), got {len(first)}",
            hint="the search chooses the levels itself",
        )
    text = str(resolution).strip()
    try:
        res = float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise ConfigError(
            f"--resolution {text!r} is not a number or a percentage", hint="e.g. --resolution 5%"
        ) from None
    if not opts["num_requests"] and not opts["duration"] and not opts["requests_per_stream"]:
        if chosen == "concurrency":
            opts["requests_per_stream"] = 5
        else:
            opts["duration"] = 20.0
    try:
        slo = C.parse_capacity_slo(opts["slo"])
    except ValueError as exc:
        raise ConfigError(f"--slo: {exc}", hint="e.g. --slo 'p99_ttft_ms<=2000,p99_tpot_ms<=50'") from None
    try:
        spec = C.SearchSpec(
            by=chosen, start=first[0] if first else 1.0, resolution=res, max_probes=max_probes
        )
    except ValueError as exc:
        raise ConfigError(str(exc), hint='docs/cli/bench.md, "Capacity search", gives the options') from None
    return spec, slo


def result_json(res: BenchResult) -> dict[str, Any]:
    """The stable `--json` document: the stored run as `servelab runs show --json` prints it."""
    with open_store() as store:
        return BenchRepo(store).load(res.uid).to_json()


def export_requests(run: str, path: Path, fmt: str) -> None:
    """The stored requests of `run` into `path` (checked by `export.check_path` before measuring)."""
    with open_store() as store:
        repo = BenchRepo(store)
        try:
            request_export.write(path, fmt, repo.load(run), repo)
        except ServelabError as exc:
            exc.hint = f"the run is stored: `servelab runs show {run} --export-requests FILE` writes it again"
            raise


def context_from_flags(opts: dict[str, Any]) -> RunContext:
    """`--gpu/--num-gpus/--interconnect/--tp/--pp/--ep/--dp-attention/--model-config/--quant/--kv-dtype`:
    what the server cannot tell about itself. Each given flag overrides what the server reports."""
    host = {k: opts.pop(k) for k in ("gpu", "num_gpus", "interconnect")}
    layout = {"tp": opts.pop("tp"), "pp": opts.pop("pp"), "ep": opts.pop("ep"), "dp": opts.pop("dp")}
    given = any(v is not None for v in (*host.values(), *layout.values()))
    return RunContext(
        model_config=opts.pop("model_config"),
        quant=opts.pop("quant"),
        kv_dtype=opts.pop("kv_dtype"),
        host=Host(**host, source="flags" if given else None),
        layout=Layout(**layout),
    )


async def _main(
    cfg: BenchConfig, observer: _ProgressObserver, search: tuple[C.SearchSpec, C.CapacitySLO] | None = None
) -> BenchResult:
    with open_store() as store:
        try:
            if search is not None:
                return (await find_capacity(cfg, store, *search, observer))[0]
            return await run_bench(cfg, store, observer)
        except asyncio.CancelledError:
            raise Interrupted(
                "benchmark interrupted before its first level started; nothing was measured"
            ) from None


def _run(
    cfg: BenchConfig, observer: _ProgressObserver, search: tuple[C.SearchSpec, C.CapacitySLO] | None = None
) -> BenchResult:
    return aio.run(_main(cfg, observer, search))


@click.command()
@option(A.ServerUrl, required=True)
@option(A.ServedModel, required=True)
@option(A.Api, default="completions", show_default=True)
@option(A.Concurrency, "concurrency")
@click.option("--rate", "rate", help="Open-loop request rates per second, comma-separated, e.g. 2,4,8.")
@click.option("--max-concurrency", type=int, help="Cap on in-flight requests for --rate levels.")
@click.option(
    "--arrival", type=click.Choice(["poisson", "gamma", "constant"]), default="poisson", show_default=True
)
@click.option(
    "--burstiness", type=float, default=1.0, show_default=True, help="Gamma shape for --arrival gamma."
)
@option(A.NumRequests)
@option(A.Duration)
@click.option(
    "--requests-per-stream",
    type=int,
    help="Per level, this many requests per concurrent stream (at least 8): c=1 → 8, c=64 → 64×N.",
)
@click.option(
    "--workload",
    type=click.Choice(["synthetic", "sharegpt", "shared-prefix", "sessions"]),
    default=None,
    help="Default: sharegpt when --dataset is given, sessions with --sessions, else synthetic.",
)
@click.option(
    "--sessions",
    "sessions",
    help="Multi-turn sessions at once, comma-separated levels (like --concurrency; --workload sessions).",
)
@click.option("--turns", type=int, default=8, show_default=True, help="Turns per session (sessions).")
@click.option(
    "--think-time",
    "think_time_s",
    type=float,
    default=3.0,
    show_default=True,
    help="Mean think time between a session's turns, seconds (sessions).",
)
@click.option(
    "--think-dist",
    type=click.Choice(["exponential", "constant"]),
    default="exponential",
    show_default=True,
    help="Think-time distribution (seeded).",
)
@click.option(
    "--system-prompt-len",
    type=int,
    default=2048,
    show_default=True,
    help="Tokens of the system prompt every session shares (0: none).",
)
@click.option(
    "--tool-turns",
    type=float,
    default=0.5,
    show_default=True,
    help="Fraction of later turns that carry a tool result instead of a user message.",
)
@click.option(
    "--tool-result-len", type=int, default=1024, show_default=True, help="Tokens of a tool result (sessions)."
)
@option(A.InputLen, default=256, show_default=True)
@option(A.OutputLen, default=128, show_default=True)
@click.option(
    "--range-ratio",
    type=float,
    default=0.0,
    show_default=True,
    help="Spread lengths uniformly by ±this fraction.",
)
@click.option("--dataset", type=click.Path(dir_okay=False), help="ShareGPT-format JSON file.")
@click.option(
    "--num-prefixes", type=int, default=4, show_default=True, help="shared-prefix: distinct prefixes."
)
@click.option(
    "--prefix-len", type=int, default=512, show_default=True, help="shared-prefix: tokens per prefix."
)
@click.option(
    "--tokenizer", type=click.Path(), help="Local tokenizer (model dir or tokenizer.json) to count tokens."
)
@click.option(
    "--trace",
    type=click.Path(dir_okay=False),
    help="Replay this request trace at its timestamps (instead of --concurrency/--rate).",
)
@click.option(
    "--trace-format",
    type=click.Choice(sorted(trace_formats())),
    help="The trace's format (default: told from its first line).",
)
@click.option(
    "--time-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Replay the trace this many times faster (2: twice as fast).",
)
@click.option("--trace-limit", type=int, help="Replay only the trace's first N requests.")
@click.option(
    "--over-context",
    type=click.Choice(["send", "skip", "clip"]),
    default="send",
    show_default=True,
    help="Requests whose prompt + max_tokens exceed the server's context: send them anyway (they are "
    "refused, and counted before the level), skip them, or clip their prompts to fit.",
)
@option(A.Seed, default=0, show_default=True)
@option(A.Slo)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=None,
    help="Unrecorded warm-up requests per level (default: one per stream, ≤16).",
)
@click.option(
    "--timeout", "timeout_s", type=float, default=600.0, show_default=True, help="Per-request timeout, s."
)
@click.option(
    "--idle-timeout",
    "idle_timeout_s",
    type=float,
    default=IDLE_TIMEOUT_S,
    show_default=True,
    help="Seconds of silence after the first token before a stream counts as `stalled`.",
)
@click.option(
    "--token-clock",
    type=click.Choice(["client", "server"]),
    default="client",
    show_default=True,
    help="Whose clock times tokens: the client's as they arrive, or the server's own stamps where it "
    "sends them (`servelab sim`: its step clock, which a stall of either process does not move).",
)
@click.option("--no-exact-length", is_flag=True, help="Do not send ignore_eos/min_tokens.")
@click.option("--temperature", type=float, help="Sampling temperature to send (default: the server's).")
@click.option(
    "--scrape-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between /metrics samples during a level; 0 keeps only the before/after snapshots.",
)
@click.option(
    "--api-key", envvar="SERVELAB_API_KEY", help="Bearer token (or $SERVELAB_API_KEY); never stored."
)
@click.option(
    "--export-vllm",
    type=click.Path(file_okay=False),
    help="Also write one JSON per level in vllm bench serve's fields to this directory.",
)
@click.option(
    "--export-requests",
    type=click.Path(dir_okay=False),
    help="Also write one row per request to FILE.jsonl or FILE.csv (format by extension).",
)
@click.option("--gpu", help="GPU kind the server runs on (catalog name), when the server cannot say.")
@click.option("--num-gpus", type=click.IntRange(min=1), help="GPUs the server uses.")
@click.option("--interconnect", help="pcie | nvlink | ... (catalog name), when the server cannot say.")
@click.option("--tp", type=click.IntRange(min=1), help="Tensor parallel size the server runs with.")
@click.option("--pp", type=click.IntRange(min=1), help="Pipeline parallel size.")
@click.option("--ep", type=click.IntRange(min=1), help="Expert parallel size.")
@click.option("--dp-attention", "dp", type=click.IntRange(min=1), help="Attention data parallel size.")
@click.option("--model-config", help="Catalog name or config.json the performance model prices the run as.")
@click.option("--quant", help="Weight format (e.g. fp8, nvfp4, bf16) for the performance model.")
@click.option("--kv-dtype", help="KV-cache dtype for the performance model.")
@click.option(
    "--find-capacity",
    is_flag=True,
    help="Search for the highest load meeting --slo (bracket, then bisect); see docs/cli/bench.md.",
)
@click.option(
    "--by",
    type=click.Choice(["concurrency", "rate"]),
    default=None,
    help="--find-capacity: search concurrency or request rate (default: concurrency, or what "
    "--concurrency/--rate names; its one value is the first probe).",
)
@click.option(
    "--resolution",
    default="10%",
    show_default=True,
    help="--find-capacity: stop when the step is under this.",
)
@click.option(
    "--max-probes",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="--find-capacity: probes at most.",
)
@price_options
@click.option(
    "--json", "as_json", is_flag=True, help="Print the result as JSON (documented in docs/cli/bench.md)."
)
def bench(**opts: Any) -> None:
    """Measure TTFT, TPOT, ITL, E2E, throughput and goodput at one or more load levels."""
    conc = parse_levels(opts.pop("concurrency"), "--concurrency")
    rate = parse_levels(opts.pop("rate"), "--rate")
    sessions = parse_levels(opts.pop("sessions"), "--sessions")
    if sessions is not None:  # the number of conversations at once is the closed loop's level
        if conc is not None or rate is not None:
            raise ConfigError(
                "--sessions is the level of a sessions run: give it instead of --concurrency or --rate",
                hint="e.g. --workload sessions --sessions 1,8",
            )
        if opts.get("workload") not in (None, "sessions"):
            raise ConfigError(f"--sessions needs --workload sessions, not {opts['workload']}")
        opts["workload"] = "sessions"
        conc = sessions
    mode: Literal["concurrency", "rate", "trace"]
    search = _search_options(opts, conc, rate)
    if search is not None and opts["trace"] is not None:
        raise ConfigError(
            "--find-capacity does not search over a --trace: it replays the trace's own schedule",
            hint="replay it faster or slower with --time-scale X",
        )
    if search is not None and opts.get("workload") == "sessions":
        # A session plan is built per level before the first one runs; a search picks its levels as
        # it goes.
        raise ConfigError(
            "--find-capacity does not search over --workload sessions",
            hint="give the session counts to measure: --workload sessions --sessions 1,4,16",
        )
    if search is not None:
        mode, levels = search[0].by, [search[0].start]
    elif opts["trace"] is not None and conc is None and rate is None:
        mode, levels = "trace", [opts["time_scale"]]  # one level: the trace at its time scale
    elif conc is not None and rate is None and opts["trace"] is None:
        mode, levels = "concurrency", conc
    elif rate is not None and conc is None and opts["trace"] is None:
        mode, levels = "rate", rate
    else:
        raise ConfigError(
            "give exactly one of --concurrency or --rate, or --trace FILE",
            hint="e.g. --concurrency 1,8,64, --rate 2,4,8 or --trace FILE",
        )
    export = opts.pop("export_vllm")
    as_json = opts.pop("as_json")
    out = check_export_dir(export) if export else None
    requests_to = opts.pop("export_requests")
    requests_out = request_export.check_path(requests_to) if requests_to else None
    context = context_from_flags(opts)
    chosen: WorkloadKind | None = opts.pop("workload")  # click.Choice allows only these
    workload: WorkloadKind = chosen or ("sharegpt" if opts.get("dataset") else "synthetic")
    if opts.get("dataset") and not Path(opts["dataset"]).is_file():
        raise ConfigError(
            f"--dataset {opts['dataset']} does not exist",
            hint="Give the path of a ShareGPT-format JSON file.",
        )
    try:
        cfg = BenchConfig(
            url=opts["url"],
            model=opts["model"],
            api=opts["api"],
            mode=mode,
            levels=levels,
            max_concurrency=opts["max_concurrency"],
            num_requests=opts["num_requests"],
            duration_s=opts["duration"],
            requests_per_stream=opts["requests_per_stream"],
            workload=workload,
            input_len=opts["input_len"],
            output_len=opts["output_len"],
            range_ratio=opts["range_ratio"],
            dataset=opts["dataset"],
            num_prefixes=opts["num_prefixes"],
            prefix_len=opts["prefix_len"],
            tokenizer=opts["tokenizer"],
            seed=opts["seed"],
            slo=opts["slo"],
            arrival=opts["arrival"],
            burstiness=opts["burstiness"],
            warmup=-1 if opts["warmup"] is None else opts["warmup"],
            timeout_s=opts["timeout_s"],
            idle_timeout_s=opts["idle_timeout_s"],
            token_clock=opts["token_clock"],
            exact_output_len=not opts["no_exact_length"],
            api_key=opts["api_key"] or os.environ.get("OPENAI_API_KEY"),
            temperature=opts["temperature"],
            scrape_interval_s=opts["scrape_interval"],
            turns=opts["turns"],
            think_time_s=opts["think_time_s"],
            think_dist=opts["think_dist"],
            system_prompt_len=opts["system_prompt_len"],
            tool_turns=opts["tool_turns"],
            tool_result_len=opts["tool_result_len"],
            trace=opts["trace"],
            trace_format=opts["trace_format"],
            time_scale=opts["time_scale"],
            trace_limit=opts["trace_limit"],
            over_context=opts["over_context"],
            gpu_hour_usd=opts["gpu_hour_usd"],
            kwh_usd=opts["kwh_usd"],
            context=context,
        )
    except ValidationError as exc:
        raise config_error(exc, mode) from None
    try:
        res = _run(cfg, _ProgressObserver(), search)
    except Interrupted as exc:
        if exc.run_uid is not None:  # --json prints the stored run (`status: interrupted`), as documented
            with open_store() as store:
                exc.document = BenchRepo(store).load(exc.run_uid).to_json()
        raise
    data = result_json(res)
    if requests_out is not None:
        export_requests(res.uid, *requests_out)
    if res.status == "failed":
        if not as_json:
            render(data)
        raise ServerError(
            next(
                (w for w in reversed(res.warnings) if w.startswith("every request")), "the benchmark failed"
            ),
            hint=f"the server answers nothing but errors: check its log; `servelab runs show {res.uid}` "
            "keeps what was stored",
        )
    if out is not None:
        for lv in res.levels:
            compat = lv.vllm_compatible(cfg.max_concurrency, cfg.burstiness) | {
                "model_id": cfg.model,
                "servelab_run": res.uid,
            }
            (out / f"{res.uid}-level{lv.index}.json").write_bytes(
                orjson.dumps(compat, option=orjson.OPT_INDENT_2)
            )
    emit(data, as_json, render)

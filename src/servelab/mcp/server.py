"""The MCP server: one tool per step of the loop, each a typed front on a servelab command.

A tool with a command runs `servelab COMMAND … --json` as a child process: its result is that command's
JSON view (validated into the tool's declared result, models.py) and its error the command's message and
hint, as an MCP tool error (isError). Nothing here re-implements a command. What only reads or merges
into the store (a study's progress, the plan) runs in this process; studies run as child `servelab
tune` processes (studies.py), so no call waits for long work."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
import orjson
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field, ValidationError

from servelab import __version__
from servelab.errors import ConfigError, ServelabError
from servelab.mcp import models as M
from servelab.mcp.progress import progress
from servelab.mcp.studies import Child, Studies, error_of, servelab_argv
from servelab.paths import data_home
from servelab.plan.formats import export_markdown, export_todowrite, import_todowrite
from servelab.plan.items import STATUSES, Plan
from servelab.redact import redact, redact_text

T = TypeVar("T", bound=BaseModel)
CLI_TIMEOUT_S = 600.0

INSTRUCTIONS = """servelab observes, predicts, benchmarks, tunes and deploys LLM servers.
Start with `status` (what runs now) and keep your todo list in servelab (`plan_update` takes your
todowrite list; `plan_check` says which items the observed state contradicts). Studies run in the
background: `tune_start` returns a study id at once; poll `tune_progress`; `report` writes the files.
Every error carries a hint: what to do next."""


@dataclass(frozen=True)
class Options:
    """What the person who started the server allows (nothing destructive unless named here)."""

    allow_install: bool = False
    bench_max_requests: int = 200
    bench_max_duration_s: float = 60.0
    bench_max_levels: int = 4
    bench_max_concurrency: int = 64


def tool_error(exc: ServelabError) -> ToolError:
    """The CLI's rendering of an error (message, then its hint), secrets masked."""
    text = f"error: {redact_text(exc.message)}"
    if exc.hint:
        text += f"\nhint: {redact_text(exc.hint)}"
    return ToolError(text)


@contextlib.contextmanager
def as_tool_errors() -> Iterator[None]:
    try:
        yield
    except ServelabError as exc:
        raise tool_error(exc) from None


def flags(**kw: Any) -> list[str]:
    """Tool arguments as the command's options: `num_gpus=8` → `--num-gpus 8`, True → the flag alone,
    a list → the option once per value; None and False are left out (the command's default)."""
    out: list[str] = []
    for name, value in kw.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            for v in value:
                out += [flag, str(v)]
        else:
            out += [flag, str(value)]
    return out


def run_cli(args: list[str], timeout: float = CLI_TIMEOUT_S) -> Any:
    """`servelab ARGS --json` in a child: its document (secrets masked), or its error raised. A command
    that exits 1 with its document (doctor's failed check) returns that document."""
    try:
        cp = subprocess.run(
            [*servelab_argv(), *args, "--json"],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            env={**os.environ, "COLUMNS": "160"},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ServelabError(
            f"servelab {args[0]} took longer than {timeout:.0f} s", hint="ask for less (fewer levels)"
        ) from None
    doc: Any = None
    with contextlib.suppress(orjson.JSONDecodeError):
        doc = orjson.loads(cp.stdout)
    is_error = isinstance(doc, dict) and {"error", "message"} <= doc.keys()
    if cp.returncode not in (0, 1) or doc is None or is_error:
        raise error_of(cp.stdout, cp.stderr, cp.returncode)
    return redact(doc)


async def call(model: type[T], args: list[str], timeout: float = CLI_TIMEOUT_S) -> T:
    try:
        doc = await anyio.to_thread.run_sync(lambda: run_cli(args, timeout))
    except ServelabError as exc:
        raise tool_error(exc) from None
    try:
        return model.model_validate(doc)
    except ValidationError as exc:  # the command's document and this tool's declared result disagree
        command = " ".join(a for a in args[:2] if not a.startswith("-"))
        raise tool_error(
            ServelabError(
                f"servelab {command} --json gave a document that does not match this tool's "
                f"result ({model.__name__}): {exc.error_count()} error(s), first: "
                f"{'.'.join(map(str, exc.errors()[0]['loc']))}: {exc.errors()[0]['msg']}",
                hint="the servelab command and its MCP server disagree (a version mismatch?): run the "
                "command with --json in a terminal, and report it",
            )
        ) from None


def typed(model: type[T], doc: Any) -> T:
    """A result built in this process, secrets masked like every command's output."""
    return model.model_validate(
        redact(doc.model_dump(mode="json", by_alias=True) if isinstance(doc, BaseModel) else doc)
    )


def check_bench(opts: Options, levels: list[int], num_requests: int | None, duration: float | None) -> None:
    """A bench call within the server's caps: so many levels, so many streams, a level's requests and
    seconds; an argument over its cap is an error naming it, the cap and the option that raises it."""
    over = [
        ("concurrency", f"{len(levels)} levels", len(levels) > opts.bench_max_levels,
         f"{opts.bench_max_levels} levels", "--bench-max-levels N"),
        ("concurrency", f"{max(levels)} streams", max(levels) > opts.bench_max_concurrency,
         f"{opts.bench_max_concurrency}", "--bench-max-concurrency N"),
        ("num_requests", f"{num_requests}", (num_requests or 0) > opts.bench_max_requests,
         f"{opts.bench_max_requests}", "--bench-max-requests N"),
        ("duration", f"{duration or 0:g} s", (duration or 0) > opts.bench_max_duration_s,
         f"{opts.bench_max_duration_s:g} s", "--bench-max-duration S"),
    ]  # fmt: skip
    for name, value, bad, cap, option in over:
        if bad:
            raise ConfigError(
                f"{name}: {value} is above this server's cap of {cap}",
                hint=f"ask for less, or start `servelab mcp {option}`",
            )


def _actor() -> str:
    return os.environ.get("SERVELAB_ACTOR") or "mcp"


def _plan_name(store: Any, ref: str | None) -> str:
    from servelab.store.plans import WORKSPACE
    from servelab.store.studies import StudyRepo

    return WORKSPACE if ref in (None, "", WORKSPACE) else str(StudyRepo(store).resolve(str(ref))["uid"])


def _plan_view(p: Plan) -> dict[str, Any]:
    counts = {s: sum(1 for i in p.items if i.status == s) for s in STATUSES}
    return {"plan": p.name, "items": [i.to_dict() for i in p.items], "counts": counts}


PlanRef = Annotated[str | None, Field(description="`workspace` (default) or a study: uid, name or `last`.")]
Host = Annotated[str | None, Field(description="ssh://[user@]host[:port] or an ~/.ssh/config alias.")]
StudyRef = Annotated[str, Field(description="A study: its uid (s-…), its name, or `last`.")]


def build(options: Options | None = None, studies: Studies | None = None) -> MCPServer:
    """The server with every tool and resource; `studies` holds the study drivers it starts."""
    opts = options or Options()
    runs = studies or Studies()
    mcp: MCPServer = MCPServer(
        "servelab", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )

    # -- observe ----------------------------------------------------------------------------------
    @mcp.tool()
    async def status(
        url: Annotated[
            list[str] | None, Field(description="Servers to probe (default: the last run's).")
        ] = None,
        unit: Annotated[list[str] | None, Field(description="systemd units (default: servelab*).")] = None,
        log: Annotated[str | None, Field(description="A server log to read.")] = None,
        gpu_source: Annotated[str | None, Field(description="auto, nvml, nvidia-smi or sim:URL.")] = None,
        host: Host = None,
    ) -> M.StatusView:
        """What is true right now: GPUs, servers, services, leftovers, unfinished studies, a verdict."""
        return await call(
            M.StatusView, ["status", *flags(url=url, unit=unit, log=log, gpu_source=gpu_source, host=host)]
        )

    @mcp.tool()
    async def doctor(gpu_source: str | None = None, host: Host = None) -> M.DoctorView:
        """Host checks with their fixes (nvidia_uvm, /dev/shm, P2P, PCIe link, power limits, ECC, …)."""
        return await call(M.DoctorView, ["doctor", *flags(gpu_source=gpu_source, host=host)])

    @mcp.tool()
    async def logs_diagnose(
        file: Annotated[str | None, Field(description="The server log (or give unit).")] = None,
        engine: str | None = None,
        unit: str | None = None,
        lines: int | None = None,
        host: Host = None,
    ) -> M.DiagnosisView:
        """Classify a failed server's log with the signatures knowledge base: class, evidence, advice."""
        return await call(
            M.DiagnosisView,
            [
                "logs",
                "diagnose",
                *([file] if file else []),
                *flags(engine=engine, unit=unit, lines=lines, host=host),
            ],
        )

    @mcp.tool()
    async def logs_parse(
        engine: Annotated[str, Field(description="The engine that wrote the log: vllm, sglang, …")],
        file: str | None = None,
        server_info: Annotated[
            str | None, Field(description="JSON saved from the engine's info endpoint.")
        ] = None,
        unit: str | None = None,
        lines: int | None = None,
        host: Host = None,
    ) -> M.LogsParseView:
        """The configuration a server log shows it runs (effective), with the log line for each key."""
        return await call(
            M.LogsParseView,
            [
                "logs",
                "parse",
                *([file] if file else []),
                *flags(engine=engine, server_info=server_info, unit=unit, lines=lines, host=host),
            ],
        )

    # -- plan -------------------------------------------------------------------------------------
    @mcp.tool()
    def plan_get(plan: PlanRef = None) -> M.PlanView:
        """The plan (the agent's todo list, kept in servelab beside the state it is about)."""
        from servelab.store import open_store
        from servelab.store.plans import PlanRepo

        with as_tool_errors(), open_store() as store:
            return typed(M.PlanView, _plan_view(PlanRepo(store).load(_plan_name(store, plan))))

    @mcp.tool()
    def plan_update(
        todos: Annotated[
            list[M.Todo], Field(description="todowrite's list: {id?, content, status, priority}.")
        ],
        plan: PlanRef = None,
        prune: Annotated[bool, Field(description="Cancel open items the list does not mention.")] = False,
    ) -> M.PlanUpdateView:
        """Merge a todowrite list into the plan (servelab's rules hold: one item in progress per worker, an
        experiment completes only with evidence); returns the plan as a todowrite list."""
        from servelab.store import open_store
        from servelab.store.db import utcnow
        from servelab.store.plans import PlanRepo

        data = {"todos": [t.model_dump(exclude_none=True) for t in todos]}
        with as_tool_errors(), open_store() as store:
            name = _plan_name(store, plan)
            repo = PlanRepo(store)
            uid = None if name == "workspace" else name
            out = repo.apply(
                name,
                lambda p: import_todowrite(p, data, now=utcnow(), actor=_actor(), prune=prune, source="mcp"),
                uid,
            )
            now = export_todowrite(repo.load(name))
        return typed(
            M.PlanUpdateView,
            {
                "plan": name,
                "todos": now,
                **{k: out.info.get(k, []) for k in ("added", "updated", "unchanged", "missing", "pruned")},
            },
        )

    @mcp.tool()
    async def plan_check(
        url: list[str] | None = None, unit: list[str] | None = None, plan: PlanRef = None, host: Host = None
    ) -> M.PlanCheckView:
        """Hold every open item against what is observed now (default: the servers and units the items
        name) and flag the assumptions the state contradicts."""
        return await call(
            M.PlanCheckView, ["plan", "check", *flags(url=url, unit=unit, plan=plan, host=host)]
        )

    # -- predict ----------------------------------------------------------------------------------
    @mcp.tool()
    async def predict(
        model: Annotated[
            str | None, Field(description="Catalog name (GLM-5-NVFP4, …) or a config.json.")
        ] = None,
        gpu: Annotated[str | None, Field(description="GPU kind: rtx-pro-6000, h200-sxm, …")] = None,
        num_gpus: int | None = None,
        tp: int | None = None,
        pp: int | None = None,
        ep: int | None = None,
        dp_attention: int | None = None,
        quant: str | None = None,
        kv_dtype: str | None = None,
        interconnect: str | None = None,
        engine: Annotated[str | None, Field(description="vllm, sglang or trtllm.")] = None,
        calibration: str | None = None,
        isl: int | None = None,
        osl: int | None = None,
        concurrency: int | None = None,
        study: Annotated[str | None, Field(description="Take the setup from this study TOML.")] = None,
        silicon: Annotated[
            bool,
            Field(
                description="Read the allreduce and routed experts off measured operator tables (`sources` says which)."
            ),
        ] = False,
    ) -> M.PredictionView:
        """Predicted TTFT, TPOT, throughput and memory for one setup, and where the decode step goes."""
        args = flags(
            model=model,
            gpu=gpu,
            num_gpus=num_gpus,
            tp=tp,
            pp=pp,
            ep=ep,
            dp_attention=dp_attention,
            quant=quant,
            kv_dtype=kv_dtype,
            interconnect=interconnect,
            engine=engine,
            calibration=calibration,
            isl=isl,
            osl=osl,
            concurrency=concurrency,
            study=study,
            silicon=silicon,
        )
        return await call(M.PredictionView, ["predict", *args])

    @mcp.tool()
    async def predict_sweep(
        sweep: Annotated[
            list[int], Field(description="The concurrencies of the curve, e.g. [1, 4, 16, 64].")
        ],
        model: Annotated[
            str | None, Field(description="Catalog name (GLM-5-NVFP4, …) or a config.json.")
        ] = None,
        gpu: Annotated[str | None, Field(description="GPU kind: rtx-pro-6000, h200-sxm, …")] = None,
        num_gpus: int | None = None,
        tp: int | None = None,
        pp: int | None = None,
        ep: int | None = None,
        dp_attention: int | None = None,
        quant: str | None = None,
        kv_dtype: str | None = None,
        interconnect: str | None = None,
        engine: Annotated[str | None, Field(description="vllm, sglang or trtllm.")] = None,
        calibration: str | None = None,
        isl: int | None = None,
        osl: int | None = None,
        study: Annotated[str | None, Field(description="Take the setup from this study TOML.")] = None,
        silicon: Annotated[
            bool,
            Field(
                description="Read the allreduce and routed experts off measured operator tables (`sources` says which)."
            ),
        ] = False,
    ) -> M.SweepView:
        """The predicted concurrency curve of one setup: TPOT, TTFT and throughput at each level
        (`servelab predict --sweep`)."""
        args = flags(
            model=model,
            gpu=gpu,
            num_gpus=num_gpus,
            tp=tp,
            pp=pp,
            ep=ep,
            dp_attention=dp_attention,
            quant=quant,
            kv_dtype=kv_dtype,
            interconnect=interconnect,
            engine=engine,
            calibration=calibration,
            isl=isl,
            osl=osl,
            study=study,
            silicon=silicon,
        )
        return await call(M.SweepView, ["predict", *args, "--sweep", ",".join(str(c) for c in sweep)])

    @mcp.tool()
    async def compare_layouts(
        model: str | None = None,
        gpu: str | None = None,
        num_gpus: int | None = None,
        engine: str | None = None,
        quant: str | None = None,
        kv_dtype: str | None = None,
        interconnect: str | None = None,
        isl: int | None = None,
        osl: int | None = None,
        concurrency: int | None = None,
        tpot_limit: Annotated[float | None, Field(description="TPOT limit, ms.")] = None,
        ttft_limit: Annotated[float | None, Field(description="TTFT limit, ms.")] = None,
        study: str | None = None,
        silicon: Annotated[
            bool,
            Field(
                description="Read the allreduce and routed experts off measured operator tables (`sources` says which)."
            ),
        ] = False,
    ) -> M.LayoutsView:
        """Every TP/PP/EP/DP layout for this host, ranked under the limits."""
        args = flags(
            model=model,
            gpu=gpu,
            num_gpus=num_gpus,
            engine=engine,
            quant=quant,
            kv_dtype=kv_dtype,
            interconnect=interconnect,
            isl=isl,
            osl=osl,
            concurrency=concurrency,
            tpot_limit=tpot_limit,
            ttft_limit=ttft_limit,
            study=study,
            silicon=silicon,
        )
        return await call(M.LayoutsView, ["predict", "--compare-layouts", *args])

    @mcp.tool()
    async def explain(
        run: Annotated[str, Field(description="A stored bench run: uid (b-…), id or `last`.")] = "last",
        model: str | None = None,
        gpu: str | None = None,
        num_gpus: int | None = None,
        tp: int | None = None,
        pp: int | None = None,
        ep: int | None = None,
        engine: str | None = None,
        osl: int | None = None,
        silicon: Annotated[
            bool,
            Field(
                description="Read the allreduce and routed experts off measured operator tables (`sources` says which)."
            ),
        ] = False,
    ) -> M.ExplainView:
        """A measured run against the model: where its time goes and how far the prediction is off."""
        args = flags(
            model=model,
            gpu=gpu,
            num_gpus=num_gpus,
            tp=tp,
            pp=pp,
            ep=ep,
            engine=engine,
            osl=osl,
            silicon=silicon,
        )
        return await call(M.ExplainView, ["explain", run, *args])

    # -- measure ----------------------------------------------------------------------------------
    @mcp.tool()
    async def bench(
        url: Annotated[str, Field(description="The OpenAI-compatible server's base URL.")],
        model: Annotated[str, Field(description="The model as the server serves it.")],
        concurrency: Annotated[
            list[int] | None, Field(description="Closed-loop levels (default: one stream).")
        ] = None,
        num_requests: Annotated[
            int | None, Field(description="Requests per level (capped by the server).")
        ] = None,
        duration: Annotated[
            float | None, Field(description="Seconds per level (capped by the server).")
        ] = None,
        input_len: int | None = None,
        output_len: int | None = None,
        api: Literal["completions", "chat"] | None = None,
        slo: Annotated[str | None, Field(description="Latency limits, e.g. `tpot_ms:p50=150`.")] = None,
        seed: int | None = None,
    ) -> M.BenchView:
        """Benchmark a running server, level by level; the call is bounded by the server's caps (levels,
        concurrency, a level's requests and duration)."""
        levels = concurrency or [1]
        with as_tool_errors():
            check_bench(opts, levels, num_requests, duration)
        if num_requests is None and duration is None:
            num_requests = min(opts.bench_max_requests, 50)
        args = flags(
            url=url,
            model=model,
            num_requests=num_requests,
            duration=duration,
            input_len=input_len,
            output_len=output_len,
            api=api,
            slo=slo,
            seed=seed,
        )
        args += ["--concurrency", ",".join(str(c) for c in levels)]
        return await call(M.BenchView, ["bench", *args])

    @mcp.tool()
    async def tune_start(
        study_file: Annotated[str, Field(description="The study TOML (docs/study.md).")],
    ) -> M.TuneStarted:
        """Start a study in the background (a `servelab tune` process holding its lease); returns its id
        at once. Poll `tune_progress`."""
        with as_tool_errors():
            child = await anyio.to_thread.run_sync(lambda: runs.start(study_file))
        return _started(child)

    @mcp.tool()
    async def tune_progress(study: StudyRef, ctx: Context) -> M.TuneProgress:
        """What runs now, trials and levels done, the ETA and what was found so far (read from the store)."""
        from servelab.store import open_store

        with as_tool_errors(), open_store() as store:
            got = progress(store, study)
        mine = runs.children.get(got.study)
        if mine is not None:
            got.exit_code = mine.exit_code()
        if got.levels_total:
            await ctx.report_progress(
                got.levels_done, got.levels_total, f"{got.status}: {got.trials_done} trial(s)"
            )
        return typed(M.TuneProgress, got)

    @mcp.tool()
    async def tune_stop(study: StudyRef) -> M.TuneStopped:
        """Stop a study this server started: SIGINT, its own clean teardown; what finished is stored and
        `tune_resume` continues it."""
        from servelab.store import open_store
        from servelab.store.studies import StudyRepo

        with as_tool_errors():
            with open_store() as store:
                uid = str(StudyRepo(store).resolve(study)["uid"])
            child = await anyio.to_thread.run_sync(lambda: runs.stop(uid))
            with open_store() as store:
                st = StudyRepo(store).resolve(uid)
        return typed(
            M.TuneStopped,
            {
                "study": uid,
                "pid": child.proc.pid,
                "exit_code": child.exit_code(),
                "status": str(st["status"]),
            },
        )

    @mcp.tool()
    async def tune_resume(
        study: StudyRef,
        study_file: Annotated[
            str | None, Field(description="Default: the file the study was run from.")
        ] = None,
        retry_failed: bool = False,
    ) -> M.TuneStarted:
        """Continue an interrupted study in the background (`servelab tune --resume`)."""
        from servelab.store import open_store
        from servelab.store.studies import StudyRepo

        with as_tool_errors():
            with open_store() as store:
                st = StudyRepo(store).resolve(study)
            source = str(Path(study_file).expanduser().resolve()) if study_file else str(st["source"] or "")
            child = await anyio.to_thread.run_sync(
                lambda: runs.resume(str(st["uid"]), source, str(st["name"]), retry_failed)
            )
        return _started(child)

    @mcp.tool()
    async def runs_show(
        run: Annotated[str, Field(description="A bench run: uid, id or `last`.")] = "last",
    ) -> M.RunView:
        """One stored bench run with every level, as `servelab runs show` prints it."""
        return await call(M.RunView, ["runs", "show", run])

    @mcp.tool()
    async def report(
        study: StudyRef = "last",
        html: Annotated[str | None, Field(description="Write the HTML report here.")] = None,
        md: Annotated[str | None, Field(description="Write the Markdown report here.")] = None,
    ) -> M.ReportView:
        """Write a study's findings report (HTML and Markdown; default: under $SERVELAB_HOME/reports/)."""
        if html is None and md is None:
            from servelab.store import open_store
            from servelab.store.studies import StudyRepo

            with as_tool_errors(), open_store() as store:
                uid = str(StudyRepo(store).resolve(study)["uid"])
            where = data_home() / "reports" / uid
            html, md = str(where / "report.html"), str(where / "report.md")
        return await call(M.ReportView, ["report", study, *flags(html=html, md=md)])

    @mcp.tool()
    async def deploy_preview(
        run: Annotated[str, Field(description="RUN, STUDY (its winner), STUDY:CANDIDATE or trial:ID.")],
        target: Literal["systemd", "compose", "kubernetes"] = "systemd",
        name: str | None = None,
        port: int | None = None,
        user: str | None = None,
        env_file: Annotated[str | None, Field(description="Where the run's secrets come from.")] = None,
        install: Annotated[
            bool, Field(description="Install it (only if the server allows installing).")
        ] = False,
    ) -> M.DeployView:
        """The unit (or Compose/Kubernetes file) a run deploys as, from its exact command line; nothing is
        written or installed unless `install` and the server was started with --allow-install."""
        with as_tool_errors():
            if install and not opts.allow_install:
                raise ConfigError(
                    "install: this server does not install units",
                    hint="start it with `servelab mcp --allow-install` to let an agent install",
                )
        mode = ["--install"] if install else ["--dry-run"]
        return await call(
            M.DeployView,
            [
                "deploy",
                run,
                "--target",
                target,
                *mode,
                *flags(name=name, port=port, user=user, env_file=env_file),
            ],
        )

    # -- resources --------------------------------------------------------------------------------
    @mcp.resource("servelab://plan", mime_type="text/markdown")
    def plan_resource() -> str:
        """The workspace plan as Markdown, with its history."""
        return _plan_markdown(None)

    @mcp.resource("servelab://plan/{ref}", mime_type="text/markdown")
    def study_plan_resource(ref: str) -> str:
        """A study's plan as Markdown."""
        return _plan_markdown(ref)

    @mcp.resource("servelab://studies/{ref}/report", mime_type="text/markdown")
    async def report_resource(ref: str) -> str:
        """The latest report of a study (`last` for the newest), as Markdown."""
        return await anyio.to_thread.run_sync(lambda: _report_markdown(ref))

    @mcp.resource("servelab://signatures", mime_type="application/toml")
    def signatures_resource() -> str:
        """The failure signatures knowledge base `logs_diagnose` classifies logs with."""
        return resources.files("servelab.engines").joinpath("signatures.toml").read_text()

    return mcp


def _started(child: Child) -> M.TuneStarted:
    return typed(
        M.TuneStarted,
        {
            "study": child.study,
            "name": child.name,
            "pid": child.proc.pid,
            "log": str(child.log),
            "source": child.source,
        },
    )


def _plan_markdown(ref: str | None) -> str:
    from servelab.store import open_store
    from servelab.store.plans import PlanRepo

    with as_tool_errors(), open_store() as store:
        name = _plan_name(store, ref)
        repo = PlanRepo(store)
        return redact_text(export_markdown(repo.load(name), repo.history(name)))


def _report_markdown(ref: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        md = Path(tmp) / "report.md"
        try:
            run_cli(["report", ref, "--md", str(md)])
        except ServelabError as exc:
            raise tool_error(exc) from None
        return md.read_text()

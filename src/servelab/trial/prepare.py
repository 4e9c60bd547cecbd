"""What a candidate runs with and how it is measured: its engine settings, the benchmark's configuration
and the run's context (host, layout, clock), the verify step's options, and the small reads a trial
makes of its server and its store."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError

from servelab.bench.client import Client
from servelab.bench.config import BenchConfig
from servelab.config.sections import CandidateSpec
from servelab.config.study import Study
from servelab.engines.base import Engine, Settings
from servelab.errors import ConfigError
from servelab.host import transport
from servelab.host.agent_op import NoArgs
from servelab.host.ops import PING
from servelab.jsontypes import JsonObject
from servelab.load import TraceLoad
from servelab.results import Clock, Host, Layout, Level, NetPath, RunContext
from servelab.store.bench import BenchRepo
from servelab.store.db import Store

if TYPE_CHECKING:
    pass

from servelab.trial.outcome import Digest

# -- what a candidate runs with, and how it is measured ----------------------------------------------


def settings_for(study: Study, cand: CandidateSpec, port: int = 0) -> Settings:
    """The candidate's settings: the engine's common args/env/options first, the candidate's on top."""
    options = {**study.engine.options, **cand.options}
    if study.engine.python:
        options.setdefault("python", study.engine.python)
    if study.host.gpu:
        options.setdefault("gpu", study.host.gpu)
        options.setdefault("num_gpus", study.host.num_gpus)
    model = study.model.path
    if Path(model).exists():  # a local checkout: engines log the absolute path, so ask for that
        model = str(Path(model).resolve())
    return Settings(
        model=model,
        served_model_name=study.model.served_name,
        host=study.engine.host,
        port=port or study.engine.port or 0,
        tp=cand.tp,
        pp=cand.pp,
        ep=cand.ep,
        dp=cand.dp,
        quantization=cand.quantization,
        kv_cache_dtype=cand.kv_cache_dtype,
        max_concurrency=cand.max_concurrency,
        mem_fraction=cand.mem_fraction,
        max_model_len=cand.max_model_len,
        extra_args=(*study.engine.args, *cand.args),
        env={**study.engine.env, **cand.env},
        options=options,
    )


async def measure_path(host: transport.Host | None, n: int = 5) -> NetPath:
    """Over SSH, the bench path's round trip: the median of `n` no-op requests to the agent on the
    connection that carries the forward (a TCP connect to the forward's local end measures ssh alone).
    Direct: left to the bench, which times TCP connects to the server (`bench.probe.direct_path`)."""
    if host is None or host.is_local:
        return NetPath()
    times: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        await asyncio.to_thread(PING.call, host, NoArgs())
        times.append((time.perf_counter() - t0) * 1000.0)
    return NetPath(via="ssh-forward", target=host.name, rtt_ms=round(statistics.median(times), 3))


def run_context(study: Study, settings: Settings, path: NetPath | None = None) -> RunContext:
    """What a trial's bench runs are of, as the study declares it: engine, model config, host, layout,
    formats, and the simulator's clock speed (so its runs are shown in simulated GPU time everywhere)."""
    simulated = study.engine.name == "sim"
    return RunContext(
        engine=study.engine.name,
        personality=settings.text_option("personality"),
        model_config=study.model.config or study.model.path,
        host=Host(gpu=study.host.gpu, num_gpus=study.host.num_gpus, source="study"),
        layout=Layout(tp=settings.tp, pp=settings.pp, ep=settings.ep, dp=settings.dp),
        quant=settings.quantization,
        kv_dtype=settings.kv_cache_dtype,
        clock=Clock(speed=sim_speed(study), source="study") if simulated else Clock(),
        path=path or NetPath(),
    )


def bench_config(
    study: Study, url: str, model: str, api_key: str | None = None, context: RunContext | None = None
) -> BenchConfig:
    w, ld = study.workload, study.load
    kind = study.load_kind()
    # a trace study's levels are time scales; workload.num_requests slices the trace (bench --trace-limit)
    traced = isinstance(kind, TraceLoad)
    try:
        return BenchConfig(
            url=url,
            model=model,
            api=w.api,
            mode=kind.mode,
            levels=ld.levels,
            max_concurrency=None if kind.closed_loop else ld.max_concurrency,
            num_requests=None if traced else w.num_requests,
            trace=ld.trace,
            trace_format=ld.trace_format,
            time_scale=ld.levels[0] if traced else 1.0,
            trace_limit=w.num_requests if traced else None,
            requests_per_stream=w.requests_per_stream,
            duration_s=w.duration_s,
            workload=w.kind,
            input_len=w.input_len,
            output_len=w.output_len,
            range_ratio=w.range_ratio,
            dataset=w.dataset,
            num_prefixes=w.num_prefixes,
            prefix_len=w.prefix_len,
            tokenizer=w.tokenizer,
            seed=w.seed,
            slo=study.slo.bench_slo(),
            warmup=w.warmup,
            timeout_s=w.timeout_s,
            temperature=w.temperature,
            turns=w.turns,
            think_time_s=w.think_time_s,
            think_dist=w.think_dist,
            system_prompt_len=w.system_prompt_len,
            tool_turns=w.tool_turns,
            tool_result_len=w.tool_result_len,
            api_key=api_key,
            gpu_hour_usd=study.cost.gpu_hour_usd,
            kwh_usd=study.cost.kwh_usd,
            price_source=study.price_source,
            scrape_interval_s=scrape_interval(study),
            context=context or RunContext(),
        )
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            table = "workload" if hasattr(w, field) else "load" if hasattr(ld, field) else ""
            where = f"{table}.{field}" if table else (field or "study")
            parts.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
        raise ConfigError(
            "the study's workload/load cannot be benchmarked: " + "; ".join(parts),
            hint="fix the value in the study file; `servelab tune STUDY --dry-run` checks it again",
        ) from None
    except ValueError as exc:
        raise ConfigError(f"the study's workload/load cannot be benchmarked: {exc}") from exc


def verify_kwargs(study: Study, engine: Engine) -> dict[str, Any]:
    """verify_output's arguments: the engine's default reference, then the study's engine.options.verify
    (the user's table, passed on as keywords: verify_output's own signature checks its keys)."""
    reference = engine.capabilities.verify_reference
    kw = {"reference": reference} if reference else {}
    opts = study.engine.options.get("verify", {})
    if not isinstance(opts, dict):
        raise ConfigError("engine.options.verify must be a table, e.g. { reference = 'hf:PATH' }")
    return kw | opts


def scrape_interval(study: Study) -> float:
    """Seconds between a level's /metrics and GPU samples on the client's clock: 1 s for a real server
    (bench's default); a simulator's faster clock every 2 s of its GPU's time, so a level lasting a fraction
    of a second on the client's clock still has power samples to integrate (at least 0.25 s apart: each
    sample is two requests to the simulator, which shares its core with the level it measures)."""
    return max(0.25, min(1.0, 2.0 / sim_speed(study)))


def sim_speed(study: Study) -> float:
    """How many times faster than a real GPU the server's clock runs (the simulator's `speed`; else 1)."""
    return study.sim_speed()


def level_digest(level: Level, clock: Clock) -> Digest:
    """The one place a study's level digest is built: the bench run's summary, already in the time base it
    is shown in (a simulator's GPU time), with the clock's speed beside it when it is simulated."""
    d = level.summary.digest()
    if clock.simulated:
        d["time_scale"] = clock.speed
    return d


async def fetch_info(url: str, paths: tuple[str, ...], api_key: str | None = None) -> JsonObject | None:
    """The engine's info endpoints merged (SGLang /get_server_info, vLLM /version); None when none answers."""
    if not paths:
        return None
    client = Client(url, api_key=api_key, timeout_s=10)
    try:
        merged: JsonObject = {}
        for p in paths:
            with contextlib.suppress(Exception):
                res = await client.get(p, timeout_s=5.0)
                if res.ok and res.body:
                    obj = orjson.loads(res.body)
                    if isinstance(obj, dict):
                        merged.update(obj)
        return merged or None
    finally:
        client.close()


def read_log(path: Path | None) -> str:
    """A server log's text ("" when there is none to read: a server we did not start)."""
    if path is None:
        return ""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def bench_run_id(store: Store, uid: str) -> int | None:
    """The store id of the bench run `uid`."""
    return BenchRepo(store).run_id(uid)

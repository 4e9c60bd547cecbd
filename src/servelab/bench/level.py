"""One level of a run, measured and stored as it goes: warm-up, the driver (open or closed loop, or
sessions), `/metrics` and GPU samples beside it, the summary, and the saturation verdict of an open loop."""

from __future__ import annotations

import asyncio
import contextlib
import time

from servelab import tasks
from servelab.bench import metrics as M
from servelab.bench import saturation as S
from servelab.bench import sessions as SE
from servelab.bench import workload as W
from servelab.bench.client import Client, StreamResult
from servelab.bench.config import BenchConfig
from servelab.bench.costs import level_costs
from servelab.bench.load import LevelSpec, PreparedRequest, Watch, frozen_heap, run_level, warmup
from servelab.bench.probe import Capabilities, fetch
from servelab.bench.prompts import session_builder
from servelab.bench.scrape import LevelScrape, parse_prometheus, pick
from servelab.bench.telemetry import GpuSource
from servelab.energy import Price
from servelab.events import BenchObserver, LevelFinished, LevelStarted, RequestDone
from servelab.load import kind_of
from servelab.results import Level, RequestRecord, RunContext
from servelab.store.bench import BenchRepo


async def run_one_level(
    client: Client,
    metrics_client: Client,
    repo: BenchRepo,
    run_id: int,
    li: int,
    spec: LevelSpec,
    cfg: BenchConfig,
    prepared: list[PreparedRequest],
    warm: list[PreparedRequest],
    make: RecordMaker,
    slo: M.SLO | None,
    notify: BenchObserver,
    speed: float = 1.0,
    early_stop: bool = False,
    gpus: GpuSource | None = None,
    plan: SE.SessionPlan | None = None,
    caps: Capabilities | None = None,
    idle_w: float | None = None,
    price: Price | None = None,
    context: RunContext | None = None,
) -> Level:
    level_id = repo.create_level(run_id, li, spec.mode, spec.value, spec.max_concurrency)
    n_warm = cfg.warmup_count(spec)
    notify(LevelStarted(li, spec.label, spec.num_requests, spec.duration_s, n_warm))
    await warmup(client, warm, n_warm, int(spec.value) if kind_of(spec.mode).closed_loop else n_warm)
    scrape = LevelScrape()
    before = await _snapshot(metrics_client)
    scrape.available = before is not None
    scrape.before = before or {}
    # GPU power is sampled on the same schedule whether or not the server has a /metrics (transformers
    # serve has none; llama.cpp only with --metrics): the energy needs the power, not the engine's gauges
    sampler = (
        asyncio.get_running_loop().create_task(_sampler(metrics_client, scrape, cfg.scrape_interval_s, gpus))
        if (scrape.available or gpus is not None) and cfg.scrape_interval_s > 0
        else None
    )
    done: list[RequestRecord] = []

    def on_record(rec: RequestRecord) -> None:
        repo.add_request(level_id, rec)
        done.append(rec)
        notify(RequestDone(li, len(done), rec.ok, rec.output_tokens, rec.ttft_s, rec.end_s, speed))

    status = "completed"
    # the collector skips what exists before the level (see frozen_heap)
    with frozen_heap():
        t_start = time.perf_counter()
        try:
            if plan is not None:
                records, wall, monitor = await SE.run_sessions(
                    client,
                    plan,
                    cfg.api,
                    session_builder(client, cfg, caps or Capabilities()),
                    make,
                    on_record,
                    speed=speed,
                    duration_s=cfg.duration_s,
                )
            else:
                watch = _watch(done) if early_stop and spec.mode == "rate" else None
                records, wall, monitor = await run_level(
                    client, prepared, spec, make, on_record, seed=cfg.seed + li, watch=watch
                )
        except asyncio.CancelledError:
            status = "interrupted"
            records, wall, monitor = done, time.perf_counter() - t_start, None
        finally:
            if sampler is not None:
                await tasks.stop(sampler)
    regular = len(scrape.samples)  # the samples on the fixed schedule (the saturation check's)
    if sampler is not None and status == "completed":
        # a closing sample at the level's end: the series (and the energy integrated over it) reaches it
        await _sample(metrics_client, scrape, gpus)
    if scrape.available:
        after = await _snapshot(metrics_client) if status == "completed" else None
        scrape.after = after or {}
    summary = M.summarize(records, slo, duration_s=None).model_copy(
        update={
            "prompts_repeated": max(0, len(records) - len(prepared)) if plan is None else 0,
            "mode": spec.mode,
            "value": spec.value,
            "label": spec.label,
            "wall_s": wall,
        }
    )
    client_stats = monitor.summary(summary.total_output_tokens, summary.itl_ms.p50) if monitor else {}
    server = scrape.summary()
    if plan is not None:
        summary = summary.model_copy(update={"sessions": SE.summarize_sessions(records, plan, server)})
    series = scrape.series(t_start, cfg.scrape_interval_s, gpus.name if gpus else None)
    energy, cost = level_costs(summary, series, idle_w, price, context or cfg.context)
    summary = summary.model_copy(update={"energy": energy, "cost": cost})
    repo.finish_level(level_id, status, summary, server, client_stats, series=series)
    saturation = None
    if not kind_of(spec.mode).closed_loop and plan is None and records:
        saturation = S.detect(
            records,
            S.asked_rate(spec.mode, spec.value, records),
            scrape.samples[:regular] if scrape.available else [],
            cfg.scrape_interval_s,
            monitor.lateness if monitor else (),
            monitor.stopped_early if monitor else None,
            monitor.descheduled if monitor else (),
        )
        repo.set_saturation(level_id, saturation)
    level = Level(
        index=li,
        status=status,
        mode=spec.mode,
        value=spec.value,
        summary=summary.in_gpu_time(speed),
        wall=summary,
        server_metrics=server,
        client=client_stats,
        saturation=saturation,
        series=series.in_gpu_time(speed),
        wall_series=series,
    )
    notify(LevelFinished(li, spec.label, status, client_stats))
    if status != "completed":
        raise asyncio.CancelledError
    return level


def _watch(done: list[RequestRecord]) -> Watch:
    """An open loop's live over-saturation check on the records finished so far (`saturation.early_stop`)."""

    def check(sent: int, elapsed_s: float, window_s: float) -> str | None:
        return S.early_stop(done, sent, elapsed_s, window_s)

    return check


def all_failed(level: Level) -> str | None:
    """Why a level measured nothing: every request failed (a server that died after ready answers
    every request with an error; that is not a measurement)."""
    s = level.wall
    if s.completed or not s.failed:
        return None
    kinds = ", ".join(f"{k}×{n}" for k, n in s.errors.items())
    example = next(iter(s.error_examples.values()), "")
    return f"every request of level {level.summary.label} failed ({kinds}): {example[:200]}"


class RecordMaker:
    """A finished stream as its `RequestRecord`: output tokens from the usage, else the tokenizer, else
    the streamed chunks (each record says which)."""

    def __init__(self, counter: W.TokenCounter | None) -> None:
        self.counter = counter

    def __call__(
        self, idx: int, req: PreparedRequest, start_s: float, scheduled: float | None, res: StreamResult
    ) -> RequestRecord:
        rec = RequestRecord(
            idx=idx,
            prompt_idx=req.prompt_idx,
            start_s=start_s,
            ok=res.ok,
            scheduled_s=scheduled,
            itl_s=res.itl_s,
            requested_output_tokens=req.requested_output_tokens,
            error_kind=res.error_kind,
            error_message=res.error_message,
        )
        rec.input_tokens = res.prompt_tokens if res.prompt_tokens is not None else req.target_input_tokens
        if res.completion_tokens is not None:
            rec.output_tokens, rec.token_source = res.completion_tokens, "usage"
            if self.counter is not None and res.ok:
                rec.tokenizer_output_tokens = self.counter.count(res.text)
        elif self.counter is not None:
            rec.output_tokens, rec.token_source = self.counter.count(res.text), "tokenizer"
        else:
            rec.output_tokens, rec.token_source = res.chunks, "chunks"
        if res.ok and res.chunks == 0 and res.completion_tokens == 0:
            rec.ok, rec.error_kind, rec.error_message = (
                False,
                "empty_response",
                "the server streamed no tokens",
            )
        return rec


async def _sampler(
    client: Client, scrape: LevelScrape, interval: float, gpus: GpuSource | None = None
) -> None:
    """A `/metrics` sample (and the GPU telemetry with it) every `interval` seconds, on a fixed schedule
    (a slow scrape does not push the later ones back), each with the client-clock time it was taken."""
    due = time.perf_counter()
    while True:
        due += interval
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        await _sample(client, scrape, gpus)


async def _sample(client: Client, scrape: LevelScrape, gpus: GpuSource | None = None) -> None:
    """One `/metrics` sample and the GPU reading taken with it (a failed scrape is counted, not kept).
    A server without /metrics (`scrape.available` False) still gets the GPU reading, with no gauges."""
    status, body = await fetch(client, "/metrics") if scrape.available else (0, b"")
    if status == 200 or not scrape.available:
        at, reading = time.perf_counter(), None
        if gpus is not None:
            with contextlib.suppress(Exception):  # telemetry is a side view: never stop a level
                reading = await gpus.read()
        # appended together, after the last await: a sampler stopped mid-read leaves no half sample
        scrape.samples.append(
            pick(parse_prometheus(body.decode("utf-8", "replace"))) if status == 200 else {}
        )
        scrape.sample_at.append(at)
        scrape.gpu_samples.append(reading)
    else:
        scrape.errors += 1


async def _snapshot(client: Client) -> dict[str, float] | None:
    status, body = await fetch(client, "/metrics")
    return pick(parse_prometheus(body.decode("utf-8", "replace"))) if status == 200 else None

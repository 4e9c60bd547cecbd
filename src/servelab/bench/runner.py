"""`servelab bench` as a service: probe the server, build the workload, drive every level, store.

The CLI calls `run_bench`; tests call it too. Progress goes to an observer callback so the same
code serves a progress bar, a study loop, or nothing. The parts a session strings together live beside
it: `probe` (what the server accepts and is), `prompts` (the pool and its prepared requests), `level`
(one level measured and stored).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

from servelab.bench import capacity as C
from servelab.bench import fit as F
from servelab.bench import metrics as M
from servelab.bench import sessions as SE
from servelab.bench import traces as T
from servelab.bench import workload as W
from servelab.bench.client import Client
from servelab.bench.config import BenchConfig
from servelab.bench.costs import idle_power, price_for
from servelab.bench.level import RecordMaker, all_failed, run_one_level
from servelab.bench.load import LevelSpec
from servelab.bench.probe import calibrate_tokens_per_word, direct_path, learn_context, probe
from servelab.bench.prompts import (
    POOL_MAX,
    POOL_TOKENS,
    build_workload,
    pool_size,
    prepare_requests,
    read_trace,
)
from servelab.bench.telemetry import source_for
from servelab.errors import ConfigError, Interrupted
from servelab.events import BenchObserver, ProbeFinished, ProbeStarted, RunFinished, RunStarted
from servelab.jsontypes import JsonObject
from servelab.results import (
    CapacityProbe,
    CapacityResult,
    Level,
    RunContext,
)
from servelab.store.bench import BenchRepo
from servelab.store.db import Store


@dataclass
class BenchResult:
    """What `run_bench` measured; `levels` as the store's `Run` holds them (summary in the time base
    shown to users, wall-clock figures beside)."""

    run_id: int
    uid: str
    status: str
    levels: list[Level]
    warnings: list[str]
    workload: JsonObject
    capabilities: JsonObject
    context: RunContext


class BenchSession:
    """One stored run against one server, its levels chosen by the caller: `start` probes the server,
    builds the workload and creates the run; `run_level(spec)` measures one level of it; `drive(body)`
    runs `body` (which calls `run_level` as often as it likes: a fixed list, a capacity search) and
    finishes the run whatever happens (interrupted, failed, completed)."""

    def __init__(self, cfg: BenchConfig, store: Store, observe: BenchObserver | None = None) -> None:
        self.cfg = cfg
        self.notify: BenchObserver = observe or (lambda _e: None)
        try:
            self.slo = M.parse_slo(cfg.slo)
        except ValueError as exc:
            raise ConfigError(f"--slo: {exc}") from exc
        self.counter = W.TokenCounter(cfg.tokenizer) if cfg.tokenizer else None
        self.trace = read_trace(cfg)
        try:
            self.client = Client(
                cfg.url,
                api_key=cfg.api_key,
                timeout_s=cfg.timeout_s,
                keep_text=self.counter is not None or cfg.workload == "sessions",  # a session resends replies
                idle_timeout_s=cfg.idle_timeout_s,
                server_token_times=cfg.server_token_times,
            )
        except ValueError as exc:
            raise ConfigError(
                str(exc), hint="--url takes the server's base URL, e.g. http://127.0.0.1:8000"
            ) from exc
        self.metrics_client = Client(cfg.url, api_key=cfg.api_key, timeout_s=10)
        self.warnings: list[str] = []
        if self.trace is not None and self.trace.skipped:
            self.warnings.append(
                f"{self.trace.skipped} rows of the trace have a zero length and are not replayed"
            )
        self.repo = BenchRepo(store)
        self.levels: list[Level] = []
        self.status = "completed"
        self.early_stop = False  # open-loop levels stop sending when clearly over-saturated
        self.run_id, self.uid = 0, ""

    def close(self) -> None:
        self.client.close()
        self.metrics_client.close()

    async def start(self, specs: list[LevelSpec], most: int | None = None) -> None:
        """Probe, build the workload (its pool sized for `specs`, the levels expected, and at most `most`
        prompts) and store the run."""
        cfg, counter, warnings = self.cfg, self.counter, self.warnings
        self.caps = caps = await probe(self.client, cfg, warnings)
        fit = None
        if counter is None:
            fit = await calibrate_tokens_per_word(self.client, cfg, caps)
            if fit is None and counter is None:
                warnings.append(
                    "no tokenizer and no usage from the server: input lengths are counted in words"
                )
        # Duration-bound levels cycle through a pool of prompts; a pool big enough that a repeat (and
        # with it a prefix-cache hit that would flatter TTFT) is rare, and a warning when it happens.
        count = cfg.num_requests or max(
            [spec.num_requests or 0 for spec in specs]
            + [
                2048 if cfg.duration_s else 0,
                int(max(spec.value for spec in specs) * (cfg.duration_s or 0) * 1.5),
            ]
        )
        if most is not None:
            count = min(count, most)
        # Sessions build their conversations per level (each turn waits for the reply before it);
        # every other workload is one pool of prepared requests.
        self.plans: list[SE.SessionPlan] = []
        # Every request against the server's context, before anything is sent (bench/fit.py).
        overhead, per_word = (round(fit[0]), fit[1]) if fit else (0, 1.0)
        counting = W._counting(counter, fit is not None)
        limit, fitted = caps.max_model_len, None
        if limit is not None and self.trace is not None:
            self.trace, fitted = F.fit_trace(self.trace, limit, overhead, cfg.over_context, counting)
        if cfg.workload == "sessions":
            self.plans = [
                SE.plan_for_level(cfg, int(sp.value), li, counter, fit) for li, sp in enumerate(specs)
            ]
            self.wl = wl = SE.workload_of(self.plans, counter, fit is not None)
            if limit is not None:
                fitted = F.fit_sessions(self.plans, limit, overhead, counting)
        else:
            self.wl = wl = await build_workload(
                cfg, counter, fit, pool_size(cfg, count), cfg.seed, self.trace
            )
            if limit is not None and self.trace is None:
                self.wl, fitted = F.fit_workload(wl, limit, overhead, cfg.over_context, counter, per_word)
                wl = self.wl
        if fitted is not None and (said := fitted.warning()) is not None:
            warnings.append(said)
        warm_wl = await build_workload(cfg, counter, fit, 16, cfg.seed + 104729)
        if cfg.workload == "sharegpt" or self.trace is not None:
            warm_wl = W.synthetic(16, W.LengthSpec(64), W.LengthSpec(16), cfg.seed + 104729, counter)
        self.prepared = await prepare_requests(self.client, cfg, caps, wl) if not self.plans else []
        self.warm = await prepare_requests(self.client, cfg, caps, warm_wl)
        context = (await learn_context(self.metrics_client, caps)).merged(cfg.context)
        if context.path.via is None:
            context = context.merged(RunContext(path=await direct_path(cfg.url)))
        self.context = context
        self.gpus = await source_for(self.metrics_client, cfg.url, context)
        # the GPUs' power before the first level (the energy's idle baseline), and the run's price
        self.idle_w = await idle_power(self.gpus) if self.gpus is not None else None
        self.price = price_for(cfg, context)
        config = (
            cfg.model_dump(exclude={"context"})
            | {
                "workload_info": wl.describe(),
                "capabilities": caps.__dict__,
                "tokens_per_word_fit": fit,
            }
            | ({"trace_info": T.describe(self.trace)} if self.trace is not None else {})
            | ({"context_fit": asdict(fitted)} if fitted is not None else {})
        )
        self.run_id, self.uid = self.repo.create_run(cfg.url, cfg.model, cfg.api, config, wl.hash, context)
        self.repo.set_run_info(self.run_id, warnings=warnings)
        self.notify(RunStarted(self.uid, len(specs), wl.describe(), warnings, context.clock.time_base))
        self.make = RecordMaker(counter)

    async def run_level(self, spec: LevelSpec) -> Level:
        """Measure one more level of the run (stored as it goes); `self.status` turns `failed` when
        every request of it failed (nothing was measured, so the caller should stop)."""
        level = await run_one_level(
            self.client,
            self.metrics_client,
            self.repo,
            self.run_id,
            len(self.levels),
            spec,
            self.cfg,
            self.prepared,
            self.warm,
            self.make,
            self.slo,
            self.notify,
            self.context.clock.speed,
            early_stop=self.early_stop,
            gpus=self.gpus,
            plan=self.plans[len(self.levels)] if self.plans else None,
            caps=self.caps,
            idle_w=self.idle_w,
            price=self.price,
            context=self.context,
        )
        self.levels.append(level)
        if level.saturation is not None and level.saturation.saturated:
            who = "the server" if level.saturation.server_saturated else "the client"
            self.warnings.append(
                f"level {spec.label}: {who} could not keep up, not a steady state (its latencies are a "
                f"growing queue's): " + "; ".join(level.saturation.reasons)
            )
        failure = all_failed(level)
        if failure is not None:
            self.status = "failed"
            self.warnings.append(failure)
        return level

    async def drive(self, body: Callable[[BenchSession], Awaitable[None]]) -> BenchResult:
        """Run `body(self)` and finish the run: interrupted (Ctrl-C), failed (anything raised, or every
        request of a level failed) or completed."""
        levels_out, warnings, repo, run_id, uid = self.levels, self.warnings, self.repo, self.run_id, self.uid
        try:
            await body(self)
        except asyncio.CancelledError:
            repo.set_run_info(run_id, warnings=warnings)
            repo.finish_run(run_id, "interrupted", [lv.wall for lv in levels_out])
            raise Interrupted(
                f"benchmark interrupted; run {uid} keeps every request that had finished",
                hint=f"`servelab runs show {uid}` shows what was measured.",
                run_uid=uid,
            ) from None
        except BaseException:
            # Never leave a run `running`: whatever stopped it, the store says it failed.
            repo.set_run_info(run_id, warnings=warnings)
            repo.finish_run(run_id, "failed", [lv.wall for lv in levels_out])
            raise
        repeated = sum(lv.wall.prompts_repeated for lv in levels_out)
        if repeated:
            warnings.append(
                f"{repeated} requests reused a prompt of the pool of {len(self.prepared)} (at most {POOL_MAX:,} "
                f"prompts or {POOL_TOKENS:,} tokens are built): a server with prefix caching may answer "
                "those faster; give fewer --num-requests or a shorter --duration"
            )
        checks = [lv.wall.tokenizer_crosscheck for lv in levels_out if lv.wall.tokenizer_crosscheck]
        checked = sum(c.checked for c in checks)
        disagree = sum(c.disagree for c in checks)
        if disagree:
            warnings.append(
                f"for {disagree} of {checked} requests the tokenizer's count of the streamed text "
                "disagrees with the server's usage by more than one token: the server streams text "
                "that is not the generated tokens, or --tokenizer is not the server's tokenizer"
            )
        if self.cfg.server_token_times and not self.client.server_timed:
            warnings.append(
                "--token-clock server: the server stamped no token times of its own (only `servelab sim` "
                "does), so the client's clock timed every token"
            )
        repo.set_run_info(run_id, warnings=warnings)
        repo.finish_run(run_id, self.status, [lv.wall for lv in levels_out])
        self.notify(RunFinished(uid, self.status))
        return BenchResult(
            run_id,
            uid,
            self.status,
            levels_out,
            warnings,
            self.wl.describe(),
            self.caps.__dict__,
            self.context,
        )


async def run_bench(cfg: BenchConfig, store: Store, observe: BenchObserver | None = None) -> BenchResult:
    """Run every level of `cfg` against the server and store each request as it finishes."""
    session = BenchSession(cfg, store, observe)
    try:
        specs = cfg.level_specs(session.trace)
        await session.start(specs)
        if session.trace is not None:  # its rows over the context may have been skipped
            specs = cfg.level_specs(session.trace)

        async def fixed(s: BenchSession) -> None:
            for li, spec in enumerate(specs):
                await s.run_level(spec)
                if s.status == "failed":
                    # Nothing was measured; the levels after it would only repeat the failure.
                    skipped = len(specs) - li - 1
                    if skipped:
                        s.warnings[-1] += f"; the {skipped} later levels were not run"
                    break

        return await session.drive(fixed)
    finally:
        session.close()


CAPACITY_POOL = 1024


async def find_capacity(
    cfg: BenchConfig,
    store: Store,
    search: C.SearchSpec,
    slo: C.CapacitySLO,
    observe: BenchObserver | None = None,
) -> tuple[BenchResult, CapacityResult]:
    """`bench --find-capacity`: probe loads chosen by `capacity.decide` as levels of one run, until the
    search stops; the result (stored with the run after every probe) gives the capacity and its curve."""
    session = BenchSession(cfg, store, observe)
    session.early_stop = True
    probes: list[CapacityProbe] = []
    found = C.result(search, slo, probes, "not started")
    try:
        # The pool is sized for the first probes (a prompt costs ~2 ms per 1k tokens to build, and the
        # search's highest load is not known ahead); larger probes cycle through it, with the warning.
        reach = min(search.highest, search.start * search.growth**2)
        await session.start([_spec(cfg, search.by, reach)], most=CAPACITY_POOL)
        speed = session.context.clock.speed

        async def searching(s: BenchSession) -> None:
            nonlocal found
            while True:
                decision = C.decide(search, probes, slo)
                if decision.load is None:
                    found = C.result(search, slo, probes, decision.reason, speed)
                    break
                s.notify(ProbeStarted(decision.load, decision.reason))
                level = await s.run_level(_spec(cfg, search.by, decision.load))
                records = s.repo.requests(s.repo.level_ids(s.run_id)[level.index])
                probe_ = C.verdict(decision.load, level.index, records, slo, speed, level.saturation)
                probes.append(probe_)
                found = C.result(search, slo, probes, "running", speed)
                s.repo.set_capacity(s.run_id, found)
                s.notify(ProbeFinished(probe_.model_dump(mode="json")))
                if s.status == "failed":
                    found = C.result(search, slo, probes, "every request of a probe failed", speed)
                    break
            s.repo.set_capacity(s.run_id, found)

        try:
            res = await session.drive(searching)
        except Interrupted:
            session.repo.set_capacity(session.run_id, C.result(search, slo, probes, "interrupted", speed))
            raise
        except BaseException as exc:
            why = f"failed: {type(exc).__name__}: {exc}"[:300]
            session.repo.set_capacity(session.run_id, C.result(search, slo, probes, why, speed))
            raise
        return res, found
    finally:
        session.close()


def _spec(cfg: BenchConfig, by: str, load: float) -> LevelSpec:
    """A capacity probe's level: the run's sizing (requests, duration or requests per stream) at `load`."""
    return LevelSpec(
        by,
        load,
        cfg.level_requests(load) if by == "concurrency" else cfg.num_requests,
        cfg.duration_s,
        cfg.max_concurrency,
        cfg.arrival,
        cfg.burstiness,
    )

"""One trial of one candidate: launch → ready → effective config → verify → bench → teardown.

The one place this pipeline lives; `servelab tune` runs it for every candidate and repeat, `servelab deploy
--install` runs its verify and bench steps against the unit systemd started:

    trial = Trial(study, engine, store, observer)
    outcome = await trial.run(settings, marker, log_path, startup_timeout_s, baseline=levels)
    # a server someone else started (an external endpoint, a systemd unit), never stopped by us:
    outcome = await trial.attach(Target(url, served_model), settings, ready_s=0.0)
    result, run = await trial.verify(target), await trial.bench(target, [4.0])

Each step tells the `TrialObserver` what it found before the next step starts (a study stores each, so a
`kill -9` at any point leaves a store that `tune --resume` can continue from). The server is launched and
torn down by `lifecycle.serving.serving()`: the teardown always runs (in a thread, off the event loop), also on
Ctrl-C, and its report is on the outcome.

Typed at the seams: `Target` (the server a step talks to), `AppliedCheck` (requested vs effective),
`LevelResult` / `BenchRun` (the load levels), `Finding` (why a trial failed) and `TrialOutcome`. A level's
numbers are `results.LevelSummary.digest()` (`Digest`, what `analyze` compares), built in one place:
`level_digest` below; every bench run records the study's host, layout and clock (`run_context`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import ValidationError

from servelab import analyze, redact
from servelab.applied import Mismatch, compare
from servelab.bench import capacity as C
from servelab.bench.client import Client
from servelab.bench.config import BenchConfig
from servelab.bench.remote import bench_remote
from servelab.bench.runner import find_capacity, run_bench
from servelab.config import CandidateSpec, Study
from servelab.engines import signatures
from servelab.engines.base import Diagnosis, EffectiveConfig, Engine, LaunchSpec, Settings
from servelab.errors import ConfigError, EngineError, ServerError
from servelab.host import transport
from servelab.host.ports import free_port
from servelab.lifecycle.handle import ServerHandle, TeardownReport
from servelab.lifecycle.serving import serving
from servelab.load import TraceLoad
from servelab.results import Clock, Host, Layout, Level, NetPath, RunContext
from servelab.store.bench import BenchRepo
from servelab.store.db import Store

if TYPE_CHECKING:
    from servelab.verify import VerifyResult

# One load level's numbers, keyed as `LevelSummary.digest` keys them (level, completed, failed,
# output_throughput, tpot_ms_p50, ...), in real-GPU time; a study's stored levels add gpu_power_w, gpu_util,
# bench_run and died (`LevelResult.stored`).
Digest = dict[str, Any]
TrialStatus = Literal["measured", "not_applied", "failed"]
# Where a trial ended: its command could not be built, it did not start, a setting was not applied,
# verify-output failed, the benchmark failed (or the server died in it), or every step passed.
Stage = Literal["command", "place", "start", "applied", "verify", "bench", "done"]
DEATH_CLASSES = ("engine_died_after_ready", "oom_runtime")
TelemetryReader = Callable[[], Awaitable[tuple[float, float] | None]]
TELEMETRY_KEYS = ("gpu_power_w", "gpu_util")


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
    Direct: left to the bench, which times TCP connects to the server (`bench.runner.direct_path`)."""
    if host is None or host.is_local:
        return NetPath()
    times: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        await asyncio.to_thread(host.call, "ping")
        times.append((time.perf_counter() - t0) * 1000.0)
    return NetPath(via="ssh-forward", target=host.name, rtt_ms=round(statistics.median(times), 3))


def run_context(study: Study, settings: Settings, path: NetPath | None = None) -> RunContext:
    """What a trial's bench runs are of, as the study declares it: engine, model config, host, layout,
    formats, and the simulator's clock speed (so its runs are shown in simulated GPU time everywhere)."""
    simulated = study.engine.name == "sim"
    return RunContext(
        engine=study.engine.name,
        personality=settings.options.get("personality"),
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
    """verify_output's arguments: the engine's default reference, then the study's engine.options.verify."""
    kw: dict[str, Any] = {}
    if engine.capabilities.verify_reference:
        kw["reference"] = engine.capabilities.verify_reference
    opts = study.engine.options.get("verify", {})
    if not isinstance(opts, dict):
        raise ConfigError("engine.options.verify must be a table, e.g. { reference = 'hf:PATH' }")
    return kw | opts


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


async def fetch_info(url: str, paths: tuple[str, ...], api_key: str | None = None) -> dict[str, Any] | None:
    """The engine's info endpoints merged (SGLang /get_server_info, vLLM /version); None when none answers."""
    if not paths:
        return None
    client = Client(url, api_key=api_key, timeout_s=10)
    try:
        merged: dict[str, Any] = {}
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


class Telemetry:
    """Samples GPU power/utilization while a level runs (the simulator's endpoint, or nvidia-smi)."""

    def __init__(self, read: TelemetryReader | None) -> None:
        self.read = read
        self.samples: list[tuple[float, float]] = []
        self.task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        assert self.read is not None
        while True:
            with contextlib.suppress(Exception):
                got = await self.read()
                if got:
                    self.samples.append(got)
            await asyncio.sleep(0.1)

    def start(self) -> None:
        self.samples = []
        if self.read is not None:
            self.task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> dict[str, float]:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
        if not self.samples:
            return {}
        # the busiest half of the level (ramp-up and drain excluded)
        top = sorted(self.samples, reverse=True)[: max(1, len(self.samples) // 2)]
        return {
            "gpu_power_w": sum(p for p, _ in top) / len(top),
            "gpu_util": sum(u for _, u in top) / len(top),
        }


def http_telemetry(url: str, path: str) -> TelemetryReader:
    """Reads GPU telemetry an engine serves over HTTP (the simulator's /servelab/gpus)."""
    client = Client(url, timeout_s=5)

    async def read() -> tuple[float, float] | None:
        res = await client.get(path, timeout_s=2.0)
        if not res.ok:
            return None
        gpus = [g for g in orjson.loads(res.body).get("gpus", []) if g.get("processes")]
        if not gpus:
            return None
        return (
            sum(g["power_w"] for g in gpus) / len(gpus),
            sum(g["utilization_pct"] for g in gpus) / len(gpus) / 100,
        )

    return read


# -- the typed seams ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The server a step talks to. `server`: ours (launched by the trial), so its exit means it died;
    `log_path`: its log, read for the effective config and diagnoses (None: not ours to read)."""

    url: str
    served_model: str
    api_key: str | None = None
    server: ServerHandle | None = None
    log_path: Path | None = None


@dataclass(frozen=True)
class Finding:
    """Why a trial failed, as stored (`to_dict`: class, evidence, advice, then fatal, tail and message when
    known: the keys readers of a stored diagnosis know)."""

    klass: str
    evidence: str
    advice: str
    fatal: bool | None = None
    tail: tuple[str, ...] | None = None
    message: str | None = None

    @classmethod
    def of(cls, diag: Diagnosis, message: str | None = None) -> Finding:
        return cls(diag.klass, diag.evidence, diag.advice, diag.fatal, diag.tail or None, message)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"class": self.klass, "evidence": self.evidence, "advice": self.advice}
        if self.fatal is not None:
            d["fatal"] = self.fatal
        if self.tail is not None:
            d["tail"] = list(self.tail)
        if self.message is not None:
            d["message"] = self.message
        return d


@dataclass(frozen=True)
class AppliedCheck:
    """What the candidate asked for against what the engine runs (`applied.compare`)."""

    requested: dict[str, Any]
    effective: EffectiveConfig
    mismatches: list[Mismatch]
    unconfirmed: list[str]  # requested keys the engine does not show

    @property
    def applied(self) -> bool:
        return not self.mismatches


@dataclass
class LevelResult:
    """One load level: its digest, the GPU telemetry sampled meanwhile, and the bench run that measured it."""

    value: float
    digest: Digest  # `level_digest`: the bench summary in real-GPU time
    telemetry: dict[str, float]  # gpu_power_w / gpu_util over the busiest half (empty: no telemetry)
    bench_uid: str
    bench_run_id: int | None
    died: bool = False  # the server died during this level

    def stored(self) -> Digest:
        """The level as a study trial stores it."""
        d = self.digest | self.telemetry | {"bench_run": self.bench_uid}
        if self.died:
            d["died"] = True
        return d

    @classmethod
    def from_stored(cls, d: Digest, bench_run_id: int | None = None) -> LevelResult:
        """A level as `stored` wrote it (one an interrupted trial had measured, kept by a resume)."""
        telemetry = {k: float(d[k]) for k in TELEMETRY_KEYS if d.get(k) is not None}
        digest = {k: v for k, v in d.items() if k not in (*TELEMETRY_KEYS, "bench_run", "died")}
        return cls(
            float(d["level"]), digest, telemetry, str(d["bench_run"]), bench_run_id, bool(d.get("died"))
        )


@dataclass
class BenchRun:
    """The levels a benchmark measured, in order, and why it stopped before the last one (if it did)."""

    levels: list[LevelResult]
    died: bool = False
    stopped_early: str | None = None  # why the remaining levels were skipped

    def stored(self) -> list[Digest]:
        return [lv.stored() for lv in self.levels]


@dataclass
class TrialOutcome:
    """How a trial ended (`status`, at `stage`), what each step found, and what its teardown proved."""

    status: TrialStatus
    stage: Stage
    diagnosis: Finding | None = None
    applied: AppliedCheck | None = None
    verify: VerifyResult | None = None
    levels: list[LevelResult] = field(default_factory=list)
    died: bool = False  # the server died during the benchmark
    ready_s: float | None = None
    teardown: TeardownReport | None = None  # None: nothing of ours ran

    def record(self) -> dict[str, Any]:
        """The outcome as a study stores it for the candidate (and reports it in `trial_finished`)."""
        if self.status == "measured":
            return {}
        if self.status == "not_applied":
            assert self.applied is not None
            return {
                "not_applied": [m.to_dict() for m in self.applied.mismatches],
                "unconfirmed": self.applied.unconfirmed,
            }
        assert self.diagnosis is not None
        if self.stage == "command":  # no command line: stored as the diagnosis itself, as it always was
            return self.diagnosis.to_dict()
        out: dict[str, Any] = {"diagnosis": self.diagnosis.to_dict()}
        if self.died:
            out["died_during_benchmark"] = True
        return out


class TrialObserver:
    """What a trial reports as it goes, each before its next step starts. Every method does nothing here:
    a caller overrides those it records (a study stores each in the trial's row)."""

    def launching(self, launch: LaunchSpec, log_path: Path) -> None:
        """The command line is built (before anything starts)."""

    def launched(self, server: ServerHandle) -> None:
        """The server process started (not ready yet)."""

    def ready(self, url: str, ready_s: float) -> None:
        """The server is ready (an attached one: at once)."""

    def applied(self, check: AppliedCheck) -> None:
        """Requested vs effective configuration."""

    def verified(self, result: VerifyResult) -> None:
        """verify-output's result."""

    def benchmarking(self) -> None:
        """The first load level starts."""

    def bench_event(self, event: str, data: dict[str, Any]) -> None:
        """`run_bench`'s own progress events."""

    def level_done(self, level: LevelResult, levels: list[LevelResult]) -> None:
        """A load level is measured (`levels`: every level so far, this one last)."""

    def stopped_early(self, reason: str) -> None:
        """The remaining levels are skipped (throughput collapsed against the baseline)."""

    def server_died(self, levels: list[LevelResult], diagnosis: Finding) -> None:
        """The server died during the benchmark."""

    def finished(self, outcome: TrialOutcome) -> None:
        """The trial's outcome, before the teardown."""

    def torn_down(self, report: TeardownReport) -> None:
        """The server is stopped, and what the teardown proved."""


# -- the pipeline ------------------------------------------------------------------------------------


class Trial:
    """The steps of a trial for one study and engine; `run` chains them, `attach` skips launch and
    teardown, and each step (`applied_check`, `verify`, `bench`) can be run alone against a `Target`."""

    def __init__(
        self,
        study: Study,
        engine: Engine,
        store: Store,
        observer: TrialObserver | None = None,
        host: transport.Host | None = None,
        *,
        bench_from: str | None = None,
    ) -> None:
        self.study = study
        self.engine = engine
        self.store = store
        self.observer = observer or TrialObserver()
        self.host = host  # None: this machine; an SshHost: the server runs there, we bench through a forward
        # Where the benchmark client runs (`[host] bench_from`); a cluster executor runs it on the node.
        self.bench_from = bench_from or study.host.bench_from

    async def run(
        self,
        settings: Settings,
        marker: str,
        log_path: Path,
        startup_timeout_s: float,
        *,
        baseline: list[Digest] | None = None,
        done: Sequence[LevelResult] = (),
    ) -> TrialOutcome:
        """The whole trial. An engine that launches gets a free port when `settings` leave it 0 and runs
        marked with `marker`, logging to `log_path`; one that does not (an external endpoint) is attached
        to. `baseline`: the baseline candidate's levels, against which a throughput collapse stops early;
        `done`: levels already measured (an interrupted trial's, kept by a resume), not run again."""
        launches = self.engine.capabilities.launches
        if launches and not settings.port:
            port = (
                free_port(settings.host)
                if self.host is None
                else self.host.call("free_port", host=settings.host)
            )
            settings = dataclasses.replace(settings, port=int(port))
        api_key: str | None = None
        try:
            launch = self.engine.command(settings)
            if launches:  # secrets leave the command line (every user reads it) for the environment
                moved = redact.externalize(launch, self.engine.name)
                launch, api_key = moved.spec, moved.api_key
        except ConfigError as exc:
            return self._finish(
                TrialOutcome("failed", "command", Finding("invalid_candidate", exc.message, exc.hint))
            )
        self.observer.launching(launch, log_path)
        t0 = time.monotonic()
        if not launches:
            target = Target(launch.url, launch.served_model, log_path=log_path)
            return await self.attach(
                target, settings, ready_s=time.monotonic() - t0, baseline=baseline, done=done
            )
        return await self._launched(
            launch, settings, marker, log_path, startup_timeout_s, t0, baseline, done, api_key
        )

    async def attach(
        self,
        target: Target,
        settings: Settings,
        *,
        ready_s: float = 0.0,
        baseline: list[Digest] | None = None,
        done: Sequence[LevelResult] = (),
    ) -> TrialOutcome:
        """The trial against a server that is already running and ready (nothing launched, nothing torn
        down): effective config → verify → bench."""
        return self._finish(await self._measure(target, settings, ready_s, baseline, done))

    async def _launched(
        self,
        launch: LaunchSpec,
        settings: Settings,
        marker: str,
        log_path: Path,
        timeout_s: float,
        t0: float,
        baseline: list[Digest] | None,
        done: Sequence[LevelResult],
        api_key: str | None = None,
    ) -> TrialOutcome:
        """`api_key`: the key the server demands (moved from its argv), sent by every request of ours."""
        cpus = settings.options.get("cpus")
        started: list[ServerHandle] = []
        outcome: TrialOutcome | None = None

        def on_launch(server: ServerHandle) -> None:
            started.append(server)
            self.observer.launched(server)

        def on_not_ready(_server: ServerHandle, exc: EngineError) -> None:
            nonlocal outcome
            outcome = self._finish(self._not_started(exc, log_path))

        try:
            async with serving(
                launch,
                log_path,
                marker,
                self.engine.readiness,
                timeout_s,
                engine=self.engine.name,
                api_key=api_key,
                cpus=set(cpus) if cpus else None,
                on_launch=on_launch,
                on_not_ready=on_not_ready,
                host=self.host,
            ) as (server, _ready):
                target = Target(
                    server.url, launch.served_model, api_key=api_key, server=server, log_path=log_path
                )
                ready_s = time.monotonic() - t0
                outcome = self._finish(await self._measure(target, settings, ready_s, baseline, done))
        except EngineError as exc:
            if outcome is None:  # refused before anything started (a busy port, no executable)
                outcome = self._finish(self._not_started(exc, log_path))
        finally:
            report = started[0].teardown_report if started else None
            if report is not None:
                self.observer.torn_down(report)
        outcome.teardown = report
        return outcome

    def _not_started(self, exc: EngineError, log_path: Path) -> TrialOutcome:
        diag = exc.diagnosis if isinstance(exc.diagnosis, Diagnosis) else None
        if diag is None:
            diag = signatures.diagnose(read_log(log_path), self.engine.name)
        return TrialOutcome("failed", "start", Finding.of(diag, exc.message))

    def _finish(self, outcome: TrialOutcome) -> TrialOutcome:
        self.observer.finished(outcome)
        return outcome

    async def _measure(
        self,
        target: Target,
        settings: Settings,
        ready_s: float,
        baseline: list[Digest] | None,
        done: Sequence[LevelResult] = (),
    ) -> TrialOutcome:
        self.observer.ready(target.url, ready_s)
        check = await self.applied_check(target, settings)
        if not check.applied:
            return TrialOutcome("not_applied", "applied", applied=check, ready_s=ready_s)
        stage: Stage = "verify"
        vres = None
        try:
            if self.study.verify_output:
                vres = await self.verify(target)
                if not vres.ok:
                    return TrialOutcome("failed", "verify", _wrong_output(vres), check, vres, ready_s=ready_s)
            stage = "bench"
            path = self._remote_path() if self._remote_url(target) else await measure_path(self.host)
            context = run_context(self.study, settings, path)
            run = await self.bench(target, baseline=baseline, context=context, done=done)
        except (ServerError, EngineError) as exc:
            if self.host is not None:
                self.host.check()  # a dropped link is no finding about the server
            # The server stopped answering (hung, died, refused): a finding about this candidate, not a
            # reason to stop the study.
            found = Finding.of(signatures.diagnose(read_log(target.log_path), self.engine.name), exc.message)
            if found.klass == "unknown":
                found = Finding(
                    "server_unresponsive",
                    exc.message,
                    "the server became ready but then stopped answering; see its log",
                    tail=found.tail or (),
                    message=exc.message,
                )
            return TrialOutcome("failed", stage, found, check, vres, ready_s=ready_s)
        if run.died:
            found = Finding.of(signatures.diagnose(read_log(target.log_path), self.engine.name))
            self.observer.server_died(run.levels, found)
            return TrialOutcome("failed", "bench", found, check, vres, run.levels, True, ready_s)
        return TrialOutcome("measured", "done", None, check, vres, run.levels, ready_s=ready_s)

    # -- the steps -----------------------------------------------------------------------------------
    async def applied_check(self, target: Target, settings: Settings) -> AppliedCheck:
        """What runs, against what `settings` asked for (the log and the engine's info endpoints)."""
        info = await fetch_info(target.url, self.engine.info_paths(), target.api_key)
        eff = self.engine.effective_config(read_log(target.log_path), info)
        req = self.engine.requested(settings)
        mism, unconfirmed = compare(req, eff.effective, eff.evidence)
        check = AppliedCheck(req, eff, mism, unconfirmed)
        self.observer.applied(check)
        return check

    async def verify(self, target: Target) -> VerifyResult:
        """verify-output with the study's API and the engine's/study's reference; raises ServerError when
        the server cannot be used at all."""
        from servelab.verify import verify_output

        kw = verify_kwargs(self.study, self.engine)
        if target.api_key is not None:
            kw["api_key"] = target.api_key
        result = await verify_output(target.url, target.served_model, api=self.study.workload.api, **kw)
        self.observer.verified(result)
        return result

    async def bench(
        self,
        target: Target,
        levels: Sequence[float] | None = None,
        *,
        baseline: list[Digest] | None = None,
        context: RunContext | None = None,
        done: Sequence[LevelResult] = (),
    ) -> BenchRun:
        """Every load level in turn (the study's, or `levels`), one stored bench run each, with GPU
        telemetry where the engine serves it; stops early when the server dies or the throughput has
        collapsed against `baseline` at `anomalies.stop_after_collapses` levels. Levels in `done` (measured
        before a kill) are kept as they are and count towards the collapses as if just measured."""
        self.observer.benchmarking()
        remote_url = self._remote_url(target)
        if remote_url is not None and (context is None or context.path.via != "remote"):
            context = (context or RunContext()).model_copy(update={"path": self._remote_path()})
        url = remote_url or target.url
        base_cfg = bench_config(self.study, url, target.served_model, target.api_key, context)
        if self.study.objective_type().searches_capacity:
            return await self._capacity(base_cfg.model_copy(update={"url": target.url}), target)
        path = self.engine.capabilities.telemetry_path
        tele = Telemetry(http_telemetry(target.url, path) if path else None)
        spec = self.study.anomalies
        kept = {float(lv.value): lv for lv in done}
        measured: list[LevelResult] = []
        collapses = 0
        for value in self.study.load.levels if levels is None else levels:
            if float(value) in kept:
                level = kept[float(value)]
                measured.append(level)
                if self._collapsed(level, baseline):
                    collapses += 1
                    if spec.stop_after_collapses and collapses >= spec.stop_after_collapses:
                        return BenchRun(measured, stopped_early=self._stop_early(collapses))
                continue
            cfg = base_cfg.model_copy(update={"levels": [value]})
            if isinstance(self.study.load_kind(), TraceLoad):  # a trace's level is its time scale
                cfg = cfg.model_copy(update={"time_scale": float(value)})
            tele.start()
            try:
                if remote_url is not None and self.host is not None:
                    res = await bench_remote(self.host, cfg, self.store, self.observer.bench_event)
                else:
                    res = await run_bench(cfg, self.store, self.observer.bench_event)
            finally:
                power = await tele.stop()
            digest = level_digest(res.levels[0], res.context.clock)
            level = LevelResult(value, digest, power, res.uid, bench_run_id(self.store, res.uid))
            if self.host is not None and digest["failed"]:
                self.host.check()  # failed requests: the link, or the server?
            died = target.server is not None and target.server.exit_code() is not None
            if not died and digest["failed"]:
                text = read_log(target.log_path)
                died = signatures.diagnose(text, self.engine.name).klass in DEATH_CLASSES
            level.died = died
            measured.append(level)
            self.observer.level_done(level, measured)
            if died:
                return BenchRun(measured, died=True)
            if self._collapsed(level, baseline):
                collapses += 1
                if spec.stop_after_collapses and collapses >= spec.stop_after_collapses:
                    return BenchRun(measured, stopped_early=self._stop_early(collapses))
        return BenchRun(measured)

    async def _capacity(self, cfg: BenchConfig, target: Target) -> BenchRun:
        """objective = "capacity": one capacity search (its probes the levels of one bench run, driven from
        here), stored as one level at the capacity found, with the search's answer in its digest."""
        ld = self.study.load
        # a capacity study loads by concurrency or rate (the study refuses a trace)
        by: Literal["concurrency", "rate"] = "concurrency" if self.study.load_kind().closed_loop else "rate"
        search = C.SearchSpec(by=by, start=min(ld.levels), resolution=ld.resolution, max_probes=ld.max_probes)
        slo = C.parse_capacity_slo(self.study.slo.capacity_slo())
        res, found = await find_capacity(cfg, self.store, search, slo, self.observer.bench_event)
        at = next((lv for lv in res.levels if lv.value == found.capacity), None)
        at = at or (res.levels[0] if res.levels else None)
        if at is None:
            raise ServerError("the capacity search measured nothing")
        digest = level_digest(at, res.context.clock) | {
            "capacity": found.capacity,
            "capacity_step": found.step,
            "capacity_bracket": list(found.bracket),
            "capacity_probes": len(found.probes),
            "capacity_stop": found.stop_reason,
        }
        level = LevelResult(at.value, digest, {}, res.uid, bench_run_id(self.store, res.uid))
        level.died = target.server is not None and target.server.exit_code() is not None
        measured = [level]
        self.observer.level_done(level, measured)
        return BenchRun(measured, died=level.died)

    def _remote_url(self, target: Target) -> str | None:
        """With `[host] bench_from = "remote"` and a server of ours over SSH: its URL over there, where the
        benchmark then runs (None: the benchmark runs here, through the forward in `target.url`)."""
        if self.bench_from != "remote" or self.host is None or self.host.is_local:
            return None
        return target.server.remote_url if target.server is not None else None

    def _remote_path(self) -> NetPath:
        """How a benchmark run on the remote reaches the server; its rtt is measured over there."""
        assert self.host is not None
        return NetPath(via="remote", target=self.host.name)

    def _collapsed(self, level: LevelResult, baseline: list[Digest] | None) -> bool:
        return bool(baseline) and any(
            a.kind == "throughput_collapse"
            for a in analyze.anomalies([level.stored()], baseline, self.study.anomalies)
        )

    def _stop_early(self, collapses: int) -> str:
        reason = f"throughput collapsed at {collapses} levels against the baseline; the remaining levels are skipped"
        self.observer.stopped_early(reason)
        return reason


def _wrong_output(vres: VerifyResult) -> Finding:
    failed = [
        c
        for c in vres.to_dict().get("checks", [])
        if not c.get("ok") and c.get("severity", "error") == "error"
    ]
    return Finding(
        "wrong_output",
        orjson.dumps(failed[:3]).decode()[:2000],
        "the server answers, but not correctly: check the weights, the quantization "
        "kernels and the tokenizer (`servelab verify-output` shows each check)",
    )

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

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import orjson

from servelab import analyze, redact
from servelab.applied import compare
from servelab.bench import capacity as C
from servelab.bench.config import BenchConfig
from servelab.bench.remote import bench_remote
from servelab.bench.runner import find_capacity, run_bench
from servelab.config.study import Study
from servelab.engines import signatures
from servelab.engines.base import Diagnosis, Engine, LaunchSpec, Settings
from servelab.engines.startup import cache_at_launch, with_launch
from servelab.errors import ConfigError, EngineError, ServerError
from servelab.host import transport
from servelab.host.ops import FREE_PORT, FreePortRequest
from servelab.host.ports import free_port
from servelab.lifecycle.handle import ServerHandle
from servelab.lifecycle.serving import serving
from servelab.load import TraceLoad
from servelab.results import NetPath, RunContext
from servelab.startup import StartupPhases
from servelab.store.db import Store
from servelab.trial.outcome import (
    DEATH_CLASSES,
    AppliedCheck,
    BenchRun,
    Digest,
    Finding,
    LevelResult,
    Stage,
    Target,
    TrialObserver,
    TrialOutcome,
)
from servelab.trial.prepare import (
    bench_config,
    bench_run_id,
    fetch_info,
    level_digest,
    measure_path,
    read_log,
    run_context,
    verify_kwargs,
)
from servelab.trial.telemetry import Telemetry, http_telemetry

if TYPE_CHECKING:
    from servelab.verify import VerifyResult


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
                else FREE_PORT.call(self.host, FreePortRequest(host=settings.host))
            )
            settings = dataclasses.replace(settings, port=port)
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
        cpus = settings.cpus
        started: list[ServerHandle] = []
        outcome: TrialOutcome | None = None

        def on_launch(server: ServerHandle) -> None:
            started.append(server)
            self.observer.launched(server)

        def on_not_ready(_server: ServerHandle, exc: EngineError) -> None:
            nonlocal outcome
            outcome = self._finish(self._not_started(exc, log_path))

        # The compile cache as this launch finds it (on this machine; elsewhere only the log can tell).
        cache = cache_at_launch(self.engine.name, {**os.environ, **launch.env}) if self.host is None else None

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
            ) as (server, ready):
                target = Target(
                    server.url, launch.served_model, api_key=api_key, server=server, log_path=log_path
                )
                ready_s = time.monotonic() - t0
                startup = with_launch(ready.startup, cache) if ready.startup is not None else None
                if startup is not None:
                    self.observer.startup(startup)
                over = self._over_bound(startup, ready_s)
                if over is not None:
                    self.observer.ready(target.url, ready_s)
                    outcome = self._finish(TrialOutcome("failed", "start", over, ready_s=ready_s))
                else:
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

    def _over_bound(self, startup: StartupPhases | None, ready_s: float) -> Finding | None:
        """The study's `[slo] max_startup_s`, failed: a finding about the candidate (not measured)."""
        bound = self.study.slo.max_startup_s
        took = startup.total_s if startup is not None and startup.total_s is not None else ready_s
        if bound is None or took <= bound:
            return None
        phases = f"; {startup.summary()}" if startup is not None else ""
        return Finding(
            "startup_over_bound",
            f"ready after {took:.1f} s, over [slo] max_startup_s = {bound:g} s{phases}",
            "start-up is slower than the study allows: look at its slowest phase (a cold compile cache, "
            "CUDA-graph capture, weight loading) or raise [slo] max_startup_s",
        )

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
    failed = [c.to_dict() for c in vres.failures]
    return Finding(
        "wrong_output",
        orjson.dumps(failed[:3]).decode()[:2000],
        "the server answers, but not correctly: check the weights, the quantization "
        "kernels and the tokenizer (`servelab verify-output` shows each check)",
    )

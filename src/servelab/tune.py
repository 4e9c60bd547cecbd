"""`servelab tune`: run a study — launch each candidate, check what really runs, verify, measure, rank.

The loop engineers ran by hand for days. Every step is in the store before the next begins, so a study
stopped at any point (Ctrl-C, `kill -9`, a reboot) resumes where it stopped: finished candidates are not
redone, recorded failures are not retried unless asked, and the processes of the interrupted trial are
found by their SERVELAB_RUN marker and ended first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from servelab import analyze
from servelab.applied import compare
from servelab.bench.client import Client
from servelab.bench.config import BenchConfig
from servelab.bench.runner import run_bench
from servelab.config import CandidateSpec, Study
from servelab.engines import registry
from servelab.engines.base import Engine, Settings
from servelab.errors import ConfigError, EngineError, Interrupted, ServelabError, ServerError
from servelab.host.ports import free_port
from servelab.paths import data_home
from servelab.results import Clock, Host, Layout, RunContext
from servelab.store.db import Store
from servelab.store.studies import StudyRepo

Observer = Callable[[str, dict[str, Any]], None]
MARKER_PREFIX = "servelab-study"
DEATH_CLASSES = ("engine_died_after_ready", "oom_runtime")
# Requested keys that describe where a server runs, not what is being tried: not part of a plan item.
_NOT_PLANNED = ("port", "host", "model", "served_model_name")


@dataclass
class TuneOptions:
    resume: bool = False
    retry_failed: bool = False
    observe: Observer | None = None
    startup_timeout_s: float | None = None  # overrides the study's and the engine's


@dataclass
class StudyOutcome:
    uid: str
    status: str
    candidates: list[dict[str, Any]]
    ranking: dict[str, Any]
    swept: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "study": self.uid,
            "status": self.status,
            "candidates": self.candidates,
            "ranking": self.ranking,
            "orphans_cleaned": self.swept,
        }


def spec_hash(study: Study) -> str:
    return hashlib.sha256(
        orjson.dumps(study.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    ).hexdigest()[:16]


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


def predict_candidate(study: Study, cand: CandidateSpec) -> dict[str, Any] | None:
    """The model's view of a candidate at the study's main level, or None when it does not know the setup."""
    model = study.model.config or study.model.path
    if not study.host.gpu:
        return None
    try:
        from servelab.model.predict import Workload, predict

        main = study.load.main or max(study.load.levels)
        conc = int(main) if study.load.mode == "concurrency" else max(1, int(main))
        p = predict(
            model,
            study.host.gpu,
            study.host.num_gpus,
            Workload(isl=study.workload.input_len, osl=study.workload.output_len, concurrency=conc),
            tp=cand.tp,
            pp=cand.pp,
            ep=cand.ep or 1,
            dp=cand.dp or 1,
            quant=cand.quantization,
            kv_dtype=cand.kv_cache_dtype,
            engine=study.engine.options.get("personality", study.engine.name),
        )
    except ServelabError as exc:
        return {"feasible": False, "reason": exc.message, "known": False}
    except Exception as exc:  # the model's own gaps must not stop a study
        return {"feasible": False, "reason": f"model error: {exc}", "known": False}
    d = p.to_dict()
    return {
        "known": True,
        **{
            k: d.get(k)
            for k in (
                "feasible",
                "reason",
                "tpot_ms",
                "ttft_ms",
                "output_throughput",
                "allreduce_share",
                "single_stream_ceiling_tok_s",
            )
        },
        "concurrency": conc,
    }


def order_candidates(study: Study) -> list[tuple[CandidateSpec, dict[str, Any] | None]]:
    """Most promising first when the model knows the setup (infeasible last); file order otherwise."""
    pairs = [(c, predict_candidate(study, c)) for c in study.candidates]

    def key(item: tuple[int, tuple[CandidateSpec, dict[str, Any] | None]]) -> tuple[int, float, int]:
        i, (_c, p) = item
        if not p or not p.get("known"):
            return (1, 0.0, i)
        if not p.get("feasible"):
            return (2, 0.0, i)
        return (0, -(p.get("output_throughput") or 0.0), i)

    ordered = [pair for _i, pair in sorted(enumerate(pairs), key=key)]
    # The baseline runs first: anomalies of the others are judged against it as they run.
    base = study.baseline_label()
    return sorted(ordered, key=lambda pair: pair[0].label() != base)


def run_context(study: Study, cand: CandidateSpec) -> RunContext:
    """What a candidate's bench runs are of, as the study declares it: engine, model config, host,
    layout, formats, and the simulator's clock speed (so its runs are shown in simulated GPU time)."""
    options = {**study.engine.options, **cand.options}
    speed = float(options.get("speed", 1.0) or 1.0) if study.engine.name == "sim" else 1.0
    return RunContext(
        engine=study.engine.name,
        personality=options.get("personality"),
        model_config=study.model.config or study.model.path,
        host=Host(gpu=study.host.gpu, num_gpus=study.host.num_gpus, source="study"),
        layout=Layout(tp=cand.tp, pp=cand.pp, ep=cand.ep, dp=cand.dp),
        quant=cand.quantization,
        kv_dtype=cand.kv_cache_dtype,
        clock=Clock(speed=speed, source="study") if study.engine.name == "sim" else Clock(),
    )


def bench_config(
    study: Study, url: str, model: str, api_key: str | None = None, context: RunContext | None = None
) -> BenchConfig:
    w, ld = study.workload, study.load
    try:
        return BenchConfig(
            url=url,
            model=model,
            api=w.api,
            mode=ld.mode,
            levels=ld.levels,
            max_concurrency=ld.max_concurrency if ld.mode == "rate" else None,
            num_requests=w.num_requests,
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
            api_key=api_key,
            context=context or RunContext(),
        )
    except ValueError as exc:
        raise ConfigError(f"the study's workload/load cannot be benchmarked: {exc}") from exc


class _Telemetry:
    """Samples GPU power/utilization while a level runs (the simulator's endpoint, or nvidia-smi)."""

    def __init__(self, read: Callable[[], Any] | None) -> None:
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


def _http_telemetry(url: str, path: str) -> Callable[[], Any]:
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


class Tuner:
    def __init__(self, study: Study, store: Store, source: str | None, opts: TuneOptions) -> None:
        self.study = study
        self.store = store
        self.repo = StudyRepo(store)
        self.source = source
        self.opts = opts
        self.engine: Engine = registry.get(study.engine.name)
        self.notify: Observer = opts.observe or (lambda _e, _d: None)

    # -- study bookkeeping ------------------------------------------------------------------------
    def _open(self) -> tuple[int, str, list[dict[str, Any]]]:
        from servelab import lifecycle

        h = spec_hash(self.study)
        if self.opts.resume:
            prev = self.repo.latest_unfinished(self.study.study.name)
            if prev is None:
                raise ConfigError(
                    f"no unfinished study named {self.study.study.name!r} to resume",
                    hint="run without --resume to start it; `servelab runs` lists studies.",
                )
            if prev["spec_hash"] != h:
                raise ConfigError(
                    f"the study file changed since study {prev['uid']} started",
                    hint="resume with the same file, or run without --resume to start a new study.",
                )
            swept = lifecycle.sweep_orphans(f"{MARKER_PREFIX}:{prev['uid']}:")
            self.swept = [s.to_dict() if hasattr(s, "to_dict") else s for s in swept]
            if swept:  # what the killed servers left in /dev/shm, once nothing holds it
                from servelab.host import shm

                shm.remove_orphaned(min_age_s=5)
            for t in self.repo.open_trials(prev["id"]):
                self.repo.update_trial(
                    t["id"], status="interrupted", error="servelab stopped during this trial"
                )
            self.repo.set_study_status(prev["id"], "running")
            self.notify("study_resumed", {"uid": prev["uid"], "orphans": self.swept})
            cands = self.repo.candidates(prev["id"])
            self._fill_plan(prev["uid"], cands)
            return prev["id"], prev["uid"], cands
        sid, uid = self.repo.create_study(
            self.study.study.name, self.source, self.study.model_dump(mode="json"), h
        )
        for idx, (cand, pred) in enumerate(order_candidates(self.study)):
            self.repo.add_candidate(sid, idx, cand.label(), cand.model_dump(mode="json"), pred)
        self.notify("study_started", {"uid": uid, "candidates": len(self.study.candidates)})
        cands = self.repo.candidates(sid)
        self._fill_plan(uid, cands)
        return sid, uid, cands

    async def run(self) -> StudyOutcome:
        self.swept: list[dict[str, Any]] = []
        self._effective: dict[str, Any] | None = None
        self._current: tuple[str, str, int] = ("", "", 0)
        sid, uid, cands = self._open()
        self._sid = sid
        specs = {c.label(): c for c in self.study.candidates}
        try:
            for cand in cands:
                await self._run_candidate(uid, cand, specs[cand["label"]])
        except (asyncio.CancelledError, KeyboardInterrupt, Interrupted):
            for t in self.repo.open_trials(sid):
                self.repo.update_trial(t["id"], status="interrupted", error="interrupted by the user")
                label = next((c["label"] for c in cands if c["id"] == t["candidate_id"]), None)
                if label:
                    self._plan(uid, label, "interrupted", {"trial": t["id"]})
            self.repo.set_study_status(sid, "interrupted")
            raise Interrupted(
                f"study {uid} interrupted; every finished step is stored",
                hint=f"`servelab tune {self.source or 'STUDY.toml'} --resume` continues it.",
            ) from None
        outcome = self.finish(sid, uid)
        self.notify("study_finished", outcome.to_dict())
        return outcome

    def finish(self, sid: int, uid: str) -> StudyOutcome:
        """Combine repeats, flag anomalies against the baseline, rank, and store the result."""
        cands = self.repo.candidates(sid)
        levels_by = {
            c["label"]: analyze.combine_repeats(
                [t["levels"] for t in self.repo.trials(c["id"]) if t["status"] == "measured" and t["levels"]]
            )
            for c in cands
        }
        base_label = self.study.baseline_label()
        baseline = levels_by.get(base_label) or None
        scores = []
        out = []
        for c in cands:
            status = c["status"]
            levels = levels_by[c["label"]]
            flags = analyze.anomalies(
                levels, None if c["label"] == base_label else baseline, self.study.anomalies
            )
            if status == "measured" and flags:
                status = "anomalous"
                self._plan(
                    uid,
                    c["label"],
                    "anomalous",
                    {"run": f"{uid}/{c['label']}", "anomalies": [a.to_dict() for a in flags]},
                )
            outcome = dict(c["outcome"] or {})
            outcome.update({"levels": levels, "anomalies": [a.to_dict() for a in flags]})
            s = analyze.score(c["label"], status, levels, self.study.slo, self.study.objective)
            outcome["score"] = s.to_dict()
            self.repo.set_candidate(c["id"], status, outcome)
            scores.append(s)
            out.append({"label": c["label"], "status": status, "predicted": c["predicted"], **outcome})
        ranking = analyze.rank(scores, self.study.objective)
        result = {"ranking": ranking.to_dict(), "baseline": base_label}
        self.repo.set_study_status(sid, "completed", result)
        return StudyOutcome(uid, "completed", out, ranking.to_dict(), self.swept)

    # -- one candidate ----------------------------------------------------------------------------
    async def _run_candidate(self, uid: str, cand: dict[str, Any], spec: CandidateSpec) -> None:
        trials = self.repo.trials(cand["id"])
        measured = [t for t in trials if t["status"] == "measured"]
        final = [t for t in trials if t["status"] in ("not_applied", "failed")]
        if cand["status"] in ("not_applied",) or (final and not self.opts.retry_failed):
            self.notify("candidate_skipped", {"label": cand["label"], "status": cand["status"]})
            return
        if len(measured) >= self.study.repeats:
            return
        self.repo.set_candidate(cand["id"], "running")
        for repeat in range(len(measured), self.study.repeats):
            status, outcome = await self._trial(uid, cand, spec, repeat)
            if status != "measured":
                self.repo.set_candidate(cand["id"], status, outcome)
                return
        self.repo.set_candidate(cand["id"], "measured", {})

    async def _trial(
        self, uid: str, cand: dict[str, Any], spec: CandidateSpec, repeat: int
    ) -> tuple[str, dict[str, Any]]:
        from servelab import lifecycle
        from servelab.engines import signatures

        label = cand["label"]
        marker = f"{MARKER_PREFIX}:{uid}:{label}:{repeat}"
        tid = self.repo.start_trial(cand["id"], repeat, marker)
        self.notify("trial_started", {"label": label, "repeat": repeat})
        self._current = (uid, label, tid)
        self._effective = None
        self._plan(uid, label, "running", {"trial": tid, "run": f"{uid}/{label}/t{tid}"})
        settings = settings_for(self.study, spec)
        external = not self.engine.capabilities.launches
        server = None
        try:
            if not external:
                port = settings.port or free_port(settings.host)
                settings = settings_for(self.study, spec, port)
            try:
                launch = self.engine.command(settings)
            except ConfigError as exc:
                return self._fail(
                    tid, "failed", {"class": "invalid_candidate", "evidence": exc.message, "advice": exc.hint}
                )
            log_path = data_home() / "logs" / uid / f"{_safe(label)}-r{repeat}.log"
            self.repo.update_trial(
                tid, argv=launch.argv, env=launch.env, url=launch.url, log_path=str(log_path)
            )
            t0 = time.monotonic()
            if not external:
                cpus = settings.options.get("cpus")
                timeout = (
                    self.opts.startup_timeout_s
                    or self.study.engine.startup_timeout_s
                    or self.engine.startup_timeout_s
                )
                try:
                    server = lifecycle.launch(launch, log_path, marker, cpus=set(cpus) if cpus else None)
                    self.repo.update_trial(tid, pid=server.pid)
                    await lifecycle.wait_ready(
                        server, self.engine.readiness, timeout, engine=self.engine.name
                    )
                except EngineError as exc:
                    diag = getattr(exc, "diagnosis", None)
                    if diag is None:
                        diag = signatures.diagnose(_read(log_path), self.engine.name)
                    d = diag.to_dict() if hasattr(diag, "to_dict") else dict(diag)
                    d.setdefault("message", exc.message)
                    return self._fail(tid, "failed", {"diagnosis": d}, diagnosis=d)
            self.repo.update_trial(tid, ready_s=time.monotonic() - t0, status="verifying")
            self.notify("trial_ready", {"label": label, "url": launch.url, "ready_s": time.monotonic() - t0})
            # What runs, against what was asked for.
            info = await _fetch_info(launch.url, self.engine.info_paths())
            eff = self.engine.effective_config(_read(log_path), info)
            req = self.engine.requested(settings)
            mism, unconfirmed = compare(req, eff.effective, eff.evidence)
            self.repo.update_trial(
                tid,
                requested=req,
                effective=eff.to_dict(),
                engine_version=eff.effective.get("version"),
                not_applied=[m.to_dict() for m in mism],
            )
            self._effective = eff.to_dict()
            if mism:
                self.notify("not_applied", {"label": label, "mismatches": [m.sentence() for m in mism]})
                return self._fail(
                    tid,
                    "not_applied",
                    {"not_applied": [m.to_dict() for m in mism], "unconfirmed": unconfirmed},
                )
            try:
                return await self._verify_and_bench(tid, launch, server, label, log_path)
            except (ServerError, EngineError) as exc:
                # The server stopped answering (hung, died, refused): a finding about this candidate,
                # not a reason to stop the study.
                diag = signatures.diagnose(_read(log_path), self.engine.name).to_dict()
                if diag["class"] == "unknown":
                    diag = {
                        "class": "server_unresponsive",
                        "evidence": exc.message,
                        "advice": "the server became ready but then stopped answering; see its log",
                        "tail": diag.get("tail", []),
                    }
                diag.setdefault("message", exc.message)
                return self._fail(tid, "failed", {"diagnosis": diag}, diagnosis=diag)
        finally:
            if server is not None:
                report = lifecycle.teardown(server)
                self.repo.update_trial(
                    tid, teardown=report.to_dict() if hasattr(report, "to_dict") else report
                )
                self.notify(
                    "trial_teardown",
                    {"label": label, "teardown": self.repo.trials(cand["id"])[-1]["teardown"]},
                )

    async def _verify_and_bench(
        self, tid: int, launch: Any, server: Any, label: str, log_path: Path
    ) -> tuple[str, dict[str, Any]]:
        from servelab.engines import signatures

        if self.study.verify_output:
            from servelab.verify import verify_output

            vres = await verify_output(
                launch.url,
                launch.served_model,
                api=self.study.workload.api,
                **_verify_kwargs(self.study, self.engine),
            )
            self.repo.update_trial(tid, verify=vres.to_dict())
            if not vres.ok:
                failed = [
                    c
                    for c in vres.to_dict().get("checks", [])
                    if not c.get("ok") and c.get("severity", "error") == "error"
                ]
                d = {
                    "class": "wrong_output",
                    "evidence": orjson.dumps(failed[:3]).decode()[:2000],
                    "advice": "the server answers, but not correctly: check the weights, the quantization "
                    "kernels and the tokenizer (`servelab verify-output` shows each check)",
                }
                return self._fail(tid, "failed", {"diagnosis": d}, diagnosis=d)
        self.repo.update_trial(tid, status="benchmarking")
        levels, died = await self._bench(tid, launch.url, launch.served_model, server, label, log_path)
        if died:
            diag = signatures.diagnose(_read(log_path), self.engine.name).to_dict()
            self.repo.update_trial(tid, levels=levels, diagnosis=diag)
            self.notify("server_died", {"label": label, "diagnosis": diag})
            return self._fail(
                tid, "failed", {"diagnosis": diag, "died_during_benchmark": True}, diagnosis=diag
            )
        self.repo.update_trial(tid, levels=levels, status="measured")
        self._plan_current("measured", {"effective": self._effective})
        return "measured", {}

    def _fail(
        self, tid: int, status: str, outcome: dict[str, Any], diagnosis: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        if diagnosis is not None:
            self.repo.update_trial(tid, diagnosis=diagnosis)
        self.repo.update_trial(tid, status=status)
        self.notify("trial_finished", {"status": status, **outcome})
        self._plan_current(status, {"effective": self._effective, **outcome})
        return status, outcome

    # -- the plan: one item per candidate, moved as trials run ------------------------------------
    def _fill_plan(self, uid: str, cands: list[dict[str, Any]]) -> None:
        specs = {c.label(): c for c in self.study.candidates}
        rows = []
        for c in cands:
            req = self.engine.requested(settings_for(self.study, specs[c["label"]]))
            own = {k: v for k, v in req.items() if k not in _NOT_PLANNED}
            rows.append((c["label"], (c["predicted"] or {}).get("output_throughput"), own))
        from servelab.store import plans

        self._plan_call(lambda: plans.fill_from_study(self.store, uid, rows))

    def _plan(self, uid: str, label: str, status: str, evidence: dict[str, Any]) -> None:
        from servelab.store import plans

        self._plan_call(lambda: plans.on_trial(self.store, uid, label, status, evidence))

    def _plan_current(self, status: str, evidence: dict[str, Any]) -> None:
        uid, label, tid = self._current
        ref = {"trial": tid, "run": f"{uid}/{label}/t{tid}"}
        self._plan(uid, label, status, {**ref, **{k: v for k, v in evidence.items() if v is not None}})

    def _plan_call(self, fn: Callable[[], Any]) -> None:
        """Plan bookkeeping never stops a study; a refusal is reported and the study goes on."""
        try:
            fn()
        except ServelabError as exc:
            self.notify("plan_warning", {"message": exc.message})

    async def _bench(
        self, tid: int, url: str, model: str, server: Any, label: str, log_path: Path
    ) -> tuple[list[dict[str, Any]], bool]:
        """Every load level in turn (one stored bench run each); stops early when the server dies or the
        throughput has collapsed against the baseline at `anomalies.stop_after_collapses` levels."""
        from servelab.engines import signatures

        spec_ = next(c for c in self.study.candidates if c.label() == label)
        base_cfg = bench_config(self.study, url, model, context=run_context(self.study, spec_))
        path = self.engine.capabilities.telemetry_path
        tele = _Telemetry(_http_telemetry(url, path) if path else None)
        baseline = self._baseline_levels(label)
        spec = self.study.anomalies
        digests: list[dict[str, Any]] = []
        collapses = 0

        def observe(event: str, data: dict[str, Any]) -> None:
            self.notify(f"bench_{event}", {"label": label, **data})

        for value in self.study.load.levels:
            cfg = base_cfg.model_copy(update={"levels": [value]})
            tele.start()
            try:
                res = await run_bench(cfg, self.store, observe)
            finally:
                power = await tele.stop()
            if not digests:
                self.repo.update_trial(tid, bench_run_id=_run_id(self.store, res.uid))
            # The run records its clock: its summary is already in the (simulated) GPU's time.
            d = res.levels[0].summary.digest() | power | {"bench_run": res.uid}
            if res.context.clock.simulated:
                d["time_scale"] = res.context.clock.speed
            died = server is not None and server.exit_code() is not None
            if not died and d["failed"]:
                died = signatures.diagnose(_read(log_path), self.engine.name).klass in DEATH_CLASSES
            if died:
                d["died"] = True
            digests.append(d)
            self.repo.update_trial(tid, levels=digests)
            self.notify("level_done", {"label": label, "digest": d})
            if died:
                return digests, True
            if baseline and any(
                a.kind == "throughput_collapse" for a in analyze.anomalies([d], baseline, spec)
            ):
                collapses += 1
                if spec.stop_after_collapses and collapses >= spec.stop_after_collapses:
                    self.notify(
                        "stopped_early",
                        {
                            "label": label,
                            "reason": f"throughput collapsed at {collapses} "
                            "levels against the baseline; the remaining levels are skipped",
                        },
                    )
                    break
        return digests, False

    def _baseline_levels(self, label: str) -> list[dict[str, Any]] | None:
        """The baseline candidate's measured levels (None for the baseline itself or before it ran)."""
        base = self.study.baseline_label()
        if label == base:
            return None
        for c in self.repo.candidates(self._sid):
            if c["label"] == base:
                measured = [
                    t["levels"]
                    for t in self.repo.trials(c["id"])
                    if t["status"] == "measured" and t["levels"]
                ]
                return analyze.combine_repeats(measured) if measured else None
        return None


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.=" else "_" for ch in label)[:120]


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _run_id(store: Store, uid: str) -> int | None:
    row = store.conn.execute("SELECT id FROM bench_runs WHERE uid = ?", (uid,)).fetchone()
    return int(row[0]) if row else None


async def _fetch_info(url: str, paths: tuple[str, ...]) -> dict[str, Any] | None:
    if not paths:
        return None
    client = Client(url, timeout_s=10)
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


def _verify_kwargs(study: Study, engine: Engine) -> dict[str, Any]:
    """verify_output's arguments: the engine's default reference, then the study's engine.options.verify."""
    kw: dict[str, Any] = {}
    if engine.capabilities.verify_reference:
        kw["reference"] = engine.capabilities.verify_reference
    opts = study.engine.options.get("verify", {})
    if not isinstance(opts, dict):
        raise ConfigError("engine.options.verify must be a table, e.g. { reference = 'hf:PATH' }")
    return kw | opts


async def tune(study: Study, store: Store, source: str | None, opts: TuneOptions) -> StudyOutcome:
    return await Tuner(study, store, source, opts).run()

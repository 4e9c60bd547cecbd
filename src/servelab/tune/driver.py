"""The study driver: opens (or resumes) a study under its lease, runs each candidate's trials through the
executor, and finishes it (repeats combined, anomalies flagged against the baseline, ranked, stored).

The loop engineers ran by hand for days. Every step is in the store before the next begins, so a study
stopped at any point (Ctrl-C, `kill -9`, a reboot) resumes where it stopped: finished candidates are not
redone, recorded failures are not retried unless asked, the levels an interrupted trial had measured are
kept, and the processes of the interrupted trial are found by their SERVELAB_RUN marker and ended first.

A trial's end and its candidate's status are written in one transaction, so no kill can leave a measured
trial under a candidate still `running`; a resume also repairs that state in stores written before. One
process drives a study at a time (`store.leases`): a resume never touches the servers of a live driver.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from servelab import analyze, naming
from servelab.config.sections import CandidateSpec
from servelab.config.study import Study
from servelab.engines import registry
from servelab.engines.base import Engine
from servelab.errors import ConfigError, HostLost, Interrupted
from servelab.events import (
    CandidateSkipped,
    ExecutorStarted,
    LevelsKept,
    Observer,
    StudyFinished,
    StudyResumed,
    StudyStarted,
    TrialStarted,
)
from servelab.executors.base import Executor, LocalExecutor, Placement
from servelab.host import transport
from servelab.jsontypes import JsonObject, JsonValue
from servelab.paths import data_home
from servelab.store import leases
from servelab.store.bench import BenchRepo
from servelab.store.db import Store
from servelab.store.studies import StoredCandidate, StoredTrial, StudyRepo
from servelab.trial.outcome import LevelResult, TrialOutcome
from servelab.trial.pipeline import Trial
from servelab.trial.prepare import settings_for
from servelab.tune import spread
from servelab.tune.options import StudyOutcome, TuneOptions
from servelab.tune.ordering import order_candidates, predict_candidate, preflight, spec_hash
from servelab.tune.plansync import PlanSync
from servelab.tune.recorder import TrialRecorder, kept_levels, record_of


class Tuner:
    def __init__(self, study: Study, store: Store, source: str | None, opts: TuneOptions) -> None:
        self._t0 = time.monotonic()  # joining a cluster is timed from here (importing Ray included)
        self.study = study
        self.store = store
        self.repo = StudyRepo(store)
        self.source = source
        self.opts = opts
        self.engine: Engine = registry.get(study.engine.name)
        self.notify: Observer = opts.observe or (lambda _e: None)
        self.swept: list[JsonObject] = []  # the interrupted run's processes a resume ended
        self._sid = 0
        self._want: dict[
            str, int
        ] = {}  # an adaptive search's measured trials per candidate (contenders: repeats)
        self._rung: dict[str, int] = {}  # the rung a candidate's next trial runs at (halving)
        self._lease: tuple[int, leases.Owner] | None = None  # (study id, us) while we hold its lease
        target = transport.target_of(opts.host, study.host.ssh)
        # None: this machine. An SSH host runs every server (and its sweep) over there.
        self.host: transport.SshHost | None = (
            transport.SshHost(
                transport.SshTarget.parse(target), python=study.host.python, workdir=study.host.workdir
            )
            if target is not None
            else None
        )
        self.executor = self._executor()
        self.plan = PlanSync(study, store, self.engine, self.notify, self.executor.parallel)

    def _executor(self) -> Executor:
        kind = self.opts.executor or self.study.executor.kind
        if kind == "local":
            return LocalExecutor(self.host)
        if kind != "ray":
            raise ConfigError(f"unknown executor {kind!r}", hint="use --executor local or --executor ray")
        if self.host is not None:
            raise ConfigError(
                "the ray executor places trials on the cluster's nodes; --host / [host] ssh names one box",
                hint="drop one of the two",
            )
        try:
            from servelab.executors.ray import RayExecutor
        except ImportError as exc:
            raise ConfigError(
                f"the ray executor needs Ray, which is not installed here ({exc})",
                hint="pip install 'servelab[ray]' (the same Ray version as the cluster's)",
            ) from None
        return RayExecutor(
            self.opts.ray_address or self.study.executor.address, workdir=self.study.host.workdir
        )

    def repeats_of(self, label: str) -> int:
        """How many measured trials a candidate needs: the study's repeats; on a cluster the baseline also
        runs on `executor.baseline_nodes` different nodes, to measure the node-to-node spread."""
        if self.study.adaptive:  # one trial each while searching; the contenders get the repeats
            return self._want.get(label, 1)
        if self.executor.parallel and label == self.study.baseline_label():
            return max(self.study.repeats, self.study.executor.baseline_nodes)
        return self.study.repeats

    def set_rung(self, label: str, rung: int) -> None:
        """The rung a candidate's next trial runs at (the search's halving; rung 0: the short benchmark)."""
        self._rung[label] = rung

    def set_repeats(self, label: str, repeats: int) -> None:
        """How many measured trials an adaptive search's candidate needs (`repeats_of`)."""
        self._want[label] = repeats

    def predicted(self, cand: CandidateSpec) -> JsonObject | None:
        """The model's view of a candidate the search proposed (as `order_candidates` stores it)."""
        return predict_candidate(self.study, cand)

    def base_label(self) -> str:
        """The baseline: the study's (marked or first listed); for a search without listed candidates, its
        first candidate (the model's best point), once it is stored."""
        label = self.study.baseline_label()
        if label or not self._sid:
            return label
        cands = self.repo.candidates(self._sid)
        return cands[0].label if cands else ""

    # -- study bookkeeping ------------------------------------------------------------------------
    def _open(self) -> tuple[int, str, list[StoredCandidate]]:
        h = spec_hash(self.study)
        if self.opts.resume:
            prev = self.repo.latest_unfinished(self.study.study.name)
            if prev is None:
                raise ConfigError(
                    f"no unfinished study named {self.study.study.name!r} to resume",
                    hint="run without --resume to start it; `servelab runs` lists studies.",
                )
            if prev.spec_hash != h:
                raise ConfigError(
                    f"the study file changed since study {prev.uid} started",
                    hint="resume with the same file, or run without --resume to start a new study.",
                )
            labels = {c.label() for c in self.study.candidates}
            renamed = [
                c.label
                for c in self.repo.candidates(prev.id)
                # a search's own candidates come from its space, not from the file's list
                if c.label not in labels and ((c.search.origin if c.search else None) or "listed") == "listed"
            ]
            if renamed:  # a servelab whose labels were derived differently started it (same file)
                raise ConfigError(
                    f"study {prev.uid} names candidates this servelab does not derive from the file "
                    f"({', '.join(map(repr, renamed[:3]))})",
                    hint="give those candidates a `name` that matches, finish the study with the servelab "
                    "that started it, or run without --resume to start a new study.",
                )
            # Before anything is swept: the processes of a live driver are not leftovers.
            self._lease = (prev.id, leases.acquire(self.store, prev.id, prev.uid))
            swept = self.executor.sweep(naming.study_markers(prev.uid))
            self.swept = [s.to_dict() for s in swept]
            bench = BenchRepo(self.store)
            for t in self.repo.open_trials(prev.id):
                if t.bench_open:  # the level the kill cut short
                    bench.interrupt_run(t.bench_open)
                self.repo.update_trial(
                    t.id, status="interrupted", error="servelab stopped during this trial", bench_open=None
                )
            self.repo.set_study_status(prev.id, "running")
            self.notify(StudyResumed(prev.uid, self.swept))
            cands = self.repo.candidates(prev.id)
            self.fill_plan(prev.uid, cands)
            return prev.id, prev.uid, cands
        with self.repo.transaction():  # a study never exists without its owner
            sid, uid = self.repo.create_study(
                self.study.study.name, self.source, self.study.model_dump(mode="json"), h
            )
            self._lease = (sid, leases.acquire(self.store, sid, uid))
        listed = order_candidates(self.study) if self.study.candidates else []
        for idx, (cand, pred) in enumerate(listed):
            search = {"origin": "listed", "point": None, "rung": 0} if self.study.adaptive else None
            self.repo.add_candidate(sid, idx, cand.label(), cand.model_dump(mode="json"), pred, search)
        self.notify(
            StudyStarted(
                uid,
                len(self.study.candidates),
                self.study.search.strategy if self.study.adaptive and self.study.search else None,
            )
        )
        cands = self.repo.candidates(sid)
        self.fill_plan(uid, cands)
        return sid, uid, cands

    async def run(self) -> StudyOutcome:
        # the engine flags are checked where the servers will run: this machine or the SSH host (a Ray
        # cluster's nodes are not read yet: only the simulator's flags are checked there)
        preflight(self.study, self.engine, self.host, reachable=not self.executor.parallel)
        self.swept = []
        try:
            await self.executor.start()  # an unusable host or cluster fails before anything is stored
            if self.executor.parallel:
                self.notify(
                    ExecutorStarted(self.executor.kind, self.executor.capacity(), time.monotonic() - self._t0)
                )
            return await self._drive()
        finally:
            if self._lease is not None:
                leases.release(self.store, *self._lease)
                self._lease = None
            await asyncio.to_thread(self.executor.close)

    async def _drive(self) -> StudyOutcome:
        sid, uid, cands = self._open()
        self._sid = sid
        specs = {c.label(): c for c in self.study.candidates}
        try:
            if self.study.adaptive:
                from servelab.search.driver import SearchDriver

                await SearchDriver(self, uid, sid).run()
            elif self.executor.parallel:
                await self._run_parallel(uid, cands, specs)
            else:
                await self._run_rounds(uid, cands, specs)
        except (asyncio.CancelledError, KeyboardInterrupt, Interrupted):
            self._interrupted(sid, uid, cands, "interrupted by the user")
            raise Interrupted(
                f"study {uid} interrupted; every finished step is stored",
                hint=f"`servelab tune {self.source or 'STUDY.toml'} --resume` continues it.",
            ) from None
        except HostLost as exc:  # the link to the GPU box dropped: interrupted, not failed
            self._interrupted(sid, uid, cands, exc.message)
            raise HostLost(
                f"study {uid} interrupted: {exc.message}; every finished step is stored",
                hint=f"once the host is back, `servelab tune {self.source or 'STUDY.toml'} --resume` continues "
                "it (ending first what the interrupted trial left running there).",
            ) from None
        outcome = self.finish(sid, uid)
        self.notify(StudyFinished(outcome.to_dict()))
        return outcome

    async def _run_parallel(
        self, uid: str, cands: list[StoredCandidate], specs: dict[str, CandidateSpec]
    ) -> None:
        """Every candidate at once, in the predicted order: each trial waits for its GPUs (first come,
        first served), so the cluster runs as many as it holds. The first error stops the others (their
        servers torn down) and is raised."""
        tasks = [asyncio.ensure_future(self.run_candidate(uid, c, specs[c.label])) for c in cands]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_rounds(
        self, uid: str, cands: list[StoredCandidate], specs: dict[str, CandidateSpec]
    ) -> None:
        """One machine: the candidates in rounds, each round every candidate's next repeat. A drift of the
        machine between trials (a neighbour's load, heat) then lands in every candidate's spread; with one
        candidate's repeats back to back it would read as a difference between two candidates."""
        ended: set[str] = set()
        for upto in range(1, max((self.repeats_of(c.label) for c in cands), default=0) + 1):
            for cand in cands:
                if cand.label not in ended and await self.run_candidate(uid, cand, specs[cand.label], upto):
                    ended.add(cand.label)

    def _interrupted(self, sid: int, uid: str, cands: list[StoredCandidate], why: str) -> None:
        """Open trials and the study become `interrupted` (a resume redoes those trials)."""
        for t in self.repo.open_trials(sid):
            self.repo.update_trial(t.id, status="interrupted", error=why)
            label = next((c.label for c in cands if c.id == t.candidate_id), None)
            if label:
                self.plan.move(uid, label, "interrupted", {"trial": t.id})
        self.repo.set_study_status(sid, "interrupted")

    def finish(self, sid: int, uid: str) -> StudyOutcome:
        """Combine repeats, flag anomalies against the baseline, rank, and store the result."""
        cands = self.repo.candidates(sid)
        levels_by = {
            c.label: analyze.combine_repeats([t.levels or [] for t in self.scored_trials(c.id)])
            for c in cands
        }
        base_label = self.base_label()
        baseline = levels_by.get(base_label) or None
        scores = []
        out: list[JsonObject] = []
        for c in cands:
            status = c.status
            levels = levels_by[c.label]
            flags = analyze.anomalies(
                levels, None if c.label == base_label else baseline, self.study.anomalies
            )
            if status == "measured" and flags:
                status = "anomalous"
                self.plan.move(
                    uid,
                    c.label,
                    "anomalous",
                    {"run": f"{uid}/{c.label}", "anomalies": [a.to_dict() for a in flags]},
                )
            outcome: JsonObject = dict(c.outcome or {})
            if status == "not_applied":
                self.plan.close_not_applied(uid, c, outcome)
            outcome.update({"levels": list[JsonValue](levels), "anomalies": [a.to_dict() for a in flags]})
            s = analyze.score(c.label, status, levels, self.study.slo, self.study.objective)
            outcome["score"] = s.to_dict()
            self.repo.set_candidate(c.id, status, outcome)
            scores.append(s)
            out.append({"label": c.label, "status": status, "predicted": c.predicted, **outcome})
        samples = spread.samples(self.store, self.study, cands, scores)
        for s, row in zip(scores, out, strict=True):
            hw = analyze.bootstrap_half_width(samples.get(s.label) or [])
            if hw is not None:  # the candidate's ± from its requests too, as its margin is judged
                s.half_width = hw
                row["score"] = s.to_dict()
                self.repo.set_candidate(
                    next(x.id for x in cands if x.label == s.label),
                    str(row["status"]),
                    {k: v for k, v in row.items() if k not in ("label", "status", "predicted")},
                )
        search_view: JsonObject | None = None
        if self.study.adaptive:
            from servelab.search.driver import excluded

            # only the contenders compete (the others ran once: no margin of theirs can be judged), and
            # for halving only those that reached the top rung (the others ran the short benchmark)
            left_out = excluded(self, cands)
            # a candidate left out says so even when no level of its own met the SLOs (its reason kept)
            scores = [
                s
                if s.label not in left_out
                else analyze.Score(
                    s.label,
                    s.status,
                    None,
                    None,
                    None,
                    f"{left_out[s.label]} ("
                    + (f"its value {s.value:,.4g}" if s.value is not None else s.why or "no value")
                    + ")",
                )
                for s in scores
            ]
        ranking = analyze.rank(scores, self.study.objective, samples)
        node_spread = spread.node_spread(self.repo, self.study.objective, cands, scores, base_label)
        ranking = analyze.guard_node_spread(ranking, node_spread, cluster=self.executor.parallel)
        spread.note_nodes(self.repo, cands, out)
        result: JsonObject = {"ranking": ranking.to_dict(), "baseline": base_label}
        if self.study.search is not None:
            from servelab.search.driver import summary

            search_view = summary(self, sid, cands, out, ranking)
            result["search"] = search_view
        self.repo.set_study_status(sid, "completed", result)
        return StudyOutcome(
            uid,
            "completed",
            out,
            ranking.to_dict(),
            self.swept,
            search_view,
            self.study.load_kind().summary(),
        )

    def scored_trials(self, cand_id: int) -> list[StoredTrial]:
        """A candidate's measured trials at its highest rung (`spread.scored_trials`)."""
        return spread.scored_trials(self.repo, cand_id)

    # -- one candidate ----------------------------------------------------------------------------
    async def run_candidate(
        self, uid: str, cand: StoredCandidate, spec: CandidateSpec, upto: int | None = None
    ) -> bool:
        """Run a candidate's missing repeats (the first `upto` of them when given); True once it has ended:
        every repeat measured, or skipped, failed or not applied."""
        trials = self.repo.trials(cand.id)
        rung = self._rung.get(cand.label, 0)
        measured = [t for t in trials if t.status == "measured" and (t.rung or 0) == rung]
        final = [t for t in trials if t.status in ("not_applied", "failed")]
        if cand.status in ("not_applied",) or (final and not self.opts.retry_failed):
            if final and cand.status not in ("not_applied", "failed"):
                # a store written before the two went in one transaction: the trial's end is the truth
                self.repo.set_candidate(cand.id, final[-1].status, record_of(final[-1]))
            self.notify(CandidateSkipped(cand.label, cand.status))
            return True
        repeats = self.repeats_of(cand.label)
        if len(measured) >= repeats:
            if cand.status not in ("measured", "anomalous"):  # as above: repaired, never dropped
                self.repo.set_candidate(cand.id, "measured", {})
            return True
        target = repeats if upto is None else min(upto, repeats)
        if len(measured) >= target:
            return False
        self.repo.set_candidate(cand.id, "running")
        for n in range(len(measured), target):
            # a candidate's trials at every rung have their own repeat numbers (its markers differ)
            repeat = n + sum(1 for t in trials if t.status == "measured" and (t.rung or 0) != rung)
            status, outcome = await self._trial(uid, cand, spec, repeat, trials)
            if status != "measured":
                self.repo.set_candidate(cand.id, status, outcome)
                return True
        if target < repeats:
            return False
        self.repo.set_candidate(cand.id, "measured", {})
        return True

    async def _trial(
        self, uid: str, cand: StoredCandidate, spec: CandidateSpec, repeat: int, before: list[StoredTrial]
    ) -> tuple[str, JsonObject]:
        """One repeat of a candidate, placed by the executor. On a cluster a trial whose node dies is
        marked `lost` and run once more on another node; lost again, it fails with that diagnosis."""
        label = cand.label
        kept, carried = kept_levels(before, repeat)
        gpus = spec.tp * spec.pp * (spec.dp or 1)
        # Repeats on nodes not used yet: a candidate's interval then holds the node-to-node noise too.
        avoid = frozenset(n.id for _, n in spread.node_trials(self.repo, cand.id))
        rung = self._rung.get(label, 0)
        for attempt in (0, 1):
            marker = naming.run_marker(naming.STUDY_MARKER_PREFIX, uid, label, repeat, attempt)
            tid = self.repo.start_trial(
                cand.id, repeat, marker, **carried, **({"rung": rung} if rung else {})
            )
            self.notify(TrialStarted(label, repeat))
            self.plan.move(uid, label, "running", {"trial": tid, "run": f"{uid}/{label}/t{tid}"})
            recorder = TrialRecorder(
                self.repo,
                self.notify,
                self.plan,
                uid,
                tid,
                label,
                cand.id,
                repeat == self.repeats_of(label) - 1,
            )
            unfit = self.executor.fits(gpus)
            if unfit is not None:
                outcome = recorder.place_failed(unfit)
                return outcome.status, outcome.record()
            placed: Placement | None = None
            try:
                async with self.executor.place(gpus, avoid) as placed:
                    recorder.placed(placed)
                    outcome = await self._run_trial(
                        uid, label, tid, repeat, marker, spec, placed, recorder, kept
                    )
                return outcome.status, outcome.record()
            except ConfigError as exc:  # no live node can take it any more
                outcome = recorder.place_failed(exc.message)
                return outcome.status, outcome.record()
            except HostLost as exc:
                if not self.executor.parallel or (placed is not None and not placed.lost_node(exc)):
                    raise  # this machine's link to its one host: the study is interrupted
                node = placed.node if placed is not None else None
                self._close_open_level(cand.id, tid)
                if attempt == 1:
                    failed = recorder.node_failed(exc, node)
                    return failed.status, failed.record()
                recorder.node_lost(exc, node)
                if node is not None:
                    avoid = avoid | {node.id}
                kept, carried = [], {}  # measured on the lost node: the rerun measures afresh
        raise AssertionError("unreachable")

    def _close_open_level(self, cand_id: int, tid: int) -> None:
        """The bench run a lost node's trial was measuring: interrupted, as a resume does for a kill."""
        row = next((t for t in self.repo.trials(cand_id) if t.id == tid), None)
        if row is not None and row.bench_open:
            BenchRepo(self.store).interrupt_run(row.bench_open)

    async def _run_trial(
        self,
        uid: str,
        label: str,
        tid: int,
        repeat: int,
        marker: str,
        spec: CandidateSpec,
        placed: Placement,
        recorder: TrialRecorder,
        kept: list[LevelResult],
    ) -> TrialOutcome:
        log_path = data_home() / "logs" / uid / naming.log_name(label, repeat, tid)
        timeout = (
            self.opts.startup_timeout_s
            or self.study.engine.startup_timeout_s
            or self.engine.startup_timeout_s
        )
        if kept:
            self.notify(LevelsKept(label, [lv.value for lv in kept]))
        settings = settings_for(self.study, spec)
        if placed.bind is not None and settings.host in ("127.0.0.1", "localhost", "::1"):
            settings = dataclasses.replace(settings, host=placed.bind)  # reachable from the driver
        trial = Trial(
            self.study_for(label),
            self.engine,
            self.store,
            recorder,
            placed.host,
            bench_from="remote" if placed.node is not None else None,
        )
        return await trial.run(
            settings,
            marker,
            log_path,
            timeout,
            baseline=self.baseline_levels(label),
            done=kept,
        )

    def study_for(self, label: str) -> Study:
        """The study a candidate's next trial measures: the study itself, or at halving's rung 0 its short
        benchmark (the main level only, a fraction of the requests)."""
        if (
            self._rung.get(label, 0) != 0
            or self.study.search is None
            or self.study.search.strategy != "halving"
        ):
            return self.study
        from servelab.search.driver import short_study

        return short_study(self.study)

    # -- the plan: one item per candidate, moved as trials run ------------------------------------
    def fill_plan(self, uid: str, cands: list[StoredCandidate]) -> None:
        """The plan's items for the study's candidates (`PlanSync.fill`; the search adds its own)."""
        self.plan.fill(uid, cands)

    def baseline_levels(self, label: str) -> list[JsonObject] | None:
        """The baseline candidate's measured levels (None for the baseline itself or before it ran)."""
        base = self.base_label()
        if label == base:
            return None
        for c in self.repo.candidates(self._sid):
            if c.label == base:
                measured = [t.levels for t in self.repo.trials(c.id) if t.status == "measured" and t.levels]
                return analyze.combine_repeats(measured) if measured else None
        return None


async def tune(study: Study, store: Store, source: str | None, opts: TuneOptions) -> StudyOutcome:
    return await Tuner(study, store, source, opts).run()

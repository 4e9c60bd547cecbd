"""`servelab tune`: run a study — launch each candidate, check what really runs, verify, measure, rank.

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
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from servelab import analyze, crashpoint, naming
from servelab.config import CandidateSpec, Study
from servelab.engines import registry
from servelab.engines.base import Engine, LaunchSpec
from servelab.errors import ConfigError, HostLost, Interrupted, ServelabError, UserError
from servelab.executors.base import Executor, LocalExecutor, Placement
from servelab.host import transport
from servelab.lifecycle.handle import ServerHandle, TeardownReport, check_marker
from servelab.paths import data_home
from servelab.plan import TUNE_WORKER
from servelab.results import Node
from servelab.store import leases
from servelab.store.bench import BenchRepo
from servelab.store.db import Store
from servelab.store.studies import StudyRepo
from servelab.trial import (
    AppliedCheck,
    Finding,
    LevelResult,
    Trial,
    TrialObserver,
    TrialOutcome,
    bench_config,
    settings_for,
)

if TYPE_CHECKING:
    from servelab.verify import VerifyResult

__all__ = ["StudyOutcome", "TuneOptions", "Tuner", "order_candidates", "settings_for", "spec_hash", "tune"]

Observer = Callable[[str, dict[str, Any]], None]
# Requested keys that describe where a server runs, not what is being tried: not part of a plan item.
_NOT_PLANNED = ("port", "host", "model", "served_model_name")


@dataclass
class TuneOptions:
    resume: bool = False
    retry_failed: bool = False
    observe: Observer | None = None
    startup_timeout_s: float | None = None  # overrides the study's and the engine's
    host: str | None = None  # --host: overrides $SERVELAB_HOST and the study's [host] ssh
    executor: str | None = None  # --executor: overrides the study's [executor] kind
    ray_address: str | None = None  # --ray-address: overrides [executor] address and $RAY_ADDRESS


@dataclass
class StudyOutcome:
    uid: str
    status: str
    candidates: list[dict[str, Any]]
    ranking: dict[str, Any]
    swept: list[dict[str, Any]] = field(default_factory=list)
    search: dict[str, Any] | None = None  # [search]: strategy, budget, pruned regions, model errors, Pareto
    load: dict[str, Any] | None = None  # the study's load kind: mode, levels, main level, unit

    def to_dict(self) -> dict[str, Any]:
        out = {
            "study": self.uid,
            "status": self.status,
            "candidates": self.candidates,
            "ranking": self.ranking,
            "orphans_cleaned": self.swept,
        }
        if self.load is not None:
            out["load"] = self.load
        if self.search is not None:
            out["search"] = self.search
        return out


def spec_hash(study: Study) -> str:
    return hashlib.sha256(
        # Where the trials run is not what is studied: a study resumes on another executor.
        orjson.dumps(study.model_dump(mode="json", exclude={"executor"}), option=orjson.OPT_SORT_KEYS)
    ).hexdigest()[:16]


def predict_candidate(study: Study, cand: CandidateSpec) -> dict[str, Any] | None:
    """The model's view of a candidate at the study's main level, or None when it does not know the setup."""
    if not study.host.gpu:
        return None
    kind = study.load_kind(read_trace=True)
    load = kind.describe()
    try:
        from servelab.search.prior import model_concurrency, prediction

        conc = model_concurrency(study, cand, kind)
        if conc.concurrency is None:
            return {"feasible": False, "reason": conc.reason, "known": False, "load": load}
        p = prediction(study, cand, conc.concurrency)
    except ServelabError as exc:
        return {"feasible": False, "reason": exc.message, "known": False, "load": load}
    except Exception as exc:  # the model's own gaps must not stop a study
        return {"feasible": False, "reason": f"model error: {exc}", "known": False, "load": load}
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
        "concurrency": conc.concurrency,
        "load": load,
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


def preflight(study: Study, engine: Engine) -> None:
    """Everything the real run derives for a candidate before launching it, derived for every candidate
    now: its settings, the engine's command line (which refuses impossible input), its run marker and
    its log file name. The dry run and the real run both call this first, so a study the dry run accepts
    never stops at a launch, and one it refuses has started nothing and stored nothing."""
    problems: list[str] = []
    try:  # the benchmark's configuration is built after the server is up: build it now
        bench_config(study, "http://127.0.0.1:1", study.model.served_name or study.model.path)
    except UserError as exc:
        problems.append(f"  workload/load: {exc.message}")
    checks = [(study.where(i), c) for i, c in enumerate(study.candidates)]
    checks += [("search.space", c) for c in study.space_checks()]
    for where, cand in checks:
        label = cand.label()
        try:
            launch = engine.command(settings_for(study, cand, port=engine.default_port or 8000))
            check_marker(naming.run_marker(naming.STUDY_MARKER_PREFIX, "preflight", label, 0))
            if launch.argv and any("\0" in a for a in launch.argv):
                raise ConfigError("the command line holds a NUL character")
        except UserError as exc:
            problems.append(
                f"  {where}: {label!r}: {exc.message}"
                + (f" ({exc.hint})" if exc.hint and exc.hint != exc.default_hint else "")
            )
        if len(problems) >= 20:
            problems.append("  ... (the first 20 problems)")
            break
    if problems:
        raise ConfigError(
            "the study cannot be launched:\n" + "\n".join(problems),
            hint="fix the fields named above; `servelab tune STUDY --dry-run` checks the same",
        )


class Tuner:
    def __init__(self, study: Study, store: Store, source: str | None, opts: TuneOptions) -> None:
        self._t0 = time.monotonic()  # joining a cluster is timed from here (importing Ray included)
        self.study = study
        self.store = store
        self.repo = StudyRepo(store)
        self.source = source
        self.opts = opts
        self.engine: Engine = registry.get(study.engine.name)
        self.notify: Observer = opts.observe or (lambda _e, _d: None)
        self.swept: list[dict[str, Any]] = []  # the interrupted run's processes a resume ended
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

    def predicted(self, cand: CandidateSpec) -> dict[str, Any] | None:
        """The model's view of a candidate the search proposed (as `order_candidates` stores it)."""
        return predict_candidate(self.study, cand)

    def base_label(self) -> str:
        """The baseline: the study's (marked or first listed); for a search without listed candidates, its
        first candidate (the model's best point), once it is stored."""
        label = self.study.baseline_label()
        if label or not self._sid:
            return label
        cands = self.repo.candidates(self._sid)
        return cands[0]["label"] if cands else ""

    # -- study bookkeeping ------------------------------------------------------------------------
    def _open(self) -> tuple[int, str, list[dict[str, Any]]]:
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
            labels = {c.label() for c in self.study.candidates}
            renamed = [
                c["label"]
                for c in self.repo.candidates(prev["id"])
                # a search's own candidates come from its space, not from the file's list
                if c["label"] not in labels and (c.get("search") or {}).get("origin", "listed") == "listed"
            ]
            if renamed:  # a servelab whose labels were derived differently started it (same file)
                raise ConfigError(
                    f"study {prev['uid']} names candidates this servelab does not derive from the file "
                    f"({', '.join(map(repr, renamed[:3]))})",
                    hint="give those candidates a `name` that matches, finish the study with the servelab "
                    "that started it, or run without --resume to start a new study.",
                )
            # Before anything is swept: the processes of a live driver are not leftovers.
            self._lease = (prev["id"], leases.acquire(self.store, prev["id"], prev["uid"]))
            swept = self.executor.sweep(naming.study_markers(prev["uid"]))
            self.swept = [s.to_dict() for s in swept]
            bench = BenchRepo(self.store)
            for t in self.repo.open_trials(prev["id"]):
                if t["bench_open"]:  # the level the kill cut short
                    bench.interrupt_run(t["bench_open"])
                self.repo.update_trial(
                    t["id"], status="interrupted", error="servelab stopped during this trial", bench_open=None
                )
            self.repo.set_study_status(prev["id"], "running")
            self.notify("study_resumed", {"uid": prev["uid"], "orphans": self.swept})
            cands = self.repo.candidates(prev["id"])
            self.fill_plan(prev["uid"], cands)
            return prev["id"], prev["uid"], cands
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
            "study_started",
            {
                "uid": uid,
                "candidates": len(self.study.candidates),
                "search": self.study.search.strategy if self.study.adaptive and self.study.search else None,
            },
        )
        cands = self.repo.candidates(sid)
        self.fill_plan(uid, cands)
        return sid, uid, cands

    async def run(self) -> StudyOutcome:
        preflight(self.study, self.engine)
        self.swept = []
        try:
            await self.executor.start()  # an unusable host or cluster fails before anything is stored
            if self.executor.parallel:
                self.notify(
                    "executor_started",
                    {
                        "kind": self.executor.kind,
                        "gpus": self.executor.capacity(),
                        "s": time.monotonic() - self._t0,
                    },
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
                for cand in cands:
                    await self.run_candidate(uid, cand, specs[cand["label"]])
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
        self.notify("study_finished", outcome.to_dict())
        return outcome

    async def _run_parallel(
        self, uid: str, cands: list[dict[str, Any]], specs: dict[str, CandidateSpec]
    ) -> None:
        """Every candidate at once, in the predicted order: each trial waits for its GPUs (first come,
        first served), so the cluster runs as many as it holds. The first error stops the others (their
        servers torn down) and is raised."""
        tasks = [asyncio.ensure_future(self.run_candidate(uid, c, specs[c["label"]])) for c in cands]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _interrupted(self, sid: int, uid: str, cands: list[dict[str, Any]], why: str) -> None:
        """Open trials and the study become `interrupted` (a resume redoes those trials)."""
        for t in self.repo.open_trials(sid):
            self.repo.update_trial(t["id"], status="interrupted", error=why)
            label = next((c["label"] for c in cands if c["id"] == t["candidate_id"]), None)
            if label:
                self._plan(uid, label, "interrupted", {"trial": t["id"]})
        self.repo.set_study_status(sid, "interrupted")

    def finish(self, sid: int, uid: str) -> StudyOutcome:
        """Combine repeats, flag anomalies against the baseline, rank, and store the result."""
        cands = self.repo.candidates(sid)
        levels_by = {
            c["label"]: analyze.combine_repeats([t["levels"] for t in self.scored_trials(c["id"])])
            for c in cands
        }
        base_label = self.base_label()
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
            if status == "not_applied":
                self._close_not_applied(uid, c, outcome)
            outcome.update({"levels": levels, "anomalies": [a.to_dict() for a in flags]})
            s = analyze.score(c["label"], status, levels, self.study.slo, self.study.objective)
            outcome["score"] = s.to_dict()
            self.repo.set_candidate(c["id"], status, outcome)
            scores.append(s)
            out.append({"label": c["label"], "status": status, "predicted": c["predicted"], **outcome})
        samples = self.samples(cands, scores)
        for s, c in zip(scores, out, strict=True):
            hw = analyze.bootstrap_half_width(samples.get(s.label) or [])
            if hw is not None:  # the candidate's ± from its requests too, as its margin is judged
                s.half_width = hw
                c["score"] = s.to_dict()
                self.repo.set_candidate(
                    next(x["id"] for x in cands if x["label"] == s.label),
                    c["status"],
                    {k: v for k, v in c.items() if k not in ("label", "status", "predicted")},
                )
        search_view: dict[str, Any] | None = None
        if self.study.adaptive:
            from servelab.search.driver import excluded

            # only the contenders compete (the others ran once: no margin of theirs can be judged), and
            # for halving only those that reached the top rung (the others ran the short benchmark)
            left_out = excluded(self, cands)
            scores = [
                s
                if s.label not in left_out or s.value is None
                else analyze.Score(
                    s.label, s.status, None, None, None, f"{left_out[s.label]} (its value {s.value:,.4g})"
                )
                for s in scores
            ]
        ranking = analyze.rank(scores, self.study.objective, samples)
        spread = self._node_spread(cands, scores, base_label)
        ranking = analyze.guard_node_spread(ranking, spread, cluster=self.executor.parallel)
        self._note_nodes(cands, out)
        result: dict[str, Any] = {"ranking": ranking.to_dict(), "baseline": base_label}
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

    def scored_trials(self, cand_id: int) -> list[dict[str, Any]]:
        """A candidate's measured trials at its highest rung (halving's short benchmarks do not mix with
        its full ones; every other study has rung 0 only)."""
        measured = [t for t in self.repo.trials(cand_id) if t["status"] == "measured" and t["levels"]]
        top = max((t.get("rung") or 0 for t in measured), default=0)
        return [t for t in measured if (t.get("rung") or 0) == top]

    def _nodes(self, cand_id: int) -> list[tuple[dict[str, Any], Node]]:
        """A candidate's measured trials that ran on a cluster node, with the node."""
        return [
            (t, Node.model_validate(t["node"]))
            for t in self.repo.trials(cand_id)
            if t["status"] == "measured" and t.get("node")
        ]

    def _node_spread(
        self, cands: list[dict[str, Any]], scores: list[analyze.Score], base_label: str
    ) -> analyze.NodeSpread | None:
        """The baseline's objective per node at its scored level (None: fewer than two nodes ran it)."""
        base = next((c for c in cands if c["label"] == base_label), None)
        score = next((s for s in scores if s.label == base_label), None)
        if base is None or score is None or score.level is None:
            return None
        values = []
        for t, node in self._nodes(base["id"]):
            d = next((d for d in t["levels"] or [] if float(d["level"]) == score.level), None)
            if d is not None and d.get(self.study.objective) is not None:
                values.append((node.name, float(d[self.study.objective])))
        return analyze.node_spread(score.level, values)

    def _note_nodes(self, cands: list[dict[str, Any]], out: list[dict[str, Any]]) -> None:
        """Each candidate's nodes, and a note when its repeats ran on different ones (its interval then
        holds the node-to-node noise too)."""
        for c, o in zip(cands, out, strict=True):
            names = sorted({n.name for _, n in self._nodes(c["id"])})
            if not names:
                continue
            o["nodes"] = names
            if len(names) > 1:
                o["node_note"] = (
                    f"its repeats ran on {len(names)} different nodes ({', '.join(names)}): its interval "
                    "includes the node-to-node noise"
                )
            self.repo.set_candidate(
                c["id"],
                o["status"],
                {k: v for k, v in o.items() if k not in ("label", "status", "predicted")},
            )

    def samples(
        self, cands: list[dict[str, Any]], scores: list[analyze.Score]
    ) -> dict[str, list[analyze.Cluster]]:
        """Each scored candidate's measured trials at its scored level, as bootstrap clusters read from the
        stored per-request records of the bench run that measured the level (a trial without them, e.g. one
        stored before requests were kept, leaves the candidate to the t-interval)."""
        from servelab.store.bench import BenchRepo

        bench = BenchRepo(self.store)
        objective = self.study.objective
        out: dict[str, list[analyze.Cluster]] = {}
        for c, s in zip(cands, scores, strict=True):
            if s.level is None:
                continue
            clusters: list[analyze.Cluster] = []
            for t in self.scored_trials(c["id"]):
                d = next((d for d in t["levels"] or [] if float(d["level"]) == s.level), None)
                cl = self._cluster(bench, d, objective) if d else None
                if cl is None:
                    clusters = []
                    break
                clusters.append(cl)
            if clusters:
                out[c["label"]] = clusters
        return out

    def _cluster(self, bench: Any, d: dict[str, Any], objective: str) -> analyze.Cluster | None:
        uid, value = d.get("bench_run"), d.get(objective)
        if not uid or value is None:
            return None
        try:
            run = bench.load(uid)
        except ServelabError:
            return None
        if not run.levels:
            return None
        level_id = bench.level_id(uid, run.levels[0].index)
        if level_id is None:
            return None
        records = bench.requests(level_id)
        return analyze.Cluster.of(records, objective, float(value), run.clock.speed, self.study.slo)

    # -- one candidate ----------------------------------------------------------------------------
    async def run_candidate(self, uid: str, cand: dict[str, Any], spec: CandidateSpec) -> None:
        trials = self.repo.trials(cand["id"])
        rung = self._rung.get(cand["label"], 0)
        measured = [t for t in trials if t["status"] == "measured" and (t.get("rung") or 0) == rung]
        final = [t for t in trials if t["status"] in ("not_applied", "failed")]
        if cand["status"] in ("not_applied",) or (final and not self.opts.retry_failed):
            if final and cand["status"] not in ("not_applied", "failed"):
                # a store written before the two went in one transaction: the trial's end is the truth
                self.repo.set_candidate(cand["id"], final[-1]["status"], _record_of(final[-1]))
            self.notify("candidate_skipped", {"label": cand["label"], "status": cand["status"]})
            return
        repeats = self.repeats_of(cand["label"])
        if len(measured) >= repeats:
            if cand["status"] not in ("measured", "anomalous"):  # as above: repaired, never dropped
                self.repo.set_candidate(cand["id"], "measured", {})
            return
        self.repo.set_candidate(cand["id"], "running")
        for n in range(len(measured), repeats):
            # a candidate's trials at every rung have their own repeat numbers (its markers differ)
            repeat = n + sum(1 for t in trials if t["status"] == "measured" and (t.get("rung") or 0) != rung)
            status, outcome = await self._trial(uid, cand, spec, repeat, trials)
            if status != "measured":
                self.repo.set_candidate(cand["id"], status, outcome)
                return
        self.repo.set_candidate(cand["id"], "measured", {})

    async def _trial(
        self, uid: str, cand: dict[str, Any], spec: CandidateSpec, repeat: int, before: list[dict[str, Any]]
    ) -> tuple[str, dict[str, Any]]:
        """One repeat of a candidate, placed by the executor. On a cluster a trial whose node dies is
        marked `lost` and run once more on another node; lost again, it fails with that diagnosis."""
        label = cand["label"]
        marker = naming.run_marker(naming.STUDY_MARKER_PREFIX, uid, label, repeat)
        kept, carried = _kept_levels(before, repeat)
        gpus = spec.tp * spec.pp * (spec.dp or 1)
        # Repeats on nodes not used yet: a candidate's interval then holds the node-to-node noise too.
        avoid = frozenset(n.id for _, n in self._nodes(cand["id"]))
        rung = self._rung.get(label, 0)
        for attempt in (0, 1):
            tid = self.repo.start_trial(
                cand["id"], repeat, marker, **carried, **({"rung": rung} if rung else {})
            )
            self.notify("trial_started", {"label": label, "repeat": repeat})
            self._plan(uid, label, "running", {"trial": tid, "run": f"{uid}/{label}/t{tid}"})
            recorder = _TrialRecorder(self, uid, tid, label, cand["id"], repeat == self.repeats_of(label) - 1)
            unfit = self.executor.fits(gpus)
            if unfit is not None:
                outcome = recorder.place_failed(unfit)
                return outcome.status, outcome.record()
            placed: Placement | None = None
            try:
                async with self.executor.place(gpus, avoid) as placed:
                    recorder.placed(placed)
                    outcome = await self._run_trial(uid, label, tid, repeat, spec, placed, recorder, kept)
                return outcome.status, outcome.record()
            except ConfigError as exc:  # no live node can take it any more
                outcome = recorder.place_failed(exc.message)
                return outcome.status, outcome.record()
            except HostLost as exc:
                if not self.executor.parallel or (placed is not None and not placed.lost_node(exc)):
                    raise  # this machine's link to its one host: the study is interrupted
                node = placed.node if placed is not None else None
                self._close_open_level(cand["id"], tid)
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
        row = next((t for t in self.repo.trials(cand_id) if t["id"] == tid), None)
        if row is not None and row["bench_open"]:
            BenchRepo(self.store).interrupt_run(row["bench_open"])

    async def _run_trial(
        self,
        uid: str,
        label: str,
        tid: int,
        repeat: int,
        spec: CandidateSpec,
        placed: Placement,
        recorder: _TrialRecorder,
        kept: list[LevelResult],
    ) -> TrialOutcome:
        log_path = data_home() / "logs" / uid / naming.log_name(label, repeat, tid)
        timeout = (
            self.opts.startup_timeout_s
            or self.study.engine.startup_timeout_s
            or self.engine.startup_timeout_s
        )
        if kept:
            self.notify("levels_kept", {"label": label, "levels": [lv.value for lv in kept]})
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
            naming.run_marker(naming.STUDY_MARKER_PREFIX, uid, label, repeat),
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
    def fill_plan(self, uid: str, cands: list[dict[str, Any]]) -> None:
        specs = {c.label(): c for c in self.study.candidates}
        rows = []
        for c in cands:
            if c["status"] == "pruned":
                continue
            spec = specs.get(c["label"]) or CandidateSpec.model_validate(c["spec"])  # a search's own
            req = self.engine.requested(settings_for(self.study, spec))
            own = {k: v for k, v in req.items() if k not in _NOT_PLANNED}
            rows.append((c["label"], (c["predicted"] or {}).get("output_throughput"), own))
        from servelab.store import plans

        self._plan_call(lambda: plans.fill_from_study(self.store, uid, rows))

    def _plan(self, uid: str, label: str, status: str, evidence: dict[str, Any]) -> None:
        from servelab.store import plans

        # On a cluster each candidate is a worker of its own: their trials run at once.
        actor = f"{TUNE_WORKER}:{label}" if self.executor.parallel else TUNE_WORKER
        self._plan_call(lambda: plans.on_trial(self.store, uid, label, status, evidence, actor=actor))

    def _close_not_applied(self, uid: str, cand: dict[str, Any], outcome: dict[str, Any]) -> None:
        """The study is over: a not-applied candidate's item is closed as not applied, with its last
        trial's evidence (what was requested, what runs, the log line), so no item is left pending."""
        from servelab.store import plans

        trials = self.repo.trials(cand["id"])
        last = trials[-1] if trials else {}
        evidence: dict[str, Any] = {
            "run": f"{uid}/{cand['label']}" + (f"/t{last['id']}" if last else ""),
            "not_applied": outcome.get("not_applied") or last.get("not_applied") or [],
            "unconfirmed": outcome.get("unconfirmed") or [],
        }
        if last:
            evidence["trial"] = last["id"]
            if last.get("effective"):  # the mismatches are found again from what runs (not twice)
                evidence["effective"] = last["effective"]
                evidence.pop("not_applied")
        self._plan_call(lambda: plans.close_not_applied(self.store, uid, cand["label"], evidence))

    def _plan_trial(self, uid: str, label: str, tid: int, status: str, evidence: dict[str, Any]) -> None:
        ref = {"trial": tid, "run": f"{uid}/{label}/t{tid}"}
        self._plan(uid, label, status, {**ref, **{k: v for k, v in evidence.items() if v is not None}})

    def _plan_call(self, fn: Callable[[], Any]) -> None:
        """Plan bookkeeping never stops a study; a refusal is reported and the study goes on."""
        try:
            fn()
        except ServelabError as exc:
            self.notify("plan_warning", {"message": exc.message})

    def baseline_levels(self, label: str) -> list[dict[str, Any]] | None:
        """The baseline candidate's measured levels (None for the baseline itself or before it ran)."""
        base = self.base_label()
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


class _TrialRecorder(TrialObserver):
    """Stores each step of one trial in its row (and moves the plan) before the trial's next step starts."""

    def __init__(
        self, tuner: Tuner, uid: str, tid: int, label: str, cand_id: int, last_repeat: bool = True
    ) -> None:
        self.tuner, self.repo, self.notify = tuner, tuner.repo, tuner.notify
        self.uid, self.tid, self.label, self.cand_id = uid, tid, label, cand_id
        self.last_repeat = last_repeat  # a measured trial ends its candidate as measured
        self.effective: dict[str, Any] | None = None

    def launching(self, launch: LaunchSpec, log_path: Path) -> None:
        self.repo.update_trial(
            self.tid, argv=launch.argv, env=launch.env, url=launch.url, log_path=str(log_path)
        )
        crashpoint.reached("launching")

    def launched(self, server: ServerHandle) -> None:
        self.repo.update_trial(self.tid, pid=server.pid)
        crashpoint.reached("launched")

    def ready(self, url: str, ready_s: float) -> None:
        self.repo.update_trial(self.tid, ready_s=ready_s, status="verifying")
        self.notify("trial_ready", {"label": self.label, "url": url, "ready_s": ready_s})
        crashpoint.reached("ready")

    def applied(self, check: AppliedCheck) -> None:
        self.effective = check.effective.to_dict()
        self.repo.update_trial(
            self.tid,
            requested=check.requested,
            effective=self.effective,
            engine_version=check.effective.effective.get("version"),
            not_applied=[m.to_dict() for m in check.mismatches],
        )
        if check.mismatches:
            self.notify(
                "not_applied", {"label": self.label, "mismatches": [m.sentence() for m in check.mismatches]}
            )

    def verified(self, result: VerifyResult) -> None:
        self.repo.update_trial(self.tid, verify=result.to_dict())
        crashpoint.reached("verified")

    def benchmarking(self) -> None:
        self.repo.update_trial(self.tid, status="benchmarking")

    def bench_event(self, event: str, data: dict[str, Any]) -> None:
        if event == "run_started":
            self.repo.update_trial(self.tid, bench_open=data["uid"])
        self.notify(f"bench_{event}", {"label": self.label, **data})
        if event == "level_started":
            crashpoint.reached("level-started")

    def level_done(self, level: LevelResult, levels: list[LevelResult]) -> None:
        if len(levels) == 1:
            self.repo.update_trial(self.tid, bench_run_id=level.bench_run_id)
        self.repo.update_trial(self.tid, levels=[lv.stored() for lv in levels], bench_open=None)
        self.notify("level_done", {"label": self.label, "digest": level.stored()})
        crashpoint.reached("level-done")

    def stopped_early(self, reason: str) -> None:
        self.notify("stopped_early", {"label": self.label, "reason": reason})

    def server_died(self, levels: list[LevelResult], diagnosis: Finding) -> None:
        diag = diagnosis.to_dict()
        self.repo.update_trial(self.tid, levels=[lv.stored() for lv in levels], diagnosis=diag)
        self.notify("server_died", {"label": self.label, "diagnosis": diag})

    def finished(self, outcome: TrialOutcome) -> None:
        """The trial's end and, when it decides it, its candidate's status: one transaction (a kill
        between the two used to leave a measured trial under a `running` candidate, dropped from the
        ranking on resume)."""
        record = outcome.record()
        with self.repo.transaction():
            if outcome.status == "measured":
                levels = [lv.stored() for lv in outcome.levels]
                self.repo.update_trial(self.tid, levels=levels, status="measured", bench_open=None)
                if self.last_repeat:
                    self.repo.set_candidate(self.cand_id, "measured", {})
            else:
                if outcome.diagnosis is not None and outcome.stage != "command":
                    self.repo.update_trial(self.tid, diagnosis=outcome.diagnosis.to_dict())
                self.repo.update_trial(self.tid, status=outcome.status, bench_open=None)
                self.repo.set_candidate(self.cand_id, outcome.status, record)
        if outcome.status == "measured":
            self._plan("measured", {"effective": self.effective})
        else:
            self.notify("trial_finished", {"label": self.label, "status": outcome.status, **record})
            self._plan(outcome.status, {"effective": self.effective, **record})
        crashpoint.reached("finished")

    def _plan(self, status: str, evidence: dict[str, Any]) -> None:
        self.tuner._plan_trial(self.uid, self.label, self.tid, status, evidence)

    def placed(self, placement: Placement) -> None:
        """The node the trial runs on (a cluster's), stored before anything launches there."""
        if placement.node is not None:
            node = placement.node.model_dump(mode="json")
            self.repo.update_trial(self.tid, node=node)
            self.notify(
                "trial_placed", {"label": self.label, "node": placement.node.name, "gpus": node["gpu_ids"]}
            )

    def place_failed(self, why: str) -> TrialOutcome:
        outcome = TrialOutcome(
            "failed",
            "place",
            Finding("does_not_fit", why, "add a node with enough GPUs, or drop the candidate"),
        )
        self.finished(outcome)
        return outcome

    def node_lost(self, exc: HostLost, node: Node | None) -> None:
        """The trial's node died under it: the trial is `lost`, and runs again elsewhere."""
        where = node.name if node is not None else "its node"
        self.notify("trial_lost", {"label": self.label, "node": where, "error": exc.message, "rerun": True})
        self.repo.update_trial(self.tid, status="lost", error=exc.message, bench_open=None)
        self._plan("lost", {"node": where, "error": exc.message})

    def node_failed(self, exc: HostLost, node: Node | None) -> TrialOutcome:
        """The rerun's node died too: the trial fails with that diagnosis."""
        where = node.name if node is not None else "its node"
        self.notify("trial_lost", {"label": self.label, "node": where, "error": exc.message, "rerun": False})
        outcome = TrialOutcome(
            "failed",
            "place",
            Finding(
                "node_lost",
                f"{exc.message}; the trial was run again on another node and lost that one too",
                "check the cluster's nodes (`ray status`); `servelab tune STUDY --resume --retry-failed` "
                "tries the candidate again",
            ),
        )
        self.finished(outcome)
        return outcome

    def torn_down(self, report: TeardownReport) -> None:
        self.repo.update_trial(self.tid, teardown=report.to_dict())
        self.notify(
            "trial_teardown",
            {"label": self.label, "teardown": self.repo.trials(self.cand_id)[-1]["teardown"]},
        )
        crashpoint.reached("torn-down")


def _kept_levels(trials: list[dict[str, Any]], repeat: int) -> tuple[list[LevelResult], dict[str, Any]]:
    """The levels the last trial of this repeat had measured when it was interrupted (kept, not run
    again), and the columns the new trial starts with. None are kept when a level saw the server die:
    that trial's end is unknown, so it is redone whole."""
    last = next((t for t in reversed(trials) if t["repeat"] == repeat), None)
    if last is None or last["status"] != "interrupted" or not last["levels"]:
        return [], {}
    if any(d.get("died") for d in last["levels"]):
        return [], {}
    kept = [LevelResult.from_stored(d) for d in last["levels"]]
    return kept, {"levels": last["levels"], "resumed_from": last["id"], "bench_run_id": last["bench_run_id"]}


def _record_of(trial: dict[str, Any]) -> dict[str, Any]:
    """A candidate's outcome as its final trial's row shows it (repairing a store written before a trial's
    end and its candidate's status went in one transaction)."""
    if trial["status"] == "not_applied":
        return {"not_applied": trial["not_applied"] or [], "unconfirmed": []}
    return {"diagnosis": trial["diagnosis"]} if trial["diagnosis"] else {}


async def tune(study: Study, store: Store, source: str | None, opts: TuneOptions) -> StudyOutcome:
    return await Tuner(study, store, source, opts).run()

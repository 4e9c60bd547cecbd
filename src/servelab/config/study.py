"""`Study`: the whole study file, the checks across its tables (objective, trace, sessions, capacity),
the candidates its matrix and search space make, and each candidate's engine options and layout."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from servelab import objectives as objective_types
from servelab.config.matrix import expand_matrix
from servelab.config.problems import StudyProblems, message, path_parts
from servelab.config.sections import (
    OBJECTIVES,
    AnomalySpec,
    CandidateSpec,
    CostSpec,
    EngineSpec,
    ExecutorSpec,
    HostSpec,
    LoadSpec,
    ModelSpec,
    SearchSpec,
    SLOSpec,
    Strict,
    StudyInfo,
    WorkloadSpec,
)
from servelab.errors import ServelabError
from servelab.load import LoadKind
from servelab.objectives import Objective


@functools.lru_cache(maxsize=16)  # asked per candidate and per proposed point; a trace is read once
def _trace_rate(path: str, fmt: str | None, limit: int | None) -> float | None:
    """Requests/s of a trace (its first `limit` requests) at time scale 1; None when it cannot be read."""
    from servelab.bench.traces import read_trace

    try:
        trace = read_trace(path, fmt).sliced(limit)
    except (ServelabError, OSError):
        return None
    span = trace.span_s
    return len(trace.requests) / span if span > 0 and len(trace.requests) > 1 else None


class Study(Strict):
    study: StudyInfo
    model: ModelSpec
    host: HostSpec = Field(default_factory=HostSpec)
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    engine: EngineSpec
    candidates: list[CandidateSpec] = Field(default_factory=list)
    matrix: dict[str, list[Any]] = Field(default_factory=dict)
    search: SearchSpec | None = None
    workload: WorkloadSpec
    load: LoadSpec
    slo: SLOSpec = Field(default_factory=SLOSpec)
    objective: str = "output_throughput"
    repeats: int = Field(default=1, ge=1, le=20)
    verify_output: bool = True
    anomalies: AnomalySpec = Field(default_factory=AnomalySpec)
    cost: CostSpec = Field(default_factory=CostSpec)
    _explicit: int = PrivateAttr(default=0)  # how many candidates the file lists before the matrix's
    _gridded: int = PrivateAttr(default=0)  # how many of the candidates the search space's grid made
    _space_checks: list[CandidateSpec] = PrivateAttr(default_factory=list)  # points a search is checked on
    _price_source: Literal["flag", "study"] = PrivateAttr(default="study")  # who set [cost]

    @field_validator("objective")
    @classmethod
    def _objective(cls, v: str) -> str:
        if v not in OBJECTIVES:
            raise ValueError(f"unknown objective {v!r}; use one of {', '.join(OBJECTIVES)}")
        return v

    @model_validator(mode="after")
    def _capacity_needs_an_slo(self) -> Study:
        if self.objective_type().searches_capacity and not self.slo.limits():
            raise ValueError(
                'objective = "capacity" searches for the highest load meeting the SLO: give [slo] limits, '
                "e.g. tpot_ms = { p99 = 50 }"
            )
        return self

    @model_validator(mode="after")
    def _a_trace_is_its_own_workload(self) -> Study:
        """What `bench --trace` refuses, in the study's words: a trace brings its requests, their lengths
        and their times."""
        if self.load.trace is None:
            return self
        w = self.workload
        if w.kind != "synthetic" or w.dataset is not None:
            raise ValueError(
                "load.trace replays the trace's own requests: drop workload.kind and workload.dataset"
            )
        if w.requests_per_stream is not None:
            raise ValueError(
                "load.trace is an open loop: slice it with workload.num_requests (its first N requests) "
                "or workload.duration_s, not requests_per_stream"
            )
        if self.objective_type().searches_capacity:
            raise ValueError(
                'objective = "capacity" searches over load.concurrency or load.rate levels, not a trace'
            )
        return self

    def priced(self, gpu_hour_usd: float | None, kwh_usd: float | None) -> Study:
        """This study with `tune --gpu-hour-usd` / `--kwh-usd` over its [cost] (the price then says it came
        from the flag); itself when neither is given."""
        if gpu_hour_usd is None and kwh_usd is None:
            return self
        cost = self.cost.model_copy(
            update={k: v for k, v in (("gpu_hour_usd", gpu_hour_usd), ("kwh_usd", kwh_usd)) if v is not None}
        )
        out = self.model_copy(update={"cost": cost})
        if gpu_hour_usd is not None:
            out._price_source = "flag"
        return out

    @property
    def price_source(self) -> Literal["flag", "study"]:
        """Who gave `cost.gpu_hour_usd`: the study file, or `tune --gpu-hour-usd`."""
        return self._price_source

    def objective_type(self) -> Objective:
        """The study's objective as its type (servelab.objectives)."""
        return objective_types.objective(self.objective)

    def sim_speed(self) -> float:
        """How many times faster than a real GPU the server's clock runs (the simulator's `speed`; else 1)."""
        speed = self.engine.options.get("speed", 1.0) or 1.0
        return float(speed) if isinstance(speed, int | float | str) else 1.0  # a number: the options model

    def load_kind(self, read_trace: bool = False) -> LoadKind:
        """The study's load as its type (servelab.load): the main-level rule, units, warm-up and what a
        level means to the model live there. `read_trace`: read a trace's request rate (the model needs
        it to stand a time scale for a concurrency)."""
        rate = None
        if read_trace and self.load.trace is not None:
            rate = _trace_rate(self.load.trace, self.load.trace_format, self.workload.num_requests)
        return self.load.kind(sessions=self.workload.kind == "sessions", trace_rate=rate)

    @model_validator(mode="after")
    def _sessions_are_a_closed_loop(self) -> Study:
        """What `bench --workload sessions` refuses, in the study's words (the dry run and the real run
        parse the same file, so both refuse it before anything starts)."""
        if self.workload.kind != "sessions":
            return self
        if not self.load.kind().closed_loop:
            raise ValueError(
                'workload.kind = "sessions" runs load.concurrency = [...] conversations at once; '
                "each turn waits for the reply it resends (no open-loop load.rate)"
            )
        if self.objective_type().searches_capacity:
            raise ValueError(
                'objective = "capacity" does not search over workload.kind = "sessions" (a session plan '
                "is built per level before it runs); rank by another objective at load.concurrency levels"
            )
        return self

    @model_validator(mode="after")
    def _expand(self) -> Study:
        explicit = self._explicit = len(self.candidates)
        expanded = expand_matrix(self.matrix)
        self.candidates = [*self.candidates, *expanded]
        space_checks: list[CandidateSpec] = []
        if self.search is not None:
            space_checks = self._search_points()
            if self.search.strategy == "grid":
                self._gridded = len(space_checks)
                self.candidates = [*self.candidates, *space_checks]
                space_checks = []
        self._space_checks = space_checks
        if not self.candidates and not space_checks:
            raise ValueError(
                "the study has no candidates: add [[candidates]] tables, a [matrix] or a [search.space]"
            )
        seen: dict[str, int] = {}
        dup: set[str] = set()
        for c in self.candidates:  # one pass: a large matrix is checked in linear time
            label = c.label()
            if label in seen:
                dup.add(label)
            seen[label] = 1
        if dup:
            shown = ", ".join(sorted(dup)[:10]) + (f" and {len(dup) - 10} more" if len(dup) > 10 else "")
            raise ValueError(
                f"candidate names must be unique; repeated: {shown} "
                "(give each a name; a matrix names its items with variants = [{name = ...}])"
            )
        if sum(c.baseline for c in self.candidates) > 1:
            raise ValueError("at most one candidate can be the baseline")
        if self.executor.kind == "ray" and self.host.ssh:
            raise ValueError(
                "executor.kind = 'ray' places trials on the Ray cluster's nodes; [host] ssh names one box "
                "(drop one of the two)"
            )
        problems = self._check_engine(explicit, space_checks)
        if problems:
            raise StudyProblems(problems)
        return self

    def _search_points(self) -> list[CandidateSpec]:
        """The grid's candidates (strategy grid), else the points every candidate's checks run on: the whole
        space when it is small, else each value of each parameter once (the others at their first)."""
        from servelab import space as sp

        assert self.search is not None
        if self.search.strategy == "halving" and not self.search.space:
            raise StudyProblems([(("search", "space"), "halving needs a [search.space]")])
        if not self.search.space:
            if self.search.strategy == "grid":
                return []
            raise StudyProblems([(("search", "space"), f"{self.search.strategy} needs a [search.space]")])
        try:
            space = sp.build(self.search)
        except sp.SpaceError as exc:
            raise StudyProblems([(("search", *path_parts(exc.path)), exc.message)]) from None
        size = space.size()
        if self.search.strategy in ("grid", "halving") and size is None:
            raise StudyProblems(
                [
                    (
                        ("search", "space"),
                        f"{self.search.strategy} needs a finite space: give every range a "
                        'step (or integer bounds without log), or use strategy = "optuna"',
                    )
                ]
            )
        if size is not None and size > sp.GRID_LIMIT:
            raise StudyProblems(
                [
                    (
                        ("search", "space"),
                        f"{size:,} points is more than {sp.GRID_LIMIT:,}: search a smaller space",
                    )
                ]
            )
        if self.search.strategy == "grid" or (size is not None and size <= 2000):
            try:
                points = list(space.points())
            except ValueError as exc:
                raise StudyProblems([(("search", "space"), str(exc))]) from None
            if not points:
                raise StudyProblems([(("search", "constraints"), "the constraints rule out every point")])
            return [CandidateSpec.model_validate(sp.candidate_fields(p, space)) for p in points]
        return [CandidateSpec.model_validate(sp.candidate_fields(p, space)) for p in sp.corners(space)]

    def _check_engine(
        self, explicit: int, space_checks: list[CandidateSpec] | None = None
    ) -> list[tuple[tuple[Any, ...], str]]:
        """Each candidate's merged engine options against the engine's typed model, and its layout
        against the box the study declares; (field path, message) for each problem, each once."""
        from servelab.engines import registry
        from servelab.engines.options import options_model
        from servelab.errors import NotFoundError

        try:
            engine = registry.get(self.engine.name)
        except NotFoundError as exc:
            return [(("engine", "name"), f"{exc.message}; {exc.hint}")]
        model = options_model(engine)
        out: dict[tuple[tuple[Any, ...], str], None] = {}
        try:  # the engine's own table, also where every candidate overrides a key of it
            model.model_validate(self.engine.options)
        except ValidationError as exc:
            for err in exc.errors():
                out[(("engine", "options", *err["loc"]), message(err))] = None
        checked: dict[str, list[tuple[tuple[Any, ...], str]]] = {}
        matrix_seen: set[tuple[tuple[Any, ...], str]] = set()  # one line per problem, not per item
        gridded_from = len(self.candidates) - self._gridded
        for i, c in enumerate([*self.candidates, *(space_checks or [])]):
            where: tuple[Any, ...] = (
                ("candidates", i)
                if i < explicit
                else ("matrix",)
                if i < gridded_from
                else ("search", "space")
            )
            merged = {**self.engine.options, **c.options}
            key = repr(sorted(c.options.items()))  # candidates with the same options share one check
            if key not in checked:
                checked[key] = []
                try:
                    model.model_validate(merged)
                except ValidationError as exc:
                    for err in exc.errors():
                        loc = tuple(err["loc"])
                        if loc and loc[0] in c.options:  # the engine's keys were reported above
                            checked[key].append((("options", *loc), message(err)))
            problems = [((*where, *loc), msg) for loc, msg in checked[key]]
            box = self._box(merged)
            world = c.tp * c.pp * (c.dp or 1)
            if box is not None and world > box:
                problems.append(
                    (
                        (*where, "tp"),
                        f"tp×pp×dp = {c.tp}×{c.pp}×{c.dp or 1} = {world} GPUs, more than the {box} "
                        "the study's host has (host.num_gpus)",
                    )
                )
            for path, msg in problems:
                if i < explicit:
                    out[(path, msg)] = None
                elif (path, msg) not in matrix_seen:
                    matrix_seen.add((path, msg))
                    out[(path, f"{msg} (candidate {c.label()!r}, and any other item with it)")] = None
            if len(out) >= 50:
                break
        return list(out)

    def _box(self, options: Mapping[str, object]) -> int | None:
        """How many GPUs the candidates run on, when the study says (a GPU kind is declared)."""
        if not (self.host.gpu or options.get("gpu")):
            return None
        n = options.get("num_gpus", self.host.num_gpus)
        return n if isinstance(n, int) and not isinstance(n, bool) else None

    def where(self, index: int) -> str:
        """The field path of candidate `index`: its [[candidates]] table, or the matrix or space that made it."""
        if index < self._explicit:
            return f"candidates[{index}]"
        return "matrix" if index < len(self.candidates) - self._gridded else "search.space"

    def baseline_label(self) -> str:
        """The baseline's label: the one marked, else the first candidate ("" for a search without
        listed candidates: its first trial, the model's best, becomes the baseline)."""
        for c in self.candidates:
            if c.baseline:
                return c.label()
        return self.candidates[0].label() if self.candidates else ""

    @property
    def adaptive(self) -> bool:
        """Candidates are proposed as the study runs (optuna, halving), not all listed up front."""
        return self.search is not None and self.search.strategy != "grid"

    def space_checks(self) -> list[CandidateSpec]:
        """Candidates that stand for an adaptive search's space in the checks (the dry run's too)."""
        return list(self._space_checks)

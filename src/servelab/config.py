"""A study file (TOML) as validated pydantic models: model, host, engine, candidates, workload, load, SLOs.

Every error names the field path (`candidates[2].tp`, `slo.ttft_ms.p99`) and what is expected, so a
typo in a study is a one-line fix, not a traceback. See docs/study.md for every field.
"""

from __future__ import annotations

import functools
import itertools
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from servelab import load as load_kinds
from servelab import objectives as objective_types
from servelab.bench.config import SessionOptions
from servelab.errors import ConfigError, ServelabError
from servelab.load import LoadKind
from servelab.objectives import Objective
from servelab.redact import redact_argv, redact_env

# every objective's direction, by name: the classes of servelab.objectives (adding one is adding a class)
OBJECTIVES: dict[str, Literal["max", "min"]] = objective_types.directions()
SLO_STATS = ("mean", "p50", "p90", "p95", "p99")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _launchable_args(v: list[str]) -> list[str]:
    """Flags reach `exec` as C strings: a NUL would stop the launch (after the study started)."""
    for i, a in enumerate(v):
        if "\0" in a:
            raise ValueError(f"args[{i}] holds a NUL character, which no command line can carry")
    return v


def _launchable_env(v: dict[str, str]) -> dict[str, str]:
    """An environment entry is `NAME=VALUE` in C: a name with `=` or NUL, or a value with NUL, cannot be
    set, and the launch would fail after the study started."""
    for k, x in v.items():
        if not k or "=" in k or "\0" in k:
            raise ValueError(f"environment name {k!r} is not valid: it must be non-empty, without '=' or NUL")
        if "\0" in x:
            raise ValueError(f"the value of {k} holds a NUL character, which no environment can carry")
    return v


class StudyInfo(_Strict):
    name: str = Field(min_length=1)
    description: str = ""


class ModelSpec(_Strict):
    path: str = Field(
        min_length=1, description="what the engine loads: a local path, a hub id, or a catalog name"
    )
    served_name: str | None = None
    config: str | None = Field(default=None, description="catalog name or config.json for predictions")
    silicon: bool = Field(
        default=False,
        description="order the candidates by the model with measured operator tables (servelab[silicon])",
    )

    @field_validator("silicon")
    @classmethod
    def _silicon_installed(cls, v: bool) -> bool:
        if v:
            from servelab.model import silicon

            if not silicon.available():
                raise ValueError(f"needs the aiconfigurator-core package; {silicon.EXTRA_HINT}")
        return v


class HostSpec(_Strict):
    gpu: str | None = Field(default=None, description="GPU kind from the catalog; None on a CPU host")
    num_gpus: int = Field(default=1, ge=1)
    ssh: str | None = Field(
        default=None,
        description="run on this machine over SSH: ssh://[user@]host[:port] or an alias from ~/.ssh/config",
    )
    python: str = Field(
        default="python3", min_length=1, description="the interpreter that has servelab on the SSH host"
    )
    workdir: str | None = Field(
        default=None, description="where the SSH host keeps server logs (default ~/.servelab/remote there)"
    )
    bench_from: Literal["control", "remote"] = Field(
        default="control",
        description="where the benchmark client runs: this machine through an SSH port forward (control), "
        "or the SSH host itself, next to the server (remote; its numbers come back into this store)",
    )

    @field_validator("ssh")
    @classmethod
    def _target(cls, v: str | None) -> str | None:
        if v is not None:
            from servelab.host.transport import SshTarget

            try:
                SshTarget.parse(v)
            except ServelabError as exc:
                raise ValueError(f"{exc.message}; {exc.hint}") from None
        return v


class ExecutorSpec(_Strict):
    """Where the trials run: `local` (this machine or the one `[host] ssh` box, one trial at a time) or
    `ray` (the nodes of a Ray cluster, placed by the GPUs each layout needs, several at once)."""

    kind: Literal["local", "ray"] = "local"
    address: str | None = Field(
        default=None,
        min_length=1,
        description="the Ray cluster to join: HOST:PORT of its head (default $RAY_ADDRESS, else 'auto')",
    )
    baseline_nodes: int = Field(
        default=2,
        ge=1,
        le=8,
        description="on a cluster, run the baseline on this many different nodes (extra repeats where "
        "needed) to measure the node-to-node spread a winner's margin must exceed",
    )


class EngineSpec(_Strict):
    name: str
    python: str | None = None
    startup_timeout_s: float | None = Field(default=None, gt=0)
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="a fixed port (default: a free one)")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)

    check_args = field_validator("args")(_launchable_args)
    check_env = field_validator("env")(_launchable_env)


class CandidateSpec(_Strict):
    """One configuration to try; fields left out inherit the engine's defaults."""

    name: str | None = None
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    ep: int | None = Field(default=None, ge=1)
    dp: int | None = Field(default=None, ge=1)
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_concurrency: int | None = Field(default=None, ge=1)
    mem_fraction: float | None = Field(default=None, gt=0, le=1)
    max_model_len: int | None = Field(default=None, ge=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)
    baseline: bool = False
    _label: str | None = PrivateAttr(default=None)

    check_args = field_validator("args")(_launchable_args)
    check_env = field_validator("env")(_launchable_env)

    def label(self) -> str:
        """The candidate's name, else one made of every field it sets (so matrix items over any field
        differ). Human text: whatever the machine derives from it goes through `servelab.naming`."""
        if self.name:
            return self.name
        if self._label is None:
            given = self.model_dump(exclude_defaults=True, exclude={"tp", "name", "baseline"})
            self._label = "-".join([f"tp{self.tp}", *label_parts(given)])
        return self._label


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list | tuple):
        return ",".join(_show(x) for x in v)
    if isinstance(v, dict):
        return ",".join(f"{k}={_show(x)}" for k, x in v.items())
    return str(v)


def label_parts(fields: dict[str, Any]) -> list[str]:
    """The label pieces of the candidate fields given (tp only when given: `label` always shows it)."""
    parts = [f"tp{fields['tp']}"] if "tp" in fields else []
    for key, prefix in (("pp", "pp"), ("ep", "ep"), ("dp", "dp")):
        if fields.get(key) not in (None, 1) or (key != "pp" and fields.get(key) is not None):
            parts.append(f"{prefix}{fields[key]}")
    for key, prefix in (
        ("quantization", ""),
        ("kv_cache_dtype", "kv-"),
        ("max_concurrency", "c"),
        ("mem_fraction", "mem"),
        ("max_model_len", "len"),
    ):
        if fields.get(key) is not None:
            parts.append(f"{prefix}{_show(fields[key])}")
    # Secrets masked: a label is printed, stored and names files.
    parts += [a.lstrip("-") for a in redact_argv([str(a) for a in fields.get("args") or ()])]
    parts += [f"{k}={_show(v)}" for k, v in redact_env(fields.get("env") or {}).items()]
    parts += [f"{k}={_show(v)}" for k, v in (fields.get("options") or {}).items()]
    return parts


class WorkloadSpec(_Strict, SessionOptions):
    """The requests of every level; the same fields as `servelab bench` (kind = "sessions": each of a
    level's `concurrency` conversations runs `turns` turns, `SessionOptions`)."""

    api: Literal["completions", "chat"] = "completions"
    kind: Literal["synthetic", "sharegpt", "shared-prefix", "sessions"] = "synthetic"
    input_len: int = Field(default=256, ge=1)
    output_len: int = Field(default=128, ge=1)
    range_ratio: float = Field(default=0.0, ge=0, lt=1)
    dataset: str | None = None
    num_prefixes: int = Field(default=4, ge=1)
    prefix_len: int = Field(default=512, ge=1)
    tokenizer: str | None = None
    num_requests: int | None = Field(default=None, ge=1)
    requests_per_stream: int | None = Field(
        default=None, ge=1, description="num_requests = this × concurrency"
    )
    duration_s: float | None = Field(default=None, gt=0)
    seed: int = 0
    temperature: float | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    warmup: int = Field(default=-1, ge=-1)

    @model_validator(mode="after")
    def _one_size(self) -> WorkloadSpec:
        if self.kind == "sessions":
            if self.num_requests is not None or self.requests_per_stream is not None:
                raise ValueError(
                    'kind = "sessions": a level is concurrency × turns requests; give duration_s to cap '
                    "its time, or no size"
                )
            return self
        given = [x is not None for x in (self.num_requests, self.requests_per_stream, self.duration_s)]
        if sum(given) != 1:
            raise ValueError("give exactly one of num_requests, requests_per_stream or duration_s")
        return self


class LoadSpec(_Strict):
    concurrency: list[int] | None = None
    rate: list[float] | None = None
    # a trace replayed at its timestamps ÷ each time scale (bench --trace); workload.num_requests slices it
    trace: str | None = None
    trace_format: str | None = None
    time_scale: list[float] | None = None
    max_concurrency: int | None = Field(default=None, ge=1)
    main: float | None = Field(
        default=None, description="the level deployment checks use (default: the highest)"
    )
    # objective = "capacity": the search's resolution and most probes (its first probe: the lowest level)
    resolution: float = Field(default=0.10, gt=0, lt=1)
    max_probes: int = Field(default=8, ge=1)

    @model_validator(mode="after")
    def _one_kind(self) -> LoadSpec:
        if sum(x is not None for x in (self.concurrency, self.rate, self.trace)) != 1:
            raise ValueError("give exactly one of concurrency = [...], rate = [...] or trace = FILE")
        if self.trace is None and (self.time_scale is not None or self.trace_format is not None):
            raise ValueError("time_scale and trace_format need trace = FILE")
        if self.trace_format is not None:
            from servelab.bench.traces import formats

            if self.trace_format not in formats():
                raise ValueError(f"trace_format must be one of {', '.join(formats())}")
        levels = self.levels
        if not levels:
            raise ValueError("the list of load levels is empty")
        if any(v <= 0 for v in levels):
            raise ValueError("load levels must be positive")
        if self.main is not None and self.main not in levels:
            raise ValueError(f"main = {self.main:g} is not one of the levels {levels}")
        return self

    @property
    def mode(self) -> Literal["concurrency", "rate", "trace"]:
        if self.trace is not None:
            return "trace"
        return "concurrency" if self.concurrency is not None else "rate"

    @property
    def levels(self) -> list[float]:
        if self.trace is not None:
            return [float(v) for v in (self.time_scale or [1.0])]
        return [float(v) for v in (self.concurrency if self.concurrency is not None else self.rate or [])]

    def with_levels(self, levels: list[float]) -> LoadSpec:
        """The same load at these levels only (no main: the highest of them)."""
        key = self.kind().study_key
        spelled = [int(v) for v in levels] if key == "concurrency" else [float(v) for v in levels]
        return self.model_copy(update={key: spelled, "main": None})

    def kind(self, sessions: bool = False, trace_rate: float | None = None) -> LoadKind:
        """This load as its type (servelab.load); `Study.load_kind` adds what the workload says."""
        return load_kinds.make(self.mode, self.levels, self.main, sessions=sessions, trace_rate=trace_rate)


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


class SLOSpec(_Strict):
    """Latency limits a level must meet, e.g. ttft_ms = {p99 = 2000}; plus the lowest success rate."""

    ttft_ms: dict[str, float] = Field(default_factory=dict)
    tpot_ms: dict[str, float] = Field(default_factory=dict)
    itl_ms: dict[str, float] = Field(default_factory=dict)
    e2e_ms: dict[str, float] = Field(default_factory=dict)
    min_success_rate: float = Field(default=0.99, ge=0, le=1)

    @field_validator("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
    @classmethod
    def _stats(cls, v: dict[str, float]) -> dict[str, float]:
        for stat, limit in v.items():
            if stat not in SLO_STATS:
                raise ValueError(f"unknown statistic {stat!r}; use one of {', '.join(SLO_STATS)}")
            if limit <= 0:
                raise ValueError(f"the limit for {stat} must be positive, got {limit}")
        return v

    def limits(self) -> list[tuple[str, str, float]]:
        """(metric, statistic, limit) triples."""
        out = []
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            for stat, limit in getattr(self, metric).items():
                out.append((metric, stat, float(limit)))
        return out

    def capacity_slo(self) -> str:
        """The level limits as `bench --find-capacity --slo` takes them: `p99_tpot_ms<=50,...`."""
        return ",".join(f"{stat}_{metric}<={limit:g}" for metric, stat, limit in self.limits())

    def bench_slo(self) -> str | None:
        """The per-request SLO string `servelab bench` uses for goodput (the loosest limit per metric)."""
        parts = [
            f"{m}<={max(getattr(self, m).values()):g}"
            for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
            if getattr(self, m)
        ]
        return ",".join(parts) or None


class AnomalySpec(_Strict):
    """When a level is flagged as anomalous."""

    collapse_ratio: float = Field(default=0.5, gt=0, lt=1, description="throughput below this × baseline")
    power_drop_ratio: float = Field(default=0.6, gt=0, lt=1, description="GPU power below this × baseline")
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    stop_after_collapses: int = Field(
        default=2,
        ge=0,
        description="skip a candidate's remaining levels after "
        "its throughput collapsed at this many (0: never)",
    )


class ConstraintSpec(_Strict):
    """Where `when` holds (every key's test: a value, a list of values, or `{gt/ge/lt/le/ne = n}`), the
    point's values must pass `allow` and take the values in `set` (e.g. `disable_radix_cache = true` with
    NSA attention)."""

    when: dict[str, Any] = Field(default_factory=dict)
    allow: dict[str, Any] = Field(default_factory=dict)
    set: dict[str, Any] = Field(default_factory=dict)


class SearchSpec(_Strict):
    """`[search]`: how the candidates are found. `grid` runs every point of the space; `optuna` (TPE, or
    NSGA-II for two objectives) and `halving` (successive halving) search it within a budget."""

    strategy: Literal["grid", "optuna", "halving"] = "grid"
    budget_trials: int | None = Field(default=None, ge=1, description="trials in all, repeats included")
    budget_minutes: float | None = Field(default=None, gt=0)
    seed: int = 0
    space: dict[str, Any] = Field(default_factory=dict)
    constraints: list[ConstraintSpec] = Field(default_factory=list)
    # several objectives: a Pareto front (NSGA-II); the first also ranks the winner
    objectives: list[str] = Field(default_factory=list)
    prior_trials: int = Field(default=3, ge=0, description="the model's best-ranked points, tried first")
    refit: bool = True  # refit the model's factors from the study's own runs after each trial
    contenders: int = Field(default=3, ge=1, description="the top candidates that get the study's repeats")
    eta: int = Field(default=3, ge=2, description="halving: one in eta candidates goes on to the next rung")

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, v: list[str]) -> list[str]:
        for o in v:
            if o not in OBJECTIVES or not objective_types.objective(o).searchable:
                raise ValueError(
                    f"unknown objective {o!r}; use {', '.join(objective_types.names(searchable_only=True))}"
                )
        if len(v) > 2:
            raise ValueError("at most two objectives (a Pareto front of two)")
        return v


class Study(_Strict):
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
    _explicit: int = PrivateAttr(default=0)  # how many candidates the file lists before the matrix's
    _gridded: int = PrivateAttr(default=0)  # how many of the candidates the search space's grid made
    _space_checks: list[CandidateSpec] = PrivateAttr(default_factory=list)  # points a search is checked on

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

    def objective_type(self) -> Objective:
        """The study's objective as its type (servelab.objectives)."""
        return objective_types.objective(self.objective)

    def sim_speed(self) -> float:
        """How many times faster than a real GPU the server's clock runs (the simulator's `speed`; else 1)."""
        return float(self.engine.options.get("speed", 1.0) or 1.0)

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
            raise StudyProblems([(("search", *_path_parts(exc.path)), exc.message)]) from None
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
                out[(("engine", "options", *err["loc"]), _message(err))] = None
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
                            checked[key].append((("options", *loc), _message(err)))
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

    def _box(self, options: dict[str, Any]) -> int | None:
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


def expand_matrix(matrix: dict[str, list[Any]]) -> list[CandidateSpec]:
    """The cartesian product of the matrix axes. An axis is a candidate field with a list of values, or
    `variants`: a list of partial candidate tables for values that go together (tp = 4 with pp = 2). A
    variant may carry a `name`: an item's name is then its variants' names, then the label pieces of the
    fields its unnamed parts set (`variants = [{name = "wide", tp = 8}]` × `max_concurrency = [64]`:
    `wide-c64`)."""
    if not matrix:
        return []
    axes: list[list[dict[str, Any]]] = []
    for key, values in matrix.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"matrix.{key} must be a non-empty list")
        if key == "variants":
            if not all(isinstance(v, dict) for v in values):
                raise ValueError(
                    "matrix.variants must be a list of tables, e.g. [{tp = 8}, {tp = 4, pp = 2}]"
                )
            for j, v in enumerate(values):
                if "baseline" in v:
                    raise ValueError(f"matrix.variants[{j}]: baseline belongs on a [[candidates]] table")
                if "name" in v and (not isinstance(v["name"], str) or not v["name"]):
                    raise ValueError(f"matrix.variants[{j}].name must be a non-empty string")
            axes.append([dict(v) for v in values])
        elif key in CandidateSpec.model_fields and key not in ("name", "baseline"):
            axes.append([{key: v} for v in values])
        else:
            known = ", ".join(sorted(set(CandidateSpec.model_fields) - {"name", "baseline"}))
            raise ValueError(f"matrix.{key} is not a candidate field; use variants or one of: {known}")
    out: list[CandidateSpec] = []
    for combo in itertools.product(*axes):
        merged: dict[str, Any] = {}
        names: list[str] = []
        unnamed: dict[str, Any] = {}
        for part in combo:
            fields = {k: v for k, v in part.items() if k != "name"}
            if "name" in part:
                names.append(part["name"])
            else:
                _merge(unnamed, fields)
            _merge(merged, fields)
        if names:
            merged["name"] = "-".join([*names, *label_parts(unnamed)])
        out.append(CandidateSpec.model_validate(merged))
    return out


def _merge(into: dict[str, Any], part: dict[str, Any]) -> None:
    """One matrix part onto an item: args append, env and options merge, the rest replaces."""
    for k, v in part.items():
        if k == "args" and k in into and isinstance(v, list):
            into[k] = [*into[k], *v]
        elif k in ("env", "options") and k in into and isinstance(v, dict):
            into[k] = {**into[k], **v}
        else:
            into[k] = v


class StudyProblems(ConfigError):
    """Problems found across the whole study, each with its own field path (a model-level check would
    otherwise report them all at the top level). Not a ValueError, so pydantic lets it through whole."""

    def __init__(self, problems: list[tuple[tuple[Any, ...], str]]) -> None:
        super().__init__("the study is not valid: " + "; ".join(f"{_where(p)}: {m}" for p, m in problems))
        self.problems = problems


def _message(err: Any) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling; docs/study.md lists the fields)"
    return msg


def _path_parts(path: str) -> tuple[Any, ...]:
    """`constraints[0].when.pp` → ("constraints", 0, "when", "pp")."""
    out: list[Any] = []
    for part in path.split("."):
        name, *idx = part.replace("]", "").split("[")
        if name:
            out.append(name)
        out += [int(i) for i in idx]
    return tuple(out)


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def parse_study(data: dict[str, Any], source: str = "study") -> Study:
    """Validate a study given as a dict; every problem is listed with its field path."""
    try:
        return Study.model_validate(data)
    except StudyProblems as exc:
        lines = [f"  {_where(path)}: {msg}" for path, msg in exc.problems]
    except ValidationError as exc:
        lines = [f"  {_where(tuple(err['loc']))}: {_message(err)}" for err in exc.errors()]
    raise ConfigError(
        f"{source} is not a valid study:\n" + "\n".join(lines),
        hint="docs/study.md describes every field; examples/ has complete studies.",
    )


def load_study(path: str | Path) -> Study:
    """Read and validate a study TOML file."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"study file {p} does not exist", hint="give the path of a .toml study; see examples/"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the study file {p}: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p} is not valid TOML: {exc}", hint="fix the line named above") from None
    return parse_study(data, str(p))

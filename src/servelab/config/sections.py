"""The study file's tables, each a pydantic model (extra fields forbidden): `[study]`, `[model]`, `[host]`,
`[executor]`, `[engine]`, `[[candidates]]`, `[workload]`, `[load]`, `[slo]`, `[anomalies]`, `[search]`.
The whole file and its cross-table checks are study.py's `Study`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from servelab import load as load_kinds
from servelab import objectives as objective_types
from servelab.bench.config import SessionOptions
from servelab.errors import ServelabError
from servelab.load import LoadKind
from servelab.redact import redact_argv, redact_env

# every objective's direction, by name: the classes of servelab.objectives (adding one is adding a class)
OBJECTIVES: dict[str, Literal["max", "min"]] = objective_types.directions()
SLO_STATS = ("mean", "p50", "p90", "p95", "p99")


class Strict(BaseModel):
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


class StudyInfo(Strict):
    name: str = Field(min_length=1)
    description: str = ""


class ModelSpec(Strict):
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


class HostSpec(Strict):
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


class ExecutorSpec(Strict):
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


class EngineSpec(Strict):
    name: str
    python: str | None = None
    startup_timeout_s: float | None = Field(default=None, gt=0)
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="a fixed port (default: a free one)")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # the engine's table as written: its adapter's options model checks it (Study), the adapter narrows it
    options: dict[str, object] = Field(default_factory=dict)

    check_args = field_validator("args")(_launchable_args)
    check_env = field_validator("env")(_launchable_env)


class CandidateSpec(Strict):
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
    options: dict[str, object] = Field(default_factory=dict)  # merged onto the engine's, checked the same way
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


def _show(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list | tuple):
        return ",".join(_show(x) for x in v)
    if isinstance(v, dict):
        return ",".join(f"{k}={_show(x)}" for k, x in v.items())
    return str(v)


def label_parts(fields: Mapping[str, object]) -> list[str]:
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
    # a matrix's parts are not checked yet: a field of the wrong kind adds nothing (the check refuses it)
    args, env, options = fields.get("args") or (), fields.get("env") or {}, fields.get("options") or {}
    argv = [str(a) for a in (args if isinstance(args, list | tuple) else ())]
    parts += [a.lstrip("-") for a in redact_argv(argv)]
    parts += [f"{k}={_show(v)}" for k, v in redact_env(env if isinstance(env, dict) else {}).items()]
    parts += [f"{k}={_show(v)}" for k, v in (options.items() if isinstance(options, dict) else ())]
    return parts


class WorkloadSpec(Strict, SessionOptions):
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


class LoadSpec(Strict):
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


class SLOSpec(Strict):
    """Latency limits a level must meet, e.g. ttft_ms = {p99 = 2000}; plus the lowest success rate."""

    ttft_ms: dict[str, float] = Field(default_factory=dict)
    tpot_ms: dict[str, float] = Field(default_factory=dict)
    itl_ms: dict[str, float] = Field(default_factory=dict)
    e2e_ms: dict[str, float] = Field(default_factory=dict)
    min_success_rate: float = Field(default=0.99, ge=0, le=1)
    # Launch to ready, in seconds: a candidate that starts slower is a finding (`startup_over_bound`), not
    # measured; None: no bound.
    max_startup_s: float | None = Field(default=None, gt=0)

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


class CostSpec(Strict):
    """`[cost]`: what the study's GPUs cost, for the `cost` objective and the $ per million output tokens
    shown beside every level (docs/metrics.md, Money). Without it the GPU kind's dated on-demand price in
    the hardware catalog is used, marked as a default wherever it is shown; `tune --gpu-hour-usd` wins."""

    gpu_hour_usd: float | None = Field(
        default=None, gt=0, le=1000, description="the price of one GPU for one hour, US dollars (e.g. 2.5)"
    )
    kwh_usd: float | None = Field(
        default=None,
        gt=0,
        le=10,
        description="electricity, US dollars per kWh (e.g. 0.15): the energy's cost",
    )


class AnomalySpec(Strict):
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


class ConstraintSpec(Strict):
    """Where `when` holds (every key's test: a value, a list of values, or `{gt/ge/lt/le/ne = n}`), the
    point's values must pass `allow` and take the values in `set` (e.g. `disable_radix_cache = true` with
    NSA attention)."""

    # tables as written: servelab.space checks and reads them
    when: dict[str, object] = Field(default_factory=dict)
    allow: dict[str, object] = Field(default_factory=dict)
    set: dict[str, object] = Field(default_factory=dict)


class SearchSpec(Strict):
    """`[search]`: how the candidates are found. `grid` runs every point of the space; `optuna` (TPE, or
    NSGA-II for two objectives) and `halving` (successive halving) search it within a budget."""

    strategy: Literal["grid", "optuna", "halving"] = "grid"
    budget_trials: int | None = Field(default=None, ge=1, description="trials in all, repeats included")
    budget_minutes: float | None = Field(default=None, gt=0)
    seed: int = 0
    space: dict[str, object] = Field(default_factory=dict)  # as written: servelab.space checks and reads it
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

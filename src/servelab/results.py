"""The results contract: what a benchmark run is, written by `bench` and read by everyone else.

One level's measurements are a `LevelSummary` (every metric once, its unit in its name or docstring);
a stored run is a `Run` (engine, model, host, layout, workload, clock, levels). Readers — `runs show`,
`explain`, `calibrate fit --run`, the UI, the report, a study's digests, deploy's check — load a `Run`
through `store.bench.BenchRepo.load` and never read the stored JSON themselves.

**One time base.** A run against `servelab sim --speed X` is measured on a clock running X times faster
than the GPU it simulates. `Run.clock.speed` records X; `Level.summary` is in the simulated GPU's time
(what users are shown everywhere) and `Level.wall` keeps what the client's clock measured, labelled.
For a real engine speed is 1 and the two are the same numbers.

Units: latencies in milliseconds (`*_ms` statistics), durations in seconds (`*_s`), throughputs per
second (`output_throughput` and `total_token_throughput` in tokens/s, `request_throughput` in
requests/s). **Goodput** is `goodput`: output tokens per second of the requests that met every SLO;
`request_goodput` is the same requests per second (vLLM's `request_goodput`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servelab.energy import LevelCost, LevelEnergy
from servelab.jsontypes import JsonObject

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
LATENCY_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
STATS: tuple[str, ...] = ("mean", "std", "min", "max", "p50", "p90", "p95", "p99")
# Rates scale with the clock (÷ speed), latencies and durations against it (× speed).
RATES: tuple[str, ...] = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "goodput",
    "request_goodput",
)
DURATIONS: tuple[str, ...] = ("duration_s", "wall_s")


@dataclass(slots=True)
class RequestRecord:
    """What one request did, as measured by the client.

    `start_s` is when the request was due (its scheduled send time in an open loop, the actual send
    time in a closed loop) relative to the level start; every latency is measured from it so a late
    client cannot hide queueing.
    """

    idx: int
    prompt_idx: int
    start_s: float
    ok: bool
    scheduled_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    requested_output_tokens: int | None = None
    token_source: str | None = None
    error_kind: str | None = None
    error_message: str | None = None
    tokenizer_output_tokens: int | None = None
    session_id: int | None = None  # `--workload sessions`: the conversation this turn belongs to
    turn: int | None = None  # ... and its index in it (0 = the first)

    @property
    def end_s(self) -> float | None:
        return None if self.e2e_s is None else self.start_s + self.e2e_s


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Stats(_Model):
    """Distribution of one latency metric over a level's requests, in milliseconds."""

    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None

    def scaled(self, factor: float) -> Stats:
        return Stats(**{k: (None if v is None else v * factor) for k, v in self.model_dump().items()})

    def get(self, stat: str) -> float | None:
        value = getattr(self, stat, None)
        return value if isinstance(value, float | int) else None


class LengthMismatch(_Model):
    idx: int
    requested: int | None
    got: int | None


class Crosscheck(_Model):
    """The tokenizer's count of the streamed text against the server's usage."""

    checked: int
    disagree: int


class TurnStats(_Model):
    """One turn index over a level's sessions: how many were sent and answered, how long the prompt
    had grown (mean input tokens, the server's usage where it reports it), and its TTFT."""

    turn: int
    sent: int = 0
    completed: int = 0
    failed: int = 0
    mean_input_tokens: float | None = None
    mean_output_tokens: float | None = None
    ttft_ms: Stats = Field(default_factory=Stats)


class SessionStat(_Model):
    """One conversation: turns answered and failed (a failed turn ends it), first send to last answer."""

    session: int
    turns_completed: int
    turns_failed: int
    duration_s: float | None = None


class SessionsSummary(_Model):
    """`--workload sessions`: per turn index and per session (docs/cli/bench.md, Multi-turn sessions).
    `cache_hit_rate`: the server's prefix-cache hits over queries during the level, where it reports
    them (`cache_source` names the metric), else None."""

    sessions: int = 0
    turns_planned: int = 0
    sessions_completed: int = 0  # every planned turn answered
    turns_completed: int = 0
    turns_failed: int = 0
    turns_not_sent: int = 0  # after a failed turn, or past --duration
    think_time_s: float | None = None  # the mean planned think time between turns (shown time base)
    session_duration_s: Stats = Field(default_factory=Stats)  # seconds, not ms
    per_turn: list[TurnStats] = Field(default_factory=list)
    per_session: list[SessionStat] = Field(default_factory=list)
    cache_hit_rate: float | None = None
    cache_source: str | None = None

    def in_gpu_time(self, speed: float) -> SessionsSummary:
        """Latencies and durations × speed, as `LevelSummary.in_gpu_time` does."""
        if speed == 1:
            return self
        return self.model_copy(
            update={
                "session_duration_s": self.session_duration_s.scaled(speed),
                "per_turn": [
                    t.model_copy(update={"ttft_ms": t.ttft_ms.scaled(speed)}) for t in self.per_turn
                ],
                "per_session": [
                    p.model_copy(
                        update={"duration_s": None if p.duration_s is None else p.duration_s * speed}
                    )
                    for p in self.per_session
                ],
            }
        )


class LevelSummary(_Model):
    """Every metric of one load level (docs/metrics.md gives each formula)."""

    mode: Literal["concurrency", "rate", "trace"] = "concurrency"  # trace: value is its time scale
    value: float = 0.0
    label: str = ""
    num_requests: int = 0
    completed: int = 0
    failed: int = 0
    failure_rate: float = 0.0
    errors: dict[str, int] = Field(default_factory=dict)
    error_examples: dict[str, str] = Field(default_factory=dict)
    duration_s: float = 0.0  # first due time to the last completion
    wall_s: float | None = None  # the level's wall time on the client
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    mean_input_tokens: float | None = None
    mean_output_tokens: float | None = None
    request_throughput: float = 0.0  # requests/s
    output_throughput: float = 0.0  # output tokens/s
    total_token_throughput: float = 0.0  # input + output tokens/s
    ttft_ms: Stats = Field(default_factory=Stats)
    tpot_ms: Stats = Field(default_factory=Stats)
    itl_ms: Stats = Field(default_factory=Stats)
    e2e_ms: Stats = Field(default_factory=Stats)
    length_mismatches: int = 0
    length_mismatch_examples: list[LengthMismatch] = Field(default_factory=list)
    token_sources: dict[str, int] = Field(default_factory=dict)
    tokenizer_crosscheck: Crosscheck | None = None
    prompts_repeated: int = 0
    slo: dict[str, float] | None = None
    good_requests: int | None = None
    goodput: float | None = None  # output tokens/s of requests meeting every SLO
    request_goodput: float | None = None  # requests/s meeting every SLO
    slo_attainment: float | None = None
    sessions: SessionsSummary | None = None  # `--workload sessions` only
    energy: LevelEnergy | None = None  # the GPUs' energy over the level (None: no power was seen)
    cost: LevelCost | None = None  # its price per million output tokens (None: no price, no tokens)

    @model_validator(mode="before")
    @classmethod
    def _older_spelling(cls, data: Any) -> Any:
        """Runs stored before the contract named goodput twice: `goodput` (req/s) and
        `goodput_output_tokens` (tok/s). Read them as the one unit stated above."""
        if isinstance(data, dict) and "goodput_output_tokens" in data:
            data = dict(data)
            data["request_goodput"] = data.get("goodput")
            data["goodput"] = data.pop("goodput_output_tokens")
        return data

    @property
    def concurrency(self) -> int:
        """The requests in flight: a closed loop's level; an open loop's (a rate, a trace) by Little's law,
        completed requests/s × mean time in the system (the same in either time base), at least 1.
        (servelab.load.measured_concurrency says the same; the contract imports nothing of ours.)"""
        if self.mode == "concurrency":
            return int(self.value)
        e2e = self.e2e_ms.mean
        if not self.request_throughput or not e2e:
            return 1
        return max(1, round(self.request_throughput * e2e / 1000.0))

    def stat(self, metric: str, stat: str) -> float | None:
        """`stat("tpot_ms", "p50")`: one statistic of one latency metric."""
        if metric not in LATENCY_METRICS:
            raise KeyError(f"unknown latency metric {metric!r}; known: {', '.join(LATENCY_METRICS)}")
        stats: Stats = getattr(self, metric)
        return stats.get(stat)

    def in_gpu_time(self, speed: float) -> LevelSummary:
        """This level measured on a clock `speed` times faster than the GPU it stands for, in that GPU's
        time: latencies and durations × speed, rates ÷ speed. The identity at speed 1."""
        if speed == 1:
            return self
        update: dict[str, object] = {m: getattr(self, m).scaled(speed) for m in LATENCY_METRICS}
        for name in RATES:
            v = getattr(self, name)
            if v is not None:
                update[name] = v / speed
        for name in DURATIONS:
            v = getattr(self, name)
            if v is not None:
                update[name] = v * speed
        if self.sessions is not None:
            update["sessions"] = self.sessions.in_gpu_time(speed)
        if self.energy is not None:
            update["energy"] = self.energy.in_gpu_time(speed)
        if self.cost is not None:
            update["cost"] = self.cost.in_gpu_time(speed)
        return self.model_copy(update=update)

    def digest(self) -> JsonObject:
        """The flat numbers a study compares per level (`tpot_ms_p50`, `output_throughput`, …): the
        objective and SLO names of the study file are keys of this. Same units as the summary."""
        d: JsonObject = {
            "level": self.value,
            "mode": self.mode,
            "completed": self.completed,
            "failed": self.failed,
            "failure_rate": self.failure_rate,
            "errors": dict(self.errors),
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "request_throughput": self.request_throughput,
            "goodput": self.goodput,
            # the `energy` and `cost` objectives (servelab.objectives): J per output token, $ per M
            "energy": self.energy.j_per_output_token if self.energy else None,
            "cost": self.cost.usd_per_m_output_tokens if self.cost else None,
        }
        if self.energy is not None:
            d["energy_j"] = self.energy.energy_j
            d["j_per_output_token"] = self.energy.j_per_output_token
            d["j_per_output_token_above_idle"] = self.energy.j_per_output_token_above_idle
        if self.cost is not None:
            d["usd_per_m_output_tokens"] = self.cost.usd_per_m_output_tokens
        for metric in LATENCY_METRICS:
            for stat in ("mean", "p50", "p90", "p95", "p99"):
                d[f"{metric}_{stat}"] = self.stat(metric, stat)
        return d

    @classmethod
    def from_digest(cls, d: Mapping[str, object], mode: str | None = None) -> LevelSummary:
        """The inverse of `digest()` for what a digest keeps (a study's stored levels, repeats combined):
        the readers of a study's levels see the same typed summary as the readers of a run. The level's
        mode is the digest's; a digest stored before it carried one takes `mode` (the study's load kind)."""
        data: dict[str, object] = {
            m: {st: d.get(f"{m}_{st}") for st in ("mean", "p50", "p90", "p95", "p99")}
            for m in LATENCY_METRICS
        }
        data |= {
            k: d[k] for k in ("completed", "failed", "failure_rate", "errors", *RATES) if d.get(k) is not None
        }
        level_mode = d.get("mode") or mode or "concurrency"
        level = d.get("level")
        return cls.model_validate(
            data | {"mode": level_mode, "value": float(level) if isinstance(level, int | float) else 0.0}
        )

    def vllm_compatible(self, extra: JsonObject | None = None) -> JsonObject:
        """The same level in `vllm bench serve`'s result field names, so numbers compare with that tool."""
        out: JsonObject = {
            "duration": self.duration_s,
            "completed": self.completed,
            "failed": self.failed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "request_goodput": self.request_goodput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
        }
        for ours, theirs in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("itl_ms", "itl"), ("e2e_ms", "e2el")):
            out[f"mean_{theirs}_ms"] = self.stat(ours, "mean")
            out[f"median_{theirs}_ms"] = self.stat(ours, "p50")
            out[f"std_{theirs}_ms"] = self.stat(ours, "std")
            for p in PERCENTILES:
                if p != 50:
                    out[f"p{p}_{theirs}_ms"] = self.stat(ours, f"p{p}")
        if extra:
            out.update(extra)
        return out

    def to_json(self) -> JsonObject:
        return self.model_dump(mode="json")


class Host(_Model):
    """The machine the server ran on, as far as the run knows it."""

    gpu: str | None = None  # a hardware-catalog name (`servelab predict --list-gpus`), or the server's
    num_gpus: int | None = None
    interconnect: str | None = None
    source: str | None = None  # where these facts came from: server | study | flags


class Node(_Model):
    """The cluster node a trial ran on (a Ray node): its id, the address its servers listen on, its
    hostname, and the GPUs Ray gave the trial there (their CUDA_VISIBLE_DEVICES)."""

    id: str
    address: str
    hostname: str | None = None
    gpu_ids: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """How the node is shown: its address and the start of its id (two raylets can share a machine)."""
        return f"{self.address}/{self.id[:8]}"


class NetPath(_Model):
    """How the benchmark client reached the server: `direct`, `ssh-forward` through a port forwarded over
    the SSH connection to `target`, or `remote`: the client ran on `target` itself, next to the server
    (`[host] bench_from = "remote"`); `rtt_ms`: the path's round trip right before the run, the median of
    5 probes (TCP connects to the server when direct or remote, no-op agent calls over SSH)."""

    via: str | None = None
    target: str | None = None
    rtt_ms: float | None = None


class Layout(_Model):
    """How the model was split over the host's devices."""

    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    dp: int | None = None  # attention data parallelism (replicas of attention within one server)

    @property
    def gpus(self) -> int | None:
        return None if self.tp is None else self.tp * (self.pp or 1) * (self.dp or 1)


class Clock(_Model):
    """The clock the run was measured on. `speed` > 1: the simulator's clock ran that many times faster
    than the GPU it simulates (`servelab sim --speed`); every figure shown is in that GPU's time."""

    speed: float = Field(default=1.0, gt=0)
    source: str | None = None

    @property
    def simulated(self) -> bool:
        return self.speed != 1.0

    @property
    def time_base(self) -> str:
        return "simulated GPU time" if self.simulated else "wall clock"


_M = TypeVar("_M", bound=_Model)


def _known_over(a: _M, b: _M) -> _M:
    """`a` with every field `b` knows (is not None) taken from `b`."""
    return type(a).model_validate(
        {k: (v if v is not None else getattr(a, k)) for k, v in b.model_dump().items()}
    )


class RunContext(_Model):
    """What a run is *of*: engine, model config, host, layout, formats, clock. Learnt from the server's
    info routes where it tells, given by a study's candidate or by `bench --gpu/--tp/...` where not."""

    engine: str | None = None
    personality: str | None = None  # the engine the simulator imitates
    model_config_ref: str | None = Field(default=None, alias="model_config")  # catalog name or config.json
    host: Host = Field(default_factory=Host)
    layout: Layout = Field(default_factory=Layout)
    quant: str | None = None
    kv_dtype: str | None = None
    clock: Clock = Field(default_factory=Clock)
    path: NetPath = Field(default_factory=NetPath)

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, protected_namespaces=())

    def merged(self, over: RunContext) -> RunContext:
        """`over`'s known facts on top of ours (field by field; unknowns do not erase knowns)."""

        host = _known_over(self.host, over.host)
        layout = _known_over(self.layout, over.layout)
        clock = over.clock if over.clock.source else self.clock
        path = _known_over(self.path, over.path)
        return RunContext(
            engine=over.engine or self.engine,
            personality=over.personality or self.personality,
            model_config=over.model_config_ref or self.model_config_ref,
            host=host,
            layout=layout,
            quant=over.quant or self.quant,
            kv_dtype=over.kv_dtype or self.kv_dtype,
            clock=clock,
            path=path,
        )

    def to_json(self) -> JsonObject:
        return self.model_dump(mode="json", by_alias=True)


class WorkloadInfo(_Model):
    """The traffic of a run as the benchmark built it (`bench.workload.Workload.describe`)."""

    name: str = "synthetic"
    num_prompts: int | None = None
    dataset_hash: str | None = None
    token_counting: str | None = None
    mean_target_input_len: float | None = None
    mean_target_output_len: float | None = None


class Saturation(_Model):
    """Whether an open-loop level measured a steady state (`bench.saturation.detect`): the server could
    not keep up (completions fall behind arrivals, the queue grows, TTFT rises with the send time) or
    the client could not (sends late). A saturated level's latencies are those of a growing queue."""

    server_saturated: bool = False
    client_saturated: bool = False
    reasons: list[str] = Field(default_factory=list)
    arrival_rate: float | None = None  # requests/s sent over the second half of the send window
    completion_rate: float | None = None  # requests/s completed over the same window
    ttft_slope: float | None = None  # seconds of TTFT per second of scheduled time (least squares)
    ttft_slope_t: float | None = None  # the slope's t statistic (slope / its standard error)
    queue_slope: float | None = None  # requests_waiting per second, from the /metrics samples
    queue_last: float | None = None
    send_lateness_p99_ms: float | None = None
    # the client's own part of it (less its thread's run-queue wait), what `client_saturated` judges;
    # the whole where the kernel has no schedstat, None in rows stored before it
    send_lateness_own_p99_ms: float | None = None
    stopped_early: str | None = None  # why the level stopped sending before its end (over-saturated)

    @property
    def saturated(self) -> bool:
        return self.server_saturated or self.client_saturated


class CapacityProbe(_Model):
    """One probe of a capacity search: a level of the run at `load`, and its verdict under the SLO."""

    load: float
    level: int | None = None  # the run's level index
    passed: bool
    values: dict[str, float | None] = Field(default_factory=dict)  # `p99_ttft_ms` → the probe's value
    reasons: list[str] = Field(default_factory=list)  # why it failed
    stopped_early: bool = False


class CapacityResult(_Model):
    """What `bench --find-capacity` found (`bench.capacity`): the highest load that met the SLO, the
    bracket it lies in ([highest pass, lowest fail above it]) and every probe, in order."""

    by: Literal["concurrency", "rate"]
    slo: str
    resolution: float
    capacity: float | None = None  # None: even the lowest probe failed
    bracket: tuple[float | None, float | None] = (None, None)  # (pass, fail)
    step: float | None = None  # fail − pass: the uncertainty
    converged: bool = False  # the step is under the resolution
    stop_reason: str = ""
    probes: list[CapacityProbe] = Field(default_factory=list)
    non_monotonic: list[float] = Field(default_factory=list)  # passes above a failed load: noise
    warmup_fraction: float = 0.0  # the share of each probe's requests left out of its verdict
    speed: float = 1.0  # the clock's; a rate capacity is in the client's clock (÷ speed: the GPU's)

    def to_json(self) -> JsonObject:
        return self.model_dump(mode="json")


class SeriesPoint(_Model):
    """One `/metrics` sample taken during a level (and the GPU telemetry read with it), on the client's
    timeline: `t_s` is seconds since the level's start on the clock `RequestRecord.start_s` is measured on.
    Gauges are as the engine reported them; `preemptions` and `generation_tokens` are counters turned into
    what happened since the previous sample (the first one: since the level's opening snapshot). None: the
    server (or the GPU source) did not report it."""

    t_s: float
    requests_running: float | None = None
    requests_waiting: float | None = None  # queue depth
    kv_cache_usage: float | None = None  # fraction of the KV cache in use, 0..1
    preemptions: float | None = None  # since the previous sample
    generation_tokens: float | None = None  # output tokens the server generated since the previous sample
    gpu_power_w: float | None = None  # mean over the GPUs the server holds
    gpu_util: float | None = None  # mean utilization of those GPUs, 0..1
    gpu_memory_used_mib: float | None = None  # summed over those GPUs
    gpus: int | None = None  # how many GPUs the telemetry covered


class LevelSeries(_Model):
    """A level's server telemetry as a time series (`servelab runs show --json`: `levels[].series`):
    sampled every `interval_s` (`bench --scrape-interval`); `gpu_source` says where GPU figures came from
    (`http:/servelab/gpus`: the server serves them, `nvml`/`nvidia-smi`: this machine's GPUs, the server
    being on it; None: not observable)."""

    interval_s: float = 0.0
    gpu_source: str | None = None
    points: list[SeriesPoint] = Field(default_factory=list)

    def power_trace(self) -> list[tuple[float, float]]:
        """(t_s, watts of all the GPUs sampled) for every point with a power reading: `gpu_power_w` (a
        mean per GPU) × `gpus` (one when not told). What `servelab.energy.level_energy` integrates."""
        return [(p.t_s, p.gpu_power_w * (p.gpus or 1)) for p in self.points if p.gpu_power_w is not None]

    def in_gpu_time(self, speed: float) -> LevelSeries:
        """The series on a clock `speed` times slower (the simulated GPU's): times × speed; gauges, and
        counts per sample, stay as they are. The identity at speed 1."""
        if speed == 1:
            return self
        return self.model_copy(
            update={
                "interval_s": self.interval_s * speed,
                "points": [p.model_copy(update={"t_s": p.t_s * speed}) for p in self.points],
            }
        )

    def to_json(self) -> JsonObject:
        return self.model_dump(mode="json")


class Level(_Model):
    """One stored load level: `summary` in the time base shown to users, `wall` as the client's clock
    measured it (the same object when the clock is real time)."""

    index: int
    status: str
    mode: str
    value: float
    summary: LevelSummary
    wall: LevelSummary
    server_metrics: JsonObject = Field(default_factory=dict)  # the engine's /metrics deltas, shown as stored
    client: JsonObject = Field(default_factory=dict)  # the client's own counters, shown as stored
    saturation: Saturation | None = None  # open-loop levels: did it reach a steady state
    series: LevelSeries = Field(default_factory=LevelSeries)  # in the time base shown, like `summary`
    wall_series: LevelSeries = Field(default_factory=LevelSeries)  # on the client's clock, as stored

    @property
    def concurrency(self) -> int:
        return self.summary.concurrency

    def vllm_compatible(self, max_concurrency: int | None = None, burstiness: float = 1.0) -> JsonObject:
        """This level as `vllm bench serve` would write it (`--export-vllm`), in the shown time base."""
        return self.summary.vllm_compatible(
            {
                "max_concurrency": int(self.value) if self.mode == "concurrency" else max_concurrency,
                "request_rate": self.value if self.mode == "rate" else "inf",
                "burstiness": burstiness,
            }
        )

    def to_json(
        self, simulated: bool, max_concurrency: int | None = None, burstiness: float = 1.0
    ) -> JsonObject:
        return {
            "index": self.index,
            "label": self.summary.label or f"{self.value:g}",
            "status": self.status,
            "summary": self.summary.to_json()
            | {"vllm_compatible": self.vllm_compatible(max_concurrency, burstiness)},
            **({"wall_clock_summary": self.wall.to_json()} if simulated else {}),
            "server_metrics": self.server_metrics,
            "client": self.client,
            "saturation": self.saturation.model_dump(mode="json") if self.saturation else None,
            "series": self.series.to_json(),
        }


class Run(_Model):
    """A stored benchmark run, parsed once."""

    id: int
    uid: str
    created_at: str
    finished_at: str | None = None
    status: str
    url: str
    model: str
    api: str
    context: RunContext = Field(default_factory=RunContext)
    workload: WorkloadInfo = Field(default_factory=WorkloadInfo)
    capabilities: JsonObject = Field(default_factory=dict)  # what the server was seen to support
    config: JsonObject = Field(default_factory=dict)  # the full (redacted) bench options, as given
    warnings: list[str] = Field(default_factory=list)
    levels: list[Level] = Field(default_factory=list)
    capacity: CapacityResult | None = None  # `bench --find-capacity`

    @property
    def engine(self) -> str | None:
        return self.context.engine

    @property
    def clock(self) -> Clock:
        return self.context.clock

    def to_json(self) -> JsonObject:
        """The stable `--json` view (`runs show`): figures in the time base shown to users, the wall
        clock's own beside them where the two differ."""
        simulated = self.clock.simulated
        mc, burst = self.config.get("max_concurrency"), self.config.get("burstiness")
        max_concurrency = mc if isinstance(mc, int) else None
        burstiness = float(burst) if isinstance(burst, int | float) and burst else 1.0
        return {
            "run": self.uid,
            "status": self.status,
            "url": self.url,
            "model": self.model,
            "api": self.api,
            "engine": self.engine,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "context": self.context.to_json(),
            "time_base": self.clock.time_base,
            "workload": self.workload.model_dump(mode="json"),
            "capabilities": self.capabilities,
            "config": self.config,
            "warnings": [*self.warnings],
            "levels": [lv.to_json(simulated, max_concurrency, burstiness) for lv in self.levels],
            "capacity": self.capacity.to_json() if self.capacity else None,
        }

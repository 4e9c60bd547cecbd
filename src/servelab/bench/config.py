"""The configuration of one `servelab bench` invocation, validated in one place."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from servelab.bench.load import ARRIVALS, LevelSpec
from servelab.bench.traces import Trace, formats
from servelab.load import kind_of
from servelab.results import RunContext

# No served model has a context this long (the longest are 1M tokens plus change); a length above it
# is a typo, and generating it would exhaust memory before the server could refuse it.
MAX_TOKENS = 1 << 21
# The default inter-token idle timeout (docs/cli/bench.md): a healthy engine streams a token within
# a second even under heavy load; a minute of silence after the first token is a stall.
IDLE_TIMEOUT_S = 60.0


class SessionOptions(BaseModel):
    """`--workload sessions` (bench/sessions.py), spelled once for `servelab bench` and a study's
    `[workload]`; the defaults are a coding agent's conversations."""

    turns: int = Field(default=8, ge=1, le=10000)
    think_time_s: float = Field(default=3.0, ge=0)
    think_dist: Literal["exponential", "constant"] = "exponential"
    system_prompt_len: int = Field(default=2048, ge=0)
    tool_turns: float = Field(default=0.5, ge=0.0, le=1.0)
    tool_result_len: int = Field(default=1024, ge=1)


class BenchConfig(SessionOptions):
    # NaN and infinity are never a rate, a length or a timeout: refuse them here, not in SQLite.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    url: str
    model: str
    api: Literal["completions", "chat"] = "completions"
    mode: Literal["concurrency", "rate", "trace"] = "concurrency"
    levels: list[float] = Field(min_length=1)
    max_concurrency: int | None = Field(default=None, ge=1)
    num_requests: int | None = Field(default=None, ge=1)
    duration_s: float | None = Field(default=None, gt=0)
    requests_per_stream: int | None = Field(default=None, ge=1)  # per level: this × concurrency (at least 8)
    workload: Literal["synthetic", "sharegpt", "shared-prefix", "sessions"] = "synthetic"
    input_len: int = Field(default=256, ge=1)
    output_len: int = Field(default=128, ge=1)
    range_ratio: float = Field(default=0.0, ge=0.0, lt=1.0)
    dataset: str | None = None
    num_prefixes: int = Field(default=4, ge=1)
    prefix_len: int = Field(default=512, ge=1)
    tokenizer: str | None = None
    seed: int = 0
    slo: str | None = None
    arrival: str = "poisson"
    burstiness: float = Field(default=1.0, gt=0)
    warmup: int = Field(default=-1, ge=-1)  # -1: one per concurrent stream, up to 16
    timeout_s: float = Field(default=600.0, gt=0)
    idle_timeout_s: float = Field(default=IDLE_TIMEOUT_S, gt=0)
    # Whose clock times tokens: the client's as the bytes come in, or the server's own stamps where it
    # sends them (`servelab sim`: its step clock, which no stall of either process moves).
    token_clock: Literal["client", "server"] = "client"
    exact_output_len: bool = True
    api_key: str | None = None
    scrape_interval_s: float = Field(default=1.0, ge=0)
    temperature: float | None = Field(default=None, ge=0)
    # Trace replay (mode "trace"): the file, its format (None: detected), its clock ÷ time_scale.
    trace: str | None = None
    trace_format: str | None = None
    time_scale: float = Field(default=1.0, gt=0)
    trace_limit: int | None = Field(default=None, ge=1)
    # Requests whose prompt + max_tokens exceed the server's context (bench/fit.py): send | skip | clip.
    over_context: Literal["send", "skip", "clip"] = "send"
    # What a GPU-hour (and a kWh) costs, and who said so ("flag", "study"); None: the GPU kind's catalog
    # default, when the catalog has one (servelab.energy, docs/metrics.md "Money").
    gpu_hour_usd: float | None = Field(default=None, gt=0)
    kwh_usd: float | None = Field(default=None, gt=0)
    price_source: Literal["flag", "study"] = "flag"
    # What the run is of, where the server cannot say (a study's candidate, `--gpu/--tp/...`).
    context: RunContext = Field(default_factory=RunContext)

    @field_validator("input_len", "output_len", "prefix_len", "system_prompt_len", "tool_result_len")
    @classmethod
    def _bounded(cls, value: int) -> int:
        if value > MAX_TOKENS:
            raise ValueError(f"{value} is over {MAX_TOKENS:,} tokens, longer than any model's context")
        return value

    @model_validator(mode="after")
    def _check(self) -> BenchConfig:
        if self.mode == "trace" or self.trace is not None:
            return self._check_trace()
        if self.time_scale != 1.0 or self.trace_limit is not None or self.trace_format is not None:
            raise ValueError("--time-scale, --trace-limit and --trace-format need --trace FILE")
        if self.workload == "sessions":
            if self.mode != "concurrency":
                raise ValueError(
                    "--workload sessions runs --sessions (or --concurrency) conversations at once"
                )
            if self.num_requests is not None or self.requests_per_stream is not None:
                raise ValueError(
                    "a sessions level is --sessions × --turns requests; give --duration to cap its time"
                )
        elif sum(x is not None for x in (self.num_requests, self.duration_s, self.requests_per_stream)) != 1:
            raise ValueError("give exactly one of --num-requests, --duration or --requests-per-stream")
        if self.requests_per_stream is not None and self.mode != "concurrency":
            raise ValueError(
                "--requests-per-stream sizes closed-loop --concurrency levels; give --num-requests "
                "or --duration with --rate"
            )
        if self.mode == "concurrency":
            bad = [v for v in self.levels if v < 1 or v != int(v)]
            if bad:
                raise ValueError(f"concurrency levels must be whole numbers ≥ 1, got {bad}")
        elif any(v <= 0 for v in self.levels):
            raise ValueError("request rates must be positive")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}")
        if self.workload == "sessions" and self.over_context != "send":
            raise ValueError(
                "--over-context skip|clip cannot change a session's turns (every later turn resends them): "
                "the turns over the context are counted and named before the level"
            )
        if self.workload == "sharegpt" and not self.dataset:
            raise ValueError("the sharegpt workload needs --dataset FILE")
        if self.max_concurrency is not None and self.mode != "rate":
            raise ValueError(
                "--max-concurrency caps an open-loop --rate run; with --concurrency it is the level itself"
            )
        return self

    def _check_trace(self) -> BenchConfig:
        if self.mode != "trace" or self.trace is None:
            raise ValueError("a trace run is its own load: give --trace FILE without --concurrency or --rate")
        if self.num_requests is not None or self.requests_per_stream is not None:
            raise ValueError(
                "a trace replays its own requests: slice it with --trace-limit N or --duration S"
            )
        if self.workload != "synthetic" or self.dataset:
            raise ValueError("a trace is its own workload: drop --workload and --dataset")
        if self.trace_format is not None and self.trace_format not in formats():
            raise ValueError(f"--trace-format must be one of {', '.join(formats())}")
        return self

    def level_specs(self, trace: Trace | None = None) -> list[LevelSpec]:
        if trace is not None:  # one level: the trace's own schedule, its clock ÷ time_scale
            offsets = tuple(r.offset_s / self.time_scale for r in trace.requests)
            return [
                LevelSpec(
                    "trace",
                    self.time_scale,
                    len(offsets),
                    self.duration_s,
                    self.max_concurrency,
                    offsets=offsets,
                    trace=trace.format,
                )
            ]
        return [
            LevelSpec(
                self.mode,
                v,
                self.level_requests(v),
                self.duration_s,
                self.max_concurrency,
                self.arrival,
                self.burstiness,
            )
            for v in self.levels
        ]

    @property
    def server_token_times(self) -> bool:
        """Whether tokens are timed by the server's own stamps (`--token-clock server`)."""
        return self.token_clock == "server"

    def level_requests(self, value: float) -> int | None:
        """Requests of a level: the fixed count, or requests_per_stream × concurrency (at least 8)."""
        if self.workload == "sessions":
            return int(value) * self.turns
        if self.requests_per_stream is not None:
            return max(8, self.requests_per_stream * int(value))
        return self.num_requests

    def warmup_count(self, spec: LevelSpec) -> int:
        if self.warmup >= 0:
            return self.warmup
        return min(16, max(1, kind_of(spec.mode).warmup_streams(spec.value, spec.max_concurrency)))

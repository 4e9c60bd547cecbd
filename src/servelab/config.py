"""A study file (TOML) as validated pydantic models: model, host, engine, candidates, workload, load, SLOs.

Every error names the field path (`candidates[2].tp`, `slo.ttft_ms.p99`) and what is expected, so a
typo in a study is a one-line fix, not a traceback. See docs/study.md for every field.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from servelab.errors import ConfigError
from servelab.redact import redact_argv, redact_env

OBJECTIVES: dict[str, Literal["max", "min"]] = {
    "output_throughput": "max",
    "total_token_throughput": "max",
    "request_throughput": "max",
    "goodput": "max",
    "ttft_ms_p50": "min",
    "tpot_ms_p50": "min",
    "e2e_ms_p50": "min",
}
SLO_STATS = ("mean", "p50", "p90", "p95", "p99")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StudyInfo(_Strict):
    name: str = Field(min_length=1)
    description: str = ""


class ModelSpec(_Strict):
    path: str = Field(
        min_length=1, description="what the engine loads: a local path, a hub id, or a catalog name"
    )
    served_name: str | None = None
    config: str | None = Field(default=None, description="catalog name or config.json for predictions")


class HostSpec(_Strict):
    gpu: str | None = Field(default=None, description="GPU kind from the catalog; None on a CPU host")
    num_gpus: int = Field(default=1, ge=1)


class EngineSpec(_Strict):
    name: str
    python: str | None = None
    startup_timeout_s: float | None = Field(default=None, gt=0)
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="a fixed port (default: a free one)")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)


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

    def label(self) -> str:
        if self.name:
            return self.name
        parts = [f"tp{self.tp}"] + ([f"pp{self.pp}"] if self.pp > 1 else [])
        parts += [f"ep{self.ep}"] if self.ep else []
        parts += [f"dp{self.dp}"] if self.dp else []
        # Secrets masked: a label is printed, stored and names files.
        parts += [a.lstrip("-") for a in redact_argv(self.args)]
        parts += [f"{k}={v}" for k, v in redact_env(self.env).items()]
        return "-".join(parts)


class WorkloadSpec(_Strict):
    """The requests of every level; the same fields as `servelab bench`."""

    api: Literal["completions", "chat"] = "completions"
    kind: Literal["synthetic", "sharegpt", "shared-prefix"] = "synthetic"
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
        given = [x is not None for x in (self.num_requests, self.requests_per_stream, self.duration_s)]
        if sum(given) != 1:
            raise ValueError("give exactly one of num_requests, requests_per_stream or duration_s")
        return self


class LoadSpec(_Strict):
    concurrency: list[int] | None = None
    rate: list[float] | None = None
    max_concurrency: int | None = Field(default=None, ge=1)
    main: float | None = Field(
        default=None, description="the level deployment checks use (default: the highest)"
    )

    @model_validator(mode="after")
    def _one_kind(self) -> LoadSpec:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency = [...] or rate = [...]")
        levels = self.levels
        if not levels:
            raise ValueError("the list of load levels is empty")
        if any(v <= 0 for v in levels):
            raise ValueError("load levels must be positive")
        if self.main is not None and self.main not in levels:
            raise ValueError(f"main = {self.main:g} is not one of the levels {levels}")
        return self

    @property
    def mode(self) -> Literal["concurrency", "rate"]:
        return "concurrency" if self.concurrency is not None else "rate"

    @property
    def levels(self) -> list[float]:
        return [float(v) for v in (self.concurrency if self.concurrency is not None else self.rate or [])]


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


class Study(_Strict):
    study: StudyInfo
    model: ModelSpec
    host: HostSpec = Field(default_factory=HostSpec)
    engine: EngineSpec
    candidates: list[CandidateSpec] = Field(default_factory=list)
    matrix: dict[str, list[Any]] = Field(default_factory=dict)
    workload: WorkloadSpec
    load: LoadSpec
    slo: SLOSpec = Field(default_factory=SLOSpec)
    objective: str = "output_throughput"
    repeats: int = Field(default=1, ge=1, le=20)
    verify_output: bool = True
    anomalies: AnomalySpec = Field(default_factory=AnomalySpec)

    @field_validator("objective")
    @classmethod
    def _objective(cls, v: str) -> str:
        if v not in OBJECTIVES:
            raise ValueError(f"unknown objective {v!r}; use one of {', '.join(OBJECTIVES)}")
        return v

    @model_validator(mode="after")
    def _expand(self) -> Study:
        expanded = expand_matrix(self.matrix)
        self.candidates = [*self.candidates, *expanded]
        if not self.candidates:
            raise ValueError("the study has no candidates: add [[candidates]] tables or a [matrix]")
        labels = [c.label() for c in self.candidates]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"candidate names must be unique; repeated: {', '.join(dup)} (give each a name)")
        if sum(c.baseline for c in self.candidates) > 1:
            raise ValueError("at most one candidate can be the baseline")
        return self

    def baseline_label(self) -> str:
        for c in self.candidates:
            if c.baseline:
                return c.label()
        return self.candidates[0].label()


def expand_matrix(matrix: dict[str, list[Any]]) -> list[CandidateSpec]:
    """The cartesian product of the matrix axes. An axis is a candidate field with a list of values, or
    `variants`: a list of partial candidate tables for values that go together (tp = 4 with pp = 2)."""
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
            axes.append([dict(v) for v in values])
        elif key in CandidateSpec.model_fields and key not in ("name", "baseline"):
            axes.append([{key: v} for v in values])
        else:
            known = ", ".join(sorted(set(CandidateSpec.model_fields) - {"name", "baseline"}))
            raise ValueError(f"matrix.{key} is not a candidate field; use variants or one of: {known}")
    out: list[CandidateSpec] = []
    for combo in itertools.product(*axes):
        merged: dict[str, Any] = {}
        for part in combo:
            for k, v in part.items():
                if k in ("args",) and k in merged:
                    merged[k] = [*merged[k], *v]
                elif k in ("env", "options") and k in merged:
                    merged[k] = {**merged[k], **v}
                else:
                    merged[k] = v
        out.append(CandidateSpec.model_validate(merged))
    return out


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
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field (check the spelling; docs/study.md lists the fields)"
            lines.append(f"  {_where(tuple(err['loc']))}: {msg}")
        raise ConfigError(
            f"{source} is not a valid study:\n" + "\n".join(lines),
            hint="docs/study.md describes every field; examples/ has complete studies.",
        ) from None


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

"""Objectives as types (issue 30): what a study ranks its candidates by. Each objective is a class that
says its direction, whether a search can optimise it, whether it needs a capacity search per candidate,
which figure of the performance model tracks it and how one request counts toward it (the cluster
bootstrap's per-request form). Adding an objective is adding a subclass here: `__init_subclass__`
registers it by its `name`, and the study's `objective = "..."` and `[search] objectives` accept it.

Pure: imports nothing of ours (config, analyze, search, trial and the report read it).
"""

from __future__ import annotations

from typing import ClassVar, Literal

Direction = Literal["max", "min"]


class Objective:
    name: ClassVar[str] = ""
    direction: ClassVar[Direction] = "max"
    # each candidate's server gets a capacity search (bench --find-capacity) under the study's SLO
    searches_capacity: ClassVar[bool] = False
    # a [search] may optimise it (a capacity search per proposed point is not a search's step)
    searchable: ClassVar[bool] = True
    # the model's prediction that follows it (search.prior ranks points by it)
    predicted_as: ClassVar[str] = "output_throughput"
    # a rate (a sum over requests per second of request time); `request_share` counts one request
    is_rate: ClassVar[bool] = False
    # whether a request's share depends on it meeting the study's per-request SLO
    counts_slo: ClassVar[bool] = False
    # ranking by it needs a price per GPU-hour (a study without one is refused before anything runs)
    needs_price: ClassVar[bool] = False
    # why a measured level can lack its figure (a score without one says so; "": it never lacks one)
    missing: ClassVar[str] = ""

    _registry: ClassVar[dict[str, type[Objective]]] = {}

    def __init_subclass__(cls, **kw: object) -> None:
        super().__init_subclass__(**kw)
        if cls.name:
            Objective._registry[cls.name] = cls

    @property
    def sign(self) -> float:
        """+1 when higher is better, -1 when lower is."""
        return 1.0 if self.direction == "max" else -1.0

    def request_share(self, output_tokens: float, input_tokens: float, meets_slo: bool) -> float | None:
        """A rate objective: one request's share of its numerator (per second of request time). None: the
        objective is not a rate."""
        return None

    def latency(self) -> str | None:
        """A latency-median objective: the request latency it is the median of (ttft, tpot, e2e)."""
        return None


class _Rate(Objective):
    is_rate = True


class OutputThroughput(_Rate):
    name = "output_throughput"

    def request_share(self, output_tokens: float, input_tokens: float, meets_slo: bool) -> float | None:
        return output_tokens


class TotalTokenThroughput(_Rate):
    name = "total_token_throughput"

    def request_share(self, output_tokens: float, input_tokens: float, meets_slo: bool) -> float | None:
        return output_tokens + input_tokens


class RequestThroughput(_Rate):
    name = "request_throughput"

    def request_share(self, output_tokens: float, input_tokens: float, meets_slo: bool) -> float | None:
        return 1.0


class Goodput(_Rate):
    """Output tokens/s of the requests meeting every SLO."""

    name = "goodput"
    counts_slo = True

    def request_share(self, output_tokens: float, input_tokens: float, meets_slo: bool) -> float | None:
        return output_tokens if meets_slo else 0.0


class _LatencyMedian(Objective):
    direction = "min"
    of: ClassVar[str] = ""

    def latency(self) -> str | None:
        return self.of


class TtftMedian(_LatencyMedian):
    name = "ttft_ms_p50"
    of = "ttft"
    predicted_as = "ttft_ms"


class TpotMedian(_LatencyMedian):
    name = "tpot_ms_p50"
    of = "tpot"
    predicted_as = "tpot_ms"


class E2eMedian(_LatencyMedian):
    name = "e2e_ms_p50"
    of = "e2e"


class Energy(Objective):
    """Joules of GPU energy per output token at a level (`LevelSummary.energy.j_per_output_token`): the
    power of the candidate's GPUs integrated over the level, over its output tokens (servelab.energy)."""

    name = "energy"
    direction = "min"
    missing = (
        "no GPU power was sampled (bench reads it from the engine's telemetry route, or from NVML or "
        "nvidia-smi when the server runs on this machine; --scrape-interval 0 samples nothing)"
    )
    predicted_as = "gpu_s_per_m_output_tokens"  # at a fixed power, energy follows GPU-seconds per token


class Cost(Objective):
    """Dollars per million output tokens at a level (`LevelSummary.cost.usd_per_m_output_tokens`): the
    candidate's GPUs at their price per GPU-hour, over the level's output throughput (servelab.energy)."""

    name = "cost"
    direction = "min"
    needs_price = True
    predicted_as = "gpu_s_per_m_output_tokens"  # at a fixed price, cost follows GPU-seconds per token


class Capacity(Objective):
    """The highest load each candidate sustains under the study's SLO (its own capacity search)."""

    name = "capacity"
    searches_capacity = True
    searchable = False


def objective(name: str) -> Objective:
    """The objective called `name` (ValueError naming the known ones otherwise)."""
    cls = Objective._registry.get(name)
    if cls is None:
        raise ValueError(f"unknown objective {name!r}; use one of {', '.join(Objective._registry)}")
    return cls()


def names(searchable_only: bool = False) -> list[str]:
    return [n for n, c in Objective._registry.items() if c.searchable or not searchable_only]


def directions() -> dict[str, Direction]:
    """Every objective's direction, by name (config.sections.OBJECTIVES)."""
    return {n: c.direction for n, c in Objective._registry.items()}

"""Capacity search: the highest load (concurrency or request rate) whose levels meet an SLO.

Pure logic, no I/O: `decide(spec, history)` says which load to probe next (or why to stop) from the
probes made so far, so the search is tested without a server; the runner (`bench.runner.find_capacity`)
runs each probe as a level of one stored run.

The search brackets, then bisects. Bracketing grows the load geometrically (`growth`×) from `start`
until a probe fails (or shrinks it until one passes); bisection then halves [highest pass, lowest fail]
until the step is at most `resolution` of the pass (or one whole stream, by concurrency). A pass above
a lower failure (noise, or a non-monotonic server) does not move the bracket: the capacity is the
highest load that passed *below* every failure, and such passes are reported as `non_monotonic`.

A probe's verdict (`verdict`) leaves its first `warmup_fraction` of requests (by due time) out: a
closed loop's first wave arrives at once, an open loop's queue is still filling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from servelab.bench import metrics as M
from servelab.results import (
    CapacityProbe,
    CapacityResult,
    LevelSummary,
    RequestRecord,
    Saturation,
)

STATS = ("p50", "p90", "p95", "p99", "mean")
# A probe with more failed requests than this fails the SLO whatever its latencies.
MAX_FAILURE_RATE = 0.01
WARMUP_FRACTION = 0.2


@dataclass(frozen=True, slots=True)
class Limit:
    """`p99_ttft_ms<=2000`: the level's p99 TTFT must be at most 2000 ms."""

    metric: str
    stat: str
    limit_ms: float

    @property
    def name(self) -> str:
        return f"{self.stat}_{self.metric}"


@dataclass(frozen=True, slots=True)
class CapacitySLO:
    """Limits on a level's statistics; a bare metric (`tpot_ms<=50`) is its p99."""

    limits: tuple[Limit, ...]
    text: str
    max_failure_rate: float = MAX_FAILURE_RATE

    def check(self, summary: LevelSummary) -> tuple[dict[str, float | None], list[str]]:
        """The probe's value of every limit, and why it fails (empty: it passes)."""
        values: dict[str, float | None] = {}
        reasons: list[str] = []
        for lim in self.limits:
            v = summary.stat(lim.metric, lim.stat)
            values[lim.name] = v
            if v is None:
                reasons.append(f"no {lim.name} (no request completed)")
            elif v > lim.limit_ms:
                reasons.append(f"{lim.name} {v:,.1f} > {lim.limit_ms:g}")
        if summary.failure_rate > self.max_failure_rate:
            reasons.append(f"{summary.failure_rate:.1%} of requests failed (> {self.max_failure_rate:.0%})")
        return values, reasons


def parse_capacity_slo(text: str | None) -> CapacitySLO:
    """`p99_ttft_ms<=2000,p99_tpot_ms<=50` → CapacitySLO. Raises ValueError naming the bad part."""
    if not text or not text.strip():
        raise ValueError("--find-capacity needs --slo, e.g. --slo p99_ttft_ms<=2000,p99_tpot_ms<=50")
    limits = [Limit(metric, stat or "p99", limit) for stat, metric, limit in M.parse_limits(text)]
    if not limits:
        raise ValueError("--slo names no limit, e.g. p99_ttft_ms<=2000")
    return CapacitySLO(tuple(limits), text)


def steady(records: Sequence[RequestRecord], warmup_fraction: float = WARMUP_FRACTION) -> list[RequestRecord]:
    """The records after the first `warmup_fraction` of them by due time (at least one is kept)."""
    ordered = sorted(records, key=lambda r: (r.start_s, r.idx))
    skip = min(len(ordered) - 1, int(len(ordered) * warmup_fraction)) if ordered else 0
    return ordered[skip:]


def verdict(
    load: float,
    level: int | None,
    records: Sequence[RequestRecord],
    slo: CapacitySLO,
    speed: float = 1.0,
    saturation: Saturation | None = None,
    warmup_fraction: float = WARMUP_FRACTION,
) -> CapacityProbe:
    """One probe's pass/fail from its records (in the GPU's time at `speed`). A probe stopped early
    because it was over-saturated fails whatever its latencies so far."""
    summary = M.summarize(steady(records, warmup_fraction)).in_gpu_time(speed)
    values, reasons = slo.check(summary)
    stopped = saturation is not None and saturation.stopped_early is not None
    if stopped and saturation is not None:
        reasons.insert(0, f"stopped early: {saturation.stopped_early}")
    elif saturation is not None and saturation.server_saturated:
        reasons.append("the server could not keep up: " + "; ".join(saturation.reasons))
    return CapacityProbe(
        load=load, level=level, passed=not reasons, values=values, reasons=reasons, stopped_early=stopped
    )


@dataclass(frozen=True, slots=True)
class SearchSpec:
    """How to search: by concurrency (whole streams) or request rate, from `start`, growing `growth`×
    while probes pass, until the bracket's step is ≤ `resolution` × its pass, in ≤ `max_probes`."""

    by: Literal["concurrency", "rate"] = "concurrency"
    start: float = 1.0
    growth: float = 2.0
    resolution: float = 0.05
    max_probes: int = 8
    min_load: float | None = None  # default: 1 stream, or start / 64 requests/s
    max_load: float | None = None  # default: 4096 streams, or start × 4096 requests/s

    def __post_init__(self) -> None:
        if self.start <= 0 or not math.isfinite(self.start):
            raise ValueError("the first load must be a positive number")
        if self.growth <= 1:
            raise ValueError("growth must be above 1")
        if not 0 < self.resolution < 1:
            raise ValueError("--resolution must lie between 0 and 100 %")
        if self.max_probes < 1:
            raise ValueError("--max-probes must be at least 1")

    @property
    def lowest(self) -> float:
        if self.min_load is not None:
            return self.min_load
        return 1.0 if self.by == "concurrency" else self.start / 64

    @property
    def highest(self) -> float:
        if self.max_load is not None:
            return self.max_load
        return 4096.0 if self.by == "concurrency" else self.start * 4096

    def rounded(self, x: float) -> float:
        """A whole number of streams; a rate to three significant figures."""
        if self.by == "concurrency":
            return float(max(1, round(x)))
        digits = 2 - math.floor(math.log10(abs(x)))
        return round(x, digits)


@dataclass(frozen=True, slots=True)
class Decision:
    load: float | None  # the next probe; None: stop
    reason: str  # why this probe, or why the search stops


def bracket(history: Sequence[CapacityProbe]) -> tuple[float | None, float | None]:
    """(highest pass below the lowest failure, lowest failure)."""
    fails = [p.load for p in history if not p.passed]
    low_fail = min(fails) if fails else None
    passes = [p.load for p in history if p.passed and (low_fail is None or p.load < low_fail)]
    return (max(passes) if passes else None), low_fail


def converged(spec: SearchSpec, passed: float, failed: float) -> bool:
    step = failed - passed
    return step <= spec.resolution * passed + 1e-12 or (spec.by == "concurrency" and step <= 1)


def decide(spec: SearchSpec, history: Sequence[CapacityProbe]) -> Decision:
    """The next probe, or why the search stops."""
    if not history:
        return Decision(spec.rounded(spec.start), "first probe")
    ok, bad = bracket(history)
    if ok is not None and bad is not None and converged(spec, ok, bad):
        return Decision(None, f"converged: step {bad - ok:g} ≤ {spec.resolution:.0%} of {ok:g}")
    if len(history) >= spec.max_probes:
        return Decision(None, f"max probes ({spec.max_probes}) reached before the step met the resolution")
    probed = {p.load for p in history}
    if bad is None:
        assert ok is not None
        if ok >= spec.highest:
            return Decision(None, f"every probe passed up to the highest load {spec.highest:g}")
        nxt = spec.rounded(min(spec.highest, ok * spec.growth))
        return Decision(nxt, f"bracketing: {ok:g} passed, growing ×{spec.growth:g}")
    if ok is None:
        if bad <= spec.lowest:
            return Decision(None, f"even the lowest load {spec.lowest:g} failed the SLO")
        nxt = spec.rounded(max(spec.lowest, bad / spec.growth))
        if nxt in probed or nxt >= bad:
            return Decision(None, f"even the lowest load {nxt:g} failed the SLO")
        return Decision(nxt, f"bracketing: {bad:g} failed, shrinking ÷{spec.growth:g}")
    nxt = spec.rounded((ok + bad) / 2)
    if nxt in probed or not ok < nxt < bad:
        return Decision(None, f"converged: no load between {ok:g} and {bad:g} at this rounding")
    return Decision(nxt, f"bisecting [{ok:g}, {bad:g}]")


def next_probe(spec: SearchSpec, history: Sequence[CapacityProbe]) -> float | None:
    """The next load to probe (None: the search is over)."""
    return decide(spec, history).load


def result(
    spec: SearchSpec,
    slo: CapacitySLO,
    history: Sequence[CapacityProbe],
    stop_reason: str = "",
    speed: float = 1.0,
    warmup_fraction: float = WARMUP_FRACTION,
) -> CapacityResult:
    """The search so far (or at its end) as the stored, typed result."""
    ok, bad = bracket(history)
    non_monotonic = sorted(p.load for p in history if p.passed and bad is not None and p.load > bad)
    return CapacityResult(
        by=spec.by,
        slo=slo.text,
        resolution=spec.resolution,
        capacity=ok,
        bracket=(ok, bad),
        step=(bad - ok) if ok is not None and bad is not None else None,
        converged=ok is not None and bad is not None and converged(spec, ok, bad),
        stop_reason=stop_reason,
        probes=list(history),
        non_monotonic=non_monotonic,
        warmup_fraction=warmup_fraction,
        speed=speed,
    )


def overlap(a: CapacityResult, b: CapacityResult) -> bool:
    """Whether two capacities are within each other's uncertainty: each lies in [pass, fail) of the
    other's bracket stretched to cover both (an unbounded bracket overlaps what lies above its pass)."""

    def span(r: CapacityResult) -> tuple[float, float]:
        lo = r.capacity if r.capacity is not None else 0.0
        hi = r.bracket[1] if r.bracket[1] is not None else math.inf
        return lo, hi

    (alo, ahi), (blo, bhi) = span(a), span(b)
    return alo < bhi and blo < ahi

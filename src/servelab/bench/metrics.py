"""The one definition of every benchmark metric (docs/metrics.md describes the same formulas).

Pure functions over plain records: no I/O, no clocks. All times are seconds in records and
milliseconds in summaries, like `vllm bench serve`. A level's metrics come out as the typed
`servelab.results.LevelSummary`, the one spelling every reader uses.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from servelab.results import PERCENTILES, Crosscheck, LengthMismatch, LevelSummary, RequestRecord, Stats


def tpot_s(rec: RequestRecord) -> float | None:
    """Time per output token after the first: (E2E − TTFT) / (N − 1); undefined for N ≤ 1."""
    if (
        not rec.ok
        or rec.ttft_s is None
        or rec.e2e_s is None
        or not rec.output_tokens
        or rec.output_tokens < 2
    ):
        return None
    return (rec.e2e_s - rec.ttft_s) / (rec.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency limits a request must meet to count towards goodput (milliseconds)."""

    limits: tuple[tuple[str, float], ...] = ()

    def met_by(self, rec: RequestRecord) -> bool:
        if not rec.ok:
            return False
        for name, limit in self.limits:
            value = slo_value_ms(rec, name)
            if value is None or value > limit:
                return False
        return True

    def as_dict(self) -> dict[str, float]:
        return dict(self.limits)


SLO_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")
_LIMIT_NAME = re.compile(r"^(?:(p50|p90|p95|p99|mean)_)?([a-z0-9_]+)$")


def slo_value_ms(rec: RequestRecord, name: str) -> float | None:
    if name == "ttft_ms":
        return None if rec.ttft_s is None else rec.ttft_s * 1000
    if name == "tpot_ms":
        t = tpot_s(rec)
        # A one-token reply has no TPOT; it cannot violate a TPOT limit.
        return 0.0 if t is None and rec.ok else (None if t is None else t * 1000)
    if name == "e2e_ms":
        return None if rec.e2e_s is None else rec.e2e_s * 1000
    if name == "itl_ms":
        return max(rec.itl_s) * 1000 if rec.itl_s else 0.0
    raise ValueError(f"unknown SLO metric {name!r}; known: {', '.join(SLO_METRICS)}")


def stats_ms(values_s: list[float] | np.ndarray) -> Stats:
    """mean, std, min, max and the standard percentiles of a list of seconds, in milliseconds."""
    arr = np.asarray(values_s, dtype=float) * 1000.0
    if arr.size == 0:
        return Stats()
    pct = dict(zip(PERCENTILES, (float(v) for v in np.percentile(arr, PERCENTILES)), strict=True))
    return Stats(
        mean=float(arr.mean()),
        std=float(arr.std()),
        min=float(arr.min()),
        max=float(arr.max()),
        p50=pct[50],
        p90=pct[90],
        p95=pct[95],
        p99=pct[99],
    )


def benchmark_duration_s(records: list[RequestRecord]) -> float:
    """From the first request's due time to the last completion (failed requests count too)."""
    if not records:
        return 0.0
    first = min(r.start_s for r in records)
    ends = [r.start_s + (r.e2e_s or 0.0) for r in records]
    return max(ends) - first


def summarize(
    records: list[RequestRecord], slo: SLO | None = None, duration_s: float | None = None
) -> LevelSummary:
    """Every metric of one load level.

    Throughputs divide by `duration_s` when given (the level's wall time), else by the span from the
    first due time to the last completion.
    """
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    duration = duration_s if duration_s is not None else benchmark_duration_s(records)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.input_tokens or 0 for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [t for r in ok if (t := tpot_s(r)) is not None]
    e2es = [r.e2e_s for r in ok if r.e2e_s is not None]
    itls = [g for r in ok for g in r.itl_s]
    good = [r for r in ok if slo is not None and slo.met_by(r)]

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    errors = Counter(r.error_kind or "unknown" for r in failed)
    examples: dict[str, str] = {}
    for r in failed:
        examples.setdefault(r.error_kind or "unknown", (r.error_message or "")[:1000])  # the server's words

    mismatched = [
        r
        for r in ok
        if r.requested_output_tokens is not None and r.output_tokens != r.requested_output_tokens
    ]
    tok_checked = [r for r in ok if r.tokenizer_output_tokens is not None and r.token_source == "usage"]
    crosscheck = None
    if tok_checked:
        disagree = [
            r for r in tok_checked if abs((r.tokenizer_output_tokens or 0) - (r.output_tokens or 0)) > 1
        ]
        crosscheck = Crosscheck(checked=len(tok_checked), disagree=len(disagree))
    with_slo = slo is not None and bool(slo.limits)
    return LevelSummary(
        num_requests=len(records),
        completed=len(ok),
        failed=len(failed),
        failure_rate=(len(failed) / len(records)) if records else 0.0,
        errors=dict(errors),
        error_examples=examples,
        duration_s=duration,
        total_input_tokens=in_tokens,
        total_output_tokens=out_tokens,
        mean_input_tokens=(in_tokens / len(ok)) if ok else None,
        mean_output_tokens=(out_tokens / len(ok)) if ok else None,
        request_throughput=per_s(len(ok)),
        output_throughput=per_s(out_tokens),
        total_token_throughput=per_s(out_tokens + in_tokens),
        ttft_ms=stats_ms(ttfts),
        tpot_ms=stats_ms(tpots),
        itl_ms=stats_ms(itls),
        e2e_ms=stats_ms(e2es),
        length_mismatches=len(mismatched),
        length_mismatch_examples=[
            LengthMismatch(idx=r.idx, requested=r.requested_output_tokens, got=r.output_tokens)
            for r in mismatched[:5]
        ],
        token_sources=dict(Counter(r.token_source or "none" for r in ok)),
        tokenizer_crosscheck=crosscheck,
        slo=slo.as_dict() if with_slo and slo is not None else None,
        good_requests=len(good) if with_slo else None,
        goodput=per_s(sum(r.output_tokens or 0 for r in good)) if with_slo else None,
        request_goodput=per_s(len(good)) if with_slo else None,
        slo_attainment=((len(good) / len(records)) if records else 0.0) if with_slo else None,
    )


def parse_limits(text: str) -> list[tuple[str | None, str, float]]:
    """`p99_ttft_ms<=2000,tpot_ms<=50` → [(stat or None, metric, limit ms)]: the one spelling of an SLO,
    read per request by `--slo` and per level by `--find-capacity`. Raises ValueError naming the bad part."""
    limits: list[tuple[str | None, str, float]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("<=")
        m = _LIMIT_NAME.match(name.strip())
        if not sep or m is None:
            raise ValueError(f"SLO part {part!r} must look like [STAT_]METRIC<=MS, e.g. p99_ttft_ms<=2000")
        stat, metric = m.group(1), m.group(2)
        if metric not in SLO_METRICS:
            raise ValueError(f"unknown SLO metric {metric!r}; known: {', '.join(SLO_METRICS)}")
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"SLO limit {value.strip()!r} for {name.strip()} is not a number") from None
        if not math.isfinite(limit) or limit <= 0:
            raise ValueError(f"SLO limit for {name.strip()} must be a positive number, got {value.strip()!r}")
        limits.append((stat, metric, limit))
    return limits


def parse_slo(text: str | None) -> SLO | None:
    """`ttft_ms<=500,tpot_ms<=50` → SLO. Per request, `p99_ttft_ms` (a capacity search's level
    statistic) is the same limit as `ttft_ms`. Raises ValueError with the offending part."""
    if not text:
        return None
    return SLO(tuple((metric, limit) for _, metric, limit in parse_limits(text)))

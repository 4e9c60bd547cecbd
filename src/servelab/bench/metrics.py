"""The one definition of every benchmark metric (docs/metrics.md describes the same formulas).

Pure functions over plain records: no I/O, no clocks. All times are seconds in records and
milliseconds in summaries, like `vllm bench serve`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


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

    @property
    def end_s(self) -> float | None:
        return None if self.e2e_s is None else self.start_s + self.e2e_s


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


def stats_ms(values_s: list[float] | np.ndarray) -> dict[str, float | None]:
    """mean, std, min, max and the standard percentiles of a list of seconds, in milliseconds."""
    arr = np.asarray(values_s, dtype=float) * 1000.0
    if arr.size == 0:
        return {"mean": None, "std": None, "min": None, "max": None, **{f"p{p}": None for p in PERCENTILES}}
    out: dict[str, float | None] = {
        "mean": float(arr.mean()),
        "std": float(arr.std()),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }
    for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES), strict=True):
        out[f"p{p}"] = float(v)
    return out


def benchmark_duration_s(records: list[RequestRecord]) -> float:
    """From the first request's due time to the last completion (failed requests count too)."""
    if not records:
        return 0.0
    first = min(r.start_s for r in records)
    ends = [r.start_s + (r.e2e_s or 0.0) for r in records]
    return max(ends) - first


def summarize(
    records: list[RequestRecord], slo: SLO | None = None, duration_s: float | None = None
) -> dict[str, Any]:
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
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)

    errors = Counter(r.error_kind or "unknown" for r in failed)
    examples: dict[str, str] = {}
    for r in failed:
        examples.setdefault(r.error_kind or "unknown", (r.error_message or "")[:300])

    mismatched = [
        r
        for r in ok
        if r.requested_output_tokens is not None and r.output_tokens != r.requested_output_tokens
    ]
    summary: dict[str, Any] = {
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(failed),
        "failure_rate": (len(failed) / len(records)) if records else 0.0,
        "errors": dict(errors),
        "error_examples": examples,
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "mean_input_tokens": (in_tokens / len(ok)) if ok else None,
        "mean_output_tokens": (out_tokens / len(ok)) if ok else None,
        "request_throughput": per_s(len(ok)),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(out_tokens + in_tokens),
        "ttft_ms": stats_ms(ttfts),
        "tpot_ms": stats_ms(tpots),
        "itl_ms": stats_ms(itls),
        "e2e_ms": stats_ms(e2es),
        "length_mismatches": len(mismatched),
        "length_mismatch_examples": [
            {"idx": r.idx, "requested": r.requested_output_tokens, "got": r.output_tokens}
            for r in mismatched[:5]
        ],
        "token_sources": dict(Counter(r.token_source or "none" for r in ok)),
    }
    tok_checked = [r for r in ok if r.tokenizer_output_tokens is not None and r.token_source == "usage"]
    if tok_checked:
        disagree = [
            r for r in tok_checked if abs((r.tokenizer_output_tokens or 0) - (r.output_tokens or 0)) > 1
        ]
        summary["tokenizer_crosscheck"] = {"checked": len(tok_checked), "disagree": len(disagree)}
    if slo is not None and slo.limits:
        summary["slo"] = slo.as_dict()
        summary["good_requests"] = len(good)
        summary["goodput"] = per_s(len(good))
        summary["goodput_output_tokens"] = per_s(sum(r.output_tokens or 0 for r in good))
        summary["slo_attainment"] = (len(good) / len(records)) if records else 0.0
    return summary


def _ms(summary: dict[str, Any], metric: str, stat: str) -> float | None:
    value: float | None = summary[metric][stat]  # a stats_ms() entry
    return value


def vllm_compatible(summary: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The same level in `vllm bench serve`'s result field names, so numbers compare with that tool."""
    out: dict[str, Any] = {
        "duration": summary["duration_s"],
        "completed": summary["completed"],
        "failed": summary["failed"],
        "total_input_tokens": summary["total_input_tokens"],
        "total_output_tokens": summary["total_output_tokens"],
        "request_throughput": summary["request_throughput"],
        "request_goodput": summary.get("goodput"),
        "output_throughput": summary["output_throughput"],
        "total_token_throughput": summary["total_token_throughput"],
    }
    for ours, theirs in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("itl_ms", "itl"), ("e2e_ms", "e2el")):
        out[f"mean_{theirs}_ms"] = _ms(summary, ours, "mean")
        out[f"median_{theirs}_ms"] = _ms(summary, ours, "p50")
        out[f"std_{theirs}_ms"] = _ms(summary, ours, "std")
        for p in PERCENTILES:
            if p != 50:
                out[f"p{p}_{theirs}_ms"] = _ms(summary, ours, f"p{p}")
    if extra:
        out.update(extra)
    return out


def parse_slo(text: str | None) -> SLO | None:
    """`ttft_ms<=500,tpot_ms<=50` → SLO. Raises ValueError with the offending part."""
    if not text:
        return None
    limits: list[tuple[str, float]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "<=" not in part:
            raise ValueError(f"SLO part {part!r} must look like NAME<=VALUE, e.g. ttft_ms<=500")
        name, _, value = part.partition("<=")
        name = name.strip()
        if name not in SLO_METRICS:
            raise ValueError(f"unknown SLO metric {name!r}; known: {', '.join(SLO_METRICS)}")
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"SLO limit {value.strip()!r} for {name} is not a number") from None
        if not math.isfinite(limit) or limit <= 0:
            raise ValueError(f"SLO limit for {name} must be a positive number, got {value.strip()!r}")
        limits.append((name, limit))
    return SLO(tuple(limits))

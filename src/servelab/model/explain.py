"""A measured run beside the prediction, level by level, with the gap attributed to a component."""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.load import kind_of
from servelab.model.predict import Setup, Workload, evaluate
from servelab.results import LevelSummary


@dataclass
class LevelComparison:
    concurrency: int
    measured: dict[str, float | None]
    predicted: dict[str, float | None]
    error_pct: dict[str, float | None]
    attribution: dict[str, float]
    largest_gap: str
    sources: dict[str, str]  # per decode-step term: "formula" or the measured table it was read off
    # the level as it was run: its mode (concurrency, rate, trace) and value (in flight, req/s, time
    # scale); `concurrency` is the requests in flight it had (an open loop's by Little's law)
    mode: str = "concurrency"
    level: float = 0.0


@dataclass
class Explanation:
    levels: list[LevelComparison] = field(default_factory=list)
    largest_gap: str = ""


def _err(p: float | None, m: float | None) -> float | None:
    if p is None or not m:
        return None
    return (p - m) / m * 100.0


def explain_levels(setup: Setup, levels: list[LevelSummary], isl: int, osl: int) -> Explanation:
    """Compare each measured level (in the run's shown time base) to the prediction at its concurrency.

    The measured TPOT is split the way the model splits it: the predicted weights + KV + compute time is
    taken as given (memory and FLOPs are physics), and the remainder is the measured cost of
    communication, overhead and prefill stalls, set beside the predicted remainder."""
    out = Explanation()
    worst = (0.0, "")
    for lv in levels:
        s = lv
        if not s.completed:
            continue
        c = s.concurrency  # a rate or trace level: the requests in flight it had (servelab.load)
        kind = kind_of(s.mode)
        wl = Workload(round(s.mean_input_tokens or isl), round(s.mean_output_tokens or osl), c)
        p = evaluate(setup, wl)
        measured: dict[str, float | None] = {
            "tpot_ms": s.tpot_ms.p50,
            "ttft_ms": s.ttft_ms.p50,
            "output_throughput": s.output_throughput,
        }
        predicted = {"tpot_ms": p.tpot_ms, "ttft_ms": p.ttft_ms, "output_throughput": p.output_throughput}
        errors = {k: _err(predicted[k], measured[k]) for k in measured}
        b = p.decode_breakdown_ms
        physics = b.get("weights", 0) + b.get("kv_cache", 0) + b.get("compute", 0)
        pred_rest = (p.tpot_ms or 0) - physics
        attribution: dict[str, float] = {
            "predicted_weights_kv_compute_ms": physics,
            "predicted_comm_overhead_ms": pred_rest,
        }
        if measured["tpot_ms"]:
            attribution["measured_comm_overhead_ms"] = float(measured["tpot_ms"]) - physics
        gaps = {k: abs(v) for k, v in errors.items() if v is not None}
        name = max(gaps, key=lambda k: gaps[k]) if gaps else ""
        if name == "tpot_ms" and "measured_comm_overhead_ms" in attribution:
            delta = attribution["measured_comm_overhead_ms"] - pred_rest
            label = f"TPOT off by {errors['tpot_ms']:+.0f}%: communication + overhead {delta:+.2f} ms per token vs predicted"
        elif name:
            label = f"{name} off by {errors[name]:+.0f}%"
        else:
            label = "no measured numbers to compare"
        if name and gaps[name] > worst[0]:
            where = kind.label(s.value) if kind.closed_loop else f"{kind.label(s.value)} (~{c} in flight)"
            worst = (gaps[name], f"at {where}: {label}")
        out.levels.append(
            LevelComparison(
                c,
                measured,
                predicted,
                errors,
                attribution,
                label,
                p.sources,
                s.mode,
                kind.level_value(s.value),
            )
        )
    out.largest_gap = worst[1]
    return out

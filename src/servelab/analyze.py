"""Pure analysis of a study's measurements: SLO checks, confidence intervals, anomalies, the ranking.

Inputs are level *digests*: `results.LevelSummary.digest()` (the flat numbers a study compares, in the
time base shown to users) plus GPU telemetry when there is any, so this module is testable without
servers.

**The noise verdict.** With two trials a Student-t interval over trial means has one degree of freedom
(t = 12.7) and says little. When the per-request records of each trial are at hand (`Cluster.of`), the
winner's margin is judged by a *cluster bootstrap*: trials are the clusters, resampled with replacement,
and within each drawn trial its requests are resampled too (two stages), `BOOTSTRAP_B` times with a fixed
seed; the margin exceeds the noise when the 95 % percentile interval of the difference excludes zero.
The data are put in a canonical order first, so the same stored data give the same verdict whatever
order they were read in. Without per-request data the t-interval over trial means is used, and the
verdict says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from servelab.config.sections import OBJECTIVES, AnomalySpec, SLOSpec
from servelab.jsontypes import JsonObject, JsonValue
from servelab.objectives import objective as objective_of
from servelab.results import RequestRecord

# Two-sided 95 % Student-t critical values by degrees of freedom (1..30); beyond, the normal 1.96.
_T95 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def t95(dof: int) -> float:
    return _T95[dof - 1] if 1 <= dof <= len(_T95) else 1.96


@dataclass
class Estimate:
    """Mean of the repeats with a 95 % confidence interval (None half-width with one repeat)."""

    mean: float | None
    half_width: float | None
    n: int

    @property
    def low(self) -> float | None:
        return None if self.mean is None or self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.mean is None or self.half_width is None else self.mean + self.half_width


def estimate(values: list[float | None]) -> Estimate:
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return Estimate(None, None, 0)
    if len(xs) == 1:
        return Estimate(xs[0], None, 1)
    sd = statistics.stdev(xs)
    return Estimate(statistics.fmean(xs), t95(len(xs) - 1) * sd / math.sqrt(len(xs)), len(xs))


# A level digest (`results.LevelSummary.digest()`, or one `combine_repeats` merged) as this module reads it:
# open JSON another room writes, each value narrowed where it is read (`number`).
Digest = Mapping[str, object]


def number(d: Digest, key: str) -> int | float | None:
    """A digest's number under `key` as stored (an int stays an int); None when absent or not a number."""
    v = d.get(key)
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def level_of(d: Digest) -> float:
    """A digest's level (every digest has one: KeyError, TypeError or ValueError where it does not)."""
    v = d["level"]
    if not isinstance(v, int | float | str):
        raise TypeError(f"a level of {v!r}")
    return float(v)


def stored_level(d: Digest) -> int | float:
    """A digest's level as stored (a concurrency `4` stays `4`; KeyError or TypeError where there is none)."""
    v = d["level"]
    if isinstance(v, int | float) and not isinstance(v, bool):
        return v
    raise TypeError(f"a level of {v!r}")


def digests(v: object) -> list[Digest]:
    """A stored list of level digests (an outcome's `levels`) read as digests; absent, none."""
    return [d for d in _items(v) if isinstance(d, Mapping)]


def combine_repeats(repeats: Sequence[Sequence[Digest]]) -> list[JsonObject]:
    """Per level, the mean of every numeric digest field over repeats, plus `ci` for the objective fields."""
    by_level: dict[float, list[Digest]] = {}
    for levels in repeats:
        for d in levels:
            by_level.setdefault(level_of(d), []).append(d)
    out: list[JsonObject] = []
    for level in sorted(by_level):
        ds = by_level[level]
        ci: JsonObject = {}
        merged: JsonObject = {"level": level, "repeats": len(ds), "ci": ci}
        keys = {k for d in ds for k, v in d.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        for k in sorted(keys - {"level"}):
            est = estimate([number(d, k) for d in ds])
            merged[k] = est.mean
            if k in OBJECTIVES or k in ("output_throughput", "tpot_ms_p50", "ttft_ms_p50"):
                ci[k] = est.half_width
        merged["errors"] = _sum_counts([_counts(d.get("errors")) for d in ds])
        merged["flags"] = list[JsonValue](sorted({str(f) for d in ds for f in _items(d.get("flags"))}))
        merged["died"] = any(d.get("died") for d in ds)
        mode = next((d["mode"] for d in ds if d.get("mode")), None)
        if mode is not None:  # a rate or trace level stays one (digests stored before it carry none)
            merged["mode"] = str(mode)
        out.append(merged)
    return out


def _counts(v: object) -> Mapping[str, object]:
    """A digest's error counts (`errors`: kind -> count; absent or empty: none)."""
    return v if isinstance(v, Mapping) and v else {}


def _items(v: object) -> list[object]:
    """A digest's list (absent: empty)."""
    return list(v) if isinstance(v, list | tuple) else []


def _sum_counts(dicts: list[Mapping[str, object]]) -> JsonObject:
    total: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            if not isinstance(v, int | float | str):
                raise TypeError(f"an error count of {v!r}")
            total[k] = total.get(k, 0) + int(v)
    return dict[str, JsonValue](total)


def slo_failures(d: Digest, slo: SLOSpec) -> list[str]:
    """Why a level misses the SLOs (empty when it meets every one)."""
    reasons = []
    done = (number(d, "completed") or 0) + (number(d, "failed") or 0)
    success = (number(d, "completed") or 0) / done if done else 0.0
    if success < slo.min_success_rate:
        reasons.append(f"success rate {success:.1%} < {slo.min_success_rate:.1%}")
    for metric, stat, limit in slo.limits():
        value = number(d, f"{metric}_{stat}")
        if value is None:
            reasons.append(f"{metric} {stat} not measured")
        elif value > limit:
            reasons.append(f"{metric} {stat} {value:.1f} > {limit:g}")
    if d.get("died"):
        reasons.append("the server died during this level")
    return reasons


@dataclass
class Anomaly:
    level: float
    kind: str  # throughput_collapse | power_drop | utilization_drop | error_rate | server_died
    detail: str

    def to_dict(self) -> JsonObject:
        return asdict(self)


def anomalies(
    levels: Sequence[Digest], baseline: Sequence[Digest] | None, spec: AnomalySpec
) -> list[Anomaly]:
    """Flags against the study's baseline candidate (same load level) and against absolute limits."""
    base = {level_of(d): d for d in baseline or []}
    out: list[Anomaly] = []
    for d in levels:
        lv = level_of(d)
        if d.get("died"):
            out.append(Anomaly(lv, "server_died", "the server process died during this level"))
        rate = number(d, "failure_rate") or 0.0
        if rate > spec.max_error_rate:
            out.append(Anomaly(lv, "error_rate", f"{rate:.1%} of requests failed ({d.get('errors') or {}})"))
        b = base.get(lv)
        if b is None:
            continue
        thr, bthr = number(d, "output_throughput") or 0.0, number(b, "output_throughput") or 0.0
        if bthr > 0 and thr < spec.collapse_ratio * bthr:
            out.append(
                Anomaly(
                    lv,
                    "throughput_collapse",
                    f"{thr:,.0f} tok/s vs the baseline's {bthr:,.0f} tok/s ({thr / bthr:.0%})",
                )
            )
        # Lower power at the same throughput is efficiency, not a fault: power and utilization falls
        # are flagged when throughput fell with them (the GPUs starved: 1,867 → 236 tok/s at ~125 W).
        if not (bthr > 0 and thr < 0.9 * bthr):
            continue
        pw, bpw = number(d, "gpu_power_w"), number(b, "gpu_power_w")
        if pw is not None and bpw and pw < spec.power_drop_ratio * bpw:
            out.append(Anomaly(lv, "power_drop", f"GPU power {pw:.0f} W vs the baseline's {bpw:.0f} W"))
        ut, but = number(d, "gpu_util"), number(b, "gpu_util")
        if ut is not None and but and ut < spec.power_drop_ratio * but:
            out.append(
                Anomaly(lv, "utilization_drop", f"GPU utilization {ut:.0%} vs the baseline's {but:.0%}")
            )
    return out


@dataclass
class Score:
    label: str
    status: str
    value: float | None  # the objective at the best level meeting every SLO
    half_width: float | None
    level: float | None
    why: str = ""
    levels_meeting_slo: list[float] = field(default_factory=list)

    def to_dict(self) -> JsonObject:
        return asdict(self)


def score(label: str, status: str, levels: Sequence[Digest], slo: SLOSpec, objective: str) -> Score:
    """A measured candidate's objective at its best SLO-meeting level; other outcomes score None."""
    if status not in ("measured", "anomalous"):
        return Score(label, status, None, None, None, f"not measured ({status})")
    if objective_of(objective).searches_capacity:
        return _capacity_score(label, status, levels)
    direction = OBJECTIVES[objective]
    meeting = [d for d in levels if not slo_failures(d, slo)]
    ok = [(d, v) for d in meeting if (v := number(d, objective)) is not None]
    if not ok and meeting:  # the SLOs were met: what is missing is the objective's own figure
        levels_met = ", ".join(f"{level_of(d):g}" for d in meeting)
        return Score(
            label,
            status,
            None,
            None,
            None,
            f"no {objective} figure at the levels meeting the SLOs ({levels_met})"
            + (f": {missing}" if (missing := objective_of(objective).missing) else ""),
        )
    if not ok:
        reasons = {f"{d['level']:g}": slo_failures(d, slo) for d in levels}
        return Score(label, status, None, None, None, f"no level meets the SLOs: {reasons}")
    best, value = (max if direction == "max" else min)(ok, key=lambda dv: dv[1])
    ci = best.get("ci")
    return Score(
        label,
        status,
        float(value),
        number(ci, objective) if isinstance(ci, Mapping) else None,
        level_of(best),
        levels_meeting_slo=[level_of(d) for d, _ in ok],
    )


def _capacity_score(label: str, status: str, levels: Sequence[Digest]) -> Score:
    """objective = "capacity": the highest capacity a search found (the search already held each probe
    to the SLO); its uncertainty, the bracket's step, stands where a confidence interval would."""
    ok = [(d, c) for d in levels if (c := number(d, "capacity")) is not None]
    if not ok:
        probes = sum(int(number(d, "capacity_probes") or 0) for d in levels)
        return Score(
            label, status, None, None, None, f"no load met the SLOs in the capacity search ({probes} probes)"
        )
    best, capacity = max(ok, key=lambda dc: float(dc[1]))
    step = number(best, "capacity_step")
    return Score(
        label,
        status,
        float(capacity),
        None if step is None else float(step),
        level_of(best),
        levels_meeting_slo=[level_of(d) for d, _ in ok],
    )


def _judge_capacity(w: Score, r: Score) -> tuple[bool | None, JsonObject, str]:
    """Two capacities differ only when their brackets do not overlap: the winner passed a load at or above
    the one the runner-up failed at ([pass, pass + step) is where each capacity lies)."""
    if r.half_width is None:
        return (
            None,
            {
                "method": "capacity brackets",
                "significant": None,
                "reason": "the runner-up's search found no failing load",
            },
            "cannot be judged: the runner-up's search never failed, its capacity is only a lower bound",
        )
    r_fail = (r.value or 0.0) + r.half_width
    significant = (w.value or 0.0) >= r_fail
    info: JsonObject = {
        "method": "capacity brackets",
        "runner_up_failed_at": r_fail,
        "significant": significant,
    }
    word = "exceeds" if significant else "is within"
    return significant, info, f"{word} the searches' uncertainty (the runner-up failed at {r_fail:g})"


# -- the noise: a cluster bootstrap over trials and their requests -------------------------------------

BOOTSTRAP_B = 2000
BOOTSTRAP_SEED = 0


def bootstrap_method(b: int = BOOTSTRAP_B, seed: int = BOOTSTRAP_SEED) -> str:
    return f"cluster bootstrap over trials and their requests (B={b}, seed {seed})"


T_METHOD = "Student t over trial means, without per-request data"


@dataclass(frozen=True)
class Cluster:
    """One trial's requests at the level a candidate is scored at: the bootstrap's cluster.

    `value` is the trial's own figure of the objective (its digest). Rate objectives: `num` is each
    request's share of the numerator (output tokens, input + output tokens, 1 request, or the output
    tokens of a request meeting every SLO) and `den` its end-to-end seconds; a resample's figure is
    `value` × (Σnum/Σden of the resample) / (Σnum/Σden of the trial) — throughput moves with tokens per
    second of request time. Latency objectives (medians): `num` is each request's latency in ms, `den`
    empty; a resample's figure is the median of the resampled latencies."""

    value: float
    num: tuple[float, ...]
    den: tuple[float, ...] = ()

    @classmethod
    def of(
        cls,
        records: list[RequestRecord],
        objective: str,
        value: float,
        speed: float = 1.0,
        slo: SLOSpec | None = None,
    ) -> Cluster | None:
        """A trial's cluster from its stored requests (`speed`: the simulator's clock, so latencies are in
        the GPU's time as the digests are); None when the objective has no per-request form."""
        ok = [r for r in records if r.ok and r.e2e_s is not None]
        obj = objective_of(objective)
        if obj.is_rate:  # a sum over requests per second
            pairs = []
            for r in ok:
                meets = not obj.counts_slo or slo is None or not _misses(r, slo, speed)
                n = obj.request_share(float(r.output_tokens or 0), float(r.input_tokens or 0), meets) or 0.0
                pairs.append((n, float(r.e2e_s or 0.0) * speed))
            pairs.sort()
            if not pairs or sum(d for _, d in pairs) <= 0 or sum(n for n, _ in pairs) <= 0:
                return None
            return cls(float(value), tuple(n for n, _ in pairs), tuple(d for _, d in pairs))
        kind = obj.latency()  # a latency median, or no per-request form
        if kind is None:
            return None
        vals = sorted(v * 1000.0 * speed for r in ok if (v := _latency_s(r, kind)) is not None)
        return cls(float(value), tuple(vals)) if vals else None

    def resampled(self, rng: np.random.Generator, b: int) -> np.ndarray:
        """`b` figures of this trial, each from its requests resampled with replacement."""
        m = len(self.num)
        idx = rng.integers(0, m, size=(b, m))
        num = np.asarray(self.num, dtype=float)
        if self.den:
            den = np.asarray(self.den, dtype=float)
            full = num.sum() / den.sum()
            ratio = num[idx].sum(axis=1) / np.maximum(den[idx].sum(axis=1), 1e-12)
            return np.asarray(self.value * ratio / full, dtype=float)
        return np.asarray(np.percentile(num[idx], 50, axis=1), dtype=float)


def _latency_s(r: RequestRecord, kind: str) -> float | None:
    if kind == "ttft":
        return r.ttft_s
    if kind == "e2e":
        return r.e2e_s
    if r.ttft_s is None or r.e2e_s is None or not r.output_tokens or r.output_tokens < 2:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def _misses(r: RequestRecord, slo: SLOSpec, speed: float) -> bool:
    """Whether one request misses a per-request SLO limit (the goodput objective's numerator)."""
    for metric, _stat, limit in slo.limits():
        kind = metric.removesuffix("_ms")
        if kind not in ("ttft", "tpot", "e2e"):
            continue
        v = _latency_s(r, kind)
        if v is not None and v * 1000.0 * speed > limit:
            return True
    return False


def _canonical(clusters: list[Cluster]) -> list[Cluster]:
    """The same data in one order (requests within a trial, then the trials), whatever order they were
    read in: the seeded bootstrap then draws the same resamples."""
    out = []
    for c in clusters:
        if c.den:
            pairs = sorted(zip(c.num, c.den, strict=True))
            out.append(Cluster(c.value, tuple(n for n, _ in pairs), tuple(d for _, d in pairs)))
        else:
            out.append(Cluster(c.value, tuple(sorted(c.num))))
    return sorted(out, key=lambda c: (c.value, len(c.num), c.num, c.den))


def bootstrap(clusters: list[Cluster], b: int = BOOTSTRAP_B, seed: int = BOOTSTRAP_SEED) -> np.ndarray | None:
    """`b` bootstrap figures of a candidate (the mean over its trials): trials resampled with
    replacement, then each drawn trial's requests. None with fewer than two trials (the trial-to-trial
    noise cannot be seen) or a trial without requests."""
    cs = _canonical(clusters)
    if len(cs) < 2 or any(len(c.num) < 2 for c in cs):
        return None
    rng = np.random.default_rng(seed)
    per = np.stack([c.resampled(rng, b) for c in cs])  # (trials, b)
    picks = rng.integers(0, len(cs), size=(b, len(cs)))
    return np.asarray(per[picks, np.arange(b)[:, None]].mean(axis=1), dtype=float)


def bootstrap_half_width(
    clusters: list[Cluster], b: int = BOOTSTRAP_B, seed: int = BOOTSTRAP_SEED
) -> float | None:
    """Half the width of the 95 % percentile interval of a candidate's figure (None: cannot tell)."""
    draws = bootstrap(clusters, b, seed)
    if draws is None:
        return None
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(hi - lo) / 2


@dataclass
class Ranking:
    objective: str
    ranked: list[Score]
    winner: str | None
    runner_up: str | None
    margin: float | None  # winner − runner-up, in the objective's unit (positive = better)
    margin_pct: float | None
    significant: bool | None  # the margin exceeds the noise (None: one repeat, unknown)
    verdict: str
    # how the noise was judged (method, interval, …): each method writes its own keys, readers narrow them
    noise: JsonObject = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        d = asdict(self)
        d["ranked"] = [s.to_dict() for s in self.ranked]
        return d


def rank(
    scores: list[Score],
    objective: str,
    samples: dict[str, list[Cluster]] | None = None,
    *,
    b: int = BOOTSTRAP_B,
    seed: int = BOOTSTRAP_SEED,
) -> Ranking:
    """Order candidates by the objective; the winner is the best that meets every SLO. `samples`: each
    candidate's trials at its scored level (`Cluster.of`), for the cluster bootstrap of the margin; where
    the winner or the runner-up has none, the t-interval over trial means judges it."""
    sign = 1.0 if OBJECTIVES[objective] == "max" else -1.0
    valid = sorted([s for s in scores if s.value is not None], key=lambda s: -sign * (s.value or 0.0))
    rest = [s for s in scores if s.value is None]
    ranked = valid + rest
    if not valid:
        return Ranking(
            objective,
            ranked,
            None,
            None,
            None,
            None,
            None,
            "no candidate met every SLO; see each candidate's reason",
        )
    w = valid[0]
    if len(valid) == 1:
        return Ranking(
            objective,
            ranked,
            w.label,
            None,
            None,
            None,
            None,
            f"{w.label} is the only candidate that meets every SLO",
        )
    r = valid[1]
    margin = sign * ((w.value or 0.0) - (r.value or 0.0))
    pct = margin / abs(r.value) * 100 if r.value else None
    if objective_of(objective).searches_capacity:
        significant, noise_info, noise = _judge_capacity(w, r)
    else:
        significant, noise_info, noise = _judge(w, r, sign, margin, samples or {}, b, seed)
    pct_text = f" ({pct:+.1f} %)" if pct is not None else ""
    verdict = f"{w.label} wins on {objective}: {w.value:,.4g} vs {r.label}'s {r.value:,.4g}{pct_text}; the margin {noise}"
    return Ranking(objective, ranked, w.label, r.label, margin, pct, significant, verdict, noise_info)


def _judge(
    w: Score, r: Score, sign: float, margin: float, samples: dict[str, list[Cluster]], b: int, seed: int
) -> tuple[bool | None, JsonObject, str]:
    """Whether the winner's margin exceeds the noise, how that was judged, and the sentence that says it."""
    dw = bootstrap(samples.get(w.label) or [], b, seed)
    dr = bootstrap(samples.get(r.label) or [], b, seed + 1)
    if dw is not None and dr is not None:
        diff = sign * (dw - dr)
        lo, hi = (float(x) for x in np.percentile(diff, [2.5, 97.5]))
        significant = lo > 0
        trials: JsonObject = {w.label: len(samples[w.label]), r.label: len(samples[r.label])}
        requests: JsonObject = {
            w.label: sum(len(c.num) for c in samples[w.label]),
            r.label: sum(len(c.num) for c in samples[r.label]),
        }
        info: JsonObject = {
            "method": bootstrap_method(b, seed),
            "b": b,
            "seed": seed,
            "trials": trials,
            "requests": requests,
            "difference_ci95": [lo, hi],
            "significant": significant,
        }
        word = "exceeds" if significant else "is within"
        text = f"{word} the noise ({info['method']}: 95 % interval of the difference [{lo:+.3g}, {hi:+.3g}])"
        return significant, info, text
    if w.half_width is None or r.half_width is None:
        info = {"method": None, "significant": None, "reason": "one trial each"}
        return (
            None,
            info,
            "cannot be judged against the noise with one repeat each (set repeats ≥ 2 for confidence intervals)",
        )
    noise_hw = math.hypot(w.half_width, r.half_width)
    significant = margin > noise_hw
    info = {"method": T_METHOD, "half_width": noise_hw, "significant": significant}
    word = "exceeds" if significant else "is within"
    return significant, info, f"{word} the noise ({T_METHOD}: 95 % CI of the difference ±{noise_hw:.3g})"


@dataclass(frozen=True)
class NodeSpread:
    """How far apart "identical" cluster nodes measured the baseline: the range of the per-node means of
    the objective at its scored level (`spread`, in the objective's unit)."""

    level: float
    per_node: dict[str, float]  # node name -> mean of the baseline's trials there
    spread: float
    spread_pct: float | None

    def to_dict(self) -> JsonObject:
        return asdict(self)


def node_spread(level: float, values: list[tuple[str, float]]) -> NodeSpread | None:
    """The baseline's node-to-node spread from (node name, objective value) per measured trial; None with
    fewer than two nodes (it cannot be seen)."""
    by: dict[str, list[float]] = {}
    for node, v in values:
        by.setdefault(node, []).append(v)
    if len(by) < 2:
        return None
    means = {n: sum(vs) / len(vs) for n, vs in sorted(by.items())}
    spread = max(means.values()) - min(means.values())
    mean = sum(means.values()) / len(means)
    return NodeSpread(level, means, spread, spread / abs(mean) * 100 if mean else None)


def guard_node_spread(ranking: Ranking, spread: NodeSpread | None, *, cluster: bool) -> Ranking:
    """On a cluster, a winner's margin must exceed the node-to-node spread measured on the baseline: a
    smaller margin is within the noise whatever the per-trial statistics say. Off a cluster: unchanged."""
    if not cluster:
        return ranking
    if spread is None:
        ranking.noise["node_spread"] = {
            "measured": False,
            "reason": "the baseline did not run on two nodes: the node-to-node spread is unknown",
        }
        if ranking.margin is not None:
            ranking.verdict += "; the node-to-node spread was not measured (the baseline ran on one node)"
        return ranking
    ranking.noise["node_spread"] = {"measured": True, **spread.to_dict()}
    if ranking.margin is None or ranking.winner is None:
        return ranking
    pct = f" ({spread.spread_pct:.1f} %)" if spread.spread_pct is not None else ""
    if abs(ranking.margin) <= spread.spread:
        ranking.significant = False
        ranking.verdict += (
            f"; but the margin {ranking.margin:,.4g} is not larger than the node-to-node spread "
            f"{spread.spread:,.4g}{pct} measured on the baseline: no winner is called on it"
        )
    else:
        ranking.verdict += (
            f"; it exceeds the node-to-node spread {spread.spread:,.4g}{pct} measured on the baseline"
        )
    return ranking


def pareto_front(
    points: list[tuple[str, float, float]], signs: list[float]
) -> list[tuple[str, float, float]]:
    """The points no other beats on both axes (`signs`: +1 higher is better, -1 lower), best first on
    the first axis."""
    s0, s1 = signs
    out = []
    for label, a, b in points:
        dominated = any(
            (s0 * a2 >= s0 * a and s1 * b2 >= s1 * b) and (s0 * a2 > s0 * a or s1 * b2 > s1 * b)
            for _, a2, b2 in points
        )
        if not dominated:
            out.append((label, a, b))
    return sorted(out, key=lambda p: -s0 * p[1])

"""Fitting efficiency factors to measured runs (the published CSV, or the user's own bench runs).

Each observation (`model.observations`) is turned once into factor-independent `Terms`; a fit then only
re-runs the cheap `latencies()` over numpy arrays, so a few thousand rows fit in seconds. The loss is the
mean absolute percentage error of TPOT plus that of TTFT: the figure the accuracy benchmark reports.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from servelab.errors import ConfigError, ServelabError
from servelab.jsontypes import JsonObject, JsonValue
from servelab.model.factors import FIT_BOUNDS, Factors
from servelab.model.memory import plan_memory
from servelab.model.observations import Observation, holdout_mask
from servelab.model.predict import Setup, Terms, latencies, make_setup, make_terms, perf_of
from servelab.model.step import StepRaw


@dataclass
class Prepared:
    """Observations turned into stacked terms (rows the model cannot place are dropped with a reason)."""

    obs: list[Observation]
    terms: Terms
    setups: list[Setup]
    dropped: list[tuple[Observation, str]]

    def subset(self, mask: np.ndarray) -> Prepared:
        idx = np.nonzero(mask)[0]
        return Prepared(
            [self.obs[i] for i in idx],
            _take(self.terms, idx),
            [self.setups[i] for i in idx],
            self.dropped,
        )


def _take(t: Terms, idx: np.ndarray) -> Terms:
    def raw(r: StepRaw) -> StepRaw:
        return StepRaw(**{f.name: getattr(r, f.name)[idx] for f in fields(StepRaw)})

    return Terms(
        raw(t.dec),
        raw(t.pre),
        t.per_group[idx],
        t.running[idx],
        t.osl[idx],
        t.spec[idx],
        t.isl[idx],
    )


def prepare(
    observations: Iterable[Observation], factors: Factors | None = None, silicon: bool = False
) -> Prepared:
    """Resolve each observation to a setup and its terms (memory uses the given factors); `silicon`
    reads each row's allreduce off the measured tables where they cover its GPU and engine."""
    obs_ok: list[Observation] = []
    setups: list[Setup] = []
    terms: list[Terms] = []
    dropped: list[tuple[Observation, str]] = []
    base = factors or Factors()
    for o in observations:
        try:
            s = make_setup(
                o.model,
                o.gpu,
                o.num_gpus,
                tp=o.tp,
                pp=o.pp,
                ep=o.ep,
                dp=o.dp,
                quant=o.quant,
                kv_dtype=o.kv_dtype,
                factors=base.merged(ENGINE_BEHAVIOUR.get(o.engine, {})),
                engine=o.engine,
                silicon=silicon,
            )
        except ServelabError as exc:
            dropped.append((o, exc.message))
            continue
        perf = perf_of(s)
        mem = plan_memory(s.arch, s.quant, s.host, s.layout, s.mem_fraction)
        wl = o.workload
        if mem.max_concurrency(wl.isl + wl.osl) < 1:
            mem = plan_memory(s.arch, s.quant, s.host, s.layout, 0.97)  # engines run tighter than our default
        obs_ok.append(o)
        setups.append(s)
        terms.append(make_terms(perf, mem, wl))
    if not obs_ok:
        raise ConfigError("no usable measurements to fit", hint="check the models and GPUs named in the data")
    stacked = Terms(
        dec=StepRaw.stack([t.dec for t in terms]),
        pre=StepRaw.stack([t.pre for t in terms]),
        per_group=np.array([float(t.per_group) for t in terms]),
        running=np.array([float(t.running) for t in terms]),
        osl=np.array([float(t.osl) for t in terms]),
        spec=np.array([float(t.spec) for t in terms]),
        isl=np.array([float(t.isl) for t in terms]),
    )
    return Prepared(obs_ok, stacked, setups, dropped)


def predicted_ms(p: Prepared, f: Factors) -> tuple[np.ndarray, np.ndarray]:
    _, tpot, ttft = latencies(p.terms, f)
    return np.asarray(tpot) * 1e3, np.asarray(ttft) * 1e3


def measured_ms(p: Prepared) -> tuple[np.ndarray, np.ndarray]:
    return np.array([o.tpot_ms for o in p.obs]), np.array([o.ttft_ms for o in p.obs])


def mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - meas) / meas) * 100) if len(meas) else float("nan")


def _loss(
    p: Prepared,
    f: Factors,
    ttft_weight: float,
    overrides: Sequence[tuple[np.ndarray, dict[str, float]]] = (),
) -> float:
    """MAPE of TPOT plus `ttft_weight` × that of TTFT; `overrides` apply per-engine factors to row masks."""
    mt, mf = measured_ms(p)
    if overrides:
        tpot, ttft = np.empty(len(mt)), np.empty(len(mt))
        for mask, over in overrides:
            t, ff = predicted_ms(p.subset(mask), f.merged(over))
            tpot[mask], ttft[mask] = t, ff
    else:
        tpot, ttft = predicted_ms(p, f)
    lt = np.abs(tpot / mt - 1.0)
    lf = np.abs(ttft / mf - 1.0)
    return float(np.mean(lt) + ttft_weight * np.mean(lf))


def nelder_mead(fun: Any, x0: np.ndarray, iters: int = 600, step: float = 0.25) -> np.ndarray:
    """A plain Nelder-Mead minimiser (numpy only; the fit has ~10 parameters)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [fun(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(vals)
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = fun(xr)
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - simplex[-1])
            fe = fun(xe)
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = fun(xc)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (s - simplex[0]) for s in simplex[1:]]
                vals = [vals[0]] + [fun(s) for s in simplex[1:]]
        if np.std(vals) < 1e-7:
            break
    best: np.ndarray = simplex[int(np.argmin(vals))]
    return best


def fit(
    p: Prepared,
    start: Factors | None = None,
    names: Sequence[str] | None = None,
    ttft_weight: float = 1.0,
    iters: int = 800,
    overrides: Sequence[tuple[np.ndarray, dict[str, float]]] = (),
) -> Factors:
    """Fit the named scalar factors (log space, clipped to FIT_BOUNDS); the others stay as in `start`.
    `overrides` (row mask, factor values) keep per-engine factors fixed on their rows while fitting."""
    start = start or Factors()
    names = list(names or FIT_BOUNDS)

    def to_factors(x: np.ndarray) -> Factors:
        vals = {}
        for n, v in zip(names, x, strict=True):
            lo, hi = FIT_BOUNDS[n]
            # Clipped in log space: the simplex can wander past exp's range (an OverflowError once, in CI).
            vals[n] = float(math.exp(min(max(float(v), math.log(max(lo, 1e-6))), math.log(hi))))
        return start.merged(vals)

    x0 = np.array([math.log(max(getattr(start, n), 1e-3)) for n in names])

    def loss(x: np.ndarray) -> float:
        return _loss(p, to_factors(x), ttft_weight, overrides)

    best = nelder_mead(loss, x0, iters=iters)
    # restarts: Nelder-Mead stalls on the flat directions of ~20 factors
    for step in (0.5, 0.3, 0.2, 0.1, 0.05):
        best = nelder_mead(loss, best, iters=iters, step=step)
    return to_factors(best)


@dataclass
class GroupError:
    system: str
    engine: str
    n: int
    tpot_mape: float
    ttft_mape: float


def error_table(p: Prepared, f: Factors, by: Sequence[str] = ("gpu", "engine")) -> list[GroupError]:
    """MAPE of TPOT and TTFT per group (default: per GPU system and engine), plus an `all` row."""
    tpot, ttft = predicted_ms(p, f)
    mt, mf = measured_ms(p)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, o in enumerate(p.obs):
        key = tuple(str(getattr(o, b)) for b in by)
        groups.setdefault((key[0], key[1] if len(key) > 1 else ""), []).append(i)
    rows = [
        GroupError(k[0], k[1], len(ix), mape(tpot[ix], mt[ix]), mape(ttft[ix], mf[ix]))
        for k, ix in sorted(groups.items())
    ]
    rows.append(GroupError("all", "all", len(mt), mape(tpot, mt), mape(ttft, mf)))
    return rows


# How each engine's scheduler holds KV (not fitted: documented behaviour). TensorRT-LLM's default capacity
# scheduler (GUARANTEED_NO_EVICT) admits a request only with room for its whole output; vLLM and SGLang
# allocate KV blocks as sequences grow (and preempt when they run out), so their running batch holds its
# mean context, prompt + output / 2.
ENGINE_BEHAVIOUR: dict[str, dict[str, float]] = {
    "trtllm": {"kv_reserve": 1.0},
    "vllm": {"kv_reserve": 0.5},
    "sglang": {"kv_reserve": 0.5},
}

# Factors refitted per engine: its kernels, scheduler and front end (not the hardware or the model).
ENGINE_FACTORS: tuple[str, ...] = (
    "step_overhead_ms",
    "layer_overhead_us",
    "prefill_queue",
    "prefill_interference",
    "ttft_overhead_ms",
    "prefill_eff",
    "bw_eff",
    "queue_exp",
    "prefill_wait",
    "expert_eff",
    "moe_layer_us",
    "seq_overhead_us",
)


def fit_observations(
    observations: list[Observation],
    start: Factors | None = None,
    holdout: float = 0.3,
    per_engine: bool = True,
    silicon: bool = False,
) -> tuple[Factors, dict[str, dict[str, float]], JsonObject]:
    """Fit global factors (and per-engine overhead/queue factors) on a split; report on the held-out rows.
    With `silicon` the rows' allreduces are read off the measured tables (`prepare`), and the factors
    fit the rest around them.

    Fewer than `FEW_ROWS` observations (a user's bench run: a handful of levels of one configuration)
    free only the few factors those rows identify (`fit_few`); the report names them under `fitted`."""
    start = start or Factors()
    prepared = prepare(observations, start, silicon)
    test_mask = holdout_mask(prepared.obs, holdout)
    train = prepared.subset(~test_mask) if test_mask.any() else prepared
    if len(train.obs) < FEW_ROWS:
        glob, few = fit_few(train, start)
        return (
            glob,
            {},
            {
                "rows": len(prepared.obs),
                "train_rows": len(train.obs),
                "test_rows": int(test_mask.sum()),
                "dropped": len(prepared.dropped),
                **few,
            },
        )
    # Collective latency stays at the catalog's physical figure: the published rows are all NVLink, and
    # a scale fitted there would leak into PCIe predictions. `calibrate host` measures it instead.
    glob = fit(train, start, [n for n in FIT_BOUNDS if n != "lat_scale"])
    engines: dict[str, dict[str, float]] = {}
    engine_names = ENGINE_FACTORS
    if per_engine:
        masks = {
            eng: np.array([o.engine == eng for o in train.obs])
            for eng in sorted({o.engine for o in train.obs if o.engine})
        }
        masks = {e: m for e, m in masks.items() if m.sum() >= 30}
        for _ in range(2):  # alternate: engine factors on their rows, then the shared ones under them
            for eng, mask in masks.items():
                f_e = fit(train.subset(mask), glob.merged(engines.get(eng, {})), engine_names, iters=400)
                engines[eng] = {n: getattr(f_e, n) for n in engine_names} | ENGINE_BEHAVIOUR.get(eng, {})
            shared = [n for n in FIT_BOUNDS if n != "lat_scale" and n not in engine_names]
            rest = ~np.any(list(masks.values()), axis=0) if masks else np.ones(len(train.obs), bool)
            overrides = [(m, engines[e]) for e, m in masks.items()] + ([(rest, {})] if rest.any() else [])
            glob = fit(train, glob, shared, iters=400, overrides=overrides)
    report: JsonObject = {
        "rows": len(prepared.obs),
        "train_rows": int((~test_mask).sum()),
        "test_rows": int(test_mask.sum()),
        "dropped": len(prepared.dropped),
        "mode": "full",
        "fitted": [n for n in FIT_BOUNDS if n != "lat_scale"],
    }
    return glob, engines, report


# Below this many observations a fit frees only the factors the rows can identify (`fit_few`): a handful
# of levels of one configuration cannot pin ~25 factors, and a full fit spends them on noise (3 rows moved
# gemm_eff to 0.43 and blackwell_compute to 0.47, which those rows say nothing about).
FEW_ROWS = 30

# The levers a few rows identify, per measured quantity: one sets its level (what dominates at the lowest
# concurrency measured), one how it grows with concurrency (needs a second level). Each pair lists the
# roofline's physical lever first and the overhead lever second:
#   TPOT level: bw_eff (weights + KV read per step) or step_overhead_ms (fixed work per engine step)
#   TPOT slope: prefill_interference (other requests' prefills stall decode steps) or seq_overhead_us
#               (per running sequence per step: scheduling, sampling, detokenizing)
#   TTFT level: prefill_eff (prefill FLOPs) or ttft_overhead_ms (per request, before the first step)
#   TTFT slope: prefill_queue (prefills a new request waits behind) or prefill_wait (in-flight steps)
FEW_LEVERS: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    "tpot": (("bw_eff", "step_overhead_ms"), ("prefill_interference", "seq_overhead_us")),
    "ttft": (("prefill_eff", "ttft_overhead_ms"), ("prefill_queue", "prefill_wait")),
}
# A later candidate replaces an earlier (more physical) one only when its loss (MAPE of TPOT + TTFT, as a
# fraction) is lower by more than this: two levers that both fit the rows exactly keep the physical one.
FEW_TOLERANCE = 0.02


def _seeded(start: Factors, names: Sequence[str]) -> Factors:
    """Overhead levers that start at (about) zero begin at 1 % of their range: a log-space search cannot
    leave zero."""
    seeds = {n: FIT_BOUNDS[n][1] * 1e-2 for n in names if getattr(start, n) < FIT_BOUNDS[n][1] * 1e-3}
    return start.merged(seeds)


def _pick(
    p: Prepared,
    start: Factors,
    fixed: Sequence[str],
    candidates: Sequence[tuple[str, ...]],
    ttft_weight: float,
    tried: list[JsonValue],
    exclusive: bool = False,
) -> tuple[Factors, list[str], list[str]]:
    """Fit `fixed` plus each combination of one lever per candidate pair; keep the best, preferring the
    earlier (more physical) combination within `FEW_TOLERANCE`. `exclusive`: the pair's other lever is
    switched off (its lower bound) while one is fitted: the rows measure one growth rate, so the model
    gets one mechanism for it rather than the fitted one plus defaults fitted on other hardware."""
    results: list[tuple[float, list[str], Factors, list[str]]] = []
    for combo in itertools.product(*candidates):
        names = [*fixed, *combo]
        off = (
            {n: FIT_BOUNDS[n][0] for pair in candidates for n in pair if n not in combo} if exclusive else {}
        )
        f = fit(p, _seeded(start.merged(off), names), names, ttft_weight, iters=300)
        loss = _loss(p, f, ttft_weight)
        results.append((loss, names, f, sorted(off)))
        tried.append({"factors": [*names], "off": [*sorted(off)], "loss": round(loss, 5)})
    best = min(r[0] for r in results)
    _, names, f, off_names = next(r for r in results if r[0] <= best + FEW_TOLERANCE)
    return f, names, off_names


def fit_few(p: Prepared, start: Factors, ttft_weight: float = 1.0) -> tuple[Factors, JsonObject]:
    """Fit a handful of observations: per measured quantity (TPOT, TTFT) one level lever on the rows
    of the lowest concurrency, then, with two or more concurrency levels, one slope lever over all rows
    (`FEW_LEVERS`): at most as many factors per quantity as there are levels, and never more than two.
    A fitted slope lever replaces its alternative, which is switched off (`switched_off`). Every other
    factor keeps its value in `start` (the engine's defaults). Returns the factors and a
    report naming what was fitted and the candidates' losses."""
    levels = sorted({o.concurrency for o in p.obs})
    tried: list[JsonValue] = []
    level_pairs = [FEW_LEVERS[q][0] for q in ("tpot", "ttft")]
    lowest = p.subset(np.array([o.concurrency == levels[0] for o in p.obs]))
    f, names, off = _pick(lowest, start, (), level_pairs, ttft_weight, tried)
    if len(levels) >= 2:
        slope_pairs = [FEW_LEVERS[q][1] for q in ("tpot", "ttft")]
        f, names, off = _pick(
            p, start.merged({n: getattr(f, n) for n in names}), names, slope_pairs, ttft_weight, tried, True
        )
    report: JsonObject = {
        "mode": "few-observations",
        "fitted": [*names],
        "switched_off": [*off],
        "levels": [*levels],
        "candidates": tried,
        "loss": round(_loss(p, f, ttft_weight), 5),
        "note": f"fewer than {FEW_ROWS} observations: only the factors named in `fitted` moved "
        "(and `switched_off` went to zero); the others keep the engine's defaults",
    }
    return f, report


def apply_engine(f: Factors, engines: dict[str, dict[str, float]], engine: str) -> Factors:
    return f.merged(engines.get(engine, {}))


def evaluate_split(
    observations: list[Observation], glob: Factors, engines: dict[str, dict[str, float]], holdout: float = 0.3
) -> dict[str, list[GroupError]]:
    """Error tables on the train and test split with the per-engine factors applied row by row."""
    prepared = prepare(observations, glob)
    out: dict[str, list[GroupError]] = {}
    test_mask = holdout_mask(prepared.obs, holdout)
    for name, mask in (("train", ~test_mask), ("test", test_mask)):
        sub = prepared.subset(mask)
        if not sub.obs:
            continue
        out[name] = _engine_table(sub, glob, engines)
    return out


def _engine_table(p: Prepared, glob: Factors, engines: dict[str, dict[str, float]]) -> list[GroupError]:
    tpot = np.zeros(len(p.obs))
    ttft = np.zeros(len(p.obs))
    for eng in {o.engine for o in p.obs}:
        mask = np.array([o.engine == eng for o in p.obs])
        t, f = predicted_ms(p.subset(mask), apply_engine(glob, engines, eng))
        tpot[mask], ttft[mask] = t, f
    mt, mf = measured_ms(p)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, o in enumerate(p.obs):
        groups.setdefault((o.gpu, o.engine), []).append(i)
    rows = [
        GroupError(k[0], k[1], len(ix), mape(tpot[ix], mt[ix]), mape(ttft[ix], mf[ix]))
        for k, ix in sorted(groups.items())
    ]
    rows.append(GroupError("all", "all", len(mt), mape(tpot, mt), mape(ttft, mf)))
    return rows


# Factors that are host measurements (`calibrate host`), not efficiencies: a fit carries them, never moves them.
MEASURED: tuple[str, ...] = ("mem_bw_gbs", "bus_gbs", "allreduce_us")


class _ProbePoint(BaseModel):
    """One allreduce timing of `host/commprobe.py`: the message size and its time."""

    model_config = ConfigDict(frozen=True)

    bytes: int | float
    us: int | float


class _Probe(BaseModel):
    """What `factors_from_probe` reads of `host/commprobe.py`'s output (its other keys are the report's)."""

    model_config = ConfigDict(frozen=True)

    ranks: int
    allreduce: list[_ProbePoint] | None = None
    mem_bw_gbs: int | float | None = None


def factors_from_probe(probe: Mapping[str, object]) -> JsonObject:
    """Turn `host/commprobe.py` output into factor overrides: per-rank-count allreduce latency (the
    smallest decode-sized message), bus bandwidth (largest message), and memory bandwidth."""
    read = _Probe.model_validate(probe)
    ranks = read.ranks
    points = sorted(read.allreduce or [], key=lambda p: p.bytes)
    if not points:
        raise ConfigError("the host probe returned no allreduce timings")
    small = [p.us for p in points if p.bytes <= 32 * 1024] or [points[0].us]
    big = points[-1]
    bus = 2.0 * (ranks - 1) / ranks * big.bytes / (big.us * 1e-6) / 1e9 if ranks > 1 else None
    out: JsonObject = {"allreduce_us": {str(ranks): round(min(small), 3)}}
    if bus:
        out["bus_gbs"] = round(bus, 3)
    if read.mem_bw_gbs:
        out["mem_bw_gbs"] = round(float(read.mem_bw_gbs), 3)
    return out

"""Proposing the next candidate: grid order, Optuna (TPE; NSGA-II for two objectives), successive halving.

Every strategy is a function of the history the store holds: Optuna's study is rebuilt in memory from the
stored candidates at each step (its sampler seeded by the study's seed and the step), so a search resumed
after `kill -9` proposes exactly what the uninterrupted one would have, and no finished point twice.
Points in a region a failure ruled out (`prune`) are not run: they are returned as pruned proposals (the
tuner stores them with the region), and Optuna is told they scored the worst value seen, so its model
learns the region too.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from servelab.search import prune
from servelab.search.base import History, Proposal, Region, Tried, point_key
from servelab.space import Categorical, Point, Range, Space, corners

if TYPE_CHECKING:  # optuna is imported only by the strategy that uses it
    from optuna.distributions import BaseDistribution

# The model's objective for a point (None: it cannot say), with the factors the tuner last refitted.
Rank = Callable[[Point], float | None]
# Proposals Optuna may make in one step before the search falls back to the model's best untried point.
MAX_ASKS = 200
# A continuous space's pool for the model's ranking: its corners and this many seeded samples.
POOL_SAMPLES = 256


@dataclass(frozen=True)
class Budget:
    """What the search phase may still spend; the confirm phase's repeats are reserved out of it."""

    trials: int | None
    seconds: float | None
    reserve_trials: int = 0

    def spent(self, h: History) -> bool:
        if self.trials is not None and h.trials_used + self.reserve_trials >= self.trials:
            return True
        if self.seconds is not None and h.tried:
            per = h.elapsed_s / max(1, h.trials_used)
            return h.elapsed_s + per * self.reserve_trials >= self.seconds
        return False


def pool(space: Space, seed: int) -> list[Point]:
    """Every feasible point of a finite space; else its corners and seeded samples."""
    if space.finite():
        return list(space.points())
    rng = random.Random(seed)
    out = list(corners(space))
    seen = {point_key(p) for p in out}
    for _ in range(POOL_SAMPLES * 4):
        if len(out) >= POOL_SAMPLES + len(corners(space)):
            break
        raw: Point = {}
        for p in space.params:
            if isinstance(p, Categorical):
                raw[p.key] = rng.choice(p.values)
            else:
                x = (
                    math.exp(rng.uniform(math.log(p.low), math.log(p.high)))
                    if p.log
                    else rng.uniform(p.low, p.high)
                )
                raw[p.key] = p.clip(x)
        settled = space.settle(raw)
        if settled is not None and point_key(settled) not in seen:
            seen.add(point_key(settled))
            out.append(settled)
    return out


def ranked(points: Sequence[Point], rank: Rank, sign: float) -> list[tuple[Point, float | None]]:
    """Best predicted first; points the model cannot say keep their order after those it can."""
    scored = [(i, p, rank(p)) for i, p in enumerate(points)]
    known = sorted(
        [(i, p, v) for i, p, v in scored if v is not None], key=lambda x: (-sign * float(x[2] or 0.0), x[0])
    )
    out: list[tuple[Point, float | None]] = [(p, v) for _, p, v in known]
    return out + [(p, v) for _, p, v in scored if v is None]


def _next_untried(
    candidates: list[tuple[Point, float | None]], h: History, learned: list[Region], origin: Any
) -> Proposal | None:
    seen = h.keyset()
    for p, v in candidates:
        if point_key(p) in seen:
            continue
        region = prune.avoided(p, learned)
        return Proposal(p, "pruned" if region else origin, 0, region, v)
    return None


class GridSearch:
    """Every point, the model's best first (the tuner's `order_candidates` order for listed grids)."""

    def __init__(self, space: Space, sign: float, seed: int = 0) -> None:
        self.space, self.sign, self.seed = space, sign, seed

    def propose(self, h: History, rank: Rank, budget: Budget) -> Proposal | None:
        if budget.spent(h):
            return None
        return _next_untried(ranked(pool(self.space, self.seed), rank, self.sign), h, [], "grid")


class OptunaSearch:
    """TPE (one objective) or NSGA-II (two), through Optuna. The model's best points run first and, after
    them, every other step the refitted model's best untried point; each enters the rebuilt Optuna study as
    a finished trial like the sampler's own (the part `enqueue_trial` plays in a study that persists)."""

    def __init__(self, space: Space, signs: Sequence[float], seed: int, prior_trials: int) -> None:
        self.space, self.signs, self.seed, self.prior_trials = space, list(signs), seed, prior_trials

    def distributions(self) -> dict[str, BaseDistribution]:
        import optuna

        out: dict[str, BaseDistribution] = {}
        for p in self.space.params:
            if isinstance(p, Categorical):
                out[p.key] = optuna.distributions.CategoricalDistribution(list(p.values))
            elif p.integer:
                out[p.key] = optuna.distributions.IntDistribution(
                    int(p.low), int(p.high), log=p.log, step=int(p.step or 1)
                )
            else:
                out[p.key] = optuna.distributions.FloatDistribution(p.low, p.high, log=p.log, step=p.step)
        return out

    def _worst(self, h: History) -> list[float]:
        """Per objective, a value worse than any measured (what a failed or pruned point is told)."""
        out = []
        for i, s in enumerate(self.signs):
            vals = [
                float(v) for t in h.tried if t.ok and len(t.values) > i and (v := t.values[i]) is not None
            ]
            if not vals:
                out.append(0.0 if s > 0 else 1e9)
            else:
                lo, hi = min(vals), max(vals)
                out.append(min(0.0, lo) if s > 0 else hi * 2 + 1.0)
        return out

    def _values(self, t: Tried, worst: list[float]) -> list[float]:
        if t.outcome in ("measured", "collapsed") and t.values and all(v is not None for v in t.values):
            return [float(v) for v in t.values if v is not None]
        return worst

    def study(self, h: History) -> Any:
        import warnings

        import optuna

        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        n = len(h.tried)
        sampler: Any
        if len(self.signs) > 1:
            sampler = optuna.samplers.NSGAIISampler(seed=self.seed * 1_000_003 + n, population_size=8)
        else:
            sampler = optuna.samplers.TPESampler(
                seed=self.seed * 1_000_003 + n,
                n_startup_trials=max(4, self.prior_trials),
                multivariate=True,
            )
        directions: list[Literal["minimize", "maximize"]] = [
            "maximize" if s > 0 else "minimize" for s in self.signs
        ]
        study = optuna.create_study(directions=directions, sampler=sampler)
        dists = self.distributions()
        worst = self._worst(h)
        for t in h.tried:
            if t.outcome == "pending":
                continue
            params = {k: v for k, v in t.point.items() if k in dists}
            if len(params) != len(dists):
                continue  # a listed candidate outside the space: the sampler cannot hold it
            values = self._values(t, worst)
            try:
                frozen = optuna.trial.create_trial(
                    params=params,
                    distributions=dists,
                    values=values if len(values) > 1 else None,
                    value=values[0] if len(values) == 1 else None,
                    user_attrs={"label": t.label, "outcome": t.outcome},
                )
            except ValueError:  # a value outside the space's distributions (a listed candidate's)
                continue
            study.add_trial(frozen)
        return study

    def propose(self, h: History, rank: Rank, budget: Budget) -> Proposal | None:
        if budget.spent(h):
            return None
        learned = prune.regions(h, self.space)
        seen = h.keyset()
        by_model = ranked(pool(self.space, self.seed), rank, self.signs[0])
        prior_done = sum(t.origin == "prior" for t in h.tried)
        if prior_done < self.prior_trials:
            prop = _next_untried(by_model, h, learned, "prior")
            if prop is not None:
                return prop
        sampled = sum(t.origin in ("sampler", "model") for t in h.tried)
        if sampled % 2 == 1:  # every other step: the corrected model's best untried point
            prop = _next_untried(by_model, h, learned, "model")
            if prop is not None and not prop.pruned:
                return prop
        import optuna

        study = self.study(h)
        worst = self._worst(h)
        for _ in range(MAX_ASKS):
            trial = study.ask()
            raw = {p.key: self._suggest(trial, p) for p in self.space.params}
            point = self.space.settle(raw)
            if point is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            if point_key(point) in seen:
                study.tell(trial, worst if len(worst) > 1 else worst[0])
                continue
            region = prune.avoided(point, learned)
            return Proposal(point, "pruned" if region else "sampler", 0, region, rank(point))
        # the sampler keeps proposing what ran: the model's best untried point, if any is left
        return _next_untried(by_model, h, learned, "model")

    @staticmethod
    def _suggest(trial: Any, p: Categorical | Range) -> Any:
        if isinstance(p, Categorical):
            return trial.suggest_categorical(p.key, list(p.values))
        if p.integer:
            return trial.suggest_int(p.key, int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
        return p.clip(trial.suggest_float(p.key, p.low, p.high, log=p.log, step=p.step))


class Halving:
    """Successive halving: the model's best `n` points on a short benchmark (rung 0: the main level, a
    fraction of the requests), then the best one in `eta` on the full levels (rung 1)."""

    def __init__(self, space: Space, sign: float, seed: int, eta: int, contenders: int) -> None:
        self.space, self.sign, self.seed, self.eta, self.contenders = space, sign, seed, eta, contenders

    def rung0_size(self, n_points: int, budget: Budget) -> int:
        """How many points start: all of them, or as many as the trial budget leaves room for with the
        promotions (n + ceil(n / eta)) and the reserved repeats."""
        if budget.trials is None:
            return n_points
        room = budget.trials - budget.reserve_trials
        n = n_points
        while n > 1 and n + math.ceil(n / self.eta) > room:
            n -= 1
        return max(1, n)

    def propose(self, h: History, rank: Rank, budget: Budget) -> Proposal | None:
        points = ranked(pool(self.space, self.seed), rank, self.sign)
        n0 = self.rung0_size(len(points), budget)
        learned = prune.regions(h, self.space)
        rung0 = [t for t in h.tried if t.origin != "pruned"]
        if len(rung0) < n0 and not (budget.seconds is not None and budget.spent(h)):
            prop = _next_untried(points, h, learned, "rung")
            if prop is not None:
                return prop
        # promote: one in eta of the measured, best by the short benchmark; the promoted count is fixed by
        # rung 0 (a promoted point's value is its full one after, which must not pull another one up)
        scored = [t for t in h.tried if t.ok and t.values and t.values[0] is not None]
        keep = max(1, math.ceil(len(scored) / self.eta))
        if sum(t.rung >= 1 for t in h.tried) >= keep:
            return None
        waiting = sorted(
            (t for t in scored if t.rung < 1), key=lambda t: -self.sign * float(t.values[0] or 0.0)
        )
        if waiting:
            return Proposal(waiting[0].point, "rung", 1, None, None)
        return None


def promoted(h: History, sign: float, contenders: int) -> list[Tried]:
    """The contenders: the best measured candidates at their highest rung, best first."""
    if not h.tried:
        return []
    top = max((t.rung for t in h.tried if t.ok), default=0)
    scored = [t for t in h.tried if t.ok and t.rung == top and t.values and t.values[0] is not None]
    return sorted(scored, key=lambda t: -sign * float(t.values[0] or 0.0))[:contenders]


def make(
    strategy: str,
    space: Space,
    signs: Sequence[float],
    seed: int,
    prior_trials: int,
    eta: int,
    contenders: int,
) -> GridSearch | OptunaSearch | Halving:
    if strategy == "optuna":
        return OptunaSearch(space, signs, seed, prior_trials)
    if strategy == "halving":
        return Halving(space, signs[0], seed, eta, contenders)
    return GridSearch(space, signs[0], seed)

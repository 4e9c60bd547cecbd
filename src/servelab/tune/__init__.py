"""`servelab tune`: run a study — launch each candidate, check what really runs, verify, measure, rank.

The rooms: `driver` (the Tuner: open or resume, run, finish), `recorder` (each trial's steps stored as they
happen), `ordering` (identity, the model's order, the preflight), `spread` (scored trials, nodes, bootstrap
clusters) and `plansync` (the plan moved as trials run)."""

from __future__ import annotations

from servelab.tune.driver import Tuner, tune
from servelab.tune.options import StudyOutcome, TuneOptions
from servelab.tune.ordering import order_candidates, preflight, spec_hash

__all__ = [
    "StudyOutcome",
    "TuneOptions",
    "Tuner",
    "order_candidates",
    "preflight",
    "spec_hash",
    "tune",
]

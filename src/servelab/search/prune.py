"""Regions a failed, not-applied or collapsed trial rules out.

Relearned from the whole history at every step, so a region generalises as good points arrive:
- **not applied**: the engine ran something else for key K (SGLang on SM120 falls back from
  `flashinfer_trtllm` to `flashinfer_cutlass`), so every point asking for that value of K is not applied
  either: the region is {K = value} for each such key;
- **collapsed** or **failed to start**: the region is the conjunction of the point's categorical values
  that no measured point shares. One bad point with three unshared values rules out only points with all
  three; once good points share two of them, the region narrows to the third (every
  `enable_flashinfer_allreduce_fusion = true` point collapses). A bad point whose every value a good point
  has taught nothing beyond itself.
"""

from __future__ import annotations

from servelab.search.base import History, Region
from servelab.space import Categorical, Point, Space


def regions(history: History, space: Space) -> list[Region]:
    categorical = {p.key for p in space.params if isinstance(p, Categorical)} | set(space.forced_keys)
    good = [t for t in history.tried if t.ok]
    out: dict[tuple[object, ...], Region] = {}
    for t in history.tried:
        if t.outcome == "not_applied":
            keys = [k for k in t.not_applied if k in t.point]
            if keys:
                for k in keys:
                    r = Region(((k, t.point[k]),), "not_applied", t.label, t.reason or f"{k} was not applied")
                    out.setdefault(("not_applied", k, repr(t.point[k])), r)
                continue
        if not t.bad:
            continue
        unshared = tuple(
            (k, v)
            for k, v in t.point.items()
            if k in categorical
            and not any(k in g.point and g.point[k] == v and type(g.point[k]) is type(v) for g in good)
        )
        if not unshared:
            continue  # every value of it ran fine somewhere: only the point itself is known bad
        r = Region(unshared, t.outcome, t.label, t.reason or t.outcome)
        out.setdefault((t.outcome, *unshared), r)
    # A region that holds a measured point is wrong for it: drop it (the good point is the evidence).
    return [r for r in out.values() if not any(r.holds(g.point) for g in good)]


def avoided(point: Point, learned: list[Region]) -> Region | None:
    for r in learned:
        if all(k in point and point[k] == v and type(point[k]) is type(v) for k, v in r.values):
            return r
    return None

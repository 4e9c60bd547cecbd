"""Regions a failed, not-applied or collapsed trial rules out.

Relearned from the whole history at every step, so a region generalises as good points arrive:
- **not applied**: the engine ran something else for key K (SGLang on SM120 falls back from
  `flashinfer_trtllm` to `flashinfer_cutlass`), so every point asking for that value of K is not applied
  either: the region is {K = value} for each such key;
- **collapsed** or **failed to start**: the region is the conjunction of the point's categorical values
  that no measured point shares. One bad point with three unshared values rules out only points with all
  three; once good points share two of them, the region narrows to the third (every
  `enable_flashinfer_allreduce_fusion = true` point collapses). A bad point whose every value a good point
  has taught nothing beyond itself;
- **failed, naming a setting**: the diagnosis read a setting and a value to try from the server's log
  (`engines.base.Setting`: a KV cache too small for max_model_len, a CUDA-graph capture crash): the
  region is every value of that setting beyond the value to try, on the failed value's side (max_model_len
  > 19968), or the point's value of the flags that give it (enforce_eager = False), with the point's
  other unshared categorical values.
"""

from __future__ import annotations

from servelab.search.base import History, Region, Tried
from servelab.space import Categorical, Point, Space, Value


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
        if t.outcome == "failed" and (named := _setting_region(t, unshared)) is not None:
            out.setdefault(("failed", named.text()), named)
            continue
        if not unshared:
            continue  # every value of it ran fine somewhere: only the point itself is known bad
        r = Region(unshared, t.outcome, t.label, t.reason or t.outcome)
        out.setdefault((t.outcome, *unshared), r)
    # A region that holds a measured point is wrong for it: drop it (the good point is the evidence).
    return [r for r in out.values() if not any(r.holds(g.point) for g in good)]


def _setting_region(t: Tried, unshared: tuple[tuple[str, Value], ...]) -> Region | None:
    """The region a failed trial's diagnosis names, with the point's `unshared` values: every value of its
    setting beyond the value to try, on the side of the value that failed (a max_model_len over 19968
    when the log says 20000 fit and 32768 failed), or the point's value of each engine flag that gives the value to try
    (`enforce_eager = False` when the capture of CUDA graphs crashed). None when the point holds none."""
    s = t.setting
    if s is None:
        return None
    why = t.reason or f"failed: try {s.name} = {s.value!r}"
    x = t.point.get(s.name)
    if isinstance(x, int | float) and not isinstance(x, bool) and _number(s.value) and x != s.value:
        others = tuple((k, v) for k, v in unshared if k != s.name)
        op = ">" if float(s.value) < x else "<"
        return Region(others, "failed", t.label, why, ((s.name, op, float(s.value)),))
    named = [(s.name, t.point[s.name])] if s.name in t.point and x != s.value else []
    named += [(k, t.point[k]) for k, v in s.flags if k in t.point and t.point[k] != v]
    if not named:
        return None
    keys = {k for k, _ in named}
    return Region((*[kv for kv in unshared if kv[0] not in keys], *named), "failed", t.label, why)


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def avoided(point: Point, learned: list[Region]) -> Region | None:
    for r in learned:
        if r.holds(point):
            return r
    return None

"""A study's search space as typed parameters, its constraints, and the candidate each point is.

A point is an assignment of every parameter (`{"layout": "tp4-pp2", "moe_runner_backend": "…"}`).
Keys are candidate fields (`tp`, `pp`, `quantization`, …), `layout` (`tp4-pp2` sets tp and pp),
`env.NAME`, `options.NAME`, or an engine flag without its dashes (`chunked_prefill_size` is
`--chunked-prefill-size VALUE`; `true` is the bare flag, `false` leaves it out). Constraints restrict
values (`allow`) or force them (`set`) where a condition (`when`) holds.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard

from servelab.jsontypes import JsonObject, JsonValue
from servelab.redact import is_secret_name


class ConstraintLike(Protocol):
    """A `[[search.constraints]]` table (config.sections.ConstraintSpec): this module sits below config.
    Read only, its values narrowed here (a TOML table before it is checked)."""

    @property
    def when(self) -> Mapping[str, object]: ...

    @property
    def allow(self) -> Mapping[str, object]: ...

    @property
    def set(self) -> Mapping[str, object]: ...


class SearchLike(Protocol):
    """The `[search]` table's space and constraints (config.sections.SearchSpec)."""

    @property
    def space(self) -> Mapping[str, object]: ...

    @property
    def constraints(self) -> Sequence[ConstraintLike]: ...


Value = str | int | float | bool
Point = dict[str, Value]

# Candidate fields a space key may name directly (`layout` sets tp/pp/dp/ep together); the report shows
# the same ones as a candidate's settings.
FIELDS = (
    "tp",
    "pp",
    "ep",
    "dp",
    "quantization",
    "kv_cache_dtype",
    "max_concurrency",
    "mem_fraction",
    "max_model_len",
)
LAYOUT_PARTS = ("tp", "pp", "dp", "ep")
_LAYOUT = re.compile(r"^(?:(tp|pp|dp|ep)(\d+))(?:-(tp|pp|dp|ep)(\d+))*$")
_FLAG = re.compile(r"^[a-z][a-z0-9_]*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Points a grid may hold: a larger finite space is searched, not enumerated.
GRID_LIMIT = 100_000


class SpaceError(ValueError):
    """A problem with the space, with the field path under `search` it is about."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


def parse_layout(text: str) -> dict[str, int]:
    """`tp4-pp2` → {"tp": 4, "pp": 2}; each part once, each ≥ 1."""
    if not isinstance(text, str) or not _LAYOUT.match(text):
        raise ValueError(f"{text!r} is not a layout; write e.g. tp8, tp4-pp2, tp2-pp2-dp2, tp8-ep8")
    out: dict[str, int] = {}
    for part in text.split("-"):
        key, n = part[:2], int(part[2:])
        if key in out:
            raise ValueError(f"layout {text!r} names {key} twice")
        if n < 1:
            raise ValueError(f"layout {text!r}: {key} must be at least 1")
        out[key] = n
    return out


@dataclass(frozen=True)
class Categorical:
    key: str
    values: tuple[Value, ...]

    def contains(self, v: Value) -> bool:
        return any(type(v) is type(x) and v == x for x in self.values)


@dataclass(frozen=True)
class Range:
    key: str
    low: float
    high: float
    log: bool = False
    step: float | None = None
    integer: bool = False

    def contains(self, v: Value) -> bool:
        return not isinstance(v, bool | str) and self.low <= float(v) <= self.high

    def values(self) -> list[Value] | None:
        """Every value, when the range is finite (a step, or integers without log): else None."""
        if self.integer and self.log and self.step is None:
            return None
        if self.step is None and not self.integer:
            return None
        step = self.step or 1
        n = math.floor((self.high - self.low) / step + 1e-9) + 1
        if n > GRID_LIMIT:
            return None
        vals = [self.low + i * step for i in range(n)]
        return [round(v) if self.integer else round(v, 12) for v in vals]

    def clip(self, v: float) -> Value:
        """A sampled value as the candidate holds it: integers as int, floats to 4 significant digits."""
        v = min(self.high, max(self.low, v))
        if self.integer:
            return round(v)
        if self.step is None and v != 0:
            v = round(v, 3 - math.floor(math.log10(abs(v))))
        return min(self.high, max(self.low, v))


Param = Categorical | Range


@dataclass(frozen=True)
class Condition:
    """One key's test: equal, in a list, or compared (gt/ge/lt/le/ne)."""

    key: str
    equals: tuple[Value, ...] = ()
    ops: tuple[tuple[str, Value], ...] = ()  # a number, or the value `ne` compares with

    def holds(self, v: Value | None) -> bool:
        if v is None:
            return False
        if self.equals and not any(type(v) is type(x) and v == x for x in self.equals):
            return False
        for op, x in self.ops:
            if isinstance(v, bool | str):
                return op == "ne" and v != x
            if isinstance(x, str):  # every comparison below is taken, and a number does not order with text
                raise TypeError(f"'{op}' not supported between {type(v).__name__} and str")
            if not {
                "gt": v > x,
                "ge": v >= x,
                "lt": v < x,
                "le": v <= x,
                "ne": v != x,
            }[op]:
                return False
        return True


@dataclass(frozen=True)
class Constraint:
    when: tuple[Condition, ...]
    allow: tuple[Condition, ...]
    force: tuple[tuple[str, Value], ...]
    path: str

    def applies(self, view: Mapping[str, Value]) -> bool:
        return all(c.holds(view.get(c.key)) for c in self.when)


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...] = ()
    forced_keys: tuple[str, ...] = field(default=())

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.params]

    def shorthand(self) -> dict[str, str]:
        """Per key how `label` writes it: initials for numbers (`mrr`), the flag's name for booleans, ""
        for strings shown alone; keys that would read alike are left out (written `key=value`)."""
        keys = [*self.keys, *(k for k in self.forced_keys if k not in self.keys)]
        strings: dict[str, int] = {}
        for p in self.params:
            if isinstance(p, Categorical):
                for v in {x for x in p.values if isinstance(x, str)}:
                    strings[v] = strings.get(v, 0) + 1
        out: dict[str, str] = {}
        initials: dict[str, list[str]] = {}
        for k in keys:
            if k == "layout":
                continue
            base = k.split(".", 1)[-1]
            if k.startswith("env."):
                continue  # an environment variable reads best whole
            initials.setdefault("".join(w[0] for w in base.split("_") if w), []).append(k)
        for ini, ks in initials.items():
            for k in ks:
                par = next((q for q in self.params if q.key == k), None)
                if isinstance(par, Categorical) and all(isinstance(x, bool) for x in par.values):
                    out[k] = k.split(".", 1)[-1].replace("_", "-")
                elif isinstance(par, Categorical) and all(isinstance(x, str) for x in par.values):
                    if all(strings.get(str(x), 0) == 1 for x in par.values):
                        out[k] = ""
                elif len(ks) == 1 and ini and par is not None:
                    out[k] = ini
        return out

    def finite(self) -> bool:
        return all(isinstance(p, Categorical) or p.values() is not None for p in self.params)

    def size(self) -> int | None:
        """How many points the product holds before constraints (None: a continuous range)."""
        n = 1
        for p in self.params:
            vals = p.values if isinstance(p, Categorical) else p.values()
            if vals is None:
                return None
            n *= len(vals)
        return n

    def points(self) -> Iterator[Point]:
        """Every feasible point of a finite space, in the order its values are written (constraints'
        forced values applied; points that violate an `allow` left out; duplicates once)."""
        axes: list[list[Value]] = []
        for p in self.params:
            vals = list(p.values) if isinstance(p, Categorical) else p.values()
            if vals is None:
                raise SpaceError(f"space.{p.key}", "a continuous range has no grid; give step, or use optuna")
            axes.append(vals)
        seen: set[tuple[tuple[str, Value], ...]] = set()
        for combo in itertools.product(*axes):
            point = self.settle(dict(zip(self.keys, combo, strict=True)))
            if point is None:
                continue
            key = tuple(sorted(point.items(), key=lambda kv: kv[0]))
            if key not in seen:
                seen.add(key)
                yield point

    def settle(self, point: Point) -> Point | None:
        """The point with every applicable `set` applied, or None when an `allow` rules it out."""
        out = dict(point)
        for c in self.constraints:
            if c.applies(view(out)):
                out.update(dict(c.force))
        for c in self.constraints:
            if c.applies(view(out)) and not all(a.holds(view(out).get(a.key)) for a in c.allow):
                return None
        return out

    def why_not(self, point: Point) -> str | None:
        """Why a point is outside the space (its constraints), or None."""
        for c in self.constraints:
            if c.applies(view(point)):
                for a in c.allow:
                    if not a.holds(view(point).get(a.key)):
                        return f"{c.path}: {a.key} = {point.get(a.key, view(point).get(a.key))!r} is not allowed there"
        return None


def view(point: Mapping[str, Value]) -> dict[str, Value]:
    """The point with the layout's parts as their own keys (conditions may test `pp > 1`)."""
    out = dict(point)
    layout = point.get("layout")
    if isinstance(layout, str):
        for k, n in parse_layout(layout).items():
            out.setdefault(k, n)
    for k in LAYOUT_PARTS:
        out.setdefault(k, 1)
    return out


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def candidate_fields(point: Point, space: Space | None = None, name: str | None = None) -> JsonObject:
    """The candidate table a point is (config.sections.CandidateSpec's fields): fields, layout, env, options, and
    engine flags in the space's order. JSON: config validates it into a CandidateSpec."""
    fields: JsonObject = {}
    args: list[JsonValue] = []
    env: JsonObject = {}
    options: JsonObject = {}
    for key, v in point.items():
        if key == "layout":
            fields.update(parse_layout(str(v)))
        elif key in FIELDS:
            fields[key] = v
        elif key.startswith("env."):
            env[key[4:]] = _text(v)
        elif key.startswith("options."):
            options[key[8:]] = v
        elif v is True:
            args.append(flag(key))
        elif v is not False:
            args += [flag(key), _text(v)]
    return {**fields, "args": args, "env": env, "options": options, "name": name or label(point, space)}


def _text(v: Value) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def label(point: Point, space: Space | None = None) -> str:
    """A point's candidate name, short enough to read in a table: the layout, then per key in the
    space's order a true flag's name (a false one left out), a string value alone, a number after the
    key's initials (`max_running_requests = 64`: `mrr64`). Where two keys would read alike (same initials,
    a string both may take), the key is written whole: `key=value`."""
    short = space.shorthand() if space is not None else {}
    parts = [str(point["layout"])] if "layout" in point else []
    for key, v in point.items():
        if key == "layout":
            continue
        how = short.get(key)
        shown = (
            "true" if v is True else "false" if v is False else f"{v:g}" if isinstance(v, float) else str(v)
        )
        if how is None:
            parts.append(f"{key.removeprefix('env.')}={shown}")
        elif isinstance(v, bool):
            if v:
                parts.append(how)
        elif isinstance(v, str):
            parts.append(shown if how == "" else f"{key}={shown}")
        else:
            parts.append(f"{how}{shown}")
    return "-".join(parts) or "default"


# -- the study file's [search] into typed parameters --------------------------------------------------
def _flatten(space: Mapping[str, object]) -> Iterator[tuple[str, object]]:
    for key, v in space.items():
        if key in ("env", "options") and isinstance(v, dict):
            for sub, x in v.items():
                yield f"{key}.{sub}", x
        else:
            yield key, v


def check_key(key: str, path: str) -> None:
    if key == "layout" or key in FIELDS:
        return
    if is_secret_name(key.split(".", 1)[-1]):
        raise SpaceError(
            path,
            f"{key} looks like a secret: a secret is not searched (it would name candidates); set it once in "
            "[engine] env",
        )
    if key.startswith("env."):
        if not _ENV.match(key[4:]):
            raise SpaceError(path, f"{key[4:]!r} is not an environment variable name")
        return
    if key.startswith("options."):
        if not key[8:]:
            raise SpaceError(path, "options. needs an engine option name")
        return
    if key in ("name", "baseline", "args", "env", "options"):
        raise SpaceError(path, f"{key} cannot be searched; use engine flags as keys (without dashes)")
    if not _FLAG.match(key):
        raise SpaceError(
            path,
            f"{key!r} is not a candidate field, layout, env.NAME, options.NAME or an engine flag without "
            "dashes (lower case, underscores: chunked_prefill_size)",
        )


def _scalar(v: object) -> TypeGuard[Value]:
    return isinstance(v, str | int | float | bool)


def parse_param(key: str, raw: object, path: str) -> Param:
    check_key(key, path)
    if isinstance(raw, list):
        if not raw:
            raise SpaceError(path, "an empty list of values")
        if not all(_scalar(v) for v in raw):
            raise SpaceError(path, "values must be strings, numbers or booleans")
        if len({(type(v), v) for v in raw}) != len(raw):
            raise SpaceError(path, "a value is listed twice")
        if key == "layout":
            for v in raw:
                try:
                    parse_layout(v)
                except ValueError as exc:
                    raise SpaceError(path, str(exc)) from None
        return Categorical(key, tuple(raw))
    if isinstance(raw, dict):
        unknown = set(raw) - {"low", "high", "log", "step"}
        if unknown:
            raise SpaceError(
                path, f"unknown range field(s) {', '.join(sorted(unknown))}; use low, high, log, step"
            )
        if "low" not in raw or "high" not in raw:
            raise SpaceError(
                path, "a range needs low and high, e.g. { low = 2048, high = 16384, log = true }"
            )
        low, high, step, log = raw["low"], raw["high"], raw.get("step"), raw.get("log", False)
        nums = [x for x in (low, high, step) if x is not None]
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in nums):
            raise SpaceError(path, "low, high and step must be numbers")
        if not isinstance(log, bool):
            raise SpaceError(path, "log must be true or false")
        if low > high:
            raise SpaceError(path, f"low ({low}) is above high ({high})")
        if log and low <= 0:
            raise SpaceError(path, "a log range needs low > 0")
        if step is not None and (step <= 0 or log):
            raise SpaceError(path, "step must be positive, and a log range takes no step")
        integer = all(isinstance(x, int) for x in nums)
        if key == "layout":
            raise SpaceError(path, "layout takes a list of layouts, not a range")
        return Range(key, float(low), float(high), log, None if step is None else float(step), integer)
    if _scalar(raw):
        raise SpaceError(
            path, f"a single value; write [{raw!r}] (or set it in [engine] / a constraint's set)"
        )
    raise SpaceError(path, "give a list of values or a range table { low, high, log, step }")


def _conditions(raw: Mapping[str, object], path: str) -> tuple[Condition, ...]:
    out = []
    for key, v in _flatten(raw):
        where = f"{path}.{key}"
        if key not in LAYOUT_PARTS:
            check_key(key, where)
        if isinstance(v, list):
            if not v or not all(_scalar(x) for x in v):
                raise SpaceError(where, "a non-empty list of values")
            out.append(Condition(key, tuple(v)))
        elif isinstance(v, dict):
            ops: list[tuple[str, Value]] = []
            for op, x in v.items():
                if op == "low":
                    op = "ge"
                elif op == "high":
                    op = "le"
                if op not in ("gt", "ge", "lt", "le", "ne"):
                    raise SpaceError(
                        where, f"unknown comparison {op!r}; use gt, ge, lt, le, ne (or low / high)"
                    )
                if not isinstance(x, int | float) or isinstance(x, bool):
                    if op == "ne" and _scalar(x):
                        ops.append((op, x))
                        continue
                    raise SpaceError(where, f"{op} needs a number")
                ops.append((op, float(x)))
            out.append(Condition(key, (), tuple(ops)))
        elif _scalar(v):
            out.append(Condition(key, (v,)))
        else:
            raise SpaceError(where, "a value, a list of values, or { gt/ge/lt/le/ne = number }")
    return tuple(out)


def _constraint(c: ConstraintLike, i: int) -> Constraint:
    path = f"constraints[{i}]"
    when = _conditions(c.when, f"{path}.when")
    allow = _conditions(c.allow, f"{path}.allow")
    force: list[tuple[str, Value]] = []
    for key, v in _flatten(c.set):
        check_key(key, f"{path}.set.{key}")
        if not _scalar(v):
            raise SpaceError(f"{path}.set.{key}", "set takes one value")
        force.append((key, v))
    if not allow and not force:
        raise SpaceError(path, "a constraint needs allow = {...} or set = {...}")
    return Constraint(when, allow, tuple(force), path)


def build(spec: SearchLike) -> Space:
    """The typed space of a `[search]` table; SpaceError names the field under `search`."""
    params = [parse_param(k, v, f"space.{k}") for k, v in _flatten(spec.space)]
    if not params:
        raise SpaceError("space", "the search space is empty: give [search.space] keys")
    keys = {p.key for p in params}
    if "layout" in keys and keys & set(LAYOUT_PARTS):
        raise SpaceError("space.layout", "layout sets tp/pp/dp/ep: do not search both")
    constraints = tuple(_constraint(c, i) for i, c in enumerate(spec.constraints))
    forced = tuple(dict.fromkeys(k for c in constraints for k, _ in c.force))
    return Space(tuple(params), constraints, forced)


def corners(space: Space) -> list[Point]:
    """Points that together show every value of every parameter (ranges: low and high), the others at
    their first value: what a space too large to list is checked on. Infeasible ones are left out."""
    first: Point = {}
    choices: list[tuple[str, list[Value]]] = []
    for p in space.params:
        vals: list[Value] = list(p.values) if isinstance(p, Categorical) else [p.clip(p.low), p.clip(p.high)]
        first[p.key] = vals[0]
        choices.append((p.key, vals))
    out: list[Point] = []
    for key, vals in choices:
        for v in vals:
            point = space.settle({**first, key: v})
            if point is not None and point not in out:
                out.append(point)
    return out

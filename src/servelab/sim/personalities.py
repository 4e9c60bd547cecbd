"""What each engine looks like from outside: its flags, its start-up log, its /metrics and info routes.

servelab's own parsers (launch, verify, `logs parse`) must work on the real engines and on the
simulator alike, so everything here follows the engines' spelling: vLLM's argparse flags and
`non-default args: {...}` dict, SGLang's `server_args=ServerArgs(...)` repr, their timestamp formats
and metric names. Everything that differs between the engines (defaults, log format and lines, routes,
process and metric names, error texts) lives in `servelab/data/sim/personalities.toml`, parsed once
into typed `Personality` objects here. A personality names its flag dialect (`sim/engine_args.py`: the
engine's argparse, its flags spelled by the engine's adapter); `sim/render.py` writes its log lines and
its /metrics.
"""

from __future__ import annotations

import time
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from string import Formatter
from typing import NamedTuple, TypeVar

from servelab.engines.flagdump import dump_argparse
from servelab.engines.flagschema import FlagSchema, from_dump
from servelab.model.context import PICKS, ContextFacts, ContextRule, derive
from servelab.sim.engine_args import FLAG_DIALECTS, EngineArgs


@dataclass(frozen=True)
class FaultSignature:
    """One `[NAME]` table of sim/faults.toml: the lines a fault prints (a personality's own where it has
    them, `<personality>_lines`) and the exit code of a start-up crash."""

    lines: tuple[str, ...]
    own_lines: dict[str, tuple[str, ...]] = field(default_factory=dict)
    exit: int = 1

    def lines_for(self, personality: str) -> list[str]:
        return list(self.own_lines.get(personality) or self.lines)


@cache
def fault_signatures() -> dict[str, FaultSignature]:
    data = tomllib.loads(resources.files("servelab.data").joinpath("sim/faults.toml").read_text())
    out: dict[str, FaultSignature] = {}
    for name, raw in data.items():
        t = _Table(raw, f"faults.{name}")
        own = [k for k in t.data if k.endswith("_lines")]
        out[name] = FaultSignature(
            lines=tuple(str(x) for x in t.array("lines")),
            own_lines={k.removesuffix("_lines"): tuple(str(x) for x in t.array(k)) for k in own},
            exit=t.integer("exit") if "exit" in t.data else 1,
        )
    return out


@cache
def power_table() -> dict[str, dict[str, float]]:
    """sim/gpu_power.toml: `[default]`, `[step]` and each GPU's own figures, by name."""
    data = tomllib.loads(resources.files("servelab.data").joinpath("sim/gpu_power.toml").read_text())
    out: dict[str, dict[str, float]] = {}
    for name, raw in data.items():
        t = _Table(raw, f"gpu_power.{name}")
        out[name] = {}
        for key, v in t.data.items():  # kept as written: an int limit is shown as an int
            if not isinstance(v, int | float) or isinstance(v, bool):
                raise PersonalityError(f"{t.where}.{key}: expected a number, got {v!r}")
            out[name][key] = v
    return out


# -- the personalities, as data ----------------------------------------------------------------------

# Handlers a personality's [routes] may name (sim/routes.py implements them).
ROUTE_HANDLERS = ("version", "server_info", "model_info")
# The scheduler's numbers a /metrics row may show (SimServer.metric_values).
METRIC_VALUES = (
    "running",
    "waiting",
    "kv_usage",
    "kv_tokens_used",
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    "gen_throughput",
    "finished",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "cache_hit_rate",
)
# ... and the histograms a row of type "histogram" may show: `<value>_sum` (model seconds) and
# `<value>_count` in SimServer.metric_values, timed by the step clock.
METRIC_HISTOGRAMS = ("ttft", "itl", "e2e")
PERIODIC_FIELDS = frozenset(
    {"gen_throughput", "running", "waiting", "kv_usage", "kv_usage_pct", "kv_tokens_used"}
)
LOG_FIELDS = frozenset({"role", "level", "date", "src", "text"})
ROLE_FIELDS = frozenset({"pid", "engine_pid", "rank"})
DELAYS = ("0", "load", "compile", "kv", "graph", "engine", "warmup")


@dataclass(frozen=True)
class CompileCache:
    """The engine's compile cache (`[<p>.startup.compile_cache]`): kept under `$<env>/<subdir>` only where
    the variable is set (no env: none). A launch that finds it filled loads its graphs in `load_share` of the
    compile time and prints `warm_line`; one that finds it empty compiles, prints `cold_line` and fills it."""

    env: str = ""
    subdir: str = ""
    load_share: float = 1.0
    warm_line: str = ""
    cold_line: str = ""


class PersonalityError(ValueError):
    """A personalities file that does not describe a personality (the key path says where)."""


@dataclass(frozen=True)
class Tiers:
    """A default that depends on the GPU's memory: the value of the largest threshold reached."""

    steps: tuple[tuple[float, float], ...]

    def pick(self, gpu_gb: float) -> float:
        value = self.steps[0][1]
        for threshold, v in self.steps:
            if gpu_gb >= threshold:
                value = v
        return value


@dataclass(frozen=True)
class Defaults:
    max_running: Tiers
    max_batched_tokens: Tiers
    mem_fraction: float | None  # None: the performance model's fraction for this engine
    max_model_len: int | None  # None: derived from the model's config by the personality's [context]


@dataclass(frozen=True)
class LogStyle:
    stream: str  # "stdout" | "stderr"
    date: str  # strftime format
    line: str  # {role} {level} {date} {src} {text}
    roles: dict[str, str]
    sources: dict[str, str]
    default_source: str

    def source(self, text: str) -> str:
        """The [file:line] of a line: the longest source key that is the line's first word(s)."""
        best = ""
        for key in self.sources:
            if (text == key or text.startswith(key + " ")) and len(key) > len(best):
                best = key
        return self.sources[best] if best else self.default_source

    def format(
        self,
        who: str,
        text: str,
        *,
        level: str = "INFO",
        src: str | None = None,
        pid: int = 0,
        engine_pid: int = 0,
        tp: int = 1,
    ) -> list[str]:
        if who == "raw":
            return [text]
        role = self.roles[who]
        date = time.strftime(self.date)
        ranks = range(tp) if "{rank}" in role else range(1)
        return [
            self.line.format(
                role=role.format(pid=pid, engine_pid=engine_pid, rank=r),
                level=level,
                date=date,
                src=src or self.source(text),
                text=text,
            )
            for r in ranks
        ]


class LogLine(NamedTuple):
    who: str
    delay: str
    text: str


@dataclass(frozen=True)
class Processes:
    gpu_process: str  # per GPU when tp > 1 ({rank})
    gpu_process_single: str  # per GPU when tp = 1
    engine_core: str
    engine_core_role: str

    def on_gpu(self, rank: int, tp: int) -> str:
        return (self.gpu_process if tp > 1 else self.gpu_process_single).format(rank=rank)


@dataclass(frozen=True)
class MetricRow:
    name: str
    type: str
    help: str
    value: str | float  # a METRIC_VALUES name, or a constant


@dataclass(frozen=True)
class SuccessCounter:
    name: str
    help: str
    labels: str  # {reason}, {model}


@dataclass(frozen=True)
class Metrics:
    labels: str
    rows: tuple[MetricRow, ...]
    success: SuccessCounter | None


@dataclass(frozen=True)
class EngineDead:
    prefix: str  # before each signature line ({engine_pid})
    exit_code: int  # 0: the server stays up, answering 500s; else it exits with this code


@dataclass(frozen=True)
class Refusals:
    """The 400s a request longer than the context gets, in the engine's words ({max_model_len},
    {prompt}, {max_tokens}, {total})."""

    prompt: str  # the prompt alone reaches the context
    total: str  # prompt + max_tokens exceed it
    total_may_equal: bool  # prompt + max_tokens == the context is accepted (vLLM) or refused (SGLang)

    def refusal(self, max_model_len: int, prompt: int, max_tokens: int) -> str | None:
        """The engine's error text for this request, or None when it is accepted."""
        total = prompt + max_tokens
        values = {"max_model_len": max_model_len, "prompt": prompt, "max_tokens": max_tokens, "total": total}
        if prompt >= max_model_len:
            return self.prompt.format(**values)
        if total > max_model_len or (total == max_model_len and not self.total_may_equal):
            return self.total.format(**values)
        return None


REFUSAL_FIELDS = frozenset({"max_model_len", "prompt", "max_tokens", "total"})


@dataclass(frozen=True)
class Personality:
    """One engine the simulator imitates, as personalities.toml describes it."""

    name: str
    version: str
    flags: str
    default_port: int
    owned_by: str
    reuse_port: bool
    dead_message: str
    shutdown: tuple[str, ...]
    lines: tuple[LogLine, ...]
    defaults: Defaults
    compile_s: float
    compile_needs_cuda_graph: bool
    nsa_radix_crash_sm: tuple[int, ...]
    compile_cache: CompileCache
    log: LogStyle
    periodic: LogLine
    processes: Processes
    routes: dict[str, str]
    metrics: Metrics
    engine_dead: EngineDead
    refusals: Refusals
    context: ContextRule | None = None  # how the engine derives its context (None: defaults.max_model_len)

    def max_model_len(self, facts: ContextFacts) -> tuple[int, str]:
        """The engine's default context for a model whose config states `facts`, and how it was found."""
        if self.defaults.max_model_len is not None:
            return self.defaults.max_model_len, "the personality's default"
        assert self.context is not None  # the parser demands one or the other
        return derive(self.context, facts)

    def compile_time(self, cuda_graph: bool) -> float:
        return self.compile_s if (cuda_graph or not self.compile_needs_cuda_graph) else 0.0


_T = TypeVar("_T")


class _Table:
    """Typed reads of one TOML table; errors name the key path."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise PersonalityError(f"{where}: expected a table")
        self.data: dict[str, object] = data
        self.where = where

    def _get(self, key: str, kind: type[_T], what: str) -> _T:
        if key not in self.data:
            raise PersonalityError(f"{self.where}.{key}: missing")
        v = self.data[key]
        if not isinstance(v, kind) or (kind is not bool and isinstance(v, bool)):
            raise PersonalityError(f"{self.where}.{key}: expected {what}, got {v!r}")
        return v

    def text(self, key: str) -> str:
        return str(self._get(key, str, "a string"))

    def integer(self, key: str) -> int:
        return int(self._get(key, int, "an integer"))

    def number(self, key: str) -> float:
        v = self.data.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
        return self._get(key, float, "a number")  # missing, or not a number: says which

    def flag(self, key: str) -> bool:
        return bool(self._get(key, bool, "true or false"))

    def array(self, key: str) -> list[object]:
        return list(self._get(key, list, "an array"))

    def integers(self, key: str) -> tuple[int, ...]:
        items = self.array(key)
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in items):
            raise PersonalityError(f"{self.where}.{key}: expected an array of integers, got {items!r}")
        return tuple(int(x) for x in items if isinstance(x, int | float))

    def table(self, key: str) -> _Table:
        return _Table(self._get(key, dict, "a table"), f"{self.where}.{key}")

    def str_map(self, key: str) -> dict[str, str]:
        t = self.table(key)
        return {k: t.text(k) for k in t.data}


def _compile_cache(st: _Table) -> CompileCache:
    if "compile_cache" not in st.data:
        return CompileCache()
    c = st.table("compile_cache")
    return CompileCache(
        c.text("env"), c.text("subdir"), c.number("load_share"), c.text("warm_line"), c.text("cold_line")
    )


def _fields(template: str) -> set[str]:
    return {f.split(".")[0].split("[")[0] for _, f, _, _ in Formatter().parse(template) if f}


def _check_fields(template: str, allowed: frozenset[str], where: str) -> None:
    unknown = _fields(template) - allowed
    if unknown:
        raise PersonalityError(f"{where}: unknown placeholder(s) {sorted(unknown)} in {template!r}")


def _tiers(t: _Table, key: str) -> Tiers:
    where = f"{t.where}.{key}"
    v = t.data.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return Tiers(((0.0, float(v)),))
    steps = []
    for item in t.array(key):
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, (int, float)) for x in item)):
            raise PersonalityError(f"{where}: expected [min GPU GB, value] pairs, got {item!r}")
        steps.append((float(item[0]), float(item[1])))
    if not steps:
        raise PersonalityError(f"{where}: empty")
    return Tiers(tuple(sorted(steps)))


def _personality(name: str, t: _Table) -> Personality:
    flags = t.text("flags")
    if flags not in FLAG_DIALECTS:
        raise PersonalityError(
            f"{t.where}.flags: unknown flag dialect {flags!r} (choose {', '.join(FLAG_DIALECTS)})"
        )
    log_t = t.table("log")
    log = LogStyle(
        stream=log_t.text("stream"),
        date=log_t.text("date"),
        line=log_t.text("line"),
        roles=log_t.str_map("roles"),
        sources=log_t.str_map("sources") if "sources" in log_t.data else {},
        default_source=log_t.text("default_source") if "default_source" in log_t.data else "",
    )
    if log.stream not in ("stdout", "stderr"):
        raise PersonalityError(f"{log_t.where}.stream: stdout or stderr, not {log.stream!r}")
    _check_fields(log.line, LOG_FIELDS, f"{log_t.where}.line")
    for role, prefix in log.roles.items():
        _check_fields(prefix, ROLE_FIELDS, f"{log_t.where}.roles.{role}")
    whos = set(log.roles) | {"raw"}
    lines = []
    for i, row in enumerate(t.array("lines")):
        if not (isinstance(row, list) and len(row) == 3 and all(isinstance(x, str) for x in row)):
            raise PersonalityError(f"{t.where}.lines[{i}]: expected [who, delay, text], got {row!r}")
        line = LogLine(*row)
        if line.who not in whos:
            raise PersonalityError(f"{t.where}.lines[{i}]: unknown role {line.who!r} (roles: {sorted(whos)})")
        if line.delay not in DELAYS:
            raise PersonalityError(f"{t.where}.lines[{i}]: unknown delay {line.delay!r} (choose {DELAYS})")
        lines.append(line)
    d = t.table("defaults")
    mem = d.data.get("mem_fraction")
    defaults = Defaults(
        max_running=_tiers(d, "max_running"),
        max_batched_tokens=_tiers(d, "max_batched_tokens"),
        mem_fraction=None if mem == "model" else d.number("mem_fraction"),
        max_model_len=d.integer("max_model_len") if "max_model_len" in d.data else None,
    )
    context = _context(t.table("context")) if "context" in t.data else None
    if context is None and defaults.max_model_len is None:
        raise PersonalityError(
            f"{t.where}: give [context] (how the engine derives it) or defaults.max_model_len"
        )
    rf = t.table("refusals")
    refusals = Refusals(rf.text("prompt"), rf.text("total"), rf.flag("total_may_equal"))
    _check_fields(refusals.prompt, REFUSAL_FIELDS, f"{rf.where}.prompt")
    _check_fields(refusals.total, REFUSAL_FIELDS, f"{rf.where}.total")
    st = t.table("startup")
    per = t.table("periodic")
    periodic = LogLine(per.text("who"), "0", per.text("text"))
    if periodic.who not in whos:
        raise PersonalityError(f"{per.where}.who: unknown role {periodic.who!r}")
    _check_fields(periodic.text, PERIODIC_FIELDS, f"{per.where}.text")
    pr = t.table("processes")
    processes = Processes(
        gpu_process=pr.text("gpu_process"),
        gpu_process_single=pr.text("gpu_process_single"),
        engine_core=pr.text("engine_core"),
        engine_core_role=pr.text("engine_core_role"),
    )
    if processes.engine_core_role not in whos:
        raise PersonalityError(f"{pr.where}.engine_core_role: unknown role {processes.engine_core_role!r}")
    routes = t.str_map("routes") if "routes" in t.data else {}
    for path, handler in routes.items():
        if not path.startswith("/") or handler not in ROUTE_HANDLERS:
            raise PersonalityError(
                f"{t.where}.routes: {path!r} -> {handler!r} (a path, and one of {', '.join(ROUTE_HANDLERS)})"
            )
    m = t.table("metrics")
    rows = []
    for i, raw in enumerate(m.array("rows")):
        r = _Table(raw, f"{m.where}.rows[{i}]")
        value = r.data.get("value")
        if isinstance(value, str):
            known = METRIC_HISTOGRAMS if r.data.get("type") == "histogram" else METRIC_VALUES
            if value not in known:
                raise PersonalityError(f"{r.where}.value: {value!r} is not one of {', '.join(known)}")
        else:
            value = r.number("value")
        rows.append(MetricRow(r.text("name"), r.text("type"), r.text("help"), value))
    success = None
    if "success" in m.data:
        sc = m.table("success")
        success = SuccessCounter(sc.text("name"), sc.text("help"), sc.text("labels"))
    ed = t.table("engine_dead")
    return Personality(
        name=name,
        version=t.text("version"),
        flags=flags,
        default_port=t.integer("default_port"),
        owned_by=t.text("owned_by"),
        reuse_port=t.flag("reuse_port"),
        dead_message=t.text("dead_message"),
        shutdown=tuple(str(x) for x in t.array("shutdown")),
        lines=tuple(lines),
        defaults=defaults,
        compile_s=st.number("compile_s"),
        compile_needs_cuda_graph=st.flag("compile_needs_cuda_graph"),
        nsa_radix_crash_sm=st.integers("nsa_radix_crash_sm"),
        compile_cache=_compile_cache(st),
        log=log,
        periodic=periodic,
        processes=processes,
        routes=routes,
        metrics=Metrics(m.text("labels"), tuple(rows), success),
        engine_dead=EngineDead(ed.text("prefix"), ed.integer("exit_code")),
        refusals=refusals,
        context=context,
    )


def _context(c: _Table) -> ContextRule:
    def words(key: str) -> tuple[str, ...]:
        items = c.array(key)
        if not all(isinstance(x, str) for x in items):
            raise PersonalityError(f"{c.where}.{key}: expected an array of strings, got {items!r}")
        return tuple(str(x) for x in items)

    rule = ContextRule(
        keys=words("keys"),
        pick=c.text("pick"),
        unscaled_rope=words("unscaled_rope"),
        unscaled_if_original=c.flag("unscaled_if_original"),
        yarn_from_original=c.flag("yarn_from_original"),
        prescaled_model_types=words("prescaled_model_types"),
        fallback=c.integer("fallback"),
    )
    if rule.pick not in PICKS:
        raise PersonalityError(f"{c.where}.pick: {rule.pick!r} is not one of {', '.join(PICKS)}")
    if not rule.keys:
        raise PersonalityError(f"{c.where}.keys: empty")
    return rule


def parse_personalities(text: str, where: str = "personalities.toml") -> dict[str, Personality]:
    """Every personality a personalities file describes (one top-level table each)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PersonalityError(f"{where}: {exc}") from None
    out = {name: _personality(name, _Table(table, f"{where}: {name}")) for name, table in data.items()}
    if not out:
        raise PersonalityError(f"{where}: no personality")
    return out


def load_personalities(path: str | Path | None = None) -> dict[str, Personality]:
    """The personalities of a file (default: the packaged servelab/data/sim/personalities.toml)."""
    if path is None:
        return builtin_personalities()
    p = Path(path)
    return parse_personalities(p.read_text(), str(p))


@cache
def builtin_personalities() -> dict[str, Personality]:
    """The packaged personalities, parsed once."""
    text = resources.files("servelab.data").joinpath("sim/personalities.toml").read_text()
    return parse_personalities(text, "servelab/data/sim/personalities.toml")


def personality_names() -> tuple[str, ...]:
    return tuple(builtin_personalities())


def get_personality(name: str) -> Personality:
    known = builtin_personalities()
    if name not in known:
        raise PersonalityError(f"unknown simulator personality {name!r} (choose {', '.join(known)})")
    return known[name]


# -- a personality's flag dialect --------------------------------------------------------------------


def parse_engine_args(
    personality: str | Personality, argv: list[str], *, sm: int, is_moe: bool
) -> tuple[EngineArgs, list[str]]:
    """Parse engine flags exactly as the engine would (argparse: unknown flags → usage + exit 2),
    in the personality's flag dialect.

    Returns the effective arguments and the warning lines the engine logs while fixing them up."""
    p = get_personality(personality) if isinstance(personality, str) else personality
    return FLAG_DIALECTS[p.flags].parse(p.name, argv, sm, is_moe)


def default_argv(
    personality: str | Personality,
    model: str,
    tp: int | None,
    pp: int | None,
    ep: int | None,
    dp: int | None,
    quant: str | None,
) -> list[str]:
    """The engine flags for a model and layout, in the personality's dialect."""
    p = get_personality(personality) if isinstance(personality, str) else personality
    return FLAG_DIALECTS[p.flags].default_argv(model, tp, pp, ep, dp, quant)


@cache
def flag_schema(personality: str) -> FlagSchema:
    """The flags a personality takes, as a FlagSchema: its dialect's parser, read by the same dump an
    installed engine's parser is read with (so `tune --dry-run` checks a simulator study's args as the
    simulator will parse them)."""
    p = get_personality(personality)
    return from_dump(dump_argparse(FLAG_DIALECTS[p.flags].parser(), "sim", f"{p.name} {p.version}"))

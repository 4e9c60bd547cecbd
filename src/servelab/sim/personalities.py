"""What each engine looks like from outside: its flags, its start-up log, its /metrics and info routes.

servelab's own parsers (launch, verify, `logs parse`) must work on the real engines and on the
simulator alike, so everything here follows the engines' spelling: vLLM's argparse flags and
`non-default args: {...}` dict, SGLang's `server_args=ServerArgs(...)` repr, their timestamp formats
and metric names. Everything that differs between the engines (defaults, log format and lines, routes,
process and metric names, error texts) lives in `servelab/data/sim/personalities.toml`, parsed once
into typed `Personality` objects; the code here only keeps each flag dialect's argparse parser.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from string import Formatter
from typing import Any, NamedTuple


@cache
def fault_signatures() -> dict[str, Any]:
    return tomllib.loads(resources.files("servelab.data").joinpath("sim/faults.toml").read_text())


@cache
def power_table() -> dict[str, Any]:
    return tomllib.loads(resources.files("servelab.data").joinpath("sim/gpu_power.toml").read_text())


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
    max_model_len: int


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
    log: LogStyle
    periodic: LogLine
    processes: Processes
    routes: dict[str, str]
    metrics: Metrics
    engine_dead: EngineDead

    def compile_time(self, cuda_graph: bool) -> float:
        return self.compile_s if (cuda_graph or not self.compile_needs_cuda_graph) else 0.0


class _Table:
    """Typed reads of one TOML table; errors name the key path."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise PersonalityError(f"{where}: expected a table")
        self.data: dict[str, Any] = data
        self.where = where

    def _get(self, key: str, kind: type | tuple[type, ...], what: str) -> Any:
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
        return float(self._get(key, (int, float), "a number"))

    def flag(self, key: str) -> bool:
        return bool(self._get(key, bool, "true or false"))

    def array(self, key: str) -> list[Any]:
        return list(self._get(key, list, "an array"))

    def table(self, key: str) -> _Table:
        return _Table(self._get(key, dict, "a table"), f"{self.where}.{key}")

    def str_map(self, key: str) -> dict[str, str]:
        t = self.table(key)
        return {k: t.text(k) for k in t.data}


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
        max_model_len=d.integer("max_model_len"),
    )
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
        nsa_radix_crash_sm=tuple(int(x) for x in st.array("nsa_radix_crash_sm")),
        log=log,
        periodic=periodic,
        processes=processes,
        routes=routes,
        metrics=Metrics(m.text("labels"), tuple(rows), success),
        engine_dead=EngineDead(ed.text("prefix"), ed.integer("exit_code")),
    )


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


# -- engine flags ----------------------------------------------------------------------------------


@dataclass
class EngineArgs:
    """The engine configuration the simulator applies (effective values after the engine's own fixes)."""

    personality: str
    model: str
    served_model_name: str
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    mem_fraction: float | None = None
    max_num_seqs: int | None = None
    max_batched_tokens: int | None = None
    max_model_len: int | None = None
    moe_runner_backend: str = "auto"
    requested_moe_runner_backend: str = "auto"
    prefix_caching: bool = True
    allreduce_fusion: bool = False
    enable_dp_attention: bool = False
    enable_expert_parallel: bool = False
    cuda_graph: bool = True
    host: str = "0.0.0.0"
    port: int = 8000
    seed: int = 0
    trust_remote_code: bool = False
    non_default: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)


def _bool_flag(p: argparse.ArgumentParser, *names: str, dest: str) -> None:
    p.add_argument(*names, dest=dest, action="store_true", default=False)


def vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve", usage="vllm serve [model_tag] [options]", add_help=True)
    p.add_argument("model_tag", nargs="?", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--enable-expert-parallel", "-ep", action="store_true", default=False)
    p.add_argument("--quantization", "-q", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enforce-eager", action="store_true", default=False)
    p.add_argument("--compilation-config", "-O", default=None)
    p.add_argument("--trust-remote-code", action="store_true", default=False)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--swap-space", type=float, default=4)
    p.add_argument("--disable-log-requests", action="store_true", default=False)
    p.add_argument("--disable-log-stats", action="store_true", default=False)
    p.add_argument("--enable-log-requests", action="store_true", default=False)
    p.add_argument("--speculative-config", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--distributed-executor-backend", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--uvicorn-log-level", default="info")
    return p


VLLM_DEFAULTS = {a.dest: a.default for a in vllm_parser()._actions if a.dest != "help"}


def sglang_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch_server.py")
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--tensor-parallel-size", "--tp-size", "--tp", dest="tp_size", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "--pp-size", dest="pp_size", type=int, default=1)
    p.add_argument("--data-parallel-size", "--dp-size", "--dp", dest="dp_size", type=int, default=1)
    p.add_argument("--expert-parallel-size", "--ep-size", "--ep", dest="ep_size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true", default=False)
    p.add_argument("--quantization", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--max-prefill-tokens", type=int, default=16384)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument(
        "--moe-runner-backend",
        default="auto",
        choices=[
            "auto",
            "triton",
            "triton_kernel",
            "flashinfer_trtllm",
            "flashinfer_cutlass",
            "flashinfer_mxfp4",
            "flashinfer_cutedsl",
            "deep_gemm",
            "cutlass",
        ],
    )
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--disable-radix-cache", action="store_true", default=False)
    p.add_argument("--enable-flashinfer-allreduce-fusion", action="store_true", default=False)
    p.add_argument("--disable-cuda-graph", action="store_true", default=False)
    p.add_argument("--cuda-graph-max-bs", type=int, default=None)
    p.add_argument("--trust-remote-code", action="store_true", default=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--log-level", default="info")
    p.add_argument("--enable-metrics", action="store_true", default=False)
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--reasoning-parser", default=None)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--api-key", default=None)
    return p


def parse_engine_args(
    personality: str | Personality, argv: list[str], *, sm: int, is_moe: bool
) -> tuple[EngineArgs, list[str]]:
    """Parse engine flags exactly as the engine would (argparse: unknown flags → usage + exit 2),
    in the personality's flag dialect.

    Returns the effective arguments and the warning lines the engine logs while fixing them up."""
    p = get_personality(personality) if isinstance(personality, str) else personality
    return FLAG_DIALECTS[p.flags].parse(p.name, argv, sm, is_moe)


def _parse_vllm_flags(name: str, argv: list[str], sm: int, is_moe: bool) -> tuple[EngineArgs, list[str]]:
    warnings: list[str] = []
    ns = vllm_parser().parse_args(argv)
    raw = vars(ns)
    model = ns.model or ns.model_tag
    if not model:
        vllm_parser().error("the following arguments are required: model_tag")
    fusion = False
    if ns.compilation_config:
        try:
            cc = json.loads(ns.compilation_config)
        except ValueError:
            cc = {}
        pc = cc.get("pass_config", {}) if isinstance(cc, dict) else {}
        fusion = bool(pc.get("enable_fi_allreduce_fusion") or pc.get("fuse_allreduce_rms"))
    non_default = {"model_tag": ns.model_tag} if ns.model_tag else {}
    for k, v in raw.items():
        if k in ("model_tag",):
            continue
        if v != VLLM_DEFAULTS.get(k):
            non_default[k] = v
    if ns.model_tag:
        non_default["model"] = model
    args = EngineArgs(
        personality=name,
        model=model,
        served_model_name=(ns.served_model_name or [model])[0],
        tp=ns.tensor_parallel_size,
        pp=ns.pipeline_parallel_size,
        dp=ns.data_parallel_size,
        ep=ns.tensor_parallel_size * ns.data_parallel_size if ns.enable_expert_parallel else 1,
        enable_expert_parallel=ns.enable_expert_parallel,
        quantization=ns.quantization,
        kv_cache_dtype=None if ns.kv_cache_dtype == "auto" else ns.kv_cache_dtype,
        mem_fraction=ns.gpu_memory_utilization,
        max_num_seqs=ns.max_num_seqs,
        max_batched_tokens=ns.max_num_batched_tokens,
        max_model_len=ns.max_model_len,
        prefix_caching=ns.enable_prefix_caching is not False,
        allreduce_fusion=fusion,
        cuda_graph=not ns.enforce_eager,
        host=ns.host or "0.0.0.0",
        port=ns.port,
        seed=ns.seed,
        trust_remote_code=ns.trust_remote_code,
        non_default=non_default,
        raw=raw,
    )
    return args, warnings


def _parse_sglang_flags(name: str, argv: list[str], sm: int, is_moe: bool) -> tuple[EngineArgs, list[str]]:
    warnings: list[str] = []
    ns = sglang_parser().parse_args(argv)
    raw = vars(ns)
    backend = ns.moe_runner_backend
    if backend == "flashinfer_trtllm" and sm == 120 and is_moe:
        warnings.append(
            "Use flashinfer_cutlass as MoE runner backend on SM120: flashinfer_trtllm needs SM100 "
            "(moe_runner_backend='flashinfer_trtllm' -> 'flashinfer_cutlass')"
        )
        backend = "flashinfer_cutlass"
    args = EngineArgs(
        personality=name,
        model=ns.model_path,
        served_model_name=ns.served_model_name or ns.model_path,
        tp=ns.tp_size,
        pp=ns.pp_size,
        dp=ns.dp_size,
        ep=ns.ep_size,
        enable_dp_attention=ns.enable_dp_attention,
        quantization=ns.quantization,
        kv_cache_dtype=None if ns.kv_cache_dtype == "auto" else ns.kv_cache_dtype,
        mem_fraction=ns.mem_fraction_static,
        max_num_seqs=ns.max_running_requests,
        max_batched_tokens=ns.chunked_prefill_size,
        max_model_len=ns.context_length,
        moe_runner_backend=backend,
        requested_moe_runner_backend=ns.moe_runner_backend,
        prefix_caching=not ns.disable_radix_cache,
        allreduce_fusion=ns.enable_flashinfer_allreduce_fusion,
        cuda_graph=not ns.disable_cuda_graph,
        host=ns.host,
        port=ns.port,
        seed=ns.random_seed if ns.random_seed is not None else 0,
        trust_remote_code=ns.trust_remote_code,
        raw=raw,
    )
    return args, warnings


def vllm_default_argv(
    model: str, tp: int | None, pp: int | None, ep: int | None, dp: int | None, quant: str | None
) -> list[str]:
    out = ["--model", model]
    if tp:
        out += ["--tensor-parallel-size", str(tp)]
    if pp:
        out += ["--pipeline-parallel-size", str(pp)]
    if dp:
        out += ["--data-parallel-size", str(dp)]
    if ep and ep > 1:
        out += ["--enable-expert-parallel"]
    if quant:
        out += ["--quantization", quant]
    return out


def sglang_default_argv(
    model: str, tp: int | None, pp: int | None, ep: int | None, dp: int | None, quant: str | None
) -> list[str]:
    out = ["--model-path", model]
    if tp:
        out += ["--tp-size", str(tp)]
    if pp:
        out += ["--pp-size", str(pp)]
    if dp:
        out += ["--dp-size", str(dp)]
    if ep:
        out += ["--ep-size", str(ep)]
    if quant:
        out += ["--quantization", quant]
    return out


class FlagDialect(NamedTuple):
    """How one engine spells its command line: the parser, and the argv a layout starts from."""

    parse: Callable[[str, list[str], int, bool], tuple[EngineArgs, list[str]]]
    default_argv: Callable[[str, int | None, int | None, int | None, int | None, str | None], list[str]]


FLAG_DIALECTS: dict[str, FlagDialect] = {
    "vllm": FlagDialect(_parse_vllm_flags, vllm_default_argv),
    "sglang": FlagDialect(_parse_sglang_flags, sglang_default_argv),
}


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


# -- effective config in each engine's syntax ---------------------------------------------------


def sglang_server_args(a: EngineArgs, eff: dict[str, Any]) -> str:
    fields: list[tuple[str, Any]] = [
        ("model_path", a.model),
        ("tokenizer_path", a.model),
        ("tokenizer_mode", "auto"),
        ("load_format", "auto"),
        ("trust_remote_code", a.trust_remote_code),
        ("context_length", a.max_model_len),
        ("quantization", a.quantization),
        ("served_model_name", a.served_model_name),
        ("kv_cache_dtype", a.kv_cache_dtype or "auto"),
        ("host", a.host),
        ("port", a.port),
        ("mem_fraction_static", eff["mem_fraction"]),
        ("max_running_requests", eff["max_running"]),
        ("max_total_tokens", None),
        ("chunked_prefill_size", eff["max_batched_tokens"]),
        ("max_prefill_tokens", 16384),
        ("schedule_policy", "fcfs"),
        ("tp_size", a.tp),
        ("pp_size", a.pp),
        ("dp_size", a.dp),
        ("ep_size", a.ep),
        ("random_seed", a.seed),
        ("enable_dp_attention", a.enable_dp_attention),
        ("moe_runner_backend", a.moe_runner_backend),
        ("attention_backend", eff.get("attention_backend")),
        ("disable_radix_cache", not a.prefix_caching),
        ("disable_cuda_graph", not a.cuda_graph),
        ("enable_flashinfer_allreduce_fusion", a.allreduce_fusion),
        ("enable_metrics", True),
    ]
    return ", ".join(f"{k}={v!r}" for k, v in fields)


def vllm_engine_config(a: EngineArgs, eff: dict[str, Any]) -> str:
    fields = [
        ("model", repr(a.model)),
        ("speculative_config", "None"),
        ("tokenizer", repr(a.model)),
        ("skip_tokenizer_init", "False"),
        ("tokenizer_mode", "auto"),
        ("revision", "None"),
        ("trust_remote_code", str(a.trust_remote_code)),
        ("dtype", "torch.bfloat16"),
        ("max_seq_len", str(eff["max_model_len"])),
        ("download_dir", "None"),
        ("load_format", "auto"),
        ("tensor_parallel_size", str(a.tp)),
        ("pipeline_parallel_size", str(a.pp)),
        ("data_parallel_size", str(a.dp)),
        ("disable_custom_all_reduce", "False"),
        ("quantization", str(eff.get("quantization"))),
        ("enforce_eager", str(not a.cuda_graph)),
        ("kv_cache_dtype", a.kv_cache_dtype or "auto"),
        ("device_config", "cuda"),
        ("seed", str(a.seed)),
        ("served_model_name", a.served_model_name),
        ("enable_prefix_caching", str(a.prefix_caching)),
        ("chunked_prefill_enabled", "True"),
        ("pooler_config", "None"),
    ]
    return ", ".join(f"{k}={v}" for k, v in fields)


# -- log formatting ---------------------------------------------------------------------------------


class Logger:
    """Prints lines in the engine's format to its stream (vLLM: stdout, SGLang: stderr)."""

    def __init__(self, personality: str | Personality, tp: int, stream: Any = None) -> None:
        self.p = get_personality(personality) if isinstance(personality, str) else personality
        self.tp = tp
        self.stream = stream or (sys.stdout if self.p.log.stream == "stdout" else sys.stderr)
        self.pid = os.getpid()
        self.engine_pid = self.pid + 1

    @staticmethod
    def vdate() -> str:
        """vLLM's timestamp ({date} in faults.toml)."""
        return time.strftime("%m-%d %H:%M:%S")

    @staticmethod
    def sdate() -> str:
        """SGLang's timestamp ({sdate} in faults.toml)."""
        return time.strftime("%Y-%m-%d %H:%M:%S")

    def lines(self, who: str, text: str, level: str = "INFO", src: str | None = None) -> list[str]:
        return self.p.log.format(
            who, text, level=level, src=src, pid=self.pid, engine_pid=self.engine_pid, tp=self.tp
        )

    def emit(self, who: str, text: str, level: str = "INFO", src: str | None = None) -> None:
        self.stream.write("\n".join(self.lines(who, text, level, src)) + "\n")
        self.stream.flush()

    def raw(self, lines: list[str], stream: Any = None) -> None:
        out = stream or sys.stderr
        out.write("\n".join(lines) + "\n")
        out.flush()


# -- /metrics ---------------------------------------------------------------------------------------


def render_metrics(personality: str | Personality, model: str, s: dict[str, float]) -> bytes:
    """Prometheus text with the engine's metric names; `s` holds the scheduler's numbers."""
    m = (get_personality(personality) if isinstance(personality, str) else personality).metrics
    lbl = "{" + m.labels.format(model=model) + "}"
    lines: list[str] = []
    for row in m.rows:
        lines += [f"# HELP {row.name} {row.help}", f"# TYPE {row.name} {row.type}"]
        if row.type == "histogram":
            n = float(s[f"{row.value}_count"])
            le = "{" + m.labels.format(model=model) + ',le="+Inf"}'
            lines += [
                f"{row.name}_bucket{le} {n}",
                f"{row.name}_sum{lbl} {float(s[f'{row.value}_sum'])}",
                f"{row.name}_count{lbl} {n}",
            ]
            continue
        v = s[row.value] if isinstance(row.value, str) else row.value
        lines.append(f"{row.name}{lbl} {float(v)}")
    if m.success is not None:
        sc = m.success
        lines += [f"# HELP {sc.name} {sc.help}", f"# TYPE {sc.name} counter"]
        for reason in ("stop", "length", "abort"):
            labels = sc.labels.format(reason=reason, model=model)
            lines.append(f"{sc.name}{{{labels}}} {float(s['success_' + reason])}")
    return ("\n".join(lines) + "\n").encode()

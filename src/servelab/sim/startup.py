"""The simulated engine's start-up, and the lines it prints when it fails.

`run_startup` prints the personality's start-up log (personalities.toml `lines`) phase by phase, each
phase taking its (model) time divided by --speed, and acts on the markers (@bind, @listen, @engine,
@weights, @warnings, @ready): binding the port, injecting start-up faults, filling simulated GPU memory.
`crash` prints a fault signature (faults.toml) and returns the exit code; `engine_dead_lines` is what
the engine core prints when it dies after start-up.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from servelab.jsontypes import JsonObject
from servelab.model.architecture import catalog_names
from servelab.model.memory import GB
from servelab.sim.engine_args import sglang_server_args, vllm_engine_config
from servelab.sim.personalities import fault_signatures
from servelab.sim.render import Logger
from servelab.sim.state import SimState

GIB = 1024**3
MIB = 1024 * 1024
GRAPH_BYTES = 0.57 * GB  # what CUDA-graph capture adds per GPU

# Architecture classes by model_type, for a config without `architectures` (old or hand-written ones).
ARCH_CLASSES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "llama": "LlamaForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "glm_moe_dsa": "GlmMoeDsaForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "minimax_m2": "MiniMaxM2ForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
}


def arch_class_for_type(model_type: str) -> str:
    """The fallback: a known class for the model_type, else transformers' naming convention."""
    return ARCH_CLASSES.get(
        model_type, "".join(p.capitalize() for p in model_type.split("_")) + "ForCausalLM"
    )


def hf_config(model: str) -> JsonObject | None:
    """The HF config.json of a model as `servelab.model.architecture.load_model` finds it (a catalog
    name, or a path to a config.json or to a directory holding one); None when there is none."""
    path = Path(model).expanduser()
    if not path.exists():
        by_lower = {n.lower(): n for n in catalog_names()}
        key = model.split("/")[-1].lower().removeprefix("meta-")
        if key not in by_lower:
            return None
        from importlib import resources

        text = resources.files("servelab.data").joinpath(f"model_configs/{by_lower[key]}.json").read_text()
    else:
        if path.is_dir():
            path = path / "config.json"
        try:
            text = path.read_text()
        except OSError:
            return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def architecture_class(config: Mapping[str, object] | None, model_type: str) -> str:
    """The model's class as the engine resolves it: the config's own `architectures[0]`, else a
    mapping from model_type."""
    archs = (config or {}).get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str) and archs[0]:
        return archs[0]
    return arch_class_for_type(model_type)


@functools.cache
def _filled_at_start(path: Path) -> bool:
    """Whether the compile cache held anything when this server started (asked once: it fills it)."""
    return path.is_dir() and any(path.iterdir())


def compile_cache(srv: SimState) -> Path | None:
    """The personality's compile cache directory where its variable names one (else it keeps none)."""
    cc = srv.persona.compile_cache
    root = os.environ.get(cc.env) if cc.env else None
    return Path(root) / cc.subdir if root else None


def compile_warm(srv: SimState) -> bool:
    path = compile_cache(srv)
    return path is not None and _filled_at_start(path)


def delays(srv: SimState) -> dict[str, float]:
    """Each start-up phase's duration in model seconds (the `delay` column of the log lines)."""
    s, a, p = srv.cfg.setup, srv.cfg.engine, srv.persona
    load = 4.0 + srv.mem.weights / GB / 2.5  # per-GPU shard from local NVMe, ~2.5 GB/s
    graph = 12.0 if a.cuda_graph else 0.0
    if "slow_start" in srv.cfg.faults:
        graph += float(srv.cfg.faults["slow_start"].arg or 0)
    return {
        "0": 0.0,
        "engine": 2.0 + 0.5 * (s.layout.tp * s.layout.pp - 1),
        "load": load,
        "compile": p.compile_time(a.cuda_graph) * (p.compile_cache.load_share if compile_warm(srv) else 1.0),
        "kv": 2.0,
        "graph": graph,
        "warmup": 1.5,
    }


def context(srv: SimState) -> dict[str, object]:
    """The values the start-up lines' placeholders take (each line is `str.format`ted with them)."""
    cfg, s, a, eff, mem = srv.cfg, srv.cfg.setup, srv.cfg.engine, srv.eff, srv.mem
    weights_gb = mem.weights / GB
    kv_gb = max(mem.kv_cache, 0) / GB
    total_gb = s.host.gpu.memory_gb
    maxc = srv.kv_tokens / eff.max_model_len if eff.max_model_len else 0
    if s.arch.kv_elems_per_token and s.arch.num_kv_heads and s.arch.attention_kind != "mla":
        kv_sizes = f"K size: {kv_gb / 2:.2f} GB, V size: {kv_gb / 2:.2f} GB"
    else:
        kv_sizes = f"KV size: {kv_gb:.2f} GB"
    d = delays(srv)
    return {
        "version": srv.persona.version,
        "non_default": repr(dict(a.non_default)),
        "architecture": architecture_class(hf_config(cfg.model_name or a.model), s.arch.model_type),
        "max_model_len": eff.max_model_len,
        "max_model_len_fmt": f"{eff.max_model_len:,}",
        "max_batched_tokens": eff.max_batched_tokens,
        "max_running": eff.max_running,
        "engine_config": vllm_engine_config(a, eff),
        "server_args": sglang_server_args(a, eff),
        "world": s.layout.tp * s.layout.pp * s.layout.dp,
        "model": a.model,
        "load_s": d["load"],
        "load_s2": d["load"] + 0.4,
        "weights_gib": mem.weights / GIB,
        "weights_gb": weights_gb,
        "compile_s": d["compile"],
        "kv_gib": max(mem.kv_cache, 0) / GIB,
        "kv_tokens": srv.kv_tokens,
        "kv_tokens_fmt": f"{srv.kv_tokens:,}",
        "max_conc": maxc,
        "graph_s": d["graph"],
        "graph_gib": 0.53,
        "graph_gb": 0.57,
        "init_s": d["compile"] + d["kv"] + d["graph"] + 3.0,
        "host": cfg.host,
        "port": cfg.port,
        "pid": os.getpid(),
        "avail_gb": total_gb * 0.985,
        "avail_after_gb": total_gb * 0.985 - weights_gb,
        "avail_pool_gb": total_gb * 0.985 - weights_gb - kv_gb,
        "avail_final_gb": total_gb * 0.985 - weights_gb - kv_gb - 0.57,
        "kv_sizes": kv_sizes,
    }


def fault_lines(personality: str, name: str) -> list[str]:
    """A fault signature's lines: the personality's own (`<name>_lines`) when given."""
    return fault_signatures()[name].lines_for(personality)


def crash(srv: SimState, name: str, **extra: object) -> int:
    """Print a start-up crash's signature (faults.toml) to stderr, `extra` filling placeholders of its
    own; returns its exit code."""
    sig = fault_signatures()[name]
    gpu = srv.cfg.setup.host.gpu
    values = {
        "pid": os.getpid(),
        "port": srv.cfg.port,
        "host": srv.cfg.host,
        "rank": 0,
        "tp": srv.cfg.setup.layout.tp,
        "gpu": gpu.name,
        "gib": max(srv.mem.weights / GIB, 1.0),
        "total_gib": gpu.memory_gb * GB / GIB,
        "free_gib": 0.31,
        "date": f"{Logger.vdate()}",
        "sdate": Logger.sdate(),
        **extra,
    }
    srv.log.raw([ln.format(**values) for ln in fault_lines(srv.persona.name, name)])
    return sig.exit


def kv_too_small(srv: SimState) -> int | None:
    """Fault kv_cache_too_small: vLLM's refusal to start when one request of max_model_len does not fit
    the KV cache (of the fault's N tokens, else what memory leaves), with its figures; None when it fits
    or the personality serves on (no lines)."""
    if not fault_lines(srv.persona.name, "kv_cache_too_small"):
        return None
    mem, asked = srv.mem, int(srv.eff.max_model_len or 0)
    arg = srv.cfg.faults["kv_cache_too_small"].arg
    tokens = int(arg) if arg else int(mem.kv_cache_tokens)
    if tokens <= 0 or asked <= tokens:
        return None
    per_token = max(mem.kv_cache, 0) / GIB / max(mem.kv_cache_tokens, 1)  # GiB a token's KV takes
    fits = tokens // 16 * 16  # whole blocks of 16 tokens
    return crash(
        srv,
        "kv_cache_too_small",
        max_model_len=asked,
        need_gib=per_token * asked,
        have_gib=per_token * tokens,
        fits=fits,
    )


def engine_dead_lines(srv: SimState) -> list[str]:
    """What the engine core prints when it dies after start-up (fault die_after_ready)."""
    prefix = srv.persona.engine_dead.prefix.format(engine_pid=srv.log.engine_pid, pid=srv.log.pid)
    date, sdate = Logger.vdate(), Logger.sdate()
    return [prefix + ln.format(date=date, sdate=sdate) for ln in fault_lines(srv.persona.name, "engine_dead")]


def spawn_orphan(srv: SimState) -> None:
    """Fault "orphan": a child process named like the engine core, in its own session."""
    procs = srv.persona.processes
    code = "import time\nwhile True:\n    time.sleep(3600)\n"
    srv.orphan = subprocess.Popen(
        [sys.executable, "-c", code, procs.engine_core],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    srv.log.emit(
        procs.engine_core_role, f"Started engine core process {procs.engine_core} pid={srv.orphan.pid}"
    )


def set_memory(srv: SimState, per_gpu_bytes: float) -> None:
    """Simulated memory in use on each GPU the layout uses (the others stay empty)."""
    layout = srv.cfg.setup.layout
    used = layout.tp * layout.pp * layout.dp
    cap = srv.cfg.setup.host.gpu.memory_gb * GB
    for i in range(len(srv.gpu_mem_mib)):
        srv.gpu_mem_mib[i] = min(per_gpu_bytes, cap) / MIB if i < used else 0.0


def _compile_line(srv: SimState, who: str, ctx: Mapping[str, object]) -> None:
    """The compile cache's line: graphs loaded back (warm) or compiled and stored (cold)."""
    path = compile_cache(srv)
    if path is None or not ctx["compile_s"]:
        return
    cc = srv.persona.compile_cache
    if compile_warm(srv):
        srv.log.emit(who, cc.warm_line.format(**ctx))
        return
    srv.log.emit(who, cc.cold_line.format(**ctx))
    path.mkdir(parents=True, exist_ok=True)
    (path / "cache_key").write_text(f"{srv.cfg.engine.model}\n")


async def _sleep_model(srv: SimState, seconds: float) -> None:
    if seconds > 0 and not srv.cfg.fast_start:
        await asyncio.sleep(seconds / srv.cfg.speed)


async def run_startup(srv: SimState) -> int:
    """Print the engine's start-up, phase by phase; returns non-zero when start-up crashes."""
    cfg, faults, mem, p = srv.cfg, srv.cfg.faults, srv.mem, srv.persona
    if "cuda_init" in faults:
        return crash(srv, "cuda_init")
    ctx = context(srv)
    phase = delays(srv)
    has_listen = any(line.text == "@listen" for line in p.lines)
    extra = float(faults["slow_start"].arg or 0) if "slow_start" in faults else 0.0
    for who, key, text in p.lines:
        await _sleep_model(srv, phase.get(key, 0.0))
        if key == "graph" and extra > 0 and cfg.fast_start:
            await asyncio.sleep(extra / cfg.speed)  # an injected fault outlives --fast-start
        if key == "kv":
            set_memory(srv, mem.weights + mem.activations + max(mem.kv_cache, 0))
        elif key == "graph":
            set_memory(srv, mem.weights + mem.activations + max(mem.kv_cache, 0) + GRAPH_BYTES)
        if text == "@bind":
            if "port_in_use" in faults:
                return crash(srv, "port_in_use")
            try:
                srv.reserve()
                if not has_listen:
                    await srv.listen()
            except OSError:
                return crash(srv, "port_in_use")
            ctx["port"] = cfg.port
            if cfg.engine.port != cfg.port:  # `--port 0`: the logs name the port it bound, as served
                cfg.engine.port, cfg.engine.host = cfg.port, cfg.host
                cfg.engine.non_default["port"] = cfg.port
                ctx["server_args"] = sglang_server_args(cfg.engine, srv.eff)
                ctx["non_default"] = repr(dict(cfg.engine.non_default))
            continue
        if text == "@listen":
            await srv.listen()
            continue
        if text == "@engine":
            for name in ("worker_init", "nccl_shm"):
                if name in faults:
                    return crash(srv, name)
            if "orphan" in faults:
                spawn_orphan(srv)
            continue
        if text == "@weights":
            set_memory(srv, mem.weights + 0.5 * GB)
            if "oom_init" in faults or mem.kv_cache <= 0 or mem.kv_cache_tokens <= 0:
                return crash(srv, "oom_init")
            if "kv_cache_too_small" in faults and (code := kv_too_small(srv)) is not None:
                return code
            if (
                cfg.setup.host.gpu.sm in p.nsa_radix_crash_sm
                and cfg.setup.arch.index_topk
                and cfg.engine.prefix_caching
            ):
                return crash(srv, "nsa_radix")
            continue
        if text == "@warnings":
            for w in cfg.engine_warnings:
                srv.log.emit(who, w, level="WARNING")
            continue
        if text == "@compile":
            _compile_line(srv, who, ctx)
            continue
        if text == "@ready":
            srv.ready = True
            continue
        srv.log.emit(who, text.format(**ctx))
    return 0

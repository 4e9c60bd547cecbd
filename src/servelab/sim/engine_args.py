"""The engines' command lines as the simulator reads them, and the effective configuration it echoes back.

Each flag dialect is the engine's own argparse (unknown flags: usage and exit 2), its flags spelled once
on the engine's side (`engines.vllm.SPELLING`, `engines.sglang.SPELLING`: the adapters write and read the
same spellings), with the engine's own fixes applied on parsing (SGLang's MoE backend on SM120).
`sglang_server_args` and `vllm_engine_config` write the effective configuration in each engine's syntax,
for the start-up log servelab's parsers read.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from servelab.engines import sglang, vllm
from servelab.engines.flags import Spellings
from servelab.jsontypes import JsonObject


@dataclass(frozen=True)
class SimEffective:
    """The settings the simulated engine runs with, its defaults filled in (`server.effective`): what its
    start-up log, its info routes and its scheduler read."""

    max_running: int
    max_batched_tokens: int
    mem_fraction: float
    max_model_len: int
    quantization: str | None
    attention_backend: str

    def as_json(self) -> JsonObject:
        """The settings as GET /servelab/state shows them (these keys, in this order)."""
        return {
            "max_running": self.max_running,
            "max_batched_tokens": self.max_batched_tokens,
            "mem_fraction": self.mem_fraction,
            "max_model_len": self.max_model_len,
            "quantization": self.quantization,
            "attention_backend": self.attention_backend,
        }


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
    api_key: str | None = None  # --api-key: what /v1/* demands (else the environment's, cli.sim)
    non_default: JsonObject = field(default_factory=dict)  # repr'd into the start-up log
    raw: JsonObject = field(default_factory=dict)  # every flag's value, echoed by /get_server_info


def _adder(p: argparse.ArgumentParser, spelling: Spellings) -> Callable[..., None]:
    """`add(dest, **argparse options)`: the flag under every name the engine spells it with."""

    def add(dest: str, **kw: Any) -> None:
        p.add_argument(*spelling[dest].names, dest=dest, **kw)

    return add


def vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve", usage="vllm serve [model_tag] [options]", add_help=True)
    p.add_argument("model_tag", nargs="?", default=None)
    add = _adder(p, vllm.SPELLING)
    add("model", default=None)
    add("served_model_name", nargs="+", default=None)
    add("tensor_parallel_size", type=int, default=1)
    add("pipeline_parallel_size", type=int, default=1)
    add("data_parallel_size", type=int, default=1)
    add("enable_expert_parallel", action="store_true", default=False)
    add("quantization", default=None)
    add("kv_cache_dtype", default="auto")
    add("gpu_memory_utilization", type=float, default=0.9)
    add("max_num_seqs", type=int, default=None)
    add("max_num_batched_tokens", type=int, default=None)
    add("max_model_len", type=int, default=None)
    add("enable_prefix_caching", action=argparse.BooleanOptionalAction, default=None)
    add("enable_chunked_prefill", action=argparse.BooleanOptionalAction, default=None)
    add("enforce_eager", action="store_true", default=False)
    add("compilation_config", default=None)
    add("trust_remote_code", action="store_true", default=False)
    add("dtype", default="auto")
    add("host", default=None)
    add("port", type=int, default=8000)
    add("seed", type=int, default=0)
    add("tokenizer", default=None)
    add("block_size", type=int, default=None)
    add("swap_space", type=float, default=4)
    add("disable_log_requests", action="store_true", default=False)
    add("disable_log_stats", action="store_true", default=False)
    add("enable_log_requests", action="store_true", default=False)
    add("speculative_config", default=None)
    add("load_format", default="auto")
    add("distributed_executor_backend", default=None)
    add("api_key", default=None)
    add("uvicorn_log_level", default="info")
    return p


VLLM_DEFAULTS = {a.dest: a.default for a in vllm_parser()._actions if a.dest != "help"}


def sglang_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch_server.py")
    add = _adder(p, sglang.SPELLING)
    add("model_path", required=True)
    add("served_model_name", default=None)
    add("tokenizer_path", default=None)
    add("tp_size", type=int, default=1)
    add("pp_size", type=int, default=1)
    add("dp_size", type=int, default=1)
    add("ep_size", type=int, default=1)
    add("enable_dp_attention", action="store_true", default=False)
    add("quantization", default=None)
    add("kv_cache_dtype", default="auto")
    add("mem_fraction_static", type=float, default=None)
    add("max_running_requests", type=int, default=None)
    add("chunked_prefill_size", type=int, default=None)
    add("max_prefill_tokens", type=int, default=16384)
    add("context_length", type=int, default=None)
    add(
        "moe_runner_backend",
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
    add("attention_backend", default=None)
    add("disable_radix_cache", action="store_true", default=False)
    add("enable_flashinfer_allreduce_fusion", action="store_true", default=False)
    add("disable_cuda_graph", action="store_true", default=False)
    add("cuda_graph_max_bs", type=int, default=None)
    add("trust_remote_code", action="store_true", default=False)
    add("host", default="127.0.0.1")
    add("port", type=int, default=30000)
    add("random_seed", type=int, default=None)
    add("log_level", default="info")
    add("enable_metrics", action="store_true", default=False)
    add("tool_call_parser", default=None)
    add("reasoning_parser", default=None)
    add("speculative_algorithm", default=None)
    add("speculative_num_steps", type=int, default=None)
    add("speculative_eagle_topk", type=int, default=None)
    add("speculative_num_draft_tokens", type=int, default=None)
    add("api_key", default=None)
    return p


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
        api_key=ns.api_key,
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
        api_key=ns.api_key,
    )
    return args, warnings


def vllm_default_argv(
    model: str, tp: int | None, pp: int | None, ep: int | None, dp: int | None, quant: str | None
) -> list[str]:
    w = vllm.SPELLING.written
    out = [w("model"), model]
    if tp:
        out += [w("tensor_parallel_size"), str(tp)]
    if pp:
        out += [w("pipeline_parallel_size"), str(pp)]
    if dp:
        out += [w("data_parallel_size"), str(dp)]
    if ep and ep > 1:
        out += [w("enable_expert_parallel")]
    if quant:
        out += [w("quantization"), quant]
    return out


def sglang_default_argv(
    model: str, tp: int | None, pp: int | None, ep: int | None, dp: int | None, quant: str | None
) -> list[str]:
    w = sglang.SPELLING.written
    out = [w("model_path"), model]
    if tp:
        out += [w("tp_size"), str(tp)]
    if pp:
        out += [w("pp_size"), str(pp)]
    if dp:
        out += [w("dp_size"), str(dp)]
    if ep:
        out += [w("ep_size"), str(ep)]
    if quant:
        out += [w("quantization"), quant]
    return out


class FlagDialect(NamedTuple):
    """How one engine spells its command line: the parser, and the argv a layout starts from."""

    parse: Callable[[str, list[str], int, bool], tuple[EngineArgs, list[str]]]
    default_argv: Callable[[str, int | None, int | None, int | None, int | None, str | None], list[str]]
    parser: Callable[[], argparse.ArgumentParser]  # the flags it takes, declared once (its FlagSchema too)


FLAG_DIALECTS: dict[str, FlagDialect] = {
    "vllm": FlagDialect(_parse_vllm_flags, vllm_default_argv, vllm_parser),
    "sglang": FlagDialect(_parse_sglang_flags, sglang_default_argv, sglang_parser),
}


# -- effective config in each engine's syntax ---------------------------------------------------


def sglang_server_args(a: EngineArgs, eff: SimEffective) -> str:
    fields: list[tuple[str, object]] = [
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
        ("mem_fraction_static", eff.mem_fraction),
        ("max_running_requests", eff.max_running),
        ("max_total_tokens", None),
        ("chunked_prefill_size", eff.max_batched_tokens),
        ("max_prefill_tokens", 16384),
        ("schedule_policy", "fcfs"),
        ("tp_size", a.tp),
        ("pp_size", a.pp),
        ("dp_size", a.dp),
        ("ep_size", a.ep),
        ("random_seed", a.seed),
        ("enable_dp_attention", a.enable_dp_attention),
        ("moe_runner_backend", a.moe_runner_backend),
        ("attention_backend", eff.attention_backend),
        ("disable_radix_cache", not a.prefix_caching),
        ("disable_cuda_graph", not a.cuda_graph),
        ("enable_flashinfer_allreduce_fusion", a.allreduce_fusion),
        ("enable_metrics", True),
    ]
    return ", ".join(f"{k}={v!r}" for k, v in fields)


def vllm_engine_config(a: EngineArgs, eff: SimEffective) -> str:
    fields = [
        ("model", repr(a.model)),
        ("speculative_config", "None"),
        ("tokenizer", repr(a.model)),
        ("skip_tokenizer_init", "False"),
        ("tokenizer_mode", "auto"),
        ("revision", "None"),
        ("trust_remote_code", str(a.trust_remote_code)),
        ("dtype", "torch.bfloat16"),
        ("max_seq_len", str(eff.max_model_len)),
        ("download_dir", "None"),
        ("load_format", "auto"),
        ("tensor_parallel_size", str(a.tp)),
        ("pipeline_parallel_size", str(a.pp)),
        ("data_parallel_size", str(a.dp)),
        ("disable_custom_all_reduce", "False"),
        ("quantization", str(eff.quantization)),
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

"""What each engine looks like from outside: its flags, its start-up log, its /metrics and info routes.

servelab's own parsers (launch, verify, `logs parse`) must work on the real engines and on the
simulator alike, so everything here follows the engines' spelling: vLLM's argparse flags and
`non-default args: {...}` dict, SGLang's `server_args=ServerArgs(...)` repr, their timestamp formats
and metric names. Log templates live in `servelab/data/sim/personalities.toml`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

PERSONALITIES = ("vllm", "sglang")


@cache
def templates() -> dict[str, Any]:
    return tomllib.loads(resources.files("servelab.data").joinpath("sim/personalities.toml").read_text())


@cache
def fault_signatures() -> dict[str, Any]:
    return tomllib.loads(resources.files("servelab.data").joinpath("sim/faults.toml").read_text())


@cache
def power_table() -> dict[str, Any]:
    return tomllib.loads(resources.files("servelab.data").joinpath("sim/gpu_power.toml").read_text())


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
    personality: str, argv: list[str], *, sm: int, is_moe: bool
) -> tuple[EngineArgs, list[str]]:
    """Parse engine flags exactly as the engine would (argparse: unknown flags → usage + exit 2).

    Returns the effective arguments and the warning lines the engine logs while fixing them up."""
    warnings: list[str] = []
    if personality == "vllm":
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
            personality="vllm",
            model=model,
            served_model_name=(ns.served_model_name or [model])[0],
            tp=ns.tensor_parallel_size,
            pp=ns.pipeline_parallel_size,
            dp=ns.data_parallel_size,
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
        personality="sglang",
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

    def __init__(self, personality: str, tp: int, stream: Any = None) -> None:
        self.personality = personality
        self.tp = tp
        tmpl = templates()[personality]
        self.stream = stream or (sys.stdout if tmpl["stream"] == "stdout" else sys.stderr)
        self.pid = os.getpid()
        self.engine_pid = self.pid + 1

    @staticmethod
    def vdate() -> str:
        return time.strftime("%m-%d %H:%M:%S")

    @staticmethod
    def sdate() -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S")

    def vllm(self, who: str, text: str, level: str = "INFO", src: str = "api_server.py:1") -> str:
        if who == "raw":
            return text
        proc = f"(APIServer pid={self.pid})" if who == "api" else f"(EngineCore_DP0 pid={self.engine_pid})"
        return f"{proc} {level} {self.vdate()} [{src}] {text}"

    def sglang(self, who: str, text: str, rank: int = 0) -> list[str]:
        if who == "raw":
            return [text]
        if who == "main":
            return [f"[{self.sdate()}] {text}"]
        ranks = range(self.tp) if who == "ranks" else (0,)
        return [f"[{self.sdate()} TP{r}] {text}" for r in ranks]

    def emit(self, who: str, text: str, level: str = "INFO", src: str | None = None) -> None:
        if self.personality == "vllm":
            key = "Starting vLLM" if text.startswith("Starting vLLM") else text.split(" ")[0]
            lines = [self.vllm(who, text, level, src or _VLLM_SRC.get(key, "api_server.py:1"))]
        else:
            lines = self.sglang(who, text)
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()

    def raw(self, lines: list[str], stream: Any = None) -> None:
        out = stream or sys.stderr
        out.write("\n".join(lines) + "\n")
        out.flush()


_VLLM_SRC = {
    "vLLM": "api_server.py:1839",
    "non-default": "utils.py:233",
    "Resolved": "model.py:547",
    "Using": "model.py:1510",
    "Chunked": "scheduler.py:205",
    "Initializing": "core.py:77",
    "rank": "parallel_state.py:1208",
    "Starting": "gpu_model_runner.py:2602",
    "Starting vLLM": "api_server.py:1912",
    "Loading": "default_loader.py:267",
    "Model": "gpu_model_runner.py:2653",
    "torch.compile": "monitor.py:34",
    "Available": "gpu_worker.py:298",
    "GPU": "kv_cache_utils.py:1087",
    "Maximum": "kv_cache_utils.py:1091",
    "Graph": "gpu_model_runner.py:3480",
    "init": "core.py:210",
    "Supported_tasks:": "api_server.py:1634",
    "Engine": "loggers.py:123",
}


# -- /metrics ---------------------------------------------------------------------------------------


def render_metrics(personality: str, model: str, s: dict[str, float]) -> bytes:
    """Prometheus text with the engine's metric names; `s` holds the scheduler's numbers."""
    if personality == "vllm":
        lbl = f'{{engine="0",model_name="{model}"}}'
        rows = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                s["running"],
            ),
            (
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                s["waiting"],
            ),
            (
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                s["kv_usage"],
            ),
            (
                "vllm:num_preemptions_total",
                "counter",
                "Cumulative number of preemption from the engine.",
                s["preemptions"],
            ),
            (
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                s["prompt_tokens"],
            ),
            (
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                s["generation_tokens"],
            ),
        ]
        lines: list[str] = []
        for name, kind, help_, v in rows:
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{lbl} {float(v)}"]
        lines += [
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
        ]
        for reason in ("stop", "length", "abort"):
            lines.append(
                f'vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name="{model}"}} '
                f"{float(s['success_' + reason])}"
            )
        return ("\n".join(lines) + "\n").encode()
    lbl = f'{{model_name="{model}"}}'
    rows = [
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", s["running"]),
        ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", s["waiting"]),
        ("sglang:token_usage", "gauge", "The token usage.", s["kv_usage"]),
        ("sglang:num_used_tokens", "gauge", "The number of used tokens.", s["kv_tokens_used"]),
        ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", s["gen_throughput"]),
        ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", 0.0),
        ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", s["prompt_tokens"]),
        (
            "sglang:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            s["generation_tokens"],
        ),
        ("sglang:num_requests_total", "counter", "Number of requests processed.", s["finished"]),
        ("sglang:num_retracted_reqs", "gauge", "The number of retracted requests.", s["preemptions"]),
    ]
    lines = []
    for name, kind, help_, v in rows:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{lbl} {float(v)}"]
    return ("\n".join(lines) + "\n").encode()

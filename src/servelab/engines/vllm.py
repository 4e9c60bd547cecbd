"""vLLM: `PYTHON -m vllm.entrypoints.openai.api_server` (GPU, or the CPU build with options["cpu"]).

Readiness: the API server binds its port only once the engine is up, so a refused connection means
"still starting" and /health answers 200 from then on. Effective configuration, in increasing precedence:
`non-default args: {...}` (what the user changed), the engine's `with config: ...` dump, backend-selection
lines (`Using FLASHINFER backend.`, `Using TRITON Fp8 MoE backend out of potential backends: [...]`) and
runtime lines (`GPU KV cache size: N tokens`, `Starting vLLM server on http://...:PORT`), then /version.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import Field

from servelab.engines import logparse as lp
from servelab.engines.base import EffectiveConfig, EngineCapabilities, LaunchSpec, Readiness, Settings
from servelab.engines.flags import Flag, Spellings, opt, python_for, scan, spelled, table, typed_requested
from servelab.engines.flagschema import FlagSource
from servelab.engines.options import EngineOptions
from servelab.errors import ConfigError
from servelab.jsontypes import JsonObject

# vLLM's flags, spelled once: this adapter writes and reads them, the simulator's vLLM personality parses
# them (sim/engine_args.py). In vLLM's argparse order; `--attention-backend` and `--moe-backend` are read
# here only (the simulator does not take them).
SPELLING = Spellings(
    {
        "model": spelled("--model"),
        "served_model_name": spelled("--served-model-name"),
        "tensor_parallel_size": spelled("--tensor-parallel-size", "-tp"),
        "pipeline_parallel_size": spelled("--pipeline-parallel-size", "-pp"),
        "data_parallel_size": spelled("--data-parallel-size", "-dp"),
        "enable_expert_parallel": spelled("--enable-expert-parallel", "-ep"),
        "quantization": spelled("--quantization", "-q"),
        "kv_cache_dtype": spelled("--kv-cache-dtype"),
        "gpu_memory_utilization": spelled("--gpu-memory-utilization"),
        "max_num_seqs": spelled("--max-num-seqs"),
        "max_num_batched_tokens": spelled("--max-num-batched-tokens"),
        "max_model_len": spelled("--max-model-len"),
        "enable_prefix_caching": spelled("--enable-prefix-caching"),
        "enable_chunked_prefill": spelled("--enable-chunked-prefill"),
        "enforce_eager": spelled("--enforce-eager"),
        "compilation_config": spelled("--compilation-config", "-O"),
        "trust_remote_code": spelled("--trust-remote-code"),
        "dtype": spelled("--dtype"),
        "host": spelled("--host"),
        "port": spelled("--port"),
        "seed": spelled("--seed"),
        "tokenizer": spelled("--tokenizer"),
        "block_size": spelled("--block-size"),
        "swap_space": spelled("--swap-space"),
        "disable_log_requests": spelled("--disable-log-requests"),
        "disable_log_stats": spelled("--disable-log-stats"),
        "enable_log_requests": spelled("--enable-log-requests"),
        "speculative_config": spelled("--speculative-config"),
        "load_format": spelled("--load-format"),
        "distributed_executor_backend": spelled("--distributed-executor-backend"),
        "api_key": spelled("--api-key"),
        "uvicorn_log_level": spelled("--uvicorn-log-level"),
        "attention_backend": spelled("--attention-backend"),
        "moe_backend": spelled("--moe-backend"),
    }
)
_S = SPELLING
FLAGS = table(
    [
        (_S["model"].names, Flag("model")),
        (_S["served_model_name"].names, Flag("served_model_name")),
        (_S["port"].names, Flag("port", "int")),
        (_S["tensor_parallel_size"].names, Flag("tp_size", "int")),
        (_S["pipeline_parallel_size"].names, Flag("pp_size", "int")),
        (_S["data_parallel_size"].names, Flag("dp_size", "int")),
        (_S["enable_expert_parallel"].names, Flag("_expert_parallel", "true")),
        ((_S["enable_expert_parallel"].off,), Flag("_expert_parallel", "false")),
        (_S["quantization"].names, Flag("quantization")),
        (_S["kv_cache_dtype"].names, Flag("kv_cache_dtype")),
        (_S["max_num_seqs"].names, Flag("max_running_requests", "int")),
        (_S["max_num_batched_tokens"].names, Flag("max_num_batched_tokens", "int")),
        (_S["max_model_len"].names, Flag("max_model_len", "int")),
        (_S["gpu_memory_utilization"].names, Flag("mem_fraction", "float")),
        (_S["enable_prefix_caching"].names, Flag("disable_radix_cache", "true", False)),
        ((_S["enable_prefix_caching"].off,), Flag("disable_radix_cache", "true", True)),
        (_S["enforce_eager"].names, Flag("cuda_graph", "true", False)),
        ((_S["enforce_eager"].off,), Flag("cuda_graph", "true", True)),
        (_S["attention_backend"].names, Flag("attention_backend")),
        (_S["moe_backend"].names, Flag("moe_runner_backend")),
        (_S["dtype"].names, Flag("dtype")),
        (_S["compilation_config"].names, Flag("_compilation_config", "json")),
    ]
)

# Keys of `non-default args` / the engine config dump -> normalized keys.
_ARG_KEYS = {
    "model": "model",
    "model_tag": "model",
    "served_model_name": "served_model_name",
    "port": "port",
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "data_parallel_size": "dp_size",
    "quantization": "quantization",
    "kv_cache_dtype": "kv_cache_dtype",
    "max_num_seqs": "max_running_requests",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_model_len": "max_model_len",
    "max_seq_len": "max_model_len",
    "gpu_memory_utilization": "mem_fraction",
    "attention_backend": "attention_backend",
    "moe_backend": "moe_runner_backend",
    "dtype": "dtype",
}

_VERSION = (
    re.compile(r"vLLM API server version (\d[\w.+-]*)"),
    re.compile(r"\bversion (\d+\.\d+[\w.+-]*)\s*$"),  # the banner
    re.compile(r"Initializing a V\d LLM engine \(v(\d[\w.+-]*)\)"),
)
_ATTENTION = re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+) backend\.?\s*$")
_MOE = re.compile(r"Using '?([\w-]+)'?(?: [\w-]+)* MoE backend(?: out of potential backends|\.\s*$)")
_MOE_FLASHINFER = re.compile(r"Using (FlashInfer[\w -]*?) (?:kernels? )?for (?:MoE|\w*MoE\b)")
_KV_TOKENS = re.compile(r"\b(?:GPU|CPU|XPU|TPU|HPU) KV cache size: ([\d,]+) tokens")
_MAX_LEN = re.compile(r"Using max model len (\d+)")
_CHUNKED = re.compile(r"max_num_batched_tokens=(\d+)")
_PORT = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on https?://\S+?:(\d+)")


def _expert_parallel(tp: int, dp: int | None, ep: int | None) -> bool:
    """vLLM's EP spans TP x DP; any other EP size is impossible."""
    if ep is None or ep <= 1:
        return False
    if ep != tp * (dp or 1):
        raise ConfigError(
            f"vLLM cannot run expert parallel size {ep} with TP {tp} x DP {dp or 1}",
            hint="vLLM's --enable-expert-parallel makes EP = TP x DP; set ep to that or leave it unset",
        )
    return True


class Options(EngineOptions):
    """vLLM's options: the CPU build's switches."""

    cpu: bool = False
    kv_cache_space_gib: float | None = Field(default=None, gt=0, description="VLLM_CPU_KVCACHE_SPACE")
    cpu_bind: str | None = Field(default=None, min_length=1, description="VLLM_CPU_OMP_THREADS_BIND")


class VLLM:
    """vLLM's OpenAI-compatible API server."""

    name = "vllm"
    default_port = 8000
    startup_timeout_s = 1800.0
    readiness = Readiness(health_path="/health", port_opens_when_ready=True)
    capabilities = EngineCapabilities(metric_prefix="vllm:")
    options_model = Options
    # the engine's own parser (vllm.entrypoints...cli_args.make_arg_parser), read where it is installed
    flag_source = FlagSource("python", "vllm", sets=("--model", "--served-model-name", "--host", "--port"))

    def command(self, s: Settings) -> LaunchSpec:
        if s.tp < 1 or s.pp < 1:
            raise ConfigError(f"tp and pp must be >= 1 (got tp={s.tp}, pp={s.pp})")
        port = s.port or self.default_port
        argv = [python_for(s.options), "-m", "vllm.entrypoints.openai.api_server"]
        w = SPELLING.written
        argv += [
            w("model"),
            s.model,
            w("served_model_name"),
            s.served_name,
            w("host"),
            s.host,
            w("port"),
            str(port),
        ]
        argv += [w("tensor_parallel_size"), str(s.tp)]
        if s.pp != 1:
            argv += [w("pipeline_parallel_size"), str(s.pp)]
        argv += opt(w("data_parallel_size"), s.dp)
        if _expert_parallel(s.tp, s.dp, s.ep):
            argv.append(w("enable_expert_parallel"))
        argv += opt(w("quantization"), s.quantization)
        argv += opt(w("kv_cache_dtype"), s.kv_cache_dtype)
        argv += opt(w("max_num_seqs"), s.max_concurrency)
        argv += opt(w("gpu_memory_utilization"), s.mem_fraction)
        argv += opt(w("max_model_len"), s.max_model_len)
        argv += list(s.extra_args)
        env = dict(s.env)
        if s.options.get("cpu"):
            # vLLM-CPU reserves this many GiB for its KV cache (its default is far too big for small boxes).
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(s.options.get("kv_cache_space_gib", 1)))
            if s.options.get("cpu_bind"):
                env.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(s.options["cpu_bind"]))
        return LaunchSpec(argv=argv, env=env, host=s.host, port=port, served_model=s.served_name)

    def requested(self, s: Settings) -> JsonObject:
        req = typed_requested(s, s.served_name)
        flags = scan(s.extra_args, FLAGS)
        expert = flags.pop("_expert_parallel", None)
        compilation = flags.pop("_compilation_config", None)
        req.update(flags)
        tp, dp = req["tp_size"], req.get("dp_size", 1)
        if expert and isinstance(tp, int) and isinstance(dp, int):  # ints: the typed sizes or int flags
            req["ep_size"] = tp * dp
        if isinstance(compilation, dict):
            req.update(_compilation_keys(compilation))
        return req

    def effective_config(self, log_text: str, server_info: JsonObject | None = None) -> EffectiveConfig:
        args, chosen, runtime = EffectiveConfig(), EffectiveConfig(), EffectiveConfig()
        for line in log_text.splitlines():
            if "non-default args:" in line:
                parsed = lp.dict_after(line, "non-default args:")
                if parsed:
                    _apply_args(args, parsed, line)
            elif " args: Namespace(" in line:  # vLLM <= 0.6
                parsed = lp.call_after(line, "args: ")
                if parsed:
                    _apply_args(args, parsed, line)
            elif "with config:" in line and "LLM engine" in line:
                _apply_args(args, lp.parse_kv(line.split("with config:", 1)[1]), line)
            for rx in _VERSION:
                m = rx.search(line)
                if m:
                    runtime.set("version", m.group(1), lp.excerpt(line, m.group(0)))
                    break
            if m := _ATTENTION.search(line):
                chosen.set("attention_backend", m.group(1), line.strip())
            if m := (_MOE.search(line) or _MOE_FLASHINFER.search(line)):
                chosen.set("moe_runner_backend", m.group(1), line.strip())
            if m := _MAX_LEN.search(line):
                chosen.set("max_model_len", int(m.group(1)), line.strip())
            if "Chunked prefill is enabled" in line and (m := _CHUNKED.search(line)):
                chosen.set("max_num_batched_tokens", int(m.group(1)), line.strip())
            if m := _KV_TOKENS.search(line):
                runtime.set("kv_cache_tokens", lp.to_int(m.group(1)), line.strip())
            if m := _PORT.search(line):
                runtime.set("port", int(m.group(1)), line.strip())
        out = EffectiveConfig()
        for part in (args, chosen, runtime):
            out.merge(part)
        if server_info and server_info.get("version"):
            out.set("version", str(server_info["version"]), "GET /version")
        return lp.finish(out)

    def info_paths(self) -> tuple[str, ...]:
        return ("/version",)


def _compilation_keys(cc: Mapping[str, object]) -> JsonObject:
    """Normalized keys a compilation config decides: CUDA graphs off, all-reduce fusion on."""
    out: JsonObject = {}
    mode = cc.get("cudagraph_mode")
    if isinstance(mode, str) and mode.split(".")[-1].upper() == "NONE":
        out["cuda_graph"] = False
    pc = cc.get("pass_config")
    if isinstance(pc, dict):
        fusion = pc.get("fuse_allreduce_rms", pc.get("enable_fi_allreduce_fusion"))
        if fusion is not None:
            out["enable_allreduce_fusion"] = bool(fusion)
    return out


def _apply_args(cfg: EffectiveConfig, parsed: Mapping[str, object], line: str) -> None:
    """Map one parsed config dump (non-default args, Namespace, engine config) onto normalized keys."""
    for raw_key, key in _ARG_KEYS.items():
        if raw_key not in parsed:
            continue
        value = parsed[raw_key]
        if key == "served_model_name" and isinstance(value, list):
            value = value[0] if value else None
        if key == "dtype":
            value = lp.dtype_name(value)
        cfg.set(key, lp.json_value(value), lp.excerpt(line, f"'{raw_key}':", f"{raw_key}="))
    if "enforce_eager" in parsed:
        cfg.set("cuda_graph", not bool(parsed["enforce_eager"]), lp.excerpt(line, "enforce_eager"))
    if "enable_prefix_caching" in parsed and parsed["enable_prefix_caching"] is not None:
        cfg.set(
            "disable_radix_cache",
            not bool(parsed["enable_prefix_caching"]),
            lp.excerpt(line, "enable_prefix_caching"),
        )
    if parsed.get("enable_expert_parallel"):
        tp = parsed.get("tensor_parallel_size", 1) or 1
        dp = parsed.get("data_parallel_size", 1) or 1
        cfg.set("ep_size", _size(tp) * _size(dp), lp.excerpt(line, "enable_expert_parallel"))
    cc = parsed.get("compilation_config")
    if isinstance(cc, str):
        cc = lp.literal(cc)
    if isinstance(cc, dict):
        for key, value in _compilation_keys(cc).items():
            cfg.set(key, value, lp.excerpt(line, "cudagraph_mode" if key == "cuda_graph" else "pass_config"))
    kc = parsed.get("kernel_config")
    if isinstance(kc, dict) and "moe_backend" in kc:
        cfg.set("moe_runner_backend", lp.json_value(kc["moe_backend"]), lp.excerpt(line, "moe_backend="))


def _size(value: object) -> int:
    """A parallel size from a config dump (an int, or its text), as `int()` reads it."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"a parallel size, not {value!r}")


ENGINE = VLLM()

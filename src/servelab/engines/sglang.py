"""SGLang: `PYTHON -m sglang.launch_server`.

Readiness: the HTTP port opens early and /health answers 503 until the warm-up request has passed ("The
server is fired up and ready to roll!"), then 200. Effective configuration, in increasing precedence: the
`server_args=ServerArgs(...)` repr (old) or `server_args={...}` dict (new), auto-selection lines (`Use
flashinfer_cutlass as MoE runner backend on SM120 ...`), runtime lines (`KV Cache is allocated. #tokens: N`,
`max_total_num_tokens=..., max_running_requests=..., context_len=...`, `Uvicorn running on ...:PORT`), then
/get_server_info (or /server_info) JSON.
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

# SGLang's flags, spelled once: this adapter writes and reads them, the simulator's SGLang personality
# parses them (sim/engine_args.py). In SGLang's argparse order (which declares the long parallel sizes
# first; we write the short ones); `--dtype` is read here only (the simulator does not take it).
SPELLING = Spellings(
    {
        "model_path": spelled("--model-path", "--model"),
        "served_model_name": spelled("--served-model-name"),
        "tokenizer_path": spelled("--tokenizer-path"),
        "tp_size": spelled("--tensor-parallel-size", "--tp-size", "--tp", write=1),
        "pp_size": spelled("--pipeline-parallel-size", "--pp-size", write=1),
        "dp_size": spelled("--data-parallel-size", "--dp-size", "--dp", write=1),
        "ep_size": spelled("--expert-parallel-size", "--ep-size", "--ep", write=1),
        "enable_dp_attention": spelled("--enable-dp-attention"),
        "quantization": spelled("--quantization"),
        "kv_cache_dtype": spelled("--kv-cache-dtype"),
        "mem_fraction_static": spelled("--mem-fraction-static"),
        "max_running_requests": spelled("--max-running-requests"),
        "chunked_prefill_size": spelled("--chunked-prefill-size"),
        "max_prefill_tokens": spelled("--max-prefill-tokens"),
        "context_length": spelled("--context-length"),
        "moe_runner_backend": spelled("--moe-runner-backend"),
        "attention_backend": spelled("--attention-backend"),
        "disable_radix_cache": spelled("--disable-radix-cache"),
        "enable_flashinfer_allreduce_fusion": spelled("--enable-flashinfer-allreduce-fusion"),
        "disable_cuda_graph": spelled("--disable-cuda-graph"),
        "cuda_graph_max_bs": spelled("--cuda-graph-max-bs"),
        "trust_remote_code": spelled("--trust-remote-code"),
        "host": spelled("--host"),
        "port": spelled("--port"),
        "random_seed": spelled("--random-seed"),
        "log_level": spelled("--log-level"),
        "enable_metrics": spelled("--enable-metrics"),
        "tool_call_parser": spelled("--tool-call-parser"),
        "reasoning_parser": spelled("--reasoning-parser"),
        "speculative_algorithm": spelled("--speculative-algorithm"),
        "speculative_num_steps": spelled("--speculative-num-steps"),
        "speculative_eagle_topk": spelled("--speculative-eagle-topk"),
        "speculative_num_draft_tokens": spelled("--speculative-num-draft-tokens"),
        "api_key": spelled("--api-key"),
        "dtype": spelled("--dtype"),
    }
)
_S = SPELLING
FLAGS = table(
    [
        (_S["model_path"].names, Flag("model")),
        (_S["served_model_name"].names, Flag("served_model_name")),
        (_S["port"].names, Flag("port", "int")),
        (_S["tp_size"].names, Flag("tp_size", "int")),
        (_S["pp_size"].names, Flag("pp_size", "int")),
        (_S["dp_size"].names, Flag("dp_size", "int")),
        (_S["ep_size"].names, Flag("ep_size", "int")),
        (_S["enable_dp_attention"].names, Flag("enable_dp_attention", "true")),
        (_S["moe_runner_backend"].names, Flag("moe_runner_backend")),
        (_S["attention_backend"].names, Flag("attention_backend")),
        (_S["quantization"].names, Flag("quantization")),
        (_S["kv_cache_dtype"].names, Flag("kv_cache_dtype")),
        (_S["max_running_requests"].names, Flag("max_running_requests", "int")),
        (_S["chunked_prefill_size"].names, Flag("max_num_batched_tokens", "int")),
        (_S["context_length"].names, Flag("max_model_len", "int")),
        (_S["mem_fraction_static"].names, Flag("mem_fraction", "float")),
        (_S["disable_radix_cache"].names, Flag("disable_radix_cache", "true")),
        (_S["disable_cuda_graph"].names, Flag("cuda_graph", "true", False)),
        (_S["enable_flashinfer_allreduce_fusion"].names, Flag("enable_allreduce_fusion", "true")),
        (_S["dtype"].names, Flag("dtype")),
    ]
)

# ServerArgs fields / server_info keys -> normalized keys.
_ARG_KEYS = {
    "model_path": "model",
    "served_model_name": "served_model_name",
    "port": "port",
    "tp_size": "tp_size",
    "pp_size": "pp_size",
    "dp_size": "dp_size",
    "ep_size": "ep_size",
    "enable_dp_attention": "enable_dp_attention",
    "moe_runner_backend": "moe_runner_backend",
    "attention_backend": "attention_backend",
    "quantization": "quantization",
    "kv_cache_dtype": "kv_cache_dtype",
    "max_running_requests": "max_running_requests",
    "chunked_prefill_size": "max_num_batched_tokens",
    "context_length": "max_model_len",
    "mem_fraction_static": "mem_fraction",
    "disable_radix_cache": "disable_radix_cache",
    "enable_flashinfer_allreduce_fusion": "enable_allreduce_fusion",
    "dtype": "dtype",
}
# The scheduler's summary line after memory profiling: the values it really runs with.
_RUNTIME_KEYS = {
    "max_total_num_tokens": "kv_cache_tokens",
    "chunked_prefill_size": "max_num_batched_tokens",
    "max_running_requests": "max_running_requests",
    "context_len": "max_model_len",
}
_MOE_CHOICE = re.compile(r"\bUse (\w+) as (?:the )?MoE runner backend")
_ATTN_CHOICE = re.compile(r"\bUse (\w+) as (?:the )?attention backend")
_KV_TOKENS = re.compile(r"KV Cache is allocated\. #tokens: (\d+)")
_PORT = re.compile(r"Uvicorn running on https?://\S+?:(\d+)")


class Options(EngineOptions):
    """SGLang's options."""

    metrics: bool = Field(default=True, description="false: no --enable-metrics")


class SGLang:
    """SGLang's HTTP server (`sglang.launch_server`)."""

    name = "sglang"
    default_port = 30000
    startup_timeout_s = 1800.0
    readiness = Readiness(health_path="/health", loading_status=(503,))
    capabilities = EngineCapabilities(metric_prefix="sglang:")
    options_model = Options
    # ServerArgs.add_cli_args, read where SGLang is installed
    flag_source = FlagSource(
        "python", "sglang", sets=("--model-path", "--served-model-name", "--host", "--port")
    )

    def command(self, s: Settings) -> LaunchSpec:
        if s.tp < 1 or s.pp < 1:
            raise ConfigError(f"tp and pp must be >= 1 (got tp={s.tp}, pp={s.pp})")
        port = s.port or self.default_port
        argv = [python_for(s.options), "-m", "sglang.launch_server"]
        w = SPELLING.written
        argv += [w("model_path"), s.model, w("served_model_name"), s.served_name, w("host"), s.host]
        argv += [w("port"), str(port), w("tp_size"), str(s.tp)]
        if s.pp != 1:
            argv += [w("pp_size"), str(s.pp)]
        argv += opt(w("dp_size"), s.dp)
        argv += opt(w("ep_size"), s.ep)
        argv += opt(w("quantization"), s.quantization)
        argv += opt(w("kv_cache_dtype"), s.kv_cache_dtype)
        argv += opt(w("max_running_requests"), s.max_concurrency)
        argv += opt(w("mem_fraction_static"), s.mem_fraction)
        argv += opt(w("context_length"), s.max_model_len)
        if s.options.get("metrics", True) and w("enable_metrics") not in s.extra_args:
            argv.append(w("enable_metrics"))  # /metrics is off by default in SGLang
        argv += list(s.extra_args)
        return LaunchSpec(argv=argv, env=dict(s.env), host=s.host, port=port, served_model=s.served_name)

    def requested(self, s: Settings) -> JsonObject:
        req = typed_requested(s, s.served_name)
        req.update(scan(s.extra_args, FLAGS))
        return req

    def effective_config(self, log_text: str, server_info: JsonObject | None = None) -> EffectiveConfig:
        args, chosen, runtime = EffectiveConfig(), EffectiveConfig(), EffectiveConfig()
        for line in log_text.splitlines():
            if "server_args=" in line:
                body = line.split("server_args=", 1)[1].lstrip()
                parsed = (
                    lp.dict_after(line, "server_args=")
                    if body.startswith("{")
                    else lp.call_after(line, "server_args=")
                )
                if parsed:
                    _apply_args(args, parsed, line)
                continue
            if m := _MOE_CHOICE.search(line):
                chosen.set("moe_runner_backend", m.group(1), line.strip())
            if m := _ATTN_CHOICE.search(line):
                chosen.set("attention_backend", m.group(1), line.strip())
            if m := _KV_TOKENS.search(line):
                runtime.set("kv_cache_tokens", int(m.group(1)), line.strip())
            if "max_total_num_tokens=" in line:
                summary = lp.parse_kv(line[line.index("max_total_num_tokens=") :])
                for raw_key, key in _RUNTIME_KEYS.items():
                    if isinstance(value := summary.get(raw_key), int):
                        runtime.set(key, value, line.strip())
            if m := _PORT.search(line):
                runtime.set("port", int(m.group(1)), line.strip())
        out = EffectiveConfig()
        for part in (args, chosen, runtime):
            out.merge(part)
        if server_info:
            info = EffectiveConfig()
            _apply_args(info, server_info, "", source="GET /get_server_info")
            if isinstance(tokens := server_info.get("max_total_num_tokens"), int):
                info.set("kv_cache_tokens", tokens, "GET /get_server_info")
            if server_info.get("version"):
                info.set("version", str(server_info["version"]), "GET /get_server_info")
            out.merge(info, keep_confirmed=True)
        return lp.finish(out)

    def info_paths(self) -> tuple[str, ...]:
        return ("/get_server_info", "/server_info")


def _apply_args(
    cfg: EffectiveConfig, parsed: Mapping[str, object], line: str, source: str | None = None
) -> None:
    """Map ServerArgs fields (from the log repr or the info JSON) onto normalized keys."""

    def evidence(raw_key: str) -> str:
        return source or lp.excerpt(line, f"'{raw_key}':", f"{raw_key}=")

    for raw_key, key in _ARG_KEYS.items():
        if raw_key in parsed:
            value = parsed[raw_key]
            cfg.set(key, lp.json_value(lp.dtype_name(value) if key == "dtype" else value), evidence(raw_key))
    if "disable_cuda_graph" in parsed:
        cfg.set("cuda_graph", not bool(parsed["disable_cuda_graph"]), evidence("disable_cuda_graph"))


ENGINE = SGLang()

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
from typing import Any

from pydantic import Field

from servelab.engines import logparse as lp
from servelab.engines.base import EffectiveConfig, EngineCapabilities, LaunchSpec, Readiness, Settings
from servelab.engines.flags import Flag, opt, python_for, scan, table, typed_requested
from servelab.engines.options import EngineOptions
from servelab.errors import ConfigError

FLAGS = table(
    [
        (("--model-path", "--model"), Flag("model")),
        (("--served-model-name",), Flag("served_model_name")),
        (("--port",), Flag("port", "int")),
        (("--tp-size", "--tp", "--tensor-parallel-size"), Flag("tp_size", "int")),
        (("--pp-size", "--pipeline-parallel-size"), Flag("pp_size", "int")),
        (("--dp-size", "--dp", "--data-parallel-size"), Flag("dp_size", "int")),
        (("--ep-size", "--ep", "--expert-parallel-size"), Flag("ep_size", "int")),
        (("--enable-dp-attention",), Flag("enable_dp_attention", "true")),
        (("--moe-runner-backend",), Flag("moe_runner_backend")),
        (("--attention-backend",), Flag("attention_backend")),
        (("--quantization",), Flag("quantization")),
        (("--kv-cache-dtype",), Flag("kv_cache_dtype")),
        (("--max-running-requests",), Flag("max_running_requests", "int")),
        (("--chunked-prefill-size",), Flag("max_num_batched_tokens", "int")),
        (("--context-length",), Flag("max_model_len", "int")),
        (("--mem-fraction-static",), Flag("mem_fraction", "float")),
        (("--disable-radix-cache",), Flag("disable_radix_cache", "true")),
        (("--disable-cuda-graph",), Flag("cuda_graph", "true", False)),
        (("--enable-flashinfer-allreduce-fusion",), Flag("enable_allreduce_fusion", "true")),
        (("--dtype",), Flag("dtype")),
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

    def command(self, s: Settings) -> LaunchSpec:
        if s.tp < 1 or s.pp < 1:
            raise ConfigError(f"tp and pp must be >= 1 (got tp={s.tp}, pp={s.pp})")
        port = s.port or self.default_port
        argv = [python_for(s.options), "-m", "sglang.launch_server"]
        argv += [
            "--model-path",
            s.model,
            "--served-model-name",
            s.served_name,
            "--host",
            s.host,
            "--port",
            str(port),
        ]
        argv += ["--tp-size", str(s.tp)]
        if s.pp != 1:
            argv += ["--pp-size", str(s.pp)]
        argv += opt("--dp-size", s.dp)
        argv += opt("--ep-size", s.ep)
        argv += opt("--quantization", s.quantization)
        argv += opt("--kv-cache-dtype", s.kv_cache_dtype)
        argv += opt("--max-running-requests", s.max_concurrency)
        argv += opt("--mem-fraction-static", s.mem_fraction)
        argv += opt("--context-length", s.max_model_len)
        if s.options.get("metrics", True) and "--enable-metrics" not in s.extra_args:
            argv.append("--enable-metrics")  # /metrics is off by default in SGLang
        argv += list(s.extra_args)
        return LaunchSpec(argv=argv, env=dict(s.env), host=s.host, port=port, served_model=s.served_name)

    def requested(self, s: Settings) -> dict[str, Any]:
        req = typed_requested(s, s.served_name)
        req.update(scan(s.extra_args, FLAGS))
        return req

    def effective_config(self, log_text: str, server_info: dict[str, Any] | None = None) -> EffectiveConfig:
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
                    if isinstance(summary.get(raw_key), int):
                        runtime.set(key, summary[raw_key], line.strip())
            if m := _PORT.search(line):
                runtime.set("port", int(m.group(1)), line.strip())
        out = EffectiveConfig()
        for part in (args, chosen, runtime):
            out.merge(part)
        if server_info:
            info = EffectiveConfig()
            _apply_args(info, server_info, "", source="GET /get_server_info")
            if isinstance(server_info.get("max_total_num_tokens"), int):
                info.set("kv_cache_tokens", server_info["max_total_num_tokens"], "GET /get_server_info")
            if server_info.get("version"):
                info.set("version", str(server_info["version"]), "GET /get_server_info")
            out.merge(info, keep_confirmed=True)
        return lp.finish(out)

    def info_paths(self) -> tuple[str, ...]:
        return ("/get_server_info", "/server_info")


def _apply_args(cfg: EffectiveConfig, parsed: dict[str, Any], line: str, source: str | None = None) -> None:
    """Map ServerArgs fields (from the log repr or the info JSON) onto normalized keys."""

    def evidence(raw_key: str) -> str:
        return source or lp.excerpt(line, f"'{raw_key}':", f"{raw_key}=")

    for raw_key, key in _ARG_KEYS.items():
        if raw_key in parsed:
            value = parsed[raw_key]
            cfg.set(key, lp.dtype_name(value) if key == "dtype" else value, evidence(raw_key))
    if "disable_cuda_graph" in parsed:
        cfg.set("cuda_graph", not bool(parsed["disable_cuda_graph"]), evidence("disable_cuda_graph"))


ENGINE = SGLang()

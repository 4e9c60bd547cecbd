"""llama.cpp's `llama-server` (a GGUF file; options["binary"] names the executable).

Readiness: the HTTP port opens before the model is loaded and /health answers 503 ("Loading model") until
it is, then 200. `max_model_len` becomes the total context (`-c`), shared by the `--parallel` slots
(`max_concurrency`). Effective configuration from the start-up log: the model path (`load_model: loading
model '...'` or the loader's `from PATH`), `llama_context: n_ctx = N`, the per-slot context, `offloaded N/M
layers to GPU`, the slot count, the KV cache type, the build and the listening port.
"""

from __future__ import annotations

import re

from pydantic import Field

from servelab.engines import logparse as lp
from servelab.engines.base import EffectiveConfig, EngineCapabilities, LaunchSpec, Readiness, Settings
from servelab.engines.flags import Flag, int_option, opt, scan, table
from servelab.engines.flagschema import FlagSource
from servelab.engines.options import EngineOptions
from servelab.errors import ConfigError
from servelab.jsontypes import JsonObject

FLAGS = table(
    [
        (("-m", "--model"), Flag("model")),
        (("-a", "--alias"), Flag("served_model_name")),
        (("--port",), Flag("port", "int")),
        (("-c", "--ctx-size"), Flag("n_ctx", "int")),
        (("-ngl", "--gpu-layers", "--n-gpu-layers"), Flag("n_gpu_layers", "int")),
        (("-np", "--parallel"), Flag("max_running_requests", "int")),
        (("-ctk", "--cache-type-k"), Flag("kv_cache_dtype")),
        (("-b", "--batch-size"), Flag("max_num_batched_tokens", "int")),
        (("-fa", "--flash-attn"), Flag("flash_attn")),
    ]
)

_MODEL = (
    re.compile(r"load_model: loading model '([^']+)'"),
    re.compile(r"llama_model_loader: loaded meta data with .* from (\S+)"),
)
_N_CTX = re.compile(r"\bllama(?:_new)?_context(?:_with_model)?: n_ctx\s*=\s*(\d+)")
_PER_SEQ = (
    re.compile(r"\bn_ctx_per_seq\s*=\s*(\d+)"),
    re.compile(r"new slot,? n_ctx(?:_slot)?\s*=\s*(\d+)"),
    re.compile(r"n_ctx_seq \((\d+)\)"),
)
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_SLOTS = re.compile(
    r"(?:initializing slots, n_slots|n_parallel is set to auto, using n_parallel)\s*=\s*(\d+)"
)
_KV_TYPE = re.compile(r"\bK \((\w+)\):")
_BUILD = re.compile(r"\bbuild(?::| =)? ?(\d+) \((\w+)\)")
_PORT = re.compile(
    r"(?:server is listening on|HTTP server is listening,.*?port:?) ?(?:https?://\S+?:)?(\d+)\b"
)


class Options(EngineOptions):
    """llama-server's options."""

    binary: str = Field(default="llama-server", min_length=1, description="the executable")
    n_gpu_layers: int | None = Field(default=None, ge=-1, description="--n-gpu-layers (-1: all)")
    cpu: bool = False


class LlamaCpp:
    """llama.cpp's OpenAI-compatible `llama-server`."""

    name = "llamacpp"
    default_port = 8080
    startup_timeout_s = 900.0
    readiness = Readiness(health_path="/health", loading_status=(503,))
    capabilities = EngineCapabilities(
        ignore_eos=True, min_tokens=False, stream_usage=False, metric_prefix="llamacpp:"
    )
    options_model = Options
    flag_source = FlagSource("help", sets=("--model", "--alias", "--host", "--port"))  # `llama-server --help`

    def command(self, s: Settings) -> LaunchSpec:
        if s.tp != 1 or s.pp != 1 or (s.dp or 1) != 1 or (s.ep or 1) != 1:
            raise ConfigError(
                "llama-server has no tensor/pipeline/data/expert parallel sizes",
                hint="it spreads layers over all visible GPUs itself; choose how with --split-mode in extra_args",
            )
        if s.quantization is not None or s.mem_fraction is not None:
            raise ConfigError(
                "llama-server takes its quantization from the GGUF file and has no memory fraction",
                hint="pick a GGUF file of the wanted quantization; leave quantization and mem_fraction unset",
            )
        port = s.port or self.default_port
        argv = [str(s.options.get("binary", "llama-server")), "-m", s.model]
        argv += opt("--alias", s.served_model_name)
        argv += ["--host", s.host, "--port", str(port)]
        argv += ["--n-gpu-layers", str(s.options.get("n_gpu_layers", 0 if s.options.get("cpu") else 999))]
        argv += opt("--ctx-size", s.max_model_len)
        argv += opt("--parallel", s.max_concurrency)
        if s.kv_cache_dtype:
            argv += ["--cache-type-k", s.kv_cache_dtype, "--cache-type-v", s.kv_cache_dtype]
        if "--metrics" not in s.extra_args:
            argv.append("--metrics")  # /metrics is off by default
        argv += list(s.extra_args)
        return LaunchSpec(argv=argv, env=dict(s.env), host=s.host, port=port, served_model=s.served_name)

    def requested(self, s: Settings) -> JsonObject:
        req: JsonObject = {"model": s.model}
        if s.served_model_name:
            req["served_model_name"] = s.served_model_name
        if s.port:
            req["port"] = s.port
        for key, value in (
            ("n_ctx", s.max_model_len),
            ("max_running_requests", s.max_concurrency),
            ("kv_cache_dtype", s.kv_cache_dtype),
        ):
            if value is not None:
                req[key] = value
        if "n_gpu_layers" in s.options or s.options.get("cpu"):
            req["n_gpu_layers"] = int_option(s.options, "n_gpu_layers", 0)
        req.update(scan(s.extra_args, FLAGS))
        return req

    def effective_config(self, log_text: str, server_info: JsonObject | None = None) -> EffectiveConfig:
        cfg = EffectiveConfig()
        for line in log_text.splitlines():
            for rx in _MODEL:
                if m := rx.search(line):
                    cfg.set("model", m.group(1), line.strip())
                    break
            if m := _N_CTX.search(line):
                cfg.set("n_ctx", int(m.group(1)), line.strip())
            for rx in _PER_SEQ:
                if m := rx.search(line):
                    cfg.set("max_model_len", int(m.group(1)), line.strip())
                    break
            if m := _OFFLOADED.search(line):
                cfg.set("n_gpu_layers", int(m.group(1)), line.strip())
            if m := _SLOTS.search(line):
                cfg.set("max_running_requests", int(m.group(1)), line.strip())
            if "kv" in line.lower() and (m := _KV_TYPE.search(line)):
                cfg.set("kv_cache_dtype", m.group(1), line.strip())
            if m := _BUILD.search(line):
                cfg.set("version", f"b{m.group(1)} ({m.group(2)})", line.strip())
            if m := _PORT.search(line):
                cfg.set("port", int(m.group(1)), line.strip())
        if server_info:
            props = server_info.get("default_generation_settings", server_info)
            if isinstance(props, dict) and isinstance(n_ctx := props.get("n_ctx"), int):
                cfg.set("max_model_len", n_ctx, "GET /props")
            if isinstance(slots := server_info.get("total_slots"), int):
                cfg.set("max_running_requests", slots, "GET /props")
            if isinstance(path := server_info.get("model_path"), str):
                cfg.set("model", path, "GET /props")
        return lp.finish(cfg)

    def info_paths(self) -> tuple[str, ...]:
        return ("/props",)


ENGINE = LlamaCpp()

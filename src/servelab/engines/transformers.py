"""Hugging Face `transformers serve`: `PYTHON -m transformers.cli.transformers serve [flags] MODEL`.

The served model name is the model path exactly as passed (transformers rejects any other name), so
`served_model_name` cannot differ from `model`. /health answers 200 before the model is usable, hence a
warm-up completion decides readiness; /v1/models lists the Hub cache, not a preloaded local path, so it is not
checked. The log says little: the model it loads and the port.
"""

from __future__ import annotations

import re

from pydantic import Field

from servelab.engines import logparse as lp
from servelab.engines.base import EffectiveConfig, EngineCapabilities, LaunchSpec, Readiness, Settings
from servelab.engines.flags import Flag, opt, python_for, scan, table
from servelab.engines.flagschema import FlagSource
from servelab.engines.options import EngineOptions
from servelab.errors import ConfigError
from servelab.jsontypes import JsonObject

FLAGS = table(
    [
        (("--device",), Flag("device")),
        (("--dtype",), Flag("dtype")),
        (("--quantization",), Flag("quantization")),
        (("--attn-implementation",), Flag("attention_backend")),
        (("--continuous-batching",), Flag("continuous_batching", "true")),
        (("--no-continuous-batching",), Flag("continuous_batching", "false")),
        (("--port",), Flag("port", "int")),
    ]
)
_LOADING = re.compile(r"\[transformers\] Loading (\S+?)(?:@[\w.-]+)?\s*$")
_PORT = re.compile(r"Uvicorn running on https?://\S+?:(\d+)")


class Options(EngineOptions):
    """transformers serve's options."""

    device: str = Field(default="auto", min_length=1, description="--device")


class TransformersServe:
    """`transformers serve` with one preloaded model."""

    name = "transformers"
    default_port = 8000
    startup_timeout_s = 600.0
    readiness = Readiness(
        health_path="/health",
        loading_status=(),
        warmup_request=True,
        warmup_api="completions",
        check_models=False,
    )
    capabilities = EngineCapabilities(
        ignore_eos=False,
        min_tokens=False,
        stream_usage=False,
        metrics_path=None,
        metric_prefix=None,
        gpu=False,
    )
    options_model = Options
    flag_source = FlagSource("python", "transformers", sets=("--host", "--port"))  # `transformers serve`'s

    def command(self, s: Settings) -> LaunchSpec:
        if s.tp != 1 or s.pp != 1 or (s.dp or 1) != 1 or (s.ep or 1) != 1:
            raise ConfigError(
                "transformers serve runs one process on one device: tp, pp, dp and ep must be 1",
                hint="use vllm or sglang for parallel layouts",
            )
        if s.served_model_name and s.served_model_name != s.model:
            raise ConfigError(
                f"transformers serve serves the model under its path ({s.model!r}), not {s.served_model_name!r}",
                hint="leave served_model_name unset for transformers",
            )
        port = s.port or self.default_port
        argv = [python_for(s.options), "-m", "transformers.cli.transformers", "serve"]
        argv += ["--device", str(s.options.get("device", "auto"))]
        argv += opt("--quantization", s.quantization)
        argv += list(s.extra_args)
        argv += ["--host", s.host, "--port", str(port), s.model]
        return LaunchSpec(argv=argv, env=dict(s.env), host=s.host, port=port, served_model=s.model)

    def requested(self, s: Settings) -> JsonObject:
        req: JsonObject = {"model": s.model, "served_model_name": s.model}
        if s.port:
            req["port"] = s.port
        if s.quantization is not None:
            req["quantization"] = s.quantization
        flags = scan(s.extra_args, FLAGS)
        flags.pop("device", None)
        flags.pop("continuous_batching", None)
        req.update(flags)
        return req

    def effective_config(self, log_text: str, server_info: JsonObject | None = None) -> EffectiveConfig:
        cfg = EffectiveConfig()
        for line in log_text.splitlines():
            if m := _LOADING.search(line):
                cfg.set("model", m.group(1), line.strip())
                cfg.set("served_model_name", m.group(1), line.strip())
            if m := _PORT.search(line):
                cfg.set("port", int(m.group(1)), line.strip())
        return lp.finish(cfg)

    def info_paths(self) -> tuple[str, ...]:
        return ()


ENGINE = TransformersServe()

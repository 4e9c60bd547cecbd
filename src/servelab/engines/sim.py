"""servelab's simulator: `PYTHON -m servelab sim ...`, speaking vLLM's or SGLang's dialect.

options: gpu (catalog name, required), num_gpus (default 1), personality ("vllm" | "sglang", default vllm),
speed, seed, faults (list of "NAME" / "NAME:N"), fast_start (bool), python (default: this interpreter).
Engine flags are spelled as the personality's engine spells them, and the log, /metrics and info routes are
that engine's, so `requested` / `effective_config` delegate to the vLLM or SGLang adapter. Readiness works
for both: /health is 503 until the simulated start-up is over, and a refused connection means "starting"
(the vLLM personality binds late, like vLLM).
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from servelab.engines import sglang, vllm
from servelab.engines.base import EffectiveConfig, EngineCapabilities, LaunchSpec, Readiness, Settings
from servelab.engines.flags import Spellings, int_option, opt
from servelab.engines.flagschema import FlagSource
from servelab.engines.options import EngineOptions
from servelab.engines.signatures import guess_engine
from servelab.errors import ConfigError, ServelabError
from servelab.jsontypes import JsonObject

PERSONALITIES = ("vllm", "sglang")


def personality(s: Settings) -> str:
    """The engine the simulator imitates for these settings."""
    value = str(s.options.get("personality", "vllm"))
    if value not in PERSONALITIES:
        raise ConfigError(f"unknown simulator personality {value!r}", hint="choose vllm or sglang")
    return value


def _parse_faults(specs: list[str]) -> None:
    from servelab.sim.faults import parse_faults

    try:
        parse_faults(specs)
    except ServelabError as exc:
        raise ValueError(f"{exc.message}; {exc.hint}" if exc.hint else exc.message) from None


def _fault(spec: str) -> str:
    """One `NAME[:N]`, checked against the simulator's own fault table."""
    _parse_faults([spec])
    return spec


class Options(EngineOptions):
    """The simulator's options, checked as `servelab sim` checks its flags (the fault names are the
    simulator's own table), so nothing it would refuse at start-up reaches a launch."""

    personality: Literal["vllm", "sglang"] = "vllm"
    speed: float | None = Field(default=None, gt=0, description="clock speed-up (--speed)")
    seed: int | None = None
    faults: list[Annotated[str, AfterValidator(_fault)]] = Field(
        default_factory=list, description='["NAME" or "NAME:N", ...] (--fault)'
    )
    fast_start: bool = False

    @field_validator("faults")
    @classmethod
    def _one_crash(cls, v: list[str]) -> list[str]:
        _parse_faults(v)
        return v


# The settings handed to a personality as its engine's flags (served name, requests in flight, memory
# fraction, context, KV dtype), by that engine's argparse dest.
_SETTING_FLAGS: dict[str, tuple[Spellings, tuple[str, ...]]] = {
    "vllm": (
        vllm.SPELLING,
        ("served_model_name", "max_num_seqs", "gpu_memory_utilization", "max_model_len", "kv_cache_dtype"),
    ),
    "sglang": (
        sglang.SPELLING,
        (
            "served_model_name",
            "max_running_requests",
            "mem_fraction_static",
            "context_length",
            "kv_cache_dtype",
        ),
    ),
}


def _adapter(name: str) -> vllm.VLLM | sglang.SGLang:
    return vllm.ENGINE if name == "vllm" else sglang.ENGINE


def _check_box(model: str, gpu: str, num_gpus: int, s: Settings) -> None:
    """What `servelab sim` refuses at start-up, refused here before it is launched: an unknown GPU, model
    or weight format, a layout larger than the simulated box or one the model cannot split (the same
    `make_setup` the simulator builds, with the layout it derives from these settings)."""
    world = s.tp * s.pp * (s.dp or 1)
    if world > num_gpus:
        raise ConfigError(
            f"the layout needs {world} GPUs (tp {s.tp} × pp {s.pp} × dp {s.dp or 1}) but the simulated box "
            f"has {num_gpus}",
            hint="raise host.num_gpus (or options.num_gpus), or shrink the layout",
        )
    ep = (s.tp * (s.dp or 1) if (s.ep or 1) > 1 else 1) if personality(s) == "vllm" else (s.ep or 1)
    _setup(model, gpu, world, s.tp, s.pp, ep, s.dp or 1, s.quantization, s.kv_cache_dtype)


@cache
def _setup(
    model: str, gpu: str, world: int, tp: int, pp: int, ep: int, dp: int, quant: str | None, kv: str | None
) -> None:
    """One check per distinct layout (a large matrix repeats few of them)."""
    from servelab.model.predict import make_setup

    make_setup(model, gpu, world, tp=tp, pp=pp, ep=ep, dp=dp, quant=quant, kv_dtype=kv)


class Sim:
    """The built-in simulator (no GPUs needed)."""

    name = "sim"
    default_port = 8000
    startup_timeout_s = 600.0
    readiness = Readiness(health_path="/health", loading_status=(503,), port_opens_when_ready=True)
    capabilities = EngineCapabilities(
        metric_prefix=None, gpu=False, verify_reference="sim", telemetry_path="/servelab/gpus"
    )  # the prefix follows the personality
    options_model = Options
    # the personality's own parser (sim/engine_args.py); servelab sets what it sets for vLLM and SGLang
    flag_source = FlagSource(
        "sim", sets=("--model", "--model-path", "--served-model-name", "--host", "--port")
    )

    def command(self, s: Settings) -> LaunchSpec:
        p = personality(s)
        gpu = s.options.get("gpu")
        if not gpu:
            raise ConfigError(
                "the simulator needs options.gpu", hint="e.g. gpu = 'h100-sxm' (see `servelab sim --help`)"
            )
        _check_box(s.model, str(gpu), int_option(s.options, "num_gpus", 1), s)
        port = s.port or (8000 if p == "vllm" else 30000)
        argv = [str(s.options.get("python") or sys.executable), "-m", "servelab", "sim"]
        argv += ["--model", s.model, "--gpu", str(gpu), "--num-gpus", str(s.options.get("num_gpus", 1))]
        argv += ["--personality", p, "--host", s.host, "--port", str(port)]
        argv += ["--tp", str(s.tp)]
        if s.pp != 1:
            argv += ["--pp", str(s.pp)]
        argv += opt("--ep", s.ep) + opt("--dp", s.dp) + opt("--quant", s.quantization)
        argv += opt("--speed", s.options.get("speed")) + opt("--seed", s.options.get("seed"))
        faults = s.options.get("faults", ()) or ()
        for fault in faults if isinstance(faults, list | tuple) else ():  # a list, as Options checked
            argv += ["--fault", str(fault)]
        if s.options.get("fast_start"):
            argv.append("--fast-start")
        # What follows is engine flags, spelled by the personality's engine (its adapter's SPELLING) and
        # parsed by the personality's own parser.
        spelling, dests = _SETTING_FLAGS[p]
        values = (s.served_model_name, s.max_concurrency, s.mem_fraction, s.max_model_len, s.kv_cache_dtype)
        for dest, value in zip(dests, values, strict=True):
            argv += opt(spelling.written(dest), value)
        argv += list(s.extra_args)
        return LaunchSpec(argv=argv, env=dict(s.env), host=s.host, port=port, served_model=s.served_name)

    def requested(self, s: Settings) -> JsonObject:
        return _adapter(personality(s)).requested(s)

    def effective_config(self, log_text: str, server_info: JsonObject | None = None) -> EffectiveConfig:
        engine = guess_engine(log_text) or (
            "sglang" if server_info and "model_path" in server_info else "vllm"
        )
        return _adapter("sglang" if engine == "sglang" else "vllm").effective_config(log_text, server_info)

    def info_paths(self) -> tuple[str, ...]:
        return ("/version", "/get_server_info")


ENGINE = Sim()

"""`servelab sim`: a simulated vLLM/SGLang server on simulated GPUs (see docs/cli/sim.md)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from servelab.errors import ConfigError


@click.command(
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": ["-h", "--help"],
    }
)
@click.option("--model", help="Catalog model name (see `servelab predict --help`) or config path. Required.")
@click.option("--gpu", help="GPU kind from the catalog, e.g. rtx-pro-6000, h100-sxm. Required.")
@click.option("--num-gpus", type=int, default=1, show_default=True, help="GPUs in the simulated box.")
@click.option("--tp", type=int, default=None, help="Tensor parallel size (or the engine's own flag).")
@click.option("--pp", type=int, default=None, help="Pipeline parallel size.")
@click.option("--ep", type=int, default=None, help="Expert parallel size.")
@click.option("--dp", type=int, default=None, help="(Attention) data parallel size.")
@click.option("--quant", default=None, help="Weight format override, e.g. nvfp4, fp8 (default: the model's).")
@click.option("--personality", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Port (0: a free one; `SIM-PORT N` on stderr once bound, before it is ready: poll /health); "
    "default: the engine's (8000 / 30000).",
)
@click.option(
    "--speed",
    type=float,
    default=1.0,
    show_default=True,
    help="Run the clock this many times faster (latencies measured at speed X are X times shorter).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds EOS lengths and fault draws.")
@click.option(
    "--fault",
    "faults",
    multiple=True,
    help="Inject a fault: NAME or NAME:N (repeatable); see docs/cli/sim.md.",
)
@click.option(
    "--fault-rate",
    type=float,
    default=1.0,
    show_default=True,
    help="Fraction of requests a per-request fault hits (seeded).",
)
@click.option("--fast-start", is_flag=True, help="Skip the start-up phases' durations (logs still printed).")
@click.option(
    "--eos-mean",
    type=float,
    default=256.0,
    show_default=True,
    help="Mean natural output length (tokens) when a request does not ask for ignore_eos.",
)
@click.option("--cpu", type=int, default=None, help="Pin the simulator to this CPU core.")
@click.option(
    "--request-log",
    type=click.Path(dir_okay=False),
    help="Append one JSON line per generation request received (docs/sim.md): prompt, counts, hashes.",
)
@click.option("--list-faults", is_flag=True, help="List the faults and exit.")
@click.pass_context
def sim(ctx: click.Context, /, **opts: Any) -> None:
    """Serve an OpenAI-compatible API that behaves like vLLM or SGLang on simulated GPUs.

    Extra arguments are engine flags, spelled as the engine spells them
    (e.g. --max-num-seqs 256, --moe-runner-backend flashinfer_cutlass, --disable-radix-cache)."""
    from servelab.sim.faults import FAULTS

    if opts["list_faults"]:
        for name, (kind, default, about) in FAULTS.items():
            click.echo(f"{name:16s} {kind:8s} {about}" + (f" (default N={default:g})" if default else ""))
        return
    missing = [f"--{k}" for k in ("model", "gpu") if not opts[k]]
    if missing:
        raise ConfigError(
            f"servelab sim needs {' and '.join(missing)}",
            hint="e.g. servelab sim --model GLM-5-NVFP4 --gpu rtx-pro-6000 --num-gpus 8 --tp 8",
        )
    cfg = build_config(opts, list(ctx.args))
    from servelab.sim.app import run

    sys.exit(run(cfg, cpu=opts["cpu"]))


def build_config(opts: dict[str, Any], engine_argv: list[str]) -> Any:
    from servelab.model.hardware import make_host
    from servelab.model.predict import make_setup
    from servelab.sim.engine_args import sglang_default_argv, vllm_default_argv
    from servelab.sim.faults import parse_faults
    from servelab.sim.personalities import parse_engine_args
    from servelab.sim.state import SimConfig

    if opts["speed"] <= 0:
        raise ConfigError("--speed must be positive", hint="e.g. --speed 50 for tests")
    if not 0.0 <= opts["fault_rate"] <= 1.0:
        raise ConfigError("--fault-rate must lie in [0, 1]")
    faults = parse_faults(opts["faults"])
    personality = opts["personality"]
    host = make_host(opts["gpu"], opts["num_gpus"], None)
    from servelab.model.architecture import load_model

    arch = load_model(opts["model"])
    base = (vllm_default_argv if personality == "vllm" else sglang_default_argv)(
        opts["model"], opts["tp"], opts["pp"], opts["ep"], opts["dp"], opts["quant"]
    )
    # Engine flags are parsed the engine's way: unknown ones print its usage and exit 2.
    args, warnings = parse_engine_args(personality, base + engine_argv, sm=host.gpu.sm, is_moe=arch.is_moe)
    ep = args.ep
    if personality == "vllm" and args.enable_expert_parallel:
        ep = args.tp * args.dp
    kw: dict[str, Any] = {"tp": args.tp, "pp": args.pp, "ep": ep, "dp": args.dp, "engine": personality}
    if opts["quant"]:
        kw["quant"] = opts["quant"]
    if args.kv_cache_dtype:
        kw["kv_dtype"] = args.kv_cache_dtype
    if args.mem_fraction:
        kw["mem_fraction"] = args.mem_fraction
    if args.tp * args.pp * args.dp > opts["num_gpus"]:
        raise ConfigError(
            f"the layout needs {args.tp * args.pp * args.dp} GPUs (tp {args.tp} × pp {args.pp} × dp {args.dp}) "
            f"but --num-gpus is {opts['num_gpus']}",
            hint="raise --num-gpus or shrink the layout",
        )
    # The model prices the GPUs the layout uses; the box may have more (telemetry shows them idle).
    setup = make_setup(arch, opts["gpu"], args.tp * args.pp * args.dp, **kw)
    port = opts["port"] if opts["port"] is not None else args.port
    if port:  # the logs (server_args, non-default args) show the port actually served, as the engines do
        args.port = port
        args.host = opts["host"]
    return SimConfig(
        setup=setup,
        engine=args,
        engine_warnings=warnings,
        model_name=opts["model"],
        speed=opts["speed"],
        seed=opts["seed"],
        faults=faults,
        fault_rate=opts["fault_rate"],
        fast_start=opts["fast_start"],
        eos_mean=opts["eos_mean"],
        host=opts["host"],
        port=port,
        box_gpus=opts["num_gpus"],
        api_key=sim_api_key(personality, args.api_key),
        request_log=_writable(opts.get("request_log")),
    )


def _writable(path: str | None) -> str | None:
    """--request-log is opened at start: say now, with the path, when it cannot be written."""
    if path is None:
        return None
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--request-log {path} cannot be written: {exc.strerror or exc}",
            hint="give a file in a directory you can write to",
        ) from None
    return path


API_KEY_ENV = "SERVELAB_SIM_API_KEY"


def sim_api_key(personality: str, flag: str | None) -> str | None:
    """The key /v1/* demands: --api-key, else $SERVELAB_SIM_API_KEY, else (vLLM personality, as vLLM does)
    $VLLM_API_KEY. The environment keeps it off the command line, which every user of the host reads."""
    env = os.environ.get(API_KEY_ENV) or (os.environ.get("VLLM_API_KEY") if personality == "vllm" else None)
    return flag or env or None

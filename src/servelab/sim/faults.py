"""Faults `servelab sim --fault NAME[:N]` injects, and the real-world signatures they print."""

from __future__ import annotations

from dataclasses import dataclass

from servelab.errors import ConfigError

# name -> (kind, default argument, what it does)
FAULTS: dict[str, tuple[str, float | None, str]] = {
    "cuda_init": ("startup", None, "crash at start: CUDA init fails (HMM / driver)"),
    "oom_init": ("startup", None, "crash at start: CUDA out of memory while loading weights"),
    "worker_init": (
        "startup",
        None,
        "crash at start: a worker dies (vLLM `WorkerProc initialization failed`, SGLang `Scheduler hit an exception`)",
    ),
    "port_in_use": ("startup", None, "crash at start: the port is already in use"),
    "nccl_shm": ("startup", None, "crash at start: NCCL cannot create its /dev/shm segment"),
    "kv_cache_too_small": (
        "startup",
        None,
        "crash at start when max_model_len is more than the KV cache holds, as vLLM does "
        "(N: the KV cache's tokens; default: what memory leaves it); SGLang serves on",
    ),
    "slow_start": ("startup", 600.0, "CUDA-graph capture takes N more (model) seconds"),
    "orphan": ("startup", None, "leave a child process behind when the parent is killed"),
    "hang": ("serve", None, "accept connections, never answer"),
    "no_metrics": (
        "serve",
        None,
        "serve no /metrics (404), as transformers serve does and llama.cpp without --metrics",
    ),
    "die_after_ready": (
        "serve",
        5.0,
        "engine dies when request N+1 arrives (vLLM: EngineDeadError; SGLang: exits)",
    ),
    "stall_stream": ("request", 3.0, "a stream stops after N tokens and stays open"),
    "drop_stream": ("request", 3.0, "the connection is cut after N tokens"),
    "malformed_sse": ("request", 2.0, "a malformed SSE event after N tokens"),
    "garbage": ("request", None, "the output is garbage ('!!!!…', as broken FP4 kernels produce)"),
}
STARTUP_CRASHES = ("cuda_init", "oom_init", "worker_init", "port_in_use", "nccl_shm", "kv_cache_too_small")
REQUEST_FAULTS = ("stall_stream", "drop_stream", "malformed_sse", "garbage")


@dataclass(frozen=True)
class Fault:
    name: str
    arg: float | None

    @property
    def n(self) -> int:
        return int(self.arg or 0)


def parse_faults(specs: list[str] | tuple[str, ...]) -> dict[str, Fault]:
    out: dict[str, Fault] = {}
    for spec in specs:
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            name, _, arg = part.partition(":")
            name = name.strip().replace("-", "_")
            if name not in FAULTS:
                raise ConfigError(
                    f"unknown fault {name!r}",
                    hint="choose from: " + ", ".join(FAULTS),
                )
            default = FAULTS[name][1]
            if arg:
                try:
                    value: float | None = float(arg)
                except ValueError:
                    raise ConfigError(
                        f"fault {name}: {arg!r} is not a number", hint=f"e.g. --fault {name}:3"
                    ) from None
            else:
                value = default
            out[name] = Fault(name, value)
    crashes = [n for n in out if n in STARTUP_CRASHES]
    if len(crashes) > 1:
        raise ConfigError(f"pick one start-up crash, not {', '.join(crashes)}")
    return out

"""nvidia-smi-like telemetry of the simulated GPUs (GET /servelab/gpus): memory, power, utilization.

Power follows the model's step (`servelab/data/sim/gpu_power.toml`, issue 31): over the last ~10 model
seconds, each second of the scheduler's work draws the figure of what bound it (`scheduler.Work`) —
memory-bound (weight and KV-cache reads) `active`, compute-bound (FLOPs beyond the reads, prefill
stalls) the board's `limit`, communication (all-reduce, MoE collectives: the SMs spin on the link's
flags) `idle + comm_share × (active − idle)`, and launch and scheduling overheads
`idle + other_share × (active − idle)` — and the time between steps draws `idle`. The "allreduce fusion"
collapse on PCIe Blackwell draws `collapse` for all its busy time (the GPUs mostly wait on the slow fused
all-reduce). The process on each GPU is named as the personality names it (personalities.toml [processes]).
"""

from __future__ import annotations

import os
from collections import deque

from servelab.jsontypes import JsonObject, JsonValue
from servelab.model.memory import GB
from servelab.sim.personalities import power_table
from servelab.sim.scheduler import Work
from servelab.sim.state import SimState

MIB = 1024 * 1024
DRIVER_VERSION = "580.95.05"
CUDA_VERSION = "13.0"


def power(gpu_name: str) -> dict[str, float]:
    """The GPU's power figures (idle, active, limit, collapse: watts; comm_share, other_share: fractions)."""
    table = power_table()
    return {**table["default"], **table["step"], **table.get(gpu_name, {})}


def window(samples: deque[tuple[float, Work]], now: float, work: Work) -> tuple[float, Work]:
    """The last ~10 model seconds (at least 0.5 s back) from (time, work so far) samples: their length and
    the work done in them (0 s and no work before half a second has passed); records (now, work)."""
    samples.append((now, work))
    for t, w in samples:
        if now - t <= 10.0 and now - t >= 0.5:
            return now - t, work.minus(w)
    return 0.0, Work()


def draw(pw: dict[str, float], span_s: float, done: Work, collapse: bool = False) -> tuple[float, float]:
    """(busy fraction, watts) of a GPU that did `done` in `span_s` model seconds (module docstring)."""
    if span_s <= 0 or done.busy_s <= 0:
        return 0.0, pw["idle"]
    busy = min(done.busy_s / span_s, 1.0)
    idle = pw["idle"]
    if collapse:
        return busy, idle + (pw["collapse"] - idle) * busy
    above = (
        done.memory_s * (pw["active"] - idle)
        + done.compute_s * (pw["limit"] - idle)
        + done.comm_s * pw["comm_share"] * (pw["active"] - idle)
        + done.other_s * pw["other_share"] * (pw["active"] - idle)
    ) / done.busy_s  # the busy time's mean draw above idle
    return busy, idle + above * busy


def gpus(srv: SimState) -> JsonObject:
    """nvidia-smi-like telemetry of the simulated GPUs."""
    s = srv.cfg.setup
    pw = power(s.host.gpu.name)
    span, done = (
        window(srv.util_samples, srv.model_now(), srv.sched.counters.work) if srv.ready else (0.0, Work())
    )
    util, watts = draw(pw, span, done, srv.collapse)
    used = s.layout.tp * s.layout.pp * s.layout.dp
    pid = os.getpid()
    out: list[JsonValue] = []
    for i, mib in enumerate(srv.gpu_mem_mib):
        busy = util if i < used else 0.0
        proc_name = srv.persona.processes.on_gpu(i, s.layout.tp)
        out.append(
            {
                "index": i,
                "name": s.host.gpu.description.split(",")[0],
                "uuid": f"GPU-sim-{i:02d}",
                "memory_used_mib": round(mib),
                "memory_total_mib": round(s.host.gpu.memory_gb * GB / MIB),
                "power_w": round(watts if i < used else pw["idle"], 1),
                "power_limit_w": pw["limit"],
                "utilization_pct": round(busy * 100),
                "temperature_c": round(35 + 40 * busy),
                "processes": [{"pid": pid, "name": proc_name, "used_memory_mib": round(mib)}]
                if mib > 0
                else [],
            }
        )
    return {"simulated": True, "driver_version": DRIVER_VERSION, "cuda_version": CUDA_VERSION, "gpus": out}

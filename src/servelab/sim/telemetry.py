"""nvidia-smi-like telemetry of the simulated GPUs (GET /servelab/gpus): memory, power, utilization.

Power follows `servelab/data/sim/gpu_power.toml` (idle → active with the engine's busy fraction; the
"allreduce fusion" collapse on PCIe Blackwell draws its own, lower figure); the process on each GPU
is named as the personality names it (personalities.toml [processes]).
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any

from servelab.model.memory import GB
from servelab.sim.personalities import power_table
from servelab.sim.state import SimState

MIB = 1024 * 1024
DRIVER_VERSION = "580.95.05"
CUDA_VERSION = "13.0"


def power(gpu_name: str) -> dict[str, float]:
    """The GPU's power figures (idle, active, limit, collapse), watts."""
    table = power_table()
    return {**table["default"], **table.get(gpu_name, {})}


def utilization(samples: deque[tuple[float, float]], now: float, busy: float) -> float:
    """The busy fraction over the last ~10 model seconds (at least 0.5 s back), from (time, busy)
    samples; records (now, busy)."""
    samples.append((now, busy))
    for t, b in samples:
        if now - t <= 10.0 and now - t >= 0.5:
            return max(0.0, min(1.0, (busy - b) / (now - t)))
    return 0.0


def gpus(srv: SimState) -> dict[str, Any]:
    """nvidia-smi-like telemetry of the simulated GPUs."""
    s = srv.cfg.setup
    pw = power(s.host.gpu.name)
    util = utilization(srv.util_samples, srv.model_now(), srv.sched.counters.busy_s) if srv.ready else 0.0
    used = s.layout.tp * s.layout.pp * s.layout.dp
    active = pw["collapse"] if srv.collapse else pw["active"]
    pid = os.getpid()
    out = []
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
                "power_w": round(pw["idle"] + (active - pw["idle"]) * busy, 1),
                "power_limit_w": pw["limit"],
                "utilization_pct": round(busy * 100),
                "temperature_c": round(35 + 40 * busy),
                "processes": [{"pid": pid, "name": proc_name, "used_memory_mib": round(mib)}]
                if mib > 0
                else [],
            }
        )
    return {"simulated": True, "driver_version": DRIVER_VERSION, "cuda_version": CUDA_VERSION, "gpus": out}

"""What the simulated server is, as its parts see it: the configuration (`SimConfig`) and the
`SimState` protocol that the router (`routes.py`), the start-up (`startup.py`) and the telemetry
(`telemetry.py`) read and drive. They depend on this, not on `server.SimServer`, which imports none
of them; `app.py` composes the four.
"""

from __future__ import annotations

import subprocess
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from servelab.model.memory import MemoryPlan
from servelab.model.predict import Setup
from servelab.sim.engine_args import EngineArgs, SimEffective
from servelab.sim.faults import Fault
from servelab.sim.http import HttpProtocol, Request
from servelab.sim.personalities import Personality, get_personality
from servelab.sim.render import Logger
from servelab.sim.scheduler import Scheduler, Work


@dataclass
class SimConfig:
    setup: Setup
    engine: EngineArgs
    engine_warnings: list[str] = field(default_factory=list)
    model_name: str = ""  # as asked (catalog name or path), for the logs
    speed: float = 1.0
    seed: int = 0
    faults: dict[str, Fault] = field(default_factory=dict)
    fault_rate: float = 1.0
    fast_start: bool = False
    eos_mean: float = 256.0
    host: str = "127.0.0.1"
    port: int = 8000
    box_gpus: int = 0  # GPUs in the simulated box (default: the ones the layout uses)
    api_key: str | None = None  # /v1/* demands `Authorization: Bearer KEY` (as vLLM and SGLang do)
    persona: Personality | None = None  # default: the packaged personality named by engine.personality
    request_log: str | None = None  # one JSON line per generation request received (docs/sim.md)

    @property
    def personality(self) -> str:
        return self.engine.personality

    def resolved_persona(self) -> Personality:
        """The personality this server imitates (personalities.toml, parsed once)."""
        return self.persona if self.persona is not None else get_personality(self.engine.personality)


class SimState(Protocol):
    """The simulated server as the router, the start-up and the telemetry use it (`server.SimServer`)."""

    cfg: SimConfig
    persona: Personality
    eff: SimEffective
    mem: MemoryPlan
    collapse: bool
    kv_tokens: int
    sched: Scheduler
    log: Logger
    served: str
    created: int
    ready: bool
    dead: bool
    gen_throughput: float
    gpu_mem_mib: list[float]
    util_samples: deque[tuple[float, Work]]  # (model time, the scheduler's work so far): telemetry's window
    orphan: subprocess.Popen[bytes] | None

    def model_now(self) -> float: ...

    def metric_values(self) -> dict[str, float]: ...

    def reserve(self) -> None: ...

    async def listen(self) -> None: ...

    async def generate(self, proto: HttpProtocol, req: Request, chat: bool) -> bool: ...

"""A server's start-up split into phases (issue 31): what each phase cost, read from the engine's own log.

The contract every room speaks: `engines.startup` reads the phases from a log, the trial stores them per
trial (`study_trials.startup_json`), `runs study`, the report and `--json` show them. Each phase is ended
by a log line: `at_s` is when that line was seen (seconds from launch, at the resolution the log was
polled at; None when the log was read after the fact), `took_s` the engine's own figure for the phase when
its line gives one. `cache` tells a cold launch (the engine's compile cache was empty) from a warm one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

# The phases in the order an engine goes through them; `listening`: its API server accepts connections.
PHASES = ("weights", "compile", "kv_cache", "graphs", "listening")
PHASE_TITLES = {
    "weights": "weights loaded",
    "compile": "compiled",
    "kv_cache": "KV cache allocated",
    "graphs": "CUDA graphs captured",
    "listening": "server listening",
}
Cache = Literal["cold", "warm", "unknown"]


class StartupPhase(BaseModel):
    """One phase: the line that ended it, when it was seen and what the engine said it took."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # one of PHASES
    line: str  # the log line that ended it (the evidence)
    at_s: float | None = None  # seconds from launch when that line was seen
    took_s: float | None = None  # the engine's own duration for the phase, when its line states one


class StartupPhases(BaseModel):
    """A launch from start to ready: its phases in log order, the total, and cold or warm."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phases: tuple[StartupPhase, ...] = ()
    total_s: float | None = None  # launch to ready (the readiness rule passed)
    cache: Cache = "unknown"  # the engine's compile cache at launch: empty (cold) or not (warm)
    cache_evidence: tuple[str, ...] = ()  # what told: the cache directory seen at launch, the log's line
    compile_cache_s: float | None = None  # seconds the engine spent loading (warm) or compiling (cold) graphs

    def phase(self, name: str) -> StartupPhase | None:
        return next((p for p in self.phases if p.name == name), None)

    def took(self, name: str) -> float | None:
        """The phase's own duration: the engine's figure, else None."""
        p = self.phase(name)
        return None if p is None else p.took_s

    def summary(self) -> str:
        """One line: `weights at 4.2 s (took 3.6 s) · compile at 30.1 s (took 25.0 s) · … · ready 51.3 s (cold)`."""
        parts = []
        for p in self.phases:
            at = "" if p.at_s is None else f" at {p.at_s:.1f} s"
            took = "" if p.took_s is None else f" (took {p.took_s:.1f} s)"
            if at or took:
                parts.append(f"{p.name}{at}{took}")
        if self.total_s is not None:
            parts.append(f"ready {self.total_s:.1f} s")
        return " · ".join(parts) + f" ({self.cache})"

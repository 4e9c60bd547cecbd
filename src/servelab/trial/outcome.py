"""The typed seams of a trial: `Target` (the server a step talks to), `AppliedCheck` (requested vs
effective), `LevelResult` / `BenchRun` (the load levels), `Finding` (why a trial failed), `TrialOutcome`,
and the `TrialObserver` each step reports to before the next starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias

from servelab.applied import Mismatch
from servelab.engines.base import Diagnosis, EffectiveConfig, LaunchSpec, Setting
from servelab.events import BenchEvent
from servelab.jsontypes import JsonObject, JsonValue
from servelab.lifecycle.handle import ServerHandle, TeardownReport
from servelab.startup import StartupPhases

if TYPE_CHECKING:
    from servelab.verify import VerifyResult


# One load level's numbers, keyed as `LevelSummary.digest` keys them (level, completed, failed,
# output_throughput, tpot_ms_p50, ...), in real-GPU time; a study's stored levels add gpu_power_w, gpu_util,
# bench_run and died (`LevelResult.stored`). Open JSON: stored as it is, compared by analyze.
Digest: TypeAlias = JsonObject
TrialStatus = Literal["measured", "not_applied", "failed"]
# Where a trial ended: its command could not be built, it did not start, a setting was not applied,
# verify-output failed, the benchmark failed (or the server died in it), or every step passed.
Stage = Literal["command", "place", "start", "applied", "verify", "bench", "done"]
# Fatal classes a serving engine dies of (the illegal memory access is the usual root cause of a death).
DEATH_CLASSES = (
    "engine_died_after_ready",
    "oom_runtime",
    "illegal_memory_access",
    "worker_timeout",
    "nccl_timeout",
)
# A stored level's telemetry keys, beside its digest's (`LevelResult.stored`).
TELEMETRY_KEYS = ("gpu_power_w", "gpu_util")


# -- the typed seams ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The server a step talks to. `server`: ours (launched by the trial), so its exit means it died;
    `log_path`: its log, read for the effective config and diagnoses (None: not ours to read)."""

    url: str
    served_model: str
    api_key: str | None = None
    server: ServerHandle | None = None
    log_path: Path | None = None


@dataclass(frozen=True)
class Finding:
    """Why a trial failed, as stored (`to_dict`: class, evidence, advice, then fatal, tail and message when
    known: the keys readers of a stored diagnosis know)."""

    klass: str
    evidence: str
    advice: str
    fatal: bool | None = None
    tail: tuple[str, ...] | None = None
    message: str | None = None
    setting: Setting | None = None  # the setting to change, when the log's figures say

    @classmethod
    def of(cls, diag: Diagnosis, message: str | None = None) -> Finding:
        return cls(
            diag.klass, diag.evidence, diag.advice, diag.fatal, diag.tail or None, message, diag.setting
        )

    def to_dict(self) -> JsonObject:
        d: JsonObject = {"class": self.klass, "evidence": self.evidence, "advice": self.advice}
        if self.fatal is not None:
            d["fatal"] = self.fatal
        if self.tail is not None:
            d["tail"] = list(self.tail)
        if self.message is not None:
            d["message"] = self.message
        if self.setting is not None:
            d["setting"] = _setting_json(self.setting)
        return d


def _setting_json(setting: Setting) -> JsonObject:
    """`Setting.to_dict` as JSON (its nested tables copied, so their type is JSON's too)."""
    out: JsonObject = {}
    for k, v in setting.to_dict().items():
        if isinstance(v, dict):
            table: JsonObject = dict(v)
            out[k] = table
        else:
            out[k] = v
    return out


@dataclass(frozen=True)
class AppliedCheck:
    """What the candidate asked for against what the engine runs (`applied.compare`)."""

    requested: JsonObject  # the engine's normalized keys (`Engine.requested`), stored as they are
    effective: EffectiveConfig
    mismatches: list[Mismatch]
    unconfirmed: list[str]  # requested keys the engine does not show

    @property
    def applied(self) -> bool:
        return not self.mismatches


@dataclass
class LevelResult:
    """One load level: its digest, the GPU telemetry sampled meanwhile, and the bench run that measured it."""

    value: float
    digest: Digest  # `level_digest`: the bench summary in real-GPU time
    telemetry: dict[str, float]  # gpu_power_w / gpu_util over the busiest half (empty: no telemetry)
    bench_uid: str
    bench_run_id: int | None
    died: bool = False  # the server died during this level

    def stored(self) -> Digest:
        """The level as a study trial stores it."""
        d = self.digest | self.telemetry | {"bench_run": self.bench_uid}
        if self.died:
            d["died"] = True
        return d

    @classmethod
    def from_stored(cls, d: Digest, bench_run_id: int | None = None) -> LevelResult:
        """A level as `stored` wrote it (one an interrupted trial had measured, kept by a resume)."""
        telemetry = {k: _number(d[k]) for k in TELEMETRY_KEYS if d.get(k) is not None}
        digest = {k: v for k, v in d.items() if k not in (*TELEMETRY_KEYS, "bench_run", "died")}
        return cls(
            _number(d["level"]), digest, telemetry, str(d["bench_run"]), bench_run_id, bool(d.get("died"))
        )


def _number(v: JsonValue) -> float:
    """A stored number as `float()` reads it (a JSON number, or a numeric string); TypeError otherwise."""
    if isinstance(v, bool | int | float | str):
        return float(v)
    raise TypeError(f"float() argument must be a string or a real number, not {type(v).__name__!r}")


@dataclass
class BenchRun:
    """The levels a benchmark measured, in order, and why it stopped before the last one (if it did)."""

    levels: list[LevelResult]
    died: bool = False
    stopped_early: str | None = None  # why the remaining levels were skipped

    def stored(self) -> list[Digest]:
        return [lv.stored() for lv in self.levels]


@dataclass
class TrialOutcome:
    """How a trial ended (`status`, at `stage`), what each step found, and what its teardown proved."""

    status: TrialStatus
    stage: Stage
    diagnosis: Finding | None = None
    applied: AppliedCheck | None = None
    verify: VerifyResult | None = None
    levels: list[LevelResult] = field(default_factory=list)
    died: bool = False  # the server died during the benchmark
    ready_s: float | None = None
    teardown: TeardownReport | None = None  # None: nothing of ours ran

    def record(self) -> JsonObject:
        """The outcome as a study stores it for the candidate (and reports it in `trial_finished`)."""
        if self.status == "measured":
            return {}
        if self.status == "not_applied":
            assert self.applied is not None
            return {
                "not_applied": [m.to_dict() for m in self.applied.mismatches],
                "unconfirmed": list(self.applied.unconfirmed),
            }
        assert self.diagnosis is not None
        if self.stage == "command":  # no command line: stored as the diagnosis itself, as it always was
            return self.diagnosis.to_dict()
        out: JsonObject = {"diagnosis": self.diagnosis.to_dict()}
        if self.died:
            out["died_during_benchmark"] = True
        return out


class TrialObserver:
    """What a trial reports as it goes, each before its next step starts. Every method does nothing here:
    a caller overrides those it records (a study stores each in the trial's row)."""

    def launching(self, launch: LaunchSpec, log_path: Path) -> None:
        """The command line is built (before anything starts)."""

    def launched(self, server: ServerHandle) -> None:
        """The server process started (not ready yet)."""

    def ready(self, url: str, ready_s: float) -> None:
        """The server is ready (an attached one: at once)."""

    def startup(self, phases: StartupPhases) -> None:
        """The launched server's start-up, phase by phase (before `ready`)."""

    def applied(self, check: AppliedCheck) -> None:
        """Requested vs effective configuration."""

    def verified(self, result: VerifyResult) -> None:
        """verify-output's result."""

    def benchmarking(self) -> None:
        """The first load level starts."""

    def bench_event(self, event: BenchEvent) -> None:
        """`run_bench`'s own progress events."""

    def level_done(self, level: LevelResult, levels: list[LevelResult]) -> None:
        """A load level is measured (`levels`: every level so far, this one last)."""

    def stopped_early(self, reason: str) -> None:
        """The remaining levels are skipped (throughput collapsed against the baseline)."""

    def server_died(self, levels: list[LevelResult], diagnosis: Finding) -> None:
        """The server died during the benchmark."""

    def finished(self, outcome: TrialOutcome) -> None:
        """The trial's outcome, before the teardown."""

    def torn_down(self, report: TeardownReport) -> None:
        """The server is stopped, and what the teardown proved."""


# -- the pipeline ------------------------------------------------------------------------------------

"""The study report as one typed model: `report.data` builds a `StudyReport` from the store, and Markdown,
HTML, the web UI and `servelab report --json` all read its attributes, so no reader guesses at a key.

The JSON the fronts publish is `StudyReport.to_json()` (`"format": "servelab-report/1"`, docs/cli/report.md):
the field order here is the order of its keys, and a key some reports lack is dropped when it is None
(`_omit_none`) so that the published shape stays what it was. Numbers read back from the store keep the
type they were stored with (`int | float`: a level `4` stays `4`, not `4.0`). What another writer stores
as open JSON (a level digest, a diagnosis, how the noise was judged) stays a `JsonObject`, said so at the
field: this model does not own that shape, and its readers narrow each value they use.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    JsonValue,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from servelab.jsontypes import JsonObject
from servelab.redact import redact
from servelab.report.pareto import EnergyPoint, ParetoPoint
from servelab.report.top import TopLine, Winner
from servelab.startup import StartupPhases

FORMAT: Literal["servelab-report/1"] = "servelab-report/1"


class _Part(BaseModel):
    """A frozen part of the report; `_omit_none` names the keys the JSON leaves out when they are None
    (keys that some reports never had); `_as_given`: the JSON has only the fields it was given (a part read
    back from what another writer stored, whose older rows lack later fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _omit_none: ClassVar[tuple[str, ...]] = ()
    _as_given: ClassVar[bool] = False

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        out = handler(self)
        if isinstance(out, dict):
            for k in self._omit_none:
                if out.get(k, 0) is None:
                    del out[k]
            if self._as_given:
                for k in set(type(self).model_fields) - self.model_fields_set:
                    out.pop(k, None)
        return out


class EngineInfo(_Part):
    name: str | None
    personality: str | None
    args: list[str]


class LoadInfo(_Part):
    """The study's load as the views show it (`load.LoadKind.summary`): its levels in their unit."""

    mode: str
    levels: list[int | float]
    main: int | float | None
    unit: str


class StudyInfo(_Part):
    """What the study is: its identity, objectives, engine, workload and load, and how to run it again."""

    uid: str
    name: str
    status: str
    created_at: str
    finished_at: str | None
    source: str | None
    description: str
    objective: str | None
    objectives: list[str | None]  # every objective declared; the first ranks the winner
    repeats: int
    baseline: str | None
    model: str | None
    engine: EngineInfo
    workload: JsonObject  # the study file's [workload] table as written: each kind has its own keys
    load: LoadInfo
    command: str | None  # `servelab tune SOURCE`
    price_note: str | None  # what the energy and money columns are, at which price (None: not measured)


class DeclaredHost(_Part):
    """The study file's [host]."""

    gpu: str | None
    num_gpus: int | None
    interconnect: str | None


class RecordedRun(_Part):
    """What one trial's first bench run recorded it ran on (`results.RunContext`)."""

    candidate: str
    repeat: int
    run: str
    engine: str | None
    personality: str | None
    gpu: str | None
    num_gpus: int | None
    interconnect: str | None
    source: str | None
    layout: str | None  # "tp=8, pp=1"
    speed: int | float | None  # the simulator's clock speed (1: a real engine)
    time_base: str


class HostReport(_Part):
    """The host the study ran on: its bench runs' contexts first, the study file's [host] where they are
    silent; `this_machine` is the machine writing the report, which may be another one."""

    gpu: str | None
    num_gpus: int | None
    interconnect: str | None
    gpu_name: str | None
    gpu_memory_gb: int | float | None
    source: str | None
    declared: DeclaredHost
    recorded: list[RecordedRun]
    simulated: bool
    clock_speeds: list[float]
    engine_versions: list[str]
    # doctor's findings as `report.host.gather` (or the remote agent) returned them: its checks are the
    # doctor's own open JSON and a remote answer has keys a local one lacks (None: not gathered)
    this_machine: JsonObject | None


class ConfigRow(_Part):
    """One requested setting against what the engine's log says it ran with."""

    key: str
    requested: JsonValue
    effective: JsonValue
    evidence: str | None  # the log line that shows the effective value
    applied: bool
    confirmed: bool


class TrialReport(_Part):
    repeat: int
    status: str
    started_at: str | None
    finished_at: str | None
    url: str | None
    log_path: str | None
    engine_version: str | None
    ready_s: float | None
    error: str | None
    bench_runs: list[str]
    verify_ok: bool | None
    teardown: str | None
    levels_done: int
    startup: StartupPhases | None


class CandidateSettings(_Part):
    """What a candidate sets (`space.FIELDS`, then its args and env), as its stored spec holds them: a field
    left at 1 or unset is absent (tp is always there), so the settings column lists only what was chosen."""

    _omit_none = (
        "pp",
        "ep",
        "dp",
        "quantization",
        "kv_cache_dtype",
        "max_concurrency",
        "mem_fraction",
        "max_model_len",
        "args",
        "env",
    )

    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    dp: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_concurrency: int | None = None
    mem_fraction: int | float | None = None
    max_model_len: int | None = None
    args: list[str] | None = None
    env: dict[str, str] | None = None

    def shown(self) -> list[tuple[str, object]]:
        """(field, value) of every setting present but args and env, in order: the report's settings column."""
        return [
            (k, getattr(self, k))
            for k in type(self).model_fields
            if k not in ("args", "env") and (k == "tp" or getattr(self, k) is not None)
        ]


class NotApplied(_Part):
    """A setting the engine did not apply (`applied.Mismatch` as the trial stored it: its keys only)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    _as_given = True

    key: str | None = None
    requested: JsonValue = None
    effective: JsonValue = None  # what the engine runs instead
    evidence: str | None = None  # the log line that shows it


class AnomalyNote(_Part):
    """An anomaly at one level (`analyze.Anomaly` as the outcome stored it)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    _as_given = True

    level: int | float
    kind: str  # throughput_collapse | power_drop | utilization_drop | error_rate | server_died
    detail: str


class SloMiss(_Part):
    """The SLO limits one level missed, in words."""

    level: int | float
    reasons: list[str]


class CandidateScore(_Part):
    """`analyze.Score` as tune stored it (its keys only, in its order), and, where no level met the SLOs, the
    report's reading of why: `why` in words and `slo_misses` per level."""

    model_config = ConfigDict(extra="allow", frozen=True)  # a later Score's fields pass through as stored
    _as_given = True

    label: str | None = None
    status: str | None = None
    value: int | float | None = None  # the objective at the best level meeting every SLO
    half_width: int | float | None = None  # its 95 % confidence half-width (repeats ≥ 2)
    level: int | float | None = None  # that level
    why: str | None = None
    levels_meeting_slo: list[int | float] | None = None
    slo_misses: list[SloMiss] | None = None


class CandidateReport(_Part):
    """One candidate: its settings, its outcome and why, requested against effective, its levels, trials."""

    label: str
    idx: int
    status: str
    outcome: str  # the status in words
    baseline: bool
    winner: bool
    settings: CandidateSettings
    predicted: JsonObject | None  # the model's prediction as tune stored it
    config: list[ConfigRow]
    not_applied: list[NotApplied]
    diagnosis: JsonObject | None  # logs.diagnose's verdict as the trial stored it
    anomalies: list[AnomalyNote]
    score: CandidateScore | None
    # the stored level digests (`results.LevelSummary.digest`, combined over repeats by analyze): open
    # JSON whose keys grow with the digest (energy, cost, ci)
    levels: list[JsonObject]
    command: str | None  # the last launch as one shell line
    trials: list[TrialReport]

    def ranked_level(self) -> float | None:
        """The level its score was taken at (None: no score)."""
        lv = self.score.level if self.score else None
        return None if lv is None else float(lv)

    @property
    def measured(self) -> bool:
        return self.status in ("measured", "anomalous")


class StoredRanking(_Part):
    """`analyze.Ranking` as tune stored it (`servelab runs STUDY --json`): its keys only, in its order."""

    model_config = ConfigDict(extra="allow", frozen=True)
    _as_given = True

    objective: str | None = None
    ranked: list[CandidateScore] | None = None
    winner: str | None = None
    runner_up: str | None = None
    margin: int | float | None = None  # winner − runner-up, in the objective's unit
    margin_pct: int | float | None = None
    significant: bool | None = None  # the margin exceeds the noise (None: cannot be judged)
    verdict: str | None = None
    # how the noise was judged: each method writes its own keys (analyze.rank: a bootstrap's interval, the
    # t-interval's half-width, capacity brackets; guard_node_spread adds node_spread), so it stays open
    noise: JsonObject | None = None


class SloLimit(_Part):
    metric: str
    stat: str
    limit: float


class CurvePoint(_Part):
    """One measured level on the TPOT-against-throughput chart."""

    label: str
    level: int | float
    output_throughput: int | float  # tok/s
    tpot_ms_p50: int | float
    meets_slo: bool


class Curves(_Part):
    """TPOT p50 against output throughput (`front`: of the levels that meet every SLO), and every level per
    GPU against per user (`per_gpu`)."""

    points: list[CurvePoint]
    front: list[CurvePoint]
    per_gpu: list[ParetoPoint]


class ExplainLevel(_Part):
    """`servelab explain` at one level: measured beside predicted."""

    mode: str
    level: int | float
    concurrency: int
    measured: dict[str, float | None]
    predicted: dict[str, float | None]
    error_pct: dict[str, float | None]
    attribution: dict[str, float]
    gap: str


class DecodeView(_Part):
    """The predicted decode step at the study's main level, split into its parts, beside the measured TPOT."""

    mode: str
    level: int | float
    unit: str
    concurrency: int
    predicted_step_ms: float | None
    predicted_tpot_ms: float | None
    predicted_breakdown_ms: dict[str, float]
    measured_tpot_ms: int | float | None
    bottleneck: str | None
    allreduce_share: float | None


class Explained(_Part):
    """The model set beside the winner (or the baseline)."""

    available: Literal[True] = True
    label: str
    same_model: bool  # the engine is the simulator, which times requests with this same model
    caveat: str | None
    largest_gap: str
    levels: list[ExplainLevel]
    decode: DecodeView


class NoExplain(_Part):
    """Why there is no model beside the measurements."""

    available: Literal[False] = False
    note: str


class PlanView(_Part):
    """The stored plan of the study (`servelab plan --plan UID`)."""

    _omit_none = ("name",)

    available: bool
    note: str
    name: str | None = None  # absent when the plan could not be read
    items: list[JsonObject]  # the plan module's items (`plan.items.Item.to_dict`), its own JSON


class StudyReport(_Part):
    """A study's findings: everything every view of the report shows, built once (`report.data.build`)."""

    format: Literal["servelab-report/1"] = FORMAT
    study: StudyInfo
    host: HostReport
    candidates: list[CandidateReport]
    slo: list[SloLimit]
    max_startup_s: float | None
    pareto: Curves
    # output tok/s per GPU against tok/s per user: the levels no other level beats on both
    pareto_front: list[ParetoPoint]
    # J per output token against output tok/s (every level with energy), and its front
    energy_points: list[EnergyPoint]
    energy_front: list[EnergyPoint]
    ranking: StoredRanking | None
    search: JsonObject | None  # the search driver's stored summary (search.driver), its own JSON
    winner: Winner
    top: list[TopLine]  # one line per declared objective, then the front's members (report.top)
    explain: Explained | NoExplain
    # done / not_applied / failed / not_yet_done (and pruned, for a search): candidate labels
    plan_state: dict[str, list[str]]
    plan: PlanView

    def to_json(self) -> JsonObject:
        """The published JSON (`servelab report --json`, the UI's /api/study, MCP)."""
        return self.model_dump(mode="json")

    def redacted(self) -> StudyReport:
        """The same report with every secret masked (`redact.redact`): what the files and JSON publish."""
        return StudyReport.model_validate(redact(self.to_json()))

    def candidate(self, label: str | None) -> CandidateReport | None:
        return next((c for c in self.candidates if label is not None and c.label == label), None)

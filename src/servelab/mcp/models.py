"""The typed results of the MCP tools: each is the `--json` document of the command the tool runs.

Where that document comes from a typed model of servelab, the tool's result is that model: the run
(`results.Run.to_json()`: `RunView`, built from results.py's own models), or a pydantic mirror of a
dataclass with its real fields (`Prediction`, `Explanation`, `Diagnosis`, `EffectiveConfig`, the plan's
`Item` and `Finding`), every key required and no other allowed (`extra="forbid"`), so an output schema
checks the fields and a renamed or missing one fails (tests/unit/mcp_tools/test_mcp_views.py holds each
mirror to its dataclass). Where the command builds a free-form dict (`status`, `doctor`, a study's
report, `deploy`), its main keys are declared and the rest passes through (`extra="allow"`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from servelab.jsontypes import JsonObject
from servelab.results import (
    CapacityResult,
    LevelSeries,
    LevelSummary,
    RunContext,
    Saturation,
    WorkloadInfo,
)


class View(BaseModel):
    """A command's `--json` document built as a free-form dict: its documented keys typed, the rest
    passed through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Doc(BaseModel):
    """A document whose every key is known: each declared, none other allowed."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# -- observe (free-form dicts in servelab: status.observe, host.doctor) ---------------------------
class StatusView(View):
    """`servelab status --json` (docs/cli/status.md)."""

    host: JsonObject = Field(description="Which machine was observed (hostname, via, target).")
    verdict: str = Field(description="One line: what is true right now.")
    servers: list[JsonObject] = Field(description="Each server probed: url, up, engine, effective, ...")
    gpus: JsonObject
    findings: list[JsonObject] = Field(description="What is wrong, its evidence and what to do next.")


class DoctorCheck(View):
    name: str
    status: str = Field(description="ok | warn | fail | skip")
    evidence: str
    fix: str


class DoctorView(View):
    """`servelab doctor --json`."""

    host: JsonObject
    gpus: JsonObject
    checks: list[DoctorCheck]
    worst: str = Field(description="The worst check status: ok | warn | fail.")


# -- logs (engines/base.py: EffectiveConfig, Diagnosis) -------------------------------------------
class LogsParseView(Doc):
    """`servelab logs parse --json`: `EffectiveConfig`, the configuration a server log shows."""

    effective: JsonObject = Field(description="Each key the engine runs with, as the log shows it.")
    evidence: dict[str, str] = Field(description="For each key, the log line (or endpoint) that shows it.")


class DiagnosisSetting(Doc):
    """`Setting`: the server setting that most likely caused the failure, from the log's own figures."""

    name: str = Field(
        description="The setting, as `servelab logs parse` names it (max_model_len, mem_fraction, cuda_graph)."
    )
    value: int | float | bool | str = Field(description="The value to try.")
    reason: str = Field(description="The log's figures it comes from.")
    tried: int | float | bool | str | None = Field(
        default=None, description="The value the failed server ran with, when the log says."
    )
    flags: dict[str, int | float | bool | str] = Field(
        default={},
        description="The engine flags (as a study's search space names them) that give the value, when the "
        "setting is not a candidate field of its own name (cuda_graph false: enforce_eager, disable_cuda_graph).",
    )


class DiagnosisView(Doc):
    """`servelab logs diagnose --json`: `Diagnosis`, the failure class from the signatures knowledge base."""

    failure_class: str = Field(
        alias="class", description="The failure class (`unknown`: no signature matched, `healthy`: none)."
    )
    evidence: str = Field(description="The log line that matched.")
    advice: str = Field(description="What to do about it.")
    fatal: bool = Field(description="The server that printed it will not become ready (or serve again).")
    tail: list[str] = Field(
        default=[], description="The last lines that matter, when nothing matched (else empty)."
    )
    setting: DiagnosisSetting | None = Field(
        default=None, description="The setting to change and a value to try, when the log's figures say."
    )


# -- plan (plan/items.py: Item, plan/checks.py: Finding) -------------------------------------------
class PlanItem(Doc):
    """`plan.Item.to_dict()`: one item of a plan."""

    id: str
    content: str
    status: str = Field(description="pending | in_progress | completed | cancelled | blocked")
    priority: str = Field(description="high | medium | low")
    worker: str | None = Field(description="Who claimed it.")
    depends_on: list[str] = Field(description="Ids of the items it waits for.")
    notes: list[str]
    binding: JsonObject | None = Field(
        description="The experiment it is bound to: study, candidate, requested, predicted, url, unit."
    )
    evidence: list[JsonObject] = Field(description="Run records, newest last.")
    extra: JsonObject = Field(description="todowrite keys servelab does not use, kept verbatim.")
    created_at: str
    updated_at: str


class PlanView(Doc):
    """`servelab plan show --json`."""

    plan: str = Field(description="`workspace` or a study's uid.")
    items: list[PlanItem]
    counts: dict[str, int] = Field(description="Items per status.")


class Todo(BaseModel):
    """One entry of todowrite's list (the agent's own todo format); keys servelab does not use pass
    through, in and out."""

    model_config = ConfigDict(extra="allow")

    id: str | None = None
    content: str
    status: str = Field(description="pending | in_progress | completed | cancelled")
    priority: str = "medium"


class Todos(BaseModel):
    """todowrite's own document: `{"todos": [...]}`, in and out."""

    todos: list[Todo]


class PlanUpdateView(Doc):
    """The plan after the merge, as todowrite's list, and what the merge did (`servelab plan import`)."""

    todos: list[Todo]
    plan: str
    added: list[str]
    updated: list[str]
    unchanged: list[str]
    missing: list[str] = Field(description="Open items the list did not mention (kept).")
    pruned: list[str] = Field(description="Items cancelled because prune was asked.")


class PlanFinding(Doc):
    """`plan.Finding.to_dict()`: an open item the observed state contradicts."""

    item: str
    kind: str = Field(description="server_down, server_healthy, service_healthy, config_mismatch, ...")
    severity: str = Field(description="warning | info")
    message: str
    evidence: JsonObject = Field(description="What was observed (the server, the service, ...).")


class Observed(Doc):
    servers: int
    services: int
    host: str | None = Field(default=None, description="The SSH target, when observed over SSH.")
    hostname: str | None = None


class PlanCheckView(Doc):
    """`servelab plan check --json`: every open item held against the observed state."""

    plan: str
    checked: int = Field(description="Open items checked.")
    observed: Observed
    findings: list[PlanFinding]


# -- predict (model/predict.py: Prediction, LayoutResult; model/explain.py: Explanation) -------------
class PredictionView(Doc):
    """`servelab predict --json`: `model.predict.Prediction` (docs/cli/predict.md), every field."""

    feasible: bool = Field(description="It fits in memory (else `reason` says why not).")
    reason: str | None
    model: str
    gpu: str
    num_gpus: int
    interconnect: str
    layout: dict[str, int] = Field(description="tp, pp, ep, dp_attention.")
    quant: JsonObject = Field(description="The weight, KV cache and activation formats.")
    workload: JsonObject = Field(description="isl, osl, concurrency, ...")
    tpot_ms: float | None = Field(description="Time per output token, ms.")
    ttft_ms: float | None = Field(description="Time to first token, ms.")
    output_throughput: float | None = Field(description="Output tokens/s, every replica.")
    per_user_tok_s: float | None
    decode_step_ms: float | None
    decode_breakdown_ms: dict[str, float] = Field(description="Where a decode step goes, ms.")
    prefill_ms: float | None
    prefill_breakdown_ms: dict[str, float]
    prefill_stall_ms_per_token: float | None
    allreduce_share: float | None
    allreduces_per_step: int
    allreduce_us_each: float | None
    allreduce_latency_us_each: float | None
    allreduce_bytes_each: float | None
    decode_compute_work_ms: float | None
    bottleneck: str | None
    memory_gb_per_gpu: dict[str, float]
    kv_cache_tokens: int
    max_concurrency: int
    running_concurrency: int
    single_stream_ceiling_tok_s: float | None
    single_stream_tok_s: float | None
    replicas: int = Field(description="Copies of the layout on the host.")
    warnings: list[str]
    sources: dict[str, str] = Field(
        description="Where each decode-step term comes from: `formula`, or the measured table read."
    )


class SweepPoint(Doc):
    concurrency: int
    feasible: bool
    reason: str | None
    tpot_ms: float | None
    ttft_ms: float | None
    output_throughput: float | None
    per_user_tok_s: float | None


class SweepView(Doc):
    """`servelab predict --sweep LEVELS --json`: the prediction at each concurrency."""

    model: str
    layout: dict[str, int]
    points: list[SweepPoint]


class LayoutRow(Doc):
    """One `model.predict.LayoutResult`."""

    label: str
    rank: int | None = Field(description="1 is the best; None: it does not fit or misses a limit.")
    layout: dict[str, int]
    verdict: str = Field(description="Why it wins or loses.")
    same_as: list[str] = Field(description="Layouts folded into this row (identical predictions).")
    study_candidates: list[str] = Field(description="The study's candidates that run this layout.")
    prediction: PredictionView


class LayoutsView(Doc):
    """`servelab predict --compare-layouts --json`: every layout ranked for this host."""

    model: str
    gpu: str
    num_gpus: int
    workload: dict[str, int] = Field(description="isl, osl, concurrency.")
    concurrency_source: str = Field(description="--concurrency | study | default")
    study: str | None
    ep_note: str | None
    layouts: list[LayoutRow]


class LevelComparison(Doc):
    """One `model.explain.LevelComparison`: a measured level beside the prediction."""

    concurrency: int = Field(description="Requests in flight (a rate or trace level: by Little's law).")
    measured: dict[str, float | None] = Field(description="tpot_ms, ttft_ms, output_throughput (p50s).")
    predicted: dict[str, float | None]
    error_pct: dict[str, float | None] = Field(description="(predicted - measured) / measured, %.")
    attribution: dict[str, float] = Field(description="The TPOT split: weights+KV+compute vs the rest, ms.")
    largest_gap: str
    sources: dict[str, str] = Field(
        description="Where each decode-step term comes from: `formula`, or the measured table read."
    )
    mode: str = Field(description="The level's load kind: concurrency | rate | trace.")
    level: float = Field(description="The level as run: in flight, req/s, or a trace's time scale.")


class ExplainView(Doc):
    """`servelab explain RUN --json`: `model.explain.Explanation` for a stored run, with the setup."""

    run: str
    time_base: str = Field(description="The time base of the measured figures.")
    model: str
    gpu: str
    num_gpus: int
    layout: dict[str, int] = Field(description="tp, pp, ep, dp_attention.")
    levels: list[LevelComparison]
    largest_gap: str = Field(description="The largest gap of any level, in words.")


# -- runs (results.py: Run, Level, LevelSummary, ...) ---------------------------------------------
class LevelSummaryView(LevelSummary):
    """`LevelSummary` (docs/metrics.md) and the same figures in `vllm bench serve`'s names."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    vllm_names: JsonObject = Field(
        alias="vllm_compatible", description="The same figures in `vllm bench serve`'s result names."
    )


class LevelView(Doc):
    """`results.Level.to_json()`: one load level of a run, in the run's time base."""

    index: int
    label: str
    status: str
    summary: LevelSummaryView
    wall_clock_summary: LevelSummary | None = Field(
        default=None, description="The client's own clock, when the run's time base is a simulated GPU's."
    )
    server_metrics: JsonObject
    client: JsonObject
    saturation: Saturation | None
    series: LevelSeries


class RunView(Doc):
    """`servelab runs show RUN --json`: `results.Run.to_json()`, one stored run with every level, its
    figures in the time base it names (the simulated GPU's on the simulator)."""

    run: str = Field(description="The run's uid (b-…): `runs_show`, `explain` and `report` take it.")
    status: str
    url: str
    model: str
    api: str
    engine: str | None
    created_at: str
    finished_at: str | None
    context: RunContext
    time_base: str
    workload: WorkloadInfo
    capabilities: JsonObject
    config: JsonObject = Field(description="The bench options, as given (secrets masked).")
    warnings: list[str]
    levels: list[LevelView]
    capacity: CapacityResult | None


class BenchView(RunView):
    """`servelab bench --json` (docs/cli/bench.md): the run it stored, as `runs_show` shows it."""


# -- report and deploy (free-form dicts) ----------------------------------------------------------
class ParetoPointView(Doc):
    """`report.pareto.ParetoPoint`: one measured level on the output tok/s per GPU against tok/s per user
    chart."""

    candidate: str = Field(description="The study's candidate (or the bench run's uid).")
    level: float
    output_tps_per_gpu: float = Field(description="Output tokens/s divided by the GPUs its server held.")
    tps_per_user: float = Field(description="Tokens/s one user sees: 1000 / the median TPOT in ms.")
    gpus: int = Field(description="The GPUs of its layout, tp × pp × dp.")


class EnergyPointView(Doc):
    """`report.pareto.EnergyPoint`: one measured level on the J per output token against output tok/s
    chart."""

    candidate: str
    level: float
    output_throughput: float = Field(description="Output tokens/s.")
    j_per_output_token: float = Field(description="GPU energy per output token, joules.")


class ReportView(View):
    """`servelab report STUDY --json` with the files written (docs/cli/report.md)."""

    written: list[str] = Field(description="Paths of the files the report wrote.")
    pareto_front: list[ParetoPointView] = Field(
        description="The levels no other beats on both output tok/s per GPU and tok/s per user, in the "
        "order of tok/s per user."
    )
    energy_front: list[EnergyPointView] = Field(
        default_factory=list,
        description="A study's levels no other beats on both output tok/s and J per output token (a "
        "bench run's report has none).",
    )


class DeployView(View):
    """`servelab deploy RUN --dry-run --json` (docs/cli/deploy.md): the unit (or manifest) text and the
    steps an install would take; `install` is set only when the server allows installing."""

    name: str
    target: str = Field(description="systemd | compose | kubernetes")
    file: str = Field(description="Where the file goes (a dry run writes nothing).")
    content: str = Field(description="The unit (or Compose / Kubernetes) text, from the run's exact argv.")
    dry_run: bool
    actions: list[str] = Field(description="What deploying does, step by step.")
    install: JsonObject | None = None


# -- studies (this server's own) ------------------------------------------------------------------
class TuneStarted(Doc):
    """A study started in the background: poll `tune_progress` with `study`."""

    study: str = Field(description="The study's uid (s-…).")
    name: str
    pid: int = Field(description="The `servelab tune` process that drives it (holds its lease).")
    log: str = Field(description="Its progress lines (stderr).")
    source: str = Field(description="The study file, absolute.")


class Finding(Doc):
    candidate: str
    kind: str = Field(description="not_applied, throughput_collapse, stopped_early, failed, ...")
    detail: str


class TrialProgress(Doc):
    candidate: str
    repeat: int
    status: str = Field(description="launching, verifying, benchmarking, measured, not_applied, failed, ...")
    levels_done: list[float]
    started_at: str | None


class LevelFigures(Doc):
    """One level a trial measured (its stored digest, `results.LevelSummary.digest`): its output throughput
    and what it cost (servelab.energy; None where it was not measured: no power samples, no tokens)."""

    repeat: int
    level: float
    output_throughput: float | None = Field(description="Output tokens/s.")
    energy_j: float | None = Field(description="The GPUs' energy over the level's window, joules.")
    j_per_output_token: float | None = Field(description="Joules per output token.")
    j_per_output_token_above_idle: float | None = Field(
        description="Joules per output token above the GPUs' idle power."
    )
    usd_per_m_output_tokens: float | None = Field(description="Dollars per million output tokens.")


class CandidateProgress(Doc):
    label: str
    status: str
    trials: int
    levels_done: int
    levels: list[LevelFigures] = Field(description="Every level its trials measured so far, in order.")


class Driver(Doc):
    pid: int
    host: str
    alive: bool


class TuneProgress(Doc):
    """Where a study stands, read from the store: what runs now, levels done, ETA, findings so far."""

    study: str
    name: str
    status: str = Field(description="running | completed | interrupted | failed")
    driver: Driver | None = Field(description="Who holds the study's lease (None: nobody).")
    running: list[TrialProgress] = Field(description="Trials under way now.")
    candidates: list[CandidateProgress]
    trials_done: int
    trials_total: int | None = Field(description="candidates × repeats (None: an adaptive search).")
    levels_done: int
    levels_total: int | None
    elapsed_s: float
    eta_s: float | None = Field(description="Seconds left at the pace so far (None: nothing finished yet).")
    findings: list[Finding]
    exit_code: int | None = Field(
        default=None, description="The driver's exit status, once a driver this server started has ended."
    )


class TuneStopped(Doc):
    """`tune_stop`: the driver was sent SIGINT and tore its servers down; what finished is stored."""

    study: str
    pid: int
    exit_code: int | None = Field(description="130 once it stopped cleanly; None if still stopping.")
    status: str = Field(description="The study's status in the store afterwards.")

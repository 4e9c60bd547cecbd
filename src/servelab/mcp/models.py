"""The typed results of the MCP tools: each is the JSON view of the command the tool runs (the keys
docs/cli/*.md document), its main keys declared so an agent reads a schema, the rest kept as they are
(`extra="allow"`): the command's view stays the one source of its shape."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class View(BaseModel):
    """A command's `--json` document, its documented keys typed and the rest passed through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class StatusView(View):
    """`servelab status --json` (docs/cli/status.md)."""

    host: dict[str, Any] = Field(description="Which machine was observed (hostname, via, target).")
    verdict: str = Field(description="One line: what is true right now.")
    servers: list[dict[str, Any]] = Field(description="Each server probed: url, up, engine, effective, ...")
    gpus: dict[str, Any]
    findings: list[dict[str, Any]] = Field(description="What is wrong, its evidence and what to do next.")


class DoctorCheck(View):
    name: str
    status: str = Field(description="ok | warn | fail | skip")
    evidence: str
    fix: str


class DoctorView(View):
    """`servelab doctor --json`."""

    host: dict[str, Any]
    gpus: dict[str, Any]
    checks: list[DoctorCheck]
    worst: str = Field(description="The worst check status: ok | warn | fail.")


class LogsParseView(View):
    """`servelab logs parse --json`: the configuration a server log shows, with the line for each key."""

    effective: dict[str, Any]
    evidence: dict[str, Any]


class DiagnosisView(View):
    """`servelab logs diagnose --json`: the failure class (signatures knowledge base), evidence, advice."""

    failure_class: str = Field(alias="class")
    evidence: list[str] | str | None = None
    advice: str | None = None
    fatal: bool | None = None


class PlanItem(View):
    id: str
    content: str
    status: str = Field(description="pending | in_progress | completed | cancelled | blocked")
    priority: str = Field(description="high | medium | low")


class PlanView(View):
    """`servelab plan show --json`."""

    plan: str = Field(description="`workspace` or a study's uid.")
    items: list[PlanItem]
    counts: dict[str, int]


class Todo(BaseModel):
    """One entry of todowrite's list (the agent's own todo format)."""

    model_config = ConfigDict(extra="allow")

    id: str | None = None
    content: str
    status: str = Field(description="pending | in_progress | completed | cancelled")
    priority: str = "medium"


class Todos(BaseModel):
    """todowrite's own document: `{"todos": [...]}`, in and out."""

    todos: list[Todo]


class PlanUpdateView(Todos):
    """The plan after the merge, as todowrite's list, and what the merge did (`servelab plan import`)."""

    plan: str
    added: list[str] = []
    updated: list[str] = []
    unchanged: list[str] = []
    missing: list[str] = Field(default=[], description="Open items the list did not mention (kept).")
    pruned: list[str] = Field(default=[], description="Items cancelled because prune was asked.")


class PlanFinding(View):
    item: str
    kind: str = Field(description="server_down, server_healthy, service_healthy, config_mismatch, ...")
    severity: str
    message: str
    evidence: dict[str, Any] = {}


class PlanCheckView(View):
    """`servelab plan check --json`: every open item held against the observed state."""

    plan: str
    checked: int
    observed: dict[str, Any]
    findings: list[PlanFinding]


class PredictionView(View):
    """`servelab predict --json` (docs/cli/predict.md)."""

    feasible: bool | None = None
    tpot_ms: float | None = None
    ttft_ms: float | None = None
    output_throughput: float | None = None


class LayoutsView(View):
    """`servelab predict --compare-layouts --json`: every layout ranked for this host."""

    model: str
    gpu: str
    num_gpus: int
    workload: dict[str, Any]
    layouts: list[dict[str, Any]]


class ExplainView(View):
    """`servelab explain RUN --json`: where a measured run's time goes against the model."""


class RunView(View):
    """`servelab runs show RUN --json`: `results.Run.to_json()`, one stored run with every level, its
    figures in the time base it names (the simulated GPU's on the simulator)."""

    run: str = Field(description="The run's uid (b-…): `runs_show`, `explain` and `report` take it.")
    status: str
    url: str
    model: str
    engine: str | None = None
    time_base: str | None = None
    levels: list[dict[str, Any]] = Field(
        description="Each load level: its digest (throughput, TTFT, TPOT, …)."
    )


class BenchView(RunView):
    """`servelab bench --json` (docs/cli/bench.md): the run it stored, as `runs_show` shows it."""


class ReportView(View):
    """`servelab report STUDY --json` with the files written."""

    written: list[str] = Field(description="Paths of the files the report wrote.")


class DeployView(View):
    """`servelab deploy RUN --dry-run --json` (docs/cli/deploy.md): the unit (or manifest) text and the
    steps an install would take; `install` is set only when the server allows installing."""

    name: str
    target: str = Field(description="systemd | compose | kubernetes")
    file: str = Field(description="Where the file goes (a dry run writes nothing).")
    content: str = Field(description="The unit (or Compose / Kubernetes) text, from the run's exact argv.")
    dry_run: bool
    actions: list[str] = Field(description="What deploying does, step by step.")
    install: dict[str, Any] | None = None


class TuneStarted(BaseModel):
    """A study started in the background: poll `tune_progress` with `study`."""

    study: str = Field(description="The study's uid (s-…).")
    name: str
    pid: int = Field(description="The `servelab tune` process that drives it (holds its lease).")
    log: str = Field(description="Its progress lines (stderr).")
    source: str = Field(description="The study file, absolute.")


class Finding(BaseModel):
    candidate: str
    kind: str = Field(description="not_applied, throughput_collapse, stopped_early, failed, ...")
    detail: str


class TrialProgress(BaseModel):
    candidate: str
    repeat: int
    status: str = Field(description="launching, verifying, benchmarking, measured, not_applied, failed, ...")
    levels_done: list[float]
    started_at: str | None


class CandidateProgress(BaseModel):
    label: str
    status: str
    trials: int
    levels_done: int


class Driver(BaseModel):
    pid: int
    host: str
    alive: bool


class TuneProgress(BaseModel):
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


class TuneStopped(BaseModel):
    """`tune_stop`: the driver was sent SIGINT and tore its servers down; what finished is stored."""

    study: str
    pid: int
    exit_code: int | None = Field(description="130 once it stopped cleanly; None if still stopping.")
    status: str = Field(description="The study's status in the store afterwards.")

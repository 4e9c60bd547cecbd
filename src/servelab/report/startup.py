"""The start-up table (issue 31): each trial's launch, phase by phase, for `runs study`, the Markdown and
HTML reports. Rows are read from a trial as `runs study --json` and the report model carry it (its
`startup`: a `servelab.startup.StartupPhases` dumped), parsed back here once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.startup import PHASE_TITLES, PHASES, StartupPhases

if TYPE_CHECKING:
    from servelab.report.model import CandidateReport

HEAD = ("candidate", "trial", "cache", *(PHASE_TITLES[p] for p in PHASES), "ready")
NOTE = (
    "Start-up: seconds from launch when each phase's log line was seen; in brackets the engine's own "
    "figure for the phase; cache: the compile cache at launch (cold: empty, warm: filled)."
)


@dataclass(frozen=True)
class StartupRow:
    label: str
    repeat: int  # the trial, counted from 1 (as `t1`, `t2` in the plan)
    phases: StartupPhases

    def cells(self) -> list[str]:
        """The row's cells after candidate and trial: cache, one per phase, ready."""
        out: list[str] = [self.phases.cache]
        for name in PHASES:
            p = self.phases.phase(name)
            if p is None:
                out.append("-")
                continue
            at = "" if p.at_s is None else f"{p.at_s:.1f}"
            took = "" if p.took_s is None else f"({p.took_s:.1f})"
            out.append(" ".join(x for x in (at, took) if x) or "seen")
        out.append("-" if self.phases.total_s is None else f"{self.phases.total_s:.1f}")
        return out

    def sentence(self, label: str | None = None) -> str:
        """The row as one line: `tp1 #1 (cold): weights loaded 4.1 (3.6) · … · ready 51.3`."""
        cells = self.cells()
        parts = [f"{PHASE_TITLES[n]} {c}" for n, c in zip(PHASES, cells[1:-1], strict=True) if c != "-"]
        parts.append(f"ready {cells[-1]}")
        return f"{label or self.label} #{self.repeat} ({cells[0]}): " + " · ".join(parts)


def startup_rows(cands: Iterable[Mapping[str, object]]) -> list[StartupRow]:
    """One row per trial that recorded its start-up, candidates in order."""
    rows = []
    for c in cands:
        trials = c.get("trials")
        if not isinstance(trials, Sequence):
            continue
        for t in trials:
            if isinstance(t, Mapping) and t.get("startup"):
                phases = StartupPhases.model_validate(t["startup"])
                rows.append(StartupRow(str(c["label"]), int(str(t.get("repeat", 0))) + 1, phases))
    return rows


def report_rows(cands: Iterable[CandidateReport]) -> list[StartupRow]:
    """`startup_rows` of the study report's candidates (`report.model`), whose trials hold the phases typed."""
    return [StartupRow(c.label, t.repeat + 1, t.startup) for c in cands for t in c.trials if t.startup]

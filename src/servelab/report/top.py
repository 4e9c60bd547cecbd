"""The report's top, each thing said once: one line per objective the study declared (the ranked one with
its winner, margin and noise; a search's second one with its best candidate), then the Pareto front's
members. Built once into the report model (`report.data`, its "top"), which Markdown, HTML and the UI show
with one wording.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from pydantic import BaseModel, ConfigDict

from servelab.objectives import objective as objective_type
from servelab.report.pareto import ParetoPoint, members_text
from servelab.report.text import fmt, fmt_level

FRONT_HEAD = "Pareto front (output tok/s per GPU against tok/s per user)"


class Winner(BaseModel):
    """The ranked objective's outcome as the report model holds it ("winner"). Figures keep the number type
    the store held them in (the published JSON is unchanged by this model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str | None
    runner_up: str | None
    runner_up_value: int | float | None
    node_spread: str | None  # on a cluster: the margin against the baseline's node-to-node spread, in words
    margin: int | float | None
    margin_pct: int | float | None
    significant: bool | None
    noise: str
    noise_method: str | None
    objective: str | None
    value: int | float | None
    half_width: int | float | None
    level: int | float | None
    why: str | None


@dataclass(frozen=True)
class TopLine:
    """One line: `head` (an objective and its direction, or the Pareto front), `best` (the candidate to
    stress; None: none) and the `rest` of the sentence; `winner`: `best` is the study's winner."""

    head: str
    best: str | None
    rest: str
    winner: bool = False

    def to_json(self) -> dict[str, str | bool | None]:
        return asdict(self)


def direction(name: str) -> str:
    """ " (higher is better)" or " (lower is better)"; "" for an objective this servelab does not know."""
    try:
        return " (higher is better)" if objective_type(name).direction == "max" else " (lower is better)"
    except ValueError:  # a study stored by another version
        return ""


def _pm(value: float | None, half: float | None) -> str:
    return fmt(value) + (f" ± {fmt(half)}" if half is not None else "")


def ranked_line(name: str, win: Winner) -> TopLine:
    head = f"{name}{direction(name)}"
    if not win.label:
        return TopLine(head, None, win.why or "no candidate met every SLO")
    rest = f", {_pm(win.value, win.half_width)} at level {fmt_level(win.level)}"
    if win.runner_up:
        pct = f" ({win.margin_pct:+.1f} %)" if win.margin_pct is not None else ""
        rest += (
            f"; {fmt(win.margin)}{pct} ahead of the runner-up {win.runner_up} "
            f"({fmt(win.runner_up_value)}); the margin {win.noise}"
        )
    else:
        rest += "; the only candidate that meets every SLO"
    if win.node_spread:
        rest += f"; {win.node_spread}"
    return TopLine(head, win.label, rest + ".", winner=True)


def other_line(name: str, at: Sequence[tuple[str, float, float]]) -> TopLine:
    """A second objective: the best of (candidate, level, value), each candidate at the level it is ranked at."""
    head = f"{name}{direction(name)}"
    if not at:
        return TopLine(head, None, "not measured at any candidate's ranked level.")
    low = direction(name) == " (lower is better)"
    label, level, value = (min if low else max)(at, key=lambda t: (t[2], t[0]))
    return TopLine(
        head,
        label,
        f", {fmt(value, 2)} at level {fmt_level(level)} (each candidate at the level it is ranked at).",
    )


def top_lines(
    declared: Sequence[str | None],
    win: Winner,
    others: Mapping[str, Sequence[tuple[str, float, float]]],
    front: Sequence[ParetoPoint],
) -> list[TopLine]:
    """The ranked objective first (the winner's), every other declared one after it (`others`: its
    (candidate, level, value) at each candidate's ranked level), then the Pareto front's members."""
    ranked = win.objective or (declared[0] if declared else None) or ""
    out = [ranked_line(ranked, win)]
    out += [other_line(o, others.get(o, ())) for o in declared if o and o != ranked]
    out.append(TopLine(FRONT_HEAD, None, members_text(front) + "."))
    return out

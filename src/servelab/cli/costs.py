"""What a level costs, on the command line: `--gpu-hour-usd` / `--kwh-usd` (bench and tune) and the energy
and money table under a run's levels (`servelab bench`, `servelab runs show`). The figures: servelab.energy,
docs/metrics.md "Energy" and "Money"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from rich.table import Table

from servelab.cli.output import stdout
from servelab.results import LevelSummary

F = TypeVar("F", bound=Callable[..., Any])


def price_options(fn: F) -> F:
    """`--gpu-hour-usd` and `--kwh-usd`: the price the `cost` figures use (default: the study's [cost],
    else the GPU kind's dated catalog price, marked as a default)."""
    fn = click.option(
        "--kwh-usd",
        type=click.FloatRange(min=0, min_open=True),
        help="Electricity, US dollars per kWh: adds the energy's own cost per M output tokens.",
    )(fn)
    return click.option(
        "--gpu-hour-usd",
        type=click.FloatRange(min=0, min_open=True),
        help="Price of one GPU for one hour, US dollars (default: the GPU kind's catalog price).",
    )(fn)


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render_costs(levels: Sequence[tuple[str, LevelSummary]]) -> None:
    """Per level (its label and summary): J per output token (and above the idle baseline), J per request,
    output tokens per J, $ per million output tokens; then where the power and the price came from.
    Nothing when no level has either."""
    if not any(s.energy or s.cost for _, s in levels):
        return
    table = Table(title="energy and cost per level", title_justify="left")
    for col in ("level", "J/out tok", "J/out tok above idle", "J/req", "out tok/J", "$/M out tok"):
        table.add_column(col, justify="left" if col == "level" else "right")
    for label, s in levels:
        e = s.energy
        table.add_row(
            label,
            _f(e.j_per_output_token if e else None, ",.3g"),
            _f(e.j_per_output_token_above_idle if e else None, ",.3g"),
            _f(e.j_per_request if e else None, ",.4g"),
            _f(e.output_tokens_per_j if e else None, ",.3g"),
            _f(s.cost.usd_per_m_output_tokens if s.cost else None, ",.3f"),
        )
    stdout.print(table)
    energy = next((s.energy for _, s in levels if s.energy), None)
    if energy:
        idle = f"; idle {energy.idle_w:,.0f} W before the first level" if energy.idle_w is not None else ""
        stdout.print(
            f"GPU power integrated over each level (trapezoids): {energy.samples} samples "
            f"every {_f(energy.interval_s, '.2g')} s over {energy.gpus or '?'} GPUs{idle}",
            markup=False,
        )
    cost = next((s.cost for _, s in levels if s.cost), None)
    if cost:
        default = " — a default: give --gpu-hour-usd" if cost.is_default else ""
        kwh = f"; electricity ${cost.kwh_usd:g}/kWh" if cost.kwh_usd else ""
        stdout.print(
            f"cost at ${cost.gpu_hour_usd:g}/GPU-hour × {cost.gpus} GPUs ({cost.price_source}{default}){kwh}",
            markup=False,
        )

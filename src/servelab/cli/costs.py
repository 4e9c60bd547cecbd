"""What a level costs, on the command line: `--gpu-hour-usd` / `--kwh-usd` (bench and tune) and the energy
and money table under a run's levels (`servelab bench`, `servelab runs show`). The figures: servelab.energy,
docs/metrics.md "Energy" and "Money"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.table import Table

from servelab.cli.output import stdout

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


def render_costs(levels: list[dict[str, Any]]) -> None:
    """Per level: J per output token (and above the idle baseline), J per request, output tokens per J,
    $ per million output tokens; then where the power and the price came from. Nothing when no level has
    either."""
    rows = [(lv["label"], lv["summary"].get("energy"), lv["summary"].get("cost")) for lv in levels]
    if not any(e or c for _, e, c in rows):
        return
    table = Table(title="energy and cost per level", title_justify="left")
    for col in ("level", "J/out tok", "J/out tok above idle", "J/req", "out tok/J", "$/M out tok"):
        table.add_column(col, justify="left" if col == "level" else "right")
    for label, e, c in rows:
        e = e or {}
        table.add_row(
            label,
            _f(e.get("j_per_output_token"), ",.3g"),
            _f(e.get("j_per_output_token_above_idle"), ",.3g"),
            _f(e.get("j_per_request"), ",.4g"),
            _f(e.get("output_tokens_per_j"), ",.3g"),
            _f((c or {}).get("usd_per_m_output_tokens"), ",.3f"),
        )
    stdout.print(table)
    energy = next((e for _, e, _ in rows if e), None)
    if energy:
        idle = energy.get("idle_w")
        stdout.print(
            f"GPU power integrated over each level (trapezoids): {energy['samples']} samples "
            f"every {_f(energy.get('interval_s'), '.2g')} s over {energy.get('gpus') or '?'} GPUs"
            + (f"; idle {idle:,.0f} W before the first level" if idle is not None else ""),
            markup=False,
        )
    cost = next((c for _, _, c in rows if c), None)
    if cost:
        default = " — a default: give --gpu-hour-usd" if cost["price_source"].startswith("catalog") else ""
        kwh = f"; electricity ${cost['kwh_usd']:g}/kWh" if cost.get("kwh_usd") else ""
        stdout.print(
            f"cost at ${cost['gpu_hour_usd']:g}/GPU-hour × {cost['gpus']} GPUs "
            f"({cost['price_source']}{default}){kwh}",
            markup=False,
        )

"""A search's report in plain lines (the terminal and the Markdown report print the same ones)."""

from __future__ import annotations

from typing import Any

from servelab.report.text import fmt


def search_lines(s: dict[str, Any]) -> list[str]:
    """The search in a few lines: what it spent, what it pruned and why, how far the model was, ties."""
    budget = s["budget"]
    limit = (
        " / ".join(
            x
            for x in (
                f"{budget['trials']} trials" if budget.get("trials") else "",
                f"{budget['minutes']:g} min" if budget.get("minutes") else "",
            )
            if x
        )
        or "no budget"
    )
    size = f" of a {s['space_size']:,}-point space" if s.get("space_size") else ""
    out = [
        f"search ({s['strategy']}, seed {s['seed']}): {s['used']['trials']} trials in {s['used']['minutes']:.1f} min{size}; budget {limit}"
    ]
    for r in s.get("regions") or []:
        out.append(
            f"  pruned {r['pruned']} where {r['where']} ({r['kind']}: {r['reason'][:120]}; learned from {r['source']})"
        )
    me = s.get("model_error") or {}
    if (me.get("prior") or {}).get("n"):
        refit = me.get("refit") or {}
        out.append(
            f"  model error at the main level (median |predicted/measured - 1|): {me['prior']['median']:.0%} before refitting"
            + (f", {refit['median']:.0%} after (fitted on the trials before each)" if refit.get("n") else "")
        )
    if s.get("tied"):
        t = s["tied"]
        iv = t.get("interval")
        out.append(
            "  tied: "
            + ", ".join(t["labels"])
            + f" (margin {fmt(t.get('margin'), 2)}"
            + (f", 95 % interval of the difference [{iv[0]:+.3g}, {iv[1]:+.3g}]" if iv else "")
            + ")"
        )
    if s.get("pareto"):
        objs = s["pareto"]["objectives"]
        out.append(f"  Pareto front ({objs[0]} vs {objs[1]}):")
        for p in s["pareto"]["front"]:
            out.append(f"    {p['label']}: {fmt(p[objs[0]], 1)}, {fmt(p[objs[1]], 2)}")
    return out

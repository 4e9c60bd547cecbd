"""A search's report in plain lines (the terminal and the Markdown report print the same ones).

The search summary is the search driver's stored JSON (`search.driver.summary`), read here only: each
member is narrowed where it is read.
"""

from __future__ import annotations

from collections.abc import Mapping

from servelab.report.text import as_list, as_map, fmt


def search_lines(s: Mapping[str, object]) -> list[str]:
    """The search in a few lines: what it spent, what it pruned and why, how far the model was, ties."""
    budget = as_map(s["budget"])
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
    used = as_map(s["used"])
    out = [
        f"search ({s['strategy']}, seed {s['seed']}): {used['trials']} trials in {used['minutes']:.1f} min{size}; budget {limit}"
    ]
    for r in map(as_map, as_list(s.get("regions"))):
        out.append(
            f"  pruned {r['pruned']} where {r['where']} ({r['kind']}: {str(r['reason'])[:120]}; learned from {r['source']})"
        )
    me = as_map(s.get("model_error"))
    if as_map(me.get("prior")).get("n"):
        refit = as_map(me.get("refit"))
        out.append(
            f"  model error at the main level (median |predicted/measured - 1|): {as_map(me['prior'])['median']:.0%} before refitting"
            + (f", {refit['median']:.0%} after (fitted on the trials before each)" if refit.get("n") else "")
        )
    if s.get("tied"):
        t = as_map(s["tied"])
        iv = as_list(t.get("interval"))
        out.append(
            "  tied: "
            + ", ".join(str(label) for label in as_list(t["labels"]))
            + f" (margin {fmt(t.get('margin'), 2)}"
            + (f", 95 % interval of the difference [{iv[0]:+.3g}, {iv[1]:+.3g}]" if iv else "")
            + ")"
        )
    if s.get("pareto"):
        pareto = as_map(s["pareto"])
        objs = [str(o) for o in as_list(pareto["objectives"])]
        out.append(f"  Pareto front ({objs[0]} vs {objs[1]}):")
        for p in map(as_map, as_list(pareto["front"])):
            out.append(f"    {p['label']}: {fmt(p[objs[0]], 1)}, {fmt(p[objs[1]], 2)}")
    return out

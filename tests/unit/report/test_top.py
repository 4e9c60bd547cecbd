"""The report's top (pure): one line per declared objective, the ranked one with its winner, margin and
noise said once, a search's second objective with its best candidate, the Pareto front's members last."""

from __future__ import annotations

from servelab.report.pareto import ParetoPoint
from servelab.report.top import FRONT_HEAD, Winner, top_lines


def winner(**over: object) -> Winner:
    base = Winner(
        label="tp8",
        runner_up="tp4",
        runner_up_value=461.0,
        node_spread=None,
        margin=42.0,
        margin_pct=9.11,
        significant=True,
        noise="exceeds the noise (judged by Student t over trial means, 95 % interval of the difference ±40.2)",
        noise_method="Student t over trial means",
        objective="output_throughput",
        value=503.0,
        half_width=38.1,
        level=64.0,
        why="tp8 wins on output_throughput: 503 vs tp4's 461 (+9.1 %); the margin exceeds the noise",
    )
    return base.model_copy(update=over)


FRONT = [ParetoPoint("tp8", 64, 62.9, 9.5, 8), ParetoPoint("tp4", 1, 5.8, 50.8, 8)]


def test_one_objective_and_the_front() -> None:
    lines = top_lines(["output_throughput"], winner(), {}, FRONT)
    assert [t.head for t in lines] == ["output_throughput (higher is better)", FRONT_HEAD]
    first = lines[0]
    assert first.best == "tp8" and first.winner
    text = first.best + first.rest
    assert text == (
        "tp8, 503.0 ± 38.1 at level 64; 42.0 (+9.1 %) ahead of the runner-up tp4 (461.0); the margin exceeds "
        "the noise (judged by Student t over trial means, 95 % interval of the difference ±40.2)."
    )
    assert text.count("42.0") == 1 and text.count("461") == 1  # the margin and the runner-up said once
    assert lines[1].best is None and not lines[1].winner
    assert lines[1].rest.startswith("tp8 @ 64 (62.9 tok/s per GPU, 9.5 tok/s per user); tp4 @ 1 (")


def test_a_search_s_second_objective_names_its_best_candidate() -> None:
    at = [("tp8", 64.0, 105.3), ("tp4", 64.0, 80.2), ("tp2", 16.0, 40.5)]
    lines = top_lines(["output_throughput", "tpot_ms_p50"], winner(), {"tpot_ms_p50": at}, FRONT)
    assert [t.head for t in lines] == [
        "output_throughput (higher is better)",
        "tpot_ms_p50 (lower is better)",
        FRONT_HEAD,
    ]
    assert lines[1].best == "tp2" and not lines[1].winner and lines[1].rest.startswith(", 40.50 at level 16")
    none = top_lines(["output_throughput", "tpot_ms_p50"], winner(), {}, [])
    assert none[1].best is None and "not measured" in none[1].rest
    assert none[2].rest == "no measured level."


def test_no_winner_says_why_and_a_lone_winner_says_so() -> None:
    lines = top_lines(
        ["goodput"], winner(label=None, objective=None, why="no candidate met every SLO"), {}, []
    )
    assert lines[0].head == "goodput (higher is better)"
    assert lines[0].best is None and lines[0].rest == "no candidate met every SLO"
    alone = top_lines(["output_throughput"], winner(runner_up=None, margin=None, margin_pct=None), {}, [])
    assert (
        alone[0].rest.endswith("; the only candidate that meets every SLO.") and "ahead" not in alone[0].rest
    )


def test_a_cluster_s_node_spread_is_said_after_the_margin() -> None:
    spread = "but the margin is not larger than the node-to-node spread 50 measured on the baseline"
    (first, _front) = top_lines(["output_throughput"], winner(node_spread=spread), {}, [])
    assert first.rest.endswith(f"; {spread}.")

"""The node-to-node spread (pure): measured on the baseline's trials per node, and a winner's margin that
does not exceed it is within the noise."""

from __future__ import annotations

from servelab import analyze

OBJ = "output_throughput"


def _ranking(a: float, b: float) -> analyze.Ranking:
    scores = [analyze.Score("a", "measured", a, 1.0, 16.0), analyze.Score("b", "measured", b, 1.0, 16.0)]
    return analyze.rank(scores, OBJ)


def test_spread_is_the_range_of_the_per_node_means() -> None:
    s = analyze.node_spread(16.0, [("n1", 100.0), ("n2", 110.0), ("n1", 102.0)])
    assert s is not None
    assert s.per_node == {"n1": 101.0, "n2": 110.0}
    assert s.spread == 9.0 and round(s.spread_pct or 0, 3) == round(9.0 / 105.5 * 100, 3)
    assert analyze.node_spread(16.0, [("n1", 100.0), ("n1", 120.0)]) is None  # one node: unknown


def test_a_margin_within_the_node_spread_is_not_called() -> None:
    spread = analyze.node_spread(16.0, [("n1", 100.0), ("n2", 110.0)])
    r = _ranking(120.0, 105.0)  # margin 15 > the t half-width: significant by the per-trial statistics
    assert r.significant is True
    guarded = analyze.guard_node_spread(_ranking(120.0, 115.0), spread, cluster=True)  # margin 5 < 10
    assert guarded.significant is False
    assert "node-to-node spread" in guarded.verdict and "no winner is called" in guarded.verdict
    assert guarded.noise["node_spread"]["measured"] is True
    kept = analyze.guard_node_spread(_ranking(130.0, 105.0), spread, cluster=True)  # margin 25 > 10
    assert kept.significant is True and "no winner is called" not in kept.verdict
    assert "exceeds the node-to-node spread 10" in kept.verdict


def test_off_a_cluster_nothing_changes_and_on_one_an_unmeasured_spread_is_said() -> None:
    r = analyze.guard_node_spread(_ranking(120.0, 105.0), None, cluster=False)
    assert "node_spread" not in r.noise
    u = analyze.guard_node_spread(_ranking(120.0, 105.0), None, cluster=True)
    assert u.noise["node_spread"]["measured"] is False and "not measured" in u.verdict

"""The Pareto front (pure): which points no other beats on both axes, ties kept, dominated points dropped,
either direction per axis; and the point of one level (tok/s per GPU, tok/s per user = 1000 / TPOT p50)."""

from __future__ import annotations

import pytest

from servelab.report.pareto import (
    ParetoPoint,
    front,
    layout_gpus,
    members_text,
    point,
    throughput_front,
    tps_per_user,
)


def P(name: str, per_user: float, per_gpu: float, level: float = 1.0) -> ParetoPoint:
    return ParetoPoint(name, level, per_gpu, per_user, 1)


def names(points: list[ParetoPoint]) -> list[str]:
    return [p.candidate for p in points]


def test_dominated_points_are_dropped_and_the_front_is_in_x_order() -> None:
    pts = [
        P("fast-user", 50.0, 5.0),
        P("middle", 20.0, 35.0),
        P("dominated-by-middle", 18.0, 30.0),  # worse on both axes than `middle`
        P("busy-gpu", 9.0, 60.0),
        P("worst", 5.0, 2.0),
    ]
    assert names(throughput_front(pts)) == ["busy-gpu", "middle", "fast-user"]


def test_equal_on_one_axis_and_worse_on_the_other_is_dominated() -> None:
    pts = [P("a", 20.0, 35.0), P("same-x-lower-y", 20.0, 30.0), P("same-y-lower-x", 10.0, 35.0)]
    assert names(throughput_front(pts)) == ["a"]


def test_a_tie_keeps_every_tied_point() -> None:
    pts = [P("a", 20.0, 35.0), P("b", 20.0, 35.0), P("c", 10.0, 10.0)]
    assert sorted(names(throughput_front(pts))) == ["a", "b"]


def test_one_point_and_none() -> None:
    assert names(throughput_front([P("only", 1.0, 1.0)])) == ["only"]
    assert throughput_front([]) == []


def test_direction_per_axis() -> None:
    """J/token (lower is better) against throughput (higher is better): the same function, another call."""
    pts = [(100.0, 2.0), (200.0, 3.0), (150.0, 4.0), (50.0, 1.0)]  # (throughput, J/token)
    out = front(pts, lambda p: p[0], lambda p: p[1], maximise=(True, False))
    assert out == [(50.0, 1.0), (100.0, 2.0), (200.0, 3.0)]  # (150, 4) is beaten by (200, 3)
    assert front(pts, lambda p: p[0], lambda p: p[1], maximise=(False, False)) == [(50.0, 1.0)]


def test_a_levels_point() -> None:
    assert tps_per_user(20.0) == 50.0
    assert tps_per_user(None) is None and tps_per_user(0.0) is None
    p = point("tp8", 16, 800.0, 25.0, 8)
    assert p == ParetoPoint("tp8", 16.0, 100.0, 40.0, 8)
    assert point("tp8", 16, None, 25.0, 8) is None and point("tp8", 16, 800.0, None, 8) is None
    assert ParetoPoint.of(p.to_json()) == p
    assert p.name == "tp8 @ 16"
    assert members_text([p]) == "tp8 @ 16 (100.0 tok/s per GPU, 40.0 tok/s per user)"
    assert members_text([]) == "no measured level"


@pytest.mark.parametrize(
    ("tp", "pp", "dp", "gpus"), [(8, None, None, 8), (4, 2, None, 8), (2, 1, 2, 4), (None, None, None, 1)]
)
def test_layout_gpus(tp: int | None, pp: int | None, dp: int | None, gpus: int) -> None:
    assert layout_gpus(tp, pp, dp) == gpus

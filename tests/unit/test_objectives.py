"""Objectives as types (servelab.objectives, issue 30): the registry a study's `objective` is checked
against, and adding one is adding a class."""

from __future__ import annotations

import pytest

from servelab import objectives as O
from servelab.config.sections import OBJECTIVES, SearchSpec


def test_the_registry_is_the_study_objectives_in_their_order() -> None:
    assert list(OBJECTIVES) == [
        "output_throughput",
        "total_token_throughput",
        "request_throughput",
        "goodput",
        "ttft_ms_p50",
        "tpot_ms_p50",
        "e2e_ms_p50",
        "energy",
        "cost",
        "capacity",
    ]
    assert OBJECTIVES["tpot_ms_p50"] == "min" and O.objective("tpot_ms_p50").sign == -1.0
    assert O.objective("tpot_ms_p50").predicted_as == "tpot_ms" and O.objective("goodput").counts_slo
    cap = O.objective("capacity")
    assert cap.searches_capacity and not cap.searchable and "capacity" not in O.names(searchable_only=True)
    assert O.objective("total_token_throughput").request_share(10, 100, False) == 110
    assert O.objective("goodput").request_share(10, 100, False) == 0.0
    assert (
        O.objective("e2e_ms_p50").latency() == "e2e"
        and O.objective("e2e_ms_p50").request_share(1, 1, True) is None
    )
    with pytest.raises(ValueError, match="unknown objective 'speed'"):
        O.objective("speed")
    with pytest.raises(ValueError, match="unknown objective 'capacity'"):
        SearchSpec.model_validate({"objectives": ["capacity"]})


def test_adding_an_objective_is_adding_a_class() -> None:
    class ItlMedian(O.Objective):
        name = "itl_ms_p50_test"
        direction = "min"

    try:
        assert O.objective("itl_ms_p50_test").direction == "min"
        assert "itl_ms_p50_test" in O.directions()
    finally:
        O.Objective._registry.pop("itl_ms_p50_test")

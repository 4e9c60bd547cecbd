from __future__ import annotations

import gc

import numpy as np
import pytest

from servelab.bench.load import arrival_offsets, frozen_heap


def test_constant_schedule_is_evenly_spaced() -> None:
    assert arrival_offsets(4.0, 5, "constant", 1.0, 0) == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])


@pytest.mark.parametrize("arrival,burst", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 4.0)])
def test_random_schedules_keep_the_mean_rate(arrival: str, burst: float) -> None:
    off = arrival_offsets(10.0, 20001, arrival, burst, seed=1)
    gaps = np.diff(off)
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert off[0] == 0.0 and all(g >= 0 for g in gaps)


def test_burstiness_changes_the_spread() -> None:
    bursty = np.diff(arrival_offsets(10.0, 5000, "gamma", 0.25, seed=2)).std()
    smooth = np.diff(arrival_offsets(10.0, 5000, "gamma", 8.0, seed=2)).std()
    poisson = np.diff(arrival_offsets(10.0, 5000, "poisson", 1.0, seed=2)).std()
    assert bursty > poisson > smooth
    assert poisson == pytest.approx(0.1, rel=0.1)  # exponential: std == mean


def test_schedule_is_seeded() -> None:
    assert arrival_offsets(5, 50, "poisson", 1, 7) == arrival_offsets(5, 50, "poisson", 1, 7)
    assert arrival_offsets(5, 50, "poisson", 1, 7) != arrival_offsets(5, 50, "poisson", 1, 8)


def test_bad_rate_rejected() -> None:
    with pytest.raises(ValueError):
        arrival_offsets(0, 5, "poisson", 1, 0)


def test_frozen_heap_hides_older_objects_from_the_collector_only_while_a_level_runs() -> None:
    before = gc.get_freeze_count()
    kept = [[i] for i in range(1000)]  # made before the level: frozen with it
    with frozen_heap():
        assert gc.get_freeze_count() >= before + len(kept)
    assert gc.get_freeze_count() == 0
    assert len(kept) == 1000

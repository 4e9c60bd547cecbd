"""The regression under saturation detection (bench.saturation.slope); the verdicts themselves are tested
on records the real writer stored, against the simulator (tests/integration/test_bench_capacity.py)."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.bench.saturation import slope


def test_slope_and_its_significance() -> None:
    rng = np.random.default_rng(0)
    x = np.linspace(0, 10, 200)
    rising = 0.5 * x + rng.normal(0, 0.2, x.size)
    fit = slope(x.tolist(), rising.tolist())
    assert fit is not None
    b, t = fit
    assert b == pytest.approx(0.5, abs=0.02) and t > 50
    flat = slope(x.tolist(), rng.normal(1.0, 0.2, x.size).tolist())
    assert flat is not None and abs(flat[1]) < 4
    assert slope([1.0] * 20, list(range(20))) is None  # no spread in x
    assert slope([0, 1, 2], [0, 1, 2]) is None  # too few points

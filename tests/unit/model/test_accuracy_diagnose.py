"""The accuracy benchmark's diagnosis: the per-release correction it reports must be the MAPE-optimal one."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "model_accuracy.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("model_accuracy_bench", BENCH)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _mape(scale: float, ratio: np.ndarray) -> float:
    # rows with measured/predicted = ratio: |s·pred − meas| / meas = |s / ratio − 1|
    return float(np.mean(np.abs(scale / ratio - 1.0)))


def test_mape_scale_minimises_mape_over_a_grid() -> None:
    rng = np.random.default_rng(3)
    ratio = np.exp(rng.normal(0.3, 0.6, 301))
    s = _bench()._mape_scale(ratio)
    grid = np.exp(np.linspace(-2.0, 2.0, 4001))
    best = min(_mape(g, ratio) for g in grid)
    assert _mape(s, ratio) <= best + 1e-3
    # MAPE rewards under-prediction: the optimal scale sits below the plain median of a skewed ratio
    assert s < float(np.median(ratio))


def test_mape_scale_of_identical_ratios_is_that_ratio() -> None:
    assert _bench()._mape_scale(np.full(10, 1.7)) == 1.7

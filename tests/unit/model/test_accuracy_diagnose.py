"""The accuracy benchmark's diagnosis: the corrections it reports (per release, per model/engine/GPU) must be
the MAPE-optimal ones, learnt on the training rows only."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

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


def test_learnt_scale_mape_recovers_per_key_offsets() -> None:
    bench = _bench()
    rng = np.random.default_rng(7)
    keys = np.array(["a", "b", "c"] * 40)
    pred = rng.uniform(5.0, 50.0, keys.size)
    scale = {"a": 1.5, "b": 0.7, "c": 1.0}
    meas = pred * np.array([scale[k] for k in keys])
    test = np.arange(keys.size) % 3 == np.arange(keys.size) // 40  # some rows of each key held out
    assert test.any() and (~test).any()
    # without a correction the held-out error is the offsets'; with one learnt per key it vanishes
    raw = float((np.abs(pred[test] - meas[test]) / meas[test]).mean() * 100)
    assert raw > 10.0
    assert bench.learnt_scale_mape(keys, meas, pred, test) == pytest.approx(0.0, abs=1e-9)
    # a key never seen in training keeps scale 1
    unseen = np.where(test & (keys == "a"), "z", keys)
    assert bench.learnt_scale_mape(unseen, meas, pred, test) > 0.0

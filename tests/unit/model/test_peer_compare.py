"""benchmarks/peer_compare.py: its splits hold out by configuration and by model, never by row, and its
ranking score counts pairs the way it says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from benchmarks import peer_compare

import servelab
from servelab.model.calibrate import prepare
from servelab.model.factors import Factors
from servelab.model.observations import Observation, holdout_mask, observations_from_csv

CSV = Path(servelab.__file__).parent / "data" / "serving_measurements.csv"


@pytest.fixture(scope="module")
def obs() -> list[Observation]:
    return prepare(observations_from_csv(CSV), peer_compare.START).obs


def test_the_configuration_split_never_cuts_a_configuration(obs: list[Observation]) -> None:
    test = holdout_mask(obs)
    held = {o.group for o, t in zip(obs, test, strict=True) if t}
    kept = {o.group for o, t in zip(obs, test, strict=True) if not t}
    assert held and kept and not held & kept  # every concurrency of a configuration on one side
    assert 0.2 < test.mean() < 0.4


def test_leaving_a_model_out_fits_on_the_others_only(
    obs: list[Observation], monkeypatch: pytest.MonkeyPatch
) -> None:
    sample = [o for o in obs if o.model in ("Qwen3-32B", "Llama-3.1-8B", "MiniMax-M2.5")][:300]
    seen: list[set[str]] = []

    def fit(train: list[Observation], *_a: Any, **_k: Any) -> tuple[Factors, dict[str, Any], dict[str, Any]]:
        seen.append({o.model for o in train})
        return Factors(), {}, {}

    monkeypatch.setattr(peer_compare, "fit_observations", fit)
    tpot, ttft = peer_compare.leave_one_model_out_rows(sample)
    models = {o.model for o in sample}
    assert len(seen) == len(models) and all(len(s) == len(models) - 1 for s in seen)
    assert {next(iter(models - s)) for s in seen} == models  # each model left out once
    assert (tpot > 0).all() and (ttft > 0).all()  # and every row predicted by the fit without its model


def test_concordance_counts_pairs_within_groups_and_skips_ties() -> None:
    groups = ["a", "a", "a", "b", "b"]
    conc = [1, 1, 4, 1, 1]
    meas = np.array([1.0, 2.0, 3.0, 5.0, 5.0])  # the b pair is a tie in the measurements: skipped
    pred = np.array([2.0, 1.0, 3.0, 1.0, 2.0])  # a: (0,1) discordant, (0,2) and (1,2) concordant
    out = peer_compare.concordance(groups, conc, meas, pred)
    assert out["all"] == {
        "pairs": 3,
        "concordance": pytest.approx(2 / 3),
        "kendall_tau": pytest.approx(1 / 3),
    }
    # at the same concurrency only the a-pair (0,1) is left, and it is ordered the wrong way
    assert out["same_concurrency"] == {"pairs": 1, "concordance": 0.0, "kendall_tau": -1.0}

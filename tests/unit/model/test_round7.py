"""Round 7 of the model: reading the published rows as they were measured.

* rows whose MoE split spans more GPUs than the attention split ran attention data-parallel;
* InferenceX rows were benchmarked with lengths drawn from [0.8·L, L], so a request carries 0.9·L tokens;
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from servelab.model.calibrate import predicted_ms, prepare
from servelab.model.factors import default_factors
from servelab.model.observations import Observation, _layout, bench_protocols, length_mean

INFERENCEX_DB = "db-dump/2026-04-27; config_id=733; silicon_concurrency=128; workflow_run_id=758"
INFERENCEX_EXPORT = "source_file=2026-04-06.csv; model=DeepSeek-R1; silicon_concurrency=4; wip=False"
GAP_ANALYSIS = (
    "source_file=/Users/x/aic-auto-gap-analysis/data/h200_sxm/vllm/0.12.0/Q.csv; silicon_concurrency=8"
)


def test_moe_split_wider_than_attention_is_attention_dp() -> None:
    # vLLM Qwen3-235B-FP8 rows: tp 1, moe_tp 2, attention-DP column empty -> 2 GPUs, DP2
    assert _layout({"tp_size": "1", "attention_dp_size": "", "moe_tp_size": "2", "moe_ep_size": "1"}) == (
        1,
        2,
        1,
    )
    assert _layout({"tp_size": "2", "attention_dp_size": "", "moe_tp_size": "4", "moe_ep_size": "1"}) == (
        2,
        2,
        1,
    )
    assert _layout({"tp_size": "1", "attention_dp_size": "", "moe_tp_size": "4", "moe_ep_size": "1"}) == (
        1,
        4,
        1,
    )
    # dense rows carry moe_tp = moe_ep = 1 (or 0): nothing to undo
    assert _layout({"tp_size": "4", "attention_dp_size": "", "moe_tp_size": "1", "moe_ep_size": "1"}) == (
        4,
        1,
        1,
    )
    assert _layout({"tp_size": "2", "attention_dp_size": "", "moe_tp_size": "0", "moe_ep_size": "0"}) == (
        2,
        1,
        1,
    )
    # a split that does not divide is left as written, not guessed
    assert _layout({"tp_size": "4", "attention_dp_size": "", "moe_tp_size": "6", "moe_ep_size": "1"}) == (
        4,
        1,
        1,
    )


def test_inferencex_rows_carry_the_mean_of_their_length_distribution() -> None:
    proto = bench_protocols()["inferencex"]
    r = proto["random_range_ratio"]
    assert 0.0 < r <= 1.0
    assert length_mean(INFERENCEX_DB) == pytest.approx((1.0 + r) / 2.0)
    assert length_mean(INFERENCEX_EXPORT) == pytest.approx((1.0 + r) / 2.0)
    assert length_mean(GAP_ANALYSIS) == 1.0  # fixed lengths: read as recorded
    assert length_mean("") == 1.0


def _obs(length_mean: float) -> Observation:
    return Observation(
        "Llama-3.1-70B",
        "h200-sxm",
        4,
        4,
        1,
        1,
        1,
        "fp8",
        None,
        8192,
        1024,
        64,
        "vllm",
        1.0,
        1.0,
        "k",
        length_mean=length_mean,
    )


def test_workload_uses_the_mean_lengths_but_the_group_keeps_the_recorded_ones() -> None:
    fixed, drawn = _obs(1.0), _obs(0.9)
    assert drawn.workload.isl == round(8192 * 0.9) and drawn.workload.osl == round(1024 * 0.9)
    assert fixed.workload.isl == 8192 and fixed.workload.osl == 1024
    assert drawn.group == fixed.group  # the held-out split does not move with the protocol
    assert drawn.workload.concurrency == 64


def test_shorter_mean_prompts_predict_a_shorter_time_to_first_token() -> None:
    f = default_factors("vllm")
    p = prepare([_obs(1.0), _obs(0.9)])
    _, ttft = predicted_ms(p, f)
    assert ttft[1] < ttft[0]
    # and not by more than the prompt shrank (the intercept and the decode steps do not shrink)
    assert ttft[1] > 0.9 * ttft[0] * 0.95


def test_observation_replace_keeps_the_protocol() -> None:
    o = replace(_obs(0.9), concurrency=8)
    assert o.length_mean == 0.9 and o.workload.concurrency == 8

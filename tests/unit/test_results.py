"""The results contract: one time base, one unit for goodput, the digest and the vLLM view of one summary."""

from __future__ import annotations

import pytest

from servelab.bench import metrics as M
from servelab.results import LevelSummary, RequestRecord


def _rec(i: int, ttft: float, e2e: float, n: int) -> RequestRecord:
    return RequestRecord(
        idx=i,
        prompt_idx=i,
        start_s=0.1 * i,
        ok=True,
        ttft_s=ttft,
        e2e_s=e2e,
        itl_s=[(e2e - ttft) / max(1, n - 1)] * (n - 1),
        output_tokens=n,
        input_tokens=100,
    )


def _summary() -> LevelSummary:
    slo = M.parse_slo("ttft_ms<=150,tpot_ms<=60")
    return M.summarize([_rec(0, 0.1, 0.55, 10), _rec(1, 0.2, 0.65, 10)], slo, duration_s=2.0)


def test_in_gpu_time_scales_latencies_up_and_rates_down_exactly() -> None:
    wall = _summary()
    gpu = wall.in_gpu_time(20)
    assert gpu.tpot_ms.p50 == pytest.approx(wall.tpot_ms.p50 * 20)
    assert gpu.ttft_ms.p99 == pytest.approx(wall.ttft_ms.p99 * 20)
    assert gpu.output_throughput == pytest.approx(wall.output_throughput / 20)
    assert gpu.goodput == pytest.approx(wall.goodput / 20)
    assert gpu.duration_s == pytest.approx(wall.duration_s * 20)
    assert gpu.completed == wall.completed and gpu.total_output_tokens == wall.total_output_tokens
    assert wall.in_gpu_time(1) is wall


def test_digest_keys_are_the_study_objectives_and_round_trip() -> None:
    s = _summary().in_gpu_time(20)
    d = s.digest()
    assert d["tpot_ms_p50"] == s.tpot_ms.p50 and d["output_throughput"] == s.output_throughput
    back = LevelSummary.from_digest(d)
    assert back.digest() == d


def test_goodput_has_one_unit_and_older_runs_read_into_it() -> None:
    s = _summary()
    assert s.good_requests == 1
    assert s.goodput == pytest.approx(10 / 2.0)  # output tokens/s of requests meeting every SLO
    assert s.request_goodput == pytest.approx(1 / 2.0)
    stored_before = s.to_json() | {"goodput": 0.5, "goodput_output_tokens": 5.0}
    stored_before.pop("request_goodput")
    old = LevelSummary.model_validate(stored_before)
    assert old.goodput == 5.0 and old.request_goodput == 0.5


def test_vllm_view_is_a_method_of_the_summary() -> None:
    s = _summary()
    v = s.vllm_compatible({"max_concurrency": 2})
    assert v["median_tpot_ms"] == s.tpot_ms.p50 and v["request_goodput"] == s.request_goodput
    assert v["p99_ttft_ms"] == s.ttft_ms.p99 and v["max_concurrency"] == 2


@pytest.mark.parametrize("mode,value", [("rate", 1.5), ("trace", 5.0), ("concurrency", 4.0)])
def test_from_digest_keeps_the_level_mode(mode: str, value: float) -> None:
    """A study's rate or trace level reads back as that, not as a concurrency (issue 30)."""
    s = _summary().model_copy(update={"mode": mode, "value": value})
    d = s.digest()
    assert d["mode"] == mode and d["level"] == value
    back = LevelSummary.from_digest(d)
    assert back.mode == mode and back.value == value
    # a digest stored before the digest carried its mode: the study's load kind says it
    old = {k: v for k, v in d.items() if k != "mode"}
    assert LevelSummary.from_digest(old, mode=mode).mode == mode
    assert LevelSummary.from_digest(old).mode == "concurrency"

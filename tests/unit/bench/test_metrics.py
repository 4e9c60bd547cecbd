from __future__ import annotations

import math

import pytest

from servelab.bench import metrics as M


def rec(
    idx: int,
    ttft: float,
    e2e: float,
    n: int,
    itl: list[float] | None = None,
    ok: bool = True,
    start: float = 0.0,
    requested: int | None = None,
    kind: str | None = None,
) -> M.RequestRecord:
    return M.RequestRecord(
        idx=idx,
        prompt_idx=idx,
        start_s=start,
        ok=ok,
        ttft_s=ttft if ok else None,
        e2e_s=e2e,
        itl_s=itl or [],
        input_tokens=10,
        output_tokens=n if ok else None,
        requested_output_tokens=requested,
        error_kind=kind,
    )


def test_tpot_is_decode_time_over_n_minus_one() -> None:
    r = rec(0, ttft=0.1, e2e=1.1, n=11)
    assert M.tpot_s(r) == pytest.approx(0.1)


def test_tpot_undefined_for_single_token_and_failures() -> None:
    assert M.tpot_s(rec(0, 0.1, 0.1, 1)) is None
    assert M.tpot_s(rec(0, 0.1, 0.5, 5, ok=False)) is None


def test_stats_percentiles_match_numpy_linear() -> None:
    s = M.stats_ms([0.001 * i for i in range(1, 101)])
    assert s.mean == pytest.approx(50.5)
    assert s.p50 == pytest.approx(50.5)
    assert s.p90 == pytest.approx(90.1)
    assert s.p99 == pytest.approx(99.01)
    assert s.min == pytest.approx(1.0) and s.max == pytest.approx(100.0)


def test_stats_of_nothing_are_none() -> None:
    assert M.stats_ms([]).p50 is None


def test_summary_throughput_and_failures() -> None:
    records = [
        rec(0, 0.1, 1.0, 10, itl=[0.1] * 9, start=0.0),
        rec(1, 0.2, 1.5, 20, itl=[0.05] * 19, start=0.5),
        rec(2, 0.0, 0.3, 0, ok=False, start=1.0, kind="http_500"),
    ]
    s = M.summarize(records)
    assert s.completed == 2 and s.failed == 1
    assert s.failure_rate == pytest.approx(1 / 3)
    assert s.errors == {"http_500": 1}
    # duration: first due time 0.0 → last end max(1.0, 2.0, 1.3) = 2.0
    assert s.duration_s == pytest.approx(2.0)
    assert s.output_throughput == pytest.approx(30 / 2.0)
    assert s.request_throughput == pytest.approx(1.0)
    assert s.total_token_throughput == pytest.approx((30 + 20) / 2.0)
    # ITL pools every gap of every request
    assert s.itl_ms.mean == pytest.approx((9 * 100 + 19 * 50) / 28)
    assert s.tpot_ms.mean == pytest.approx(((0.9 / 9) + (1.3 / 19)) / 2 * 1000)


def test_explicit_duration_overrides_span() -> None:
    s = M.summarize([rec(0, 0.1, 1.0, 10)], duration_s=4.0)
    assert s.output_throughput == pytest.approx(2.5)


def test_goodput_counts_only_requests_meeting_every_limit() -> None:
    slo = M.parse_slo("ttft_ms<=150,tpot_ms<=60")
    assert slo is not None
    records = [
        rec(0, 0.1, 0.1 + 0.05 * 9, 10),  # ttft 100 ✓, tpot 50 ✓
        rec(1, 0.2, 0.2 + 0.05 * 9, 10),  # ttft 200 ✗
        rec(2, 0.1, 0.1 + 0.07 * 9, 10),  # tpot 70 ✗
        rec(3, 0.0, 0.1, 0, ok=False, kind="timeout"),
    ]
    s = M.summarize(records, slo, duration_s=2.0)
    assert s.good_requests == 1
    # goodput has one unit, output tokens/s (the good request's 10 tokens over 2 s); requests/s beside it
    assert s.request_goodput == pytest.approx(0.5)
    assert s.goodput == pytest.approx(5.0)
    assert s.slo_attainment == pytest.approx(0.25)


def test_length_mismatch_reported() -> None:
    s = M.summarize([rec(0, 0.1, 1.0, 10, requested=10), rec(1, 0.1, 1.0, 7, requested=10)])
    assert s.length_mismatches == 1
    assert [m.model_dump() for m in s.length_mismatch_examples] == [{"idx": 1, "requested": 10, "got": 7}]


@pytest.mark.parametrize(
    "text,msg",
    [
        ("ttft<=5", "unknown SLO metric"),
        ("ttft_ms=5", "must look like"),
        ("ttft_ms<=abc", "not a number"),
        ("ttft_ms<=-1", "positive"),
    ],
)
def test_bad_slo_explains(text: str, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        M.parse_slo(text)


def test_vllm_compatible_field_names() -> None:
    s = M.summarize([rec(0, 0.1, 1.0, 10, itl=[0.1] * 9)], duration_s=1.0)
    v = s.vllm_compatible({"max_concurrency": 1})
    for key in (
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "mean_itl_ms",
        "median_e2el_ms",
        "output_throughput",
        "request_throughput",
        "total_token_throughput",
        "completed",
        "total_output_tokens",
        "duration",
        "max_concurrency",
    ):
        assert key in v, key
    assert v["median_ttft_ms"] == pytest.approx(100.0)
    assert v["median_tpot_ms"] == pytest.approx(100.0)
    assert not math.isnan(v["mean_e2el_ms"])

"""Analysis of study results: SLOs, confidence intervals, anomalies, ranking."""

from __future__ import annotations

import pytest

from servelab import analyze
from servelab.config.sections import AnomalySpec, SLOSpec


def _lv(
    level: float, thr: float, tpot: float = 20.0, ttft: float = 100.0, failed: int = 0, **kw: object
) -> dict:
    return {
        "level": level,
        "completed": 100 - failed,
        "failed": failed,
        "failure_rate": failed / 100,
        "output_throughput": thr,
        "tpot_ms_p50": tpot,
        "ttft_ms_p99": ttft,
        **kw,
    }


def test_estimate_uses_student_t() -> None:
    est = analyze.estimate([10.0, 12.0])
    assert est.mean == pytest.approx(11.0)
    # sd = 1.414, n = 2, t(1) = 12.706 → half width 12.706 * 1.414 / 1.414
    assert est.half_width == pytest.approx(12.706)
    assert analyze.estimate([5.0]).half_width is None
    assert analyze.estimate([None]).n == 0


def test_combine_repeats_averages_per_level() -> None:
    out = analyze.combine_repeats([[_lv(1, 100), _lv(8, 700)], [_lv(1, 110), _lv(8, 720)]])
    assert [d["level"] for d in out] == [1.0, 8.0]
    assert out[1]["output_throughput"] == pytest.approx(710)
    assert out[1]["ci"]["output_throughput"] > 0
    assert out[0]["repeats"] == 2


def test_slo_failures_name_the_metric_and_success_rate() -> None:
    slo = SLOSpec(tpot_ms={"p50": 25}, ttft_ms={"p99": 500}, min_success_rate=0.99)
    assert analyze.slo_failures(_lv(1, 100), slo) == []
    reasons = analyze.slo_failures(_lv(1, 100, tpot=30, failed=5), slo)
    assert any("success rate 95.0%" in r for r in reasons)
    assert any("tpot_ms p50 30.0 > 25" in r for r in reasons)


def test_anomalies_against_the_baseline() -> None:
    base = [_lv(64, 1867, gpu_power_w=420.0)]
    cand = [_lv(64, 236, gpu_power_w=125.0, failed=3)]
    kinds = {a.kind for a in analyze.anomalies(cand, base, AnomalySpec())}
    assert kinds == {"throughput_collapse", "power_drop", "error_rate"}
    assert analyze.anomalies([_lv(64, 1800, gpu_power_w=410.0)], base, AnomalySpec()) == []


def test_a_score_without_the_objectives_figure_says_so_not_that_the_slos_failed() -> None:
    """The GPU check (docs/gpu.md): a study ranked by energy against a server whose power was not sampled
    read "no level meets the SLOs: {'1': [], '8': []}" with no SLO missed. Now it names the missing
    figure, and why energy can be missing; an SLO missed everywhere still reads as before."""
    slo = SLOSpec(tpot_ms={"p50": 50})
    unsampled = analyze.score("a", "measured", [_lv(1, 80), _lv(8, 140, tpot=60)], slo, "energy")
    assert unsampled.value is None
    assert unsampled.why.startswith("no energy figure at the levels meeting the SLOs (1): no GPU power")
    missed = analyze.score("b", "measured", [_lv(8, 140, tpot=60)], slo, "energy")
    assert missed.why == "no level meets the SLOs: {'8': ['tpot_ms p50 60.0 > 50']}"
    measured = analyze.score(
        "c", "measured", [_lv(1, 80, energy=2.5), _lv(8, 140, tpot=60, energy=1.5)], slo, "energy"
    )
    assert (measured.value, measured.level) == (2.5, 1.0)  # level 8 has the lower J/token, not the SLO


def test_rank_picks_best_meeting_slo_and_judges_noise() -> None:
    slo = SLOSpec(tpot_ms={"p50": 50})
    a = analyze.score(
        "a",
        "measured",
        [_lv(16, 500, ci={"output_throughput": 5.0}), _lv(64, 900, tpot=80, ci={"output_throughput": 5.0})],
        slo,
        "output_throughput",
    )
    assert a.value == 500 and a.level == 16  # the faster level misses the TPOT limit
    b = analyze.score(
        "b", "measured", [_lv(16, 450, ci={"output_throughput": 5.0})], slo, "output_throughput"
    )
    c = analyze.score("c", "not_applied", [], slo, "output_throughput")
    r = analyze.rank([b, c, a], "output_throughput")
    assert r.winner == "a" and r.runner_up == "b"
    assert r.margin == pytest.approx(50)
    assert r.significant is True
    assert [s.label for s in r.ranked] == ["a", "b", "c"]
    close = analyze.score(
        "d", "measured", [_lv(16, 498, ci={"output_throughput": 20.0})], slo, "output_throughput"
    )
    r2 = analyze.rank([a, close], "output_throughput")
    assert r2.significant is False and "within the noise" in r2.verdict


def test_rank_with_lower_is_better_and_nothing_valid() -> None:
    slo = SLOSpec()
    a = analyze.score("a", "measured", [_lv(1, 10, tpot=12)], slo, "tpot_ms_p50")
    b = analyze.score("b", "measured", [_lv(1, 10, tpot=10)], slo, "tpot_ms_p50")
    assert analyze.rank([a, b], "tpot_ms_p50").winner == "b"
    assert analyze.rank([analyze.score("x", "failed", [], slo, "tpot_ms_p50")], "tpot_ms_p50").winner is None


def test_lower_power_at_the_same_throughput_is_not_an_anomaly() -> None:
    base = [_lv(8, 460, gpu_power_w=390.0, gpu_util=0.66)]
    same = [_lv(8, 455, gpu_power_w=250.0, gpu_util=0.38)]
    assert analyze.anomalies(same, base, AnomalySpec()) == []


def _cap(capacity: float | None, step: float | None) -> dict[str, object]:
    return {"level": capacity or 8.0, "capacity": capacity, "capacity_step": step, "capacity_probes": 6}


def test_capacity_ranks_by_capacity_and_brackets_are_the_noise() -> None:
    slo = SLOSpec(tpot_ms={"p99": 100})
    a = analyze.score("a", "measured", [_cap(24, 1)], slo, "capacity")
    b = analyze.score("b", "measured", [_cap(19, 1)], slo, "capacity")
    assert (a.value, a.half_width, a.level) == (24, 1, 24)
    r = analyze.rank([b, a], "capacity")
    assert r.winner == "a" and r.significant is True and "runner-up failed at 20" in r.verdict
    # b's bracket [19, 25) holds a's 24: not significantly different
    wide = analyze.score("w", "measured", [_cap(19, 6)], slo, "capacity")
    r2 = analyze.rank([wide, a], "capacity")
    assert r2.winner == "a" and r2.significant is False and "within" in r2.verdict
    none = analyze.score("n", "measured", [_cap(None, None)], slo, "capacity")
    assert none.value is None and "capacity search (6 probes)" in none.why

"""A level's energy and cost (servelab.energy): the integration of a power trace against joules worked
out by hand, the edges of the window, the figures per token and per request, the price per million
output tokens, the simulated clock's time base, and the study's [cost] table."""

from __future__ import annotations

import pytest

from servelab.config.loading import parse_study
from servelab.config.sections import SearchSpec
from servelab.energy import LevelCost, LevelEnergy, Price, integrate, level_cost, level_energy
from servelab.errors import ConfigError
from servelab.model.predict import Workload, evaluate, make_setup
from servelab.objectives import objective
from servelab.results import LevelSeries, SeriesPoint

# 2 GPUs at 50 W each for the first 4 s, then at 150 W each: sampled every second from t = 0 to 9.
STEP = [(float(t), 100.0 if t < 5 else 300.0) for t in range(10)]


def test_a_piecewise_constant_trace_integrates_to_the_joules_worked_out_by_hand() -> None:
    # trapezoids: 0-4 s at 100 W = 400 J; the step between the samples at 4 and 5 s = (100 + 300) / 2 =
    # 200 J; 5-9 s at 300 W = 1,200 J; the last sample held to the window's end, 9-10 s = 300 J.
    assert integrate(STEP, 0.0, 10.0) == pytest.approx(2100.0)
    # the same as a step at 4.5 s: 4.5 s × 100 W + 5.5 s × 300 W
    assert integrate(STEP, 0.0, 10.0) == pytest.approx(4.5 * 100 + 5.5 * 300)


def test_the_window_clips_and_extends_the_trace() -> None:
    # the first sample held back to the window's start: 2 s before it at its 100 W
    assert integrate([(2.0, 100.0), (4.0, 100.0)], 0.0, 4.0) == pytest.approx(400.0)
    # samples outside the window count through the value interpolated at its edges: 100 → 300 W over
    # 0..10 s is 200 W at 5 s, and 5..10 s is then (200 + 300) / 2 × 5
    assert integrate([(0.0, 100.0), (10.0, 300.0)], 5.0, 10.0) == pytest.approx(1250.0)
    assert integrate([(0.0, 100.0), (10.0, 300.0)], 2.0, 3.0) == pytest.approx(150.0)
    assert integrate([], 0.0, 10.0) == 0.0
    assert integrate(STEP, 3.0, 3.0) == 0.0


def test_level_energy_per_token_per_request_and_above_idle() -> None:
    e = level_energy(STEP, 10.0, output_tokens=700, requests=7, idle_w=60.0, gpus=2)
    assert e is not None
    assert e.energy_j == pytest.approx(2100.0)
    assert e.mean_power_w == pytest.approx(210.0)
    assert e.j_per_output_token == pytest.approx(3.0)
    assert e.j_per_request == pytest.approx(300.0)
    assert e.output_tokens_per_j == pytest.approx(1 / 3)
    assert e.j_per_output_token_above_idle == pytest.approx((2100.0 - 600.0) / 700)
    assert (e.samples, e.interval_s, e.gpus) == (10, pytest.approx(1.0), 2)
    assert level_energy([], 10.0, 700, 7) is None  # no power seen: no energy
    none_out = level_energy(STEP, 10.0, 0, 0)
    assert none_out is not None and none_out.j_per_output_token is None and none_out.output_tokens_per_j == 0


def test_a_series_power_trace_is_the_mean_per_gpu_times_the_gpus() -> None:
    series = LevelSeries(
        interval_s=1.0,
        points=[
            SeriesPoint(t_s=1.0, gpu_power_w=50.0, gpus=2),
            SeriesPoint(t_s=2.0),  # a sample without GPU figures is not a zero
            SeriesPoint(t_s=3.0, gpu_power_w=150.0, gpus=2),
        ],
    )
    assert series.power_trace() == [(1.0, 100.0), (3.0, 300.0)]


def test_cost_per_million_output_tokens() -> None:
    # 8 GPUs at $3/h for 1,000 tok/s: $24/h for 3.6 M tokens = $6.667 per M
    c = level_cost(Price(gpu_hour_usd=3.0, source="flag", kwh_usd=0.2), 8, 1000.0, None)
    assert c is not None and c.usd_per_m_output_tokens == pytest.approx(24 / 3.6)
    assert c.price_source == "flag" and not c.is_default and c.energy_usd_per_m_output_tokens is None
    # twice the price, twice the cost
    c2 = level_cost(Price(gpu_hour_usd=6.0, source="study"), 8, 1000.0)
    assert c2 is not None and c2.usd_per_m_output_tokens == pytest.approx(2 * c.usd_per_m_output_tokens)
    # the electricity: 3.6 J per token is 1 kWh per M tokens
    e = level_energy([(0.0, 3600.0)], 1.0, output_tokens=1000, requests=1)
    c3 = level_cost(Price(gpu_hour_usd=3.0, source="catalog default (2025-10-01)", kwh_usd=0.2), 8, 1000.0, e)
    assert c3 is not None and c3.is_default
    assert c3.energy_usd_per_m_output_tokens == pytest.approx(0.2)
    assert level_cost(Price(gpu_hour_usd=3.0, source="flag"), 8, 0.0) is None


def test_the_simulated_clock_scales_joules_and_dollars_per_token() -> None:
    e = LevelEnergy(
        energy_j=100.0,
        window_s=1.0,
        mean_power_w=100.0,
        j_per_output_token=0.5,
        output_tokens_per_j=2.0,
        idle_w=40.0,
        interval_s=0.1,
    )
    g = e.in_gpu_time(20.0)
    assert (g.energy_j, g.window_s, g.mean_power_w, g.idle_w) == (2000.0, 20.0, 100.0, 40.0)
    assert g.j_per_output_token == pytest.approx(10.0) and g.output_tokens_per_j == pytest.approx(0.1)
    assert g.interval_s == pytest.approx(2.0) and e.in_gpu_time(1.0) is e
    c = LevelCost(usd_per_m_output_tokens=1.0, gpu_hour_usd=2.0, gpus=4, price_source="flag")
    assert c.in_gpu_time(20.0).usd_per_m_output_tokens == pytest.approx(20.0)


def test_energy_and_cost_are_objectives_lower_is_better_and_a_search_takes_them() -> None:
    for name in ("energy", "cost"):
        o = objective(name)
        assert o.direction == "min" and o.searchable and not o.searches_capacity
        assert SearchSpec.model_validate({"objectives": ["output_throughput", name]}).objectives[1] == name
    # the model's figure they follow: GPU-seconds per million output tokens, all replicas' GPUs
    p = evaluate(make_setup("Qwen3-30B-A3B", "h100-sxm", 2, tp=2), Workload(256, 32, 64))
    assert p.output_throughput
    assert p.gpu_s_per_m_output_tokens == pytest.approx(2 * p.replicas / p.output_throughput * 1e6)
    assert getattr(p, objective("energy").predicted_as) == p.gpu_s_per_m_output_tokens


def _study(**over: object) -> dict[str, object]:
    d: dict[str, object] = {
        "study": {"name": "s"},
        "model": {"path": "m"},
        "engine": {"name": "sim"},
        "workload": {"num_requests": 8},
        "load": {"concurrency": [1]},
        "candidates": [{"tp": 1}],
    }
    return d | over


def test_the_study_cost_table_is_checked_with_its_field_path() -> None:
    s = parse_study(_study(objective="cost", cost={"gpu_hour_usd": 2.5, "kwh_usd": 0.12}))
    assert (s.cost.gpu_hour_usd, s.cost.kwh_usd, s.price_source) == (2.5, 0.12, "study")
    flagged = s.priced(3.0, None)
    assert (flagged.cost.gpu_hour_usd, flagged.cost.kwh_usd, flagged.price_source) == (3.0, 0.12, "flag")
    assert s.priced(None, None) is s
    with pytest.raises(ConfigError) as exc:
        parse_study(_study(cost={"gpu_hour_usd": -1, "gpu_hours": 2}))
    msg = exc.value.message
    assert "cost.gpu_hour_usd" in msg and "greater than 0" in msg
    assert "cost.gpu_hours: unknown field" in msg

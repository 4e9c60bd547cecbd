"""The capacity search's logic (bench.capacity) against oracles: a server is a function load → pass."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from servelab.bench import capacity as C
from servelab.results import CapacityProbe, CapacityResult, RequestRecord


def _search(spec: C.SearchSpec, passes: Callable[[float], bool]) -> tuple[list[CapacityProbe], str]:
    history: list[CapacityProbe] = []
    while True:
        d = C.decide(spec, history)
        if d.load is None:
            return history, d.reason
        assert d.load not in {p.load for p in history}, "a load is never probed twice"
        history.append(CapacityProbe(load=d.load, passed=passes(d.load)))


def test_brackets_geometrically_then_bisects_to_the_resolution() -> None:
    # growth ×2 (the default is ×4) pins the sequence; without values the split is the geometric midpoint
    spec = C.SearchSpec(by="concurrency", start=4, growth=2.0, resolution=0.05, max_probes=20)
    history, reason = _search(spec, lambda c: c <= 37)
    loads = [p.load for p in history]
    assert loads[:5] == [4, 8, 16, 32, 64]  # ×2 until the first failure
    assert reason.startswith("converged")
    ok, bad = C.bracket(history)
    assert (ok, bad) == (37, 38)  # whole streams: step 1
    res = C.result(spec, C.parse_capacity_slo("p99_tpot_ms<=50"), history, reason)
    assert res.capacity == 37 and res.step == 1 and res.converged and res.probes == history


def test_rate_stops_when_the_step_is_under_the_resolution() -> None:
    spec = C.SearchSpec(by="rate", start=1.0, resolution=0.05, max_probes=20)
    history, reason = _search(spec, lambda r: r <= 11.3)
    ok, bad = C.bracket(history)
    assert ok is not None and bad is not None
    assert ok <= 11.3 < bad and (bad - ok) <= 0.05 * ok
    assert reason.startswith("converged")


def test_first_probe_fails_shrinks_until_one_passes() -> None:
    spec = C.SearchSpec(by="concurrency", start=64, growth=2.0, max_probes=20)  # ×2 pins the sequence
    history, _ = _search(spec, lambda c: c <= 5)
    assert [p.load for p in history][:5] == [64, 32, 16, 8, 4]
    assert C.bracket(history) == (5, 6)


def test_even_the_lowest_load_fails() -> None:
    spec = C.SearchSpec(by="concurrency", start=4, growth=2.0, max_probes=20)  # ×2 pins the sequence
    history, reason = _search(spec, lambda c: False)
    assert [p.load for p in history] == [4, 2, 1]
    assert "even the lowest load" in reason
    res = C.result(spec, C.parse_capacity_slo("ttft_ms<=1"), history, reason)
    assert res.capacity is None and res.bracket == (None, 1)


def test_every_probe_passes_up_to_the_highest_load() -> None:
    spec = C.SearchSpec(by="concurrency", start=100, growth=2.0, max_load=300, max_probes=20)
    history, reason = _search(spec, lambda c: True)
    assert [p.load for p in history] == [100, 200, 300]
    assert "every probe passed" in reason
    assert C.result(spec, C.parse_capacity_slo("ttft_ms<=1"), history, reason).step is None


def test_max_probes_stops_with_the_bracket_so_far() -> None:
    spec = C.SearchSpec(by="rate", start=1.0, resolution=0.01, max_probes=6)
    history, reason = _search(spec, lambda r: r <= 23.7)
    assert len(history) == 6 and reason.startswith("max probes")
    res = C.result(spec, C.parse_capacity_slo("p99_ttft_ms<=2000"), history, reason)
    assert not res.converged
    ok, bad = res.bracket
    assert ok is not None and bad is not None and ok <= 23.7 < bad


def test_a_non_monotonic_pass_above_a_failure_does_not_move_the_bracket() -> None:
    # 24 fails (say a noisy probe) though 28 passes: the capacity stays below the lowest failure.
    spec = C.SearchSpec(by="concurrency", start=4, max_probes=20)
    history, _ = _search(spec, lambda c: c <= 20 or c == 28)
    res = C.result(spec, C.parse_capacity_slo("p99_tpot_ms<=50"), history, "")
    assert res.capacity == 20 and res.bracket == (20, 21)
    history.append(CapacityProbe(load=28, passed=True))
    res = C.result(spec, C.parse_capacity_slo("p99_tpot_ms<=50"), history, "")
    assert res.capacity == 20 and res.non_monotonic == [28]


@pytest.mark.parametrize("seed", range(5))
def test_noise_near_the_edge_lands_inside_the_noisy_band(seed: int) -> None:
    """Each probe passes with a probability that falls from 1 to 0 across [27, 33]: the answer lies in
    that band (or one step below it), never far from it."""
    rng = random.Random(seed)

    def noisy(c: float) -> bool:
        p = min(1.0, max(0.0, (33 - c) / 6))
        return rng.random() < p

    spec = C.SearchSpec(by="concurrency", start=4, max_probes=12)
    history, _ = _search(spec, noisy)
    ok, bad = C.bracket(history)
    assert ok is not None and 16 <= ok <= 33
    assert bad is not None and bad > ok


def test_the_slo_reads_percentiles_and_bare_metrics_as_p99() -> None:
    slo = C.parse_capacity_slo("p99_ttft_ms<=2000, tpot_ms<=50,p50_e2e_ms<=9000")
    assert [(lim.stat, lim.metric, lim.limit_ms) for lim in slo.limits] == [
        ("p99", "ttft_ms", 2000.0),
        ("p99", "tpot_ms", 50.0),
        ("p50", "e2e_ms", 9000.0),
    ]
    for bad, words in [
        ("", "needs --slo"),
        ("p99_ttft<=3", "unknown SLO metric"),
        ("p99_ttft_ms=3", "must look like"),
        ("p99_ttft_ms<=x", "not a number"),
        ("p99_ttft_ms<=-1", "positive"),
    ]:
        with pytest.raises(ValueError, match=words):
            C.parse_capacity_slo(bad)


def _records(ttfts: list[float], failed: int = 0) -> list[RequestRecord]:
    out = [
        RequestRecord(
            idx=i, prompt_idx=i, start_s=i * 0.1, ok=True, ttft_s=t, e2e_s=t + 0.5, output_tokens=11
        )
        for i, t in enumerate(ttfts)
    ]
    out += [
        RequestRecord(idx=len(out) + j, prompt_idx=0, start_s=9.0, ok=False, error_kind="timeout")
        for j in range(failed)
    ]
    return out


def test_the_verdict_leaves_the_warm_up_out_and_scales_to_the_gpu_clock() -> None:
    slo = C.parse_capacity_slo("p99_ttft_ms<=1000")
    # the first 20 % are slow (a first wave), the rest fast
    recs = _records([2.0] * 20 + [0.04] * 80)
    p = C.verdict(8, 0, recs, slo)
    assert p.passed and p.values["p99_ttft_ms"] == pytest.approx(40.0)
    assert not C.verdict(8, 0, recs, slo, warmup_fraction=0.0).passed
    # at speed 30 the client's 40 ms are the GPU's 1200 ms
    slow = C.verdict(8, 0, recs, slo, speed=30)
    assert not slow.passed and slow.reasons == ["p99_ttft_ms 1,200.0 > 1000"]


def test_failed_requests_fail_the_probe() -> None:
    p = C.verdict(8, 0, _records([0.01] * 50, failed=5), C.parse_capacity_slo("p99_ttft_ms<=1000"))
    assert not p.passed and "failed" in p.reasons[0]


def test_overlapping_brackets() -> None:
    def r(ok: float | None, bad: float | None) -> CapacityResult:
        return CapacityResult(by="concurrency", slo="x", resolution=0.05, capacity=ok, bracket=(ok, bad))

    assert C.overlap(r(19, 20), r(19, 21))
    assert not C.overlap(r(19, 20), r(24, 25))
    assert C.overlap(r(30, None), r(40, 41))  # an unbounded bracket covers what lies above its pass


def test_bad_search_options() -> None:
    for kwargs, words in [
        ({"start": 0}, "positive"),
        ({"growth": 1.0}, "growth"),
        ({"resolution": 0}, "resolution"),
        ({"max_probes": 0}, "max-probes"),
    ]:
        with pytest.raises(ValueError, match=words):
            C.SearchSpec(**kwargs)  # type: ignore[arg-type]


def _search_curve(
    spec: C.SearchSpec, slo: C.CapacitySLO, value: Callable[[float], float]
) -> tuple[list[CapacityProbe], str]:
    """A search whose probes carry their value of the SLO's one limit (the server is a latency curve)."""
    (lim,) = slo.limits
    history: list[CapacityProbe] = []
    while True:
        d = C.decide(spec, history, slo)
        if d.load is None:
            return history, d.reason
        assert d.load not in {p.load for p in history}, "a load is never probed twice"
        v = value(d.load)
        history.append(CapacityProbe(load=d.load, passed=v <= lim.limit_ms, values={lim.name: v}))


@pytest.mark.parametrize("known", [6, 10, 14, 20, 27, 34, 45, 60])
@pytest.mark.parametrize("seed", range(3))
def test_the_default_search_lands_within_8_probes_on_a_latency_curve(known: int, seed: int) -> None:
    """Issue 18: within 10 % of the answer in at most 8 probes, from the default first probe (1 stream).
    TPOT rises with the streams from a floor (40 ms + 3 ms a stream; the limit is half a stream above
    `known`'s) and a probe's p99 is that ±2 % (seeded noise)."""
    rng = random.Random(seed)
    limit = 40 + 3 * (known + 0.5)
    slo = C.parse_capacity_slo(f"p99_tpot_ms<={limit}")
    spec = C.SearchSpec()  # the defaults: by concurrency from 1, ×4, 10 %, at most 8 probes
    history, reason = _search_curve(spec, slo, lambda c: (40 + 3 * c) * (1 + rng.uniform(-0.02, 0.02)))
    res = C.result(spec, slo, history, reason)
    assert len(history) <= 8, [p.load for p in history]
    assert res.capacity is not None and res.capacity == pytest.approx(known, rel=0.10), res.bracket
    assert res.converged, (reason, [p.load for p in history])


@pytest.mark.parametrize("mu", [12.0, 25.0, 48.0, 80.0])
def test_by_rate_a_queue_blowing_up_is_found_in_8_probes(mu: float) -> None:
    """p99 TTFT of an M/M/1-like server of `mu` requests/s: 300 ms ÷ (1 − λ/μ), limit 2 s: the answer
    is 0.85 μ. From 1 request/s, to the default 10 %."""
    slo = C.parse_capacity_slo("p99_ttft_ms<=2000")
    spec = C.SearchSpec(by="rate")

    def ttft(rate: float) -> float:
        return 300 / (1 - rate / mu) if rate < mu else 1e6

    history, reason = _search_curve(spec, slo, ttft)
    res = C.result(spec, slo, history, reason)
    assert len(history) <= 8 and res.converged, [p.load for p in history]
    ok, bad = res.bracket
    assert ok is not None and bad is not None and ok <= 0.85 * mu < bad


@pytest.mark.parametrize("answer", [17.3, 23.7, 41.0, 60.2])
@pytest.mark.parametrize("lie", [(0.99, 1.01), (0.1, 1.01), (0.99, 1e6), (0.1, 1e6)])
def test_misleading_values_cost_no_probe_over_bisection(lie: tuple[float, float], answer: float) -> None:
    """ITP's guarantee (n0 = 0): whatever the values say, the splits of the first bracket [16, 64] take no
    more probes than bisecting it in log space at worst: ⌈log2(ln 4 / ln 1.1)⌉ = 4 at the default 10 %.
    Every pass reports lie[0] × the limit, every failure lie[1] ×."""
    slo = C.parse_capacity_slo("p99_tpot_ms<=100")
    spec = C.SearchSpec(by="rate")
    history, reason = _search_curve(spec, slo, lambda r: 100 * (lie[0] if r <= answer else lie[1]))
    assert [p.load for p in history[:4]] == [1, 4, 16, 64]
    assert reason.startswith("converged") and len(history) - 4 <= 4, [p.load for p in history]
    ok, bad = C.bracket(history)
    assert ok is not None and bad is not None and ok <= answer < bad and C.converged(spec, ok, bad)

"""The noise verdict's cluster bootstrap (pure): seeded, order-free, and honest about what it used."""

from __future__ import annotations

import random

from servelab import analyze

OBJ = "output_throughput"


def _trial(value: float, n: int, seed: int, spread: float = 0.05) -> analyze.Cluster:
    """A trial of `n` requests of 32 tokens whose request times scatter by `spread` around 1 s."""
    rng = random.Random(seed)
    e2e = tuple(1.0 + rng.uniform(-spread, spread) for _ in range(n))
    return analyze.Cluster(value, tuple(32.0 for _ in range(n)), e2e)


def _score(label: str, value: float) -> analyze.Score:
    return analyze.Score(label, "measured", value, 16.0, 8.0)  # a t half-width of two trials: wide


def test_identical_configs_are_within_the_noise_whatever_the_seed() -> None:
    a = [_trial(100.0, 64, 1), _trial(101.0, 64, 2)]
    b = [_trial(100.5, 64, 3), _trial(100.2, 64, 4)]
    verdicts = {
        analyze.rank([_score("a", 100.5), _score("b", 100.35)], OBJ, {"a": a, "b": b}, seed=s).significant
        for s in range(8)
    }
    assert verdicts == {False}


def test_a_clear_lead_exceeds_the_noise_and_the_order_read_does_not_matter() -> None:
    a = [_trial(120.0, 64, 1), _trial(121.0, 64, 2)]
    b = [_trial(100.0, 64, 3), _trial(100.4, 64, 4)]
    scores = [_score("a", 120.5), _score("b", 100.2)]
    r = analyze.rank(scores, OBJ, {"a": a, "b": b})
    assert r.significant is True and r.winner == "a"
    assert r.noise["method"] == analyze.bootstrap_method() and r.noise["method"] in r.verdict
    lo, hi = r.noise["difference_ci95"]
    assert 0 < lo < 20.3 < hi
    flipped = {
        "b": [analyze.Cluster(c.value, c.num[::-1], c.den[::-1]) for c in reversed(b)],
        "a": list(reversed(a)),
    }
    assert analyze.rank(list(reversed(scores)), OBJ, flipped).noise == r.noise


def test_without_per_request_data_the_t_interval_is_named() -> None:
    r = analyze.rank([_score("a", 120.5), _score("b", 100.2)], OBJ, {})
    assert r.noise["method"] == analyze.T_METHOD and analyze.T_METHOD in r.verdict
    assert r.significant is False  # 20.3 < hypot(16, 16): one degree of freedom says little
    one = analyze.rank([_score("a", 120.5), _score("b", 100.2)], OBJ, {"a": [_trial(1, 8, 1)], "b": []})
    assert one.noise["method"] == analyze.T_METHOD  # one trial cannot show trial-to-trial noise


def test_latency_objectives_bootstrap_the_median() -> None:
    fast = [analyze.Cluster(10.0, tuple(10.0 + i % 3 for i in range(50))) for _ in range(2)]
    slow = [analyze.Cluster(20.0, tuple(20.0 + i % 3 for i in range(50))) for _ in range(2)]
    scores = [
        analyze.Score("fast", "measured", 10.0, None, 8.0),
        analyze.Score("slow", "measured", 20.0, None, 8.0),
    ]
    r = analyze.rank(scores, "tpot_ms_p50", {"fast": fast, "slow": slow})
    assert r.winner == "fast" and r.significant is True
    assert analyze.bootstrap_half_width(fast) is not None

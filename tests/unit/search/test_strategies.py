"""Strategies and pruning on a toy world: a pure function of the point stands for the measurement, so the
search's bookkeeping (no point twice, regions learned and kept out, budgets, determinism, halving's rungs)
is tested without servers. The same loop on the simulator is tests/integration/test_tune_search.py."""

from __future__ import annotations

from typing import Any

import pytest

from servelab import space as sp
from servelab.config.loading import parse_study
from servelab.engines.base import Setting
from servelab.search import prune
from servelab.search.base import History, NamedSetting, Tried, point_key
from servelab.search.strategies import Budget, Halving, OptunaSearch, pool, promoted


def _space(**extra: Any) -> sp.Space:
    study = parse_study(
        {
            "study": {"name": "s"},
            "model": {"path": "GLM-5-NVFP4"},
            "host": {"gpu": "rtx-pro-6000", "num_gpus": 8},
            "engine": {"name": "sim", "options": {"personality": "sglang"}},
            "workload": {"num_requests": 8},
            "load": {"concurrency": [4]},
            "search": {
                "strategy": "optuna",
                "space": {
                    "layout": ["tp8", "tp4-pp2", "tp2-pp4"],
                    "moe_runner_backend": ["flashinfer_cutlass", "flashinfer_trtllm"],
                    "max_running_requests": [16, 64, 256, 1024],
                    "fusion": [False, True],
                    **extra,
                },
            },
        }
    )
    assert study.search is not None
    return sp.build(study.search)


def world(point: sp.Point) -> Tried:
    """trtllm is not applied; fusion collapses; else throughput grows with the cap, tp8 best."""
    label = sp.label(point)
    if point["moe_runner_backend"] == "flashinfer_trtllm":
        return Tried(label, point, "not_applied", not_applied=("moe_runner_backend",), reason="fell back")
    layout_gain = {"tp8": 1.0, "tp4-pp2": 0.9, "tp2-pp4": 0.7}[str(point["layout"])]
    value = layout_gain * min(int(point["max_running_requests"]), 256)
    if point["fusion"]:
        return Tried(label, point, "collapsed", (value * 0.1,), reason="throughput_collapse")
    return Tried(label, point, "measured", (value,))


def rank(point: sp.Point) -> float:
    return {"tp8": 3.0, "tp4-pp2": 2.0, "tp2-pp4": 1.0}[str(point["layout"])] + float(
        point["max_running_requests"]
    ) / 1e4


def drive(search: Any, budget: Budget, steps: int = 200) -> History:
    h = History()
    for _ in range(steps):
        prop = search.propose(h, rank, budget)
        if prop is None:
            break
        if prop.pruned:
            h.tried.append(
                Tried(sp.label(prop.point), prop.point, "pruned", origin="pruned", reason=prop.region.reason)
            )
            continue
        t = world(prop.point)
        h.tried.append(Tried(t.label, t.point, t.outcome, t.values, 0, prop.origin, t.not_applied, t.reason))
        h.trials_used += 1
    return h


def test_regions_generalise_as_good_points_arrive() -> None:
    space = _space()
    bad = world(
        {
            "layout": "tp4-pp2",
            "moe_runner_backend": "flashinfer_cutlass",
            "max_running_requests": 64,
            "fusion": True,
        }
    )
    h = History([bad])
    (only,) = prune.regions(h, space)  # nothing good yet: the whole point's values
    assert dict(only.values) == dict(bad.point)
    good = world(
        {
            "layout": "tp4-pp2",
            "moe_runner_backend": "flashinfer_cutlass",
            "max_running_requests": 64,
            "fusion": False,
        }
    )
    (narrow,) = prune.regions(History([bad, good]), space)
    assert (
        dict(narrow.values) == {"fusion": True} and narrow.kind == "collapsed" and narrow.source == bad.label
    )
    na = world(
        {
            "layout": "tp8",
            "moe_runner_backend": "flashinfer_trtllm",
            "max_running_requests": 16,
            "fusion": False,
        }
    )
    learned = prune.regions(History([bad, good, na]), space)
    assert {r.text() for r in learned} == {"fusion = True", "moe_runner_backend = 'flashinfer_trtllm'"}


def test_optuna_search_runs_no_point_twice_and_nothing_in_a_learned_region() -> None:
    search = OptunaSearch(_space(), [1.0], seed=3, prior_trials=3)
    h = drive(search, Budget(20, None))
    ran = [t for t in h.tried if t.outcome != "pruned"]
    # the good region holds 12 points (3 layouts x 4 caps): the search ran them all, plus the two bad
    # points that taught the regions, and then had nothing left worth a trial (14 of a budget of 20)
    assert len(ran) == 14 and sum(t.ok for t in ran) == 12
    assert len({point_key(t.point) for t in h.tried}) == len(h.tried)  # no point proposed twice
    first_na = next(i for i, t in enumerate(h.tried) if t.outcome == "not_applied")
    later = [t for t in h.tried[first_na + 1 :] if t.point["moe_runner_backend"] == "flashinfer_trtllm"]
    assert later and all(t.outcome == "pruned" for t in later)  # every trtllm point after the first: pruned
    assert [t.origin for t in ran[:3]] == ["prior"] * 3 and ran[0].point["layout"] == "tp8"
    best = max(t.values[0] for t in ran if t.ok and t.values[0] is not None)
    assert best == pytest.approx(256.0)  # the world's optimum (tp8, cap >= 256, cutlass, no fusion)


def test_the_same_history_gives_the_same_proposal() -> None:
    search = OptunaSearch(_space(), [1.0], seed=5, prior_trials=2)
    h = drive(search, Budget(9, None))
    a = OptunaSearch(_space(), [1.0], seed=5, prior_trials=2).propose(h, rank, Budget(30, None))
    b = search.propose(h, rank, Budget(30, None))
    assert a is not None and b is not None and a.point == b.point and a.origin == b.origin


def test_budgets_reserve_the_contenders_repeats() -> None:
    h = drive(OptunaSearch(_space(), [1.0], seed=1, prior_trials=2), Budget(12, None, reserve_trials=4))
    assert h.trials_used == 8
    timed = History(list(h.tried), trials_used=8, elapsed_s=80.0)
    assert Budget(None, 100.0, reserve_trials=2).spent(timed)  # 80 s + 2 × 10 s
    assert not Budget(None, 101.0, reserve_trials=2).spent(timed)


def test_two_objectives_use_nsga2_and_keep_the_bookkeeping() -> None:
    search = OptunaSearch(_space(), [1.0, -1.0], seed=2, prior_trials=1)
    assert type(search.study(History()).sampler).__name__ == "NSGAIISampler"


def test_halving_starts_what_the_budget_allows_and_promotes_one_in_eta() -> None:
    space = _space()
    hv = Halving(space, 1.0, seed=0, eta=3, contenders=2)
    n_points = len(pool(space, 0))
    assert n_points == 48
    assert hv.rung0_size(n_points, Budget(None, None)) == 48
    assert hv.rung0_size(n_points, Budget(20, None, reserve_trials=2)) == 13  # 13 + 5 = 18 <= 18
    h = History()
    promotions = []
    for _ in range(200):
        prop = hv.propose(h, rank, Budget(20, None, reserve_trials=2))
        if prop is None:
            break
        if prop.pruned:
            h.tried.append(Tried(sp.label(prop.point), prop.point, "pruned", origin="pruned"))
            continue
        if prop.rung == 1:
            promotions.append(prop.point)
            i = next(i for i, t in enumerate(h.tried) if t.point == prop.point)
            t = h.tried[i]
            h.tried[i] = Tried(t.label, t.point, t.outcome, t.values, 1, t.origin)
            continue
        t = world(prop.point)
        h.tried.append(Tried(t.label, t.point, t.outcome, t.values, 0, "rung", t.not_applied, t.reason))
    started = [t for t in h.tried if t.origin == "rung"]
    assert len(started) == 13
    measured = [t for t in started if t.ok]
    assert len(promotions) == -(-len(measured) // 3)
    top = sorted(measured, key=lambda t: -(t.values[0] or 0.0))[: len(promotions)]
    assert [point_key(p) for p in promotions] == [point_key(t.point) for t in top]
    assert [t.label for t in promoted(h, 1.0, 2)] == [t.label for t in top[:2]]


def test_a_failure_naming_its_setting_rules_out_the_values_beyond_the_one_to_try() -> None:
    """The diagnosis read max_model_len (32768 failed, 19968 to try): every longer length with the failed
    point's unshared values is ruled out, shorter ones are not; a flag (cuda_graph off = enforce_eager)
    rules out the point's value of that flag."""
    space = _space(max_model_len=[8192, 16384, 32768, 65536], enforce_eager=[False, True])
    base = {
        "layout": "tp8",
        "moe_runner_backend": "flashinfer_cutlass",
        "max_running_requests": 64,
        "fusion": False,
    }
    good = Tried("g", {**base, "max_model_len": 8192, "enforce_eager": False}, "measured", (1.0,))
    kv = NamedSetting("max_model_len", 19968)
    bad = Tried("b", {**base, "max_model_len": 32768, "enforce_eager": False}, "failed", setting=kv)
    (region,) = prune.regions(History([good, bad]), space)
    assert region.text() == "max_model_len > 19968" and region.kind == "failed" and region.source == "b"
    assert prune.avoided({**base, "max_model_len": 65536, "enforce_eager": True}, [region]) is region
    assert prune.avoided({**base, "max_model_len": 16384, "enforce_eager": False}, [region]) is None
    # the failed point's values no good point shares stay in the region (a tp4-pp2 one has its own memory)
    alone = Tried("b2", {**bad.point, "layout": "tp4-pp2"}, "failed", setting=kv)
    (narrow,) = prune.regions(History([good, alone]), space)
    assert narrow.text() == "layout = 'tp4-pp2' and max_model_len > 19968"
    # a measured point inside the region proves it wrong: dropped
    long_ok = Tried("ok", {**base, "max_model_len": 65536, "enforce_eager": True}, "measured", (1.0,))
    assert prune.regions(History([good, bad, long_ok]), space) == []
    graphs = NamedSetting("cuda_graph", False, (("enforce_eager", True),))
    crash = Tried("c", {**base, "max_model_len": 8192, "enforce_eager": False}, "failed", setting=graphs)
    eager_ok = Tried("e", {**good.point, "enforce_eager": True}, "measured", (1.0,))
    (eager,) = prune.regions(History([eager_ok, crash]), space)
    assert eager.text() == "enforce_eager = False" and eager.kind == "failed"
    assert prune.avoided(eager_ok.point, [eager]) is None
    # a good point with that very value proves the region wrong: dropped
    assert prune.regions(History([good, crash]), space) == []
    # without a setting, a failure whose values all ran fine teaches nothing beyond itself
    assert (
        prune.regions(History([good, Tried("d", good.point | {"max_running_requests": 64}, "failed")]), space)
        == []
    )


def test_the_search_reads_the_setting_a_diagnosis_stored() -> None:
    """What engines.base.Setting writes into a stored diagnosis, read back as the search's own type."""
    stored = Setting("cuda_graph", False, "capture crashed", True, (("enforce_eager", True),)).to_dict()
    assert NamedSetting.from_stored(stored) == NamedSetting("cuda_graph", False, (("enforce_eager", True),))
    kv = Setting("max_model_len", 19968, "20000 fit", 32768).to_dict()
    assert NamedSetting.from_stored(kv) == NamedSetting("max_model_len", 19968)
    assert NamedSetting.from_stored({"value": 1}) is None and NamedSetting.from_stored(None) is None

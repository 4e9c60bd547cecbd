"""Load kinds as types (servelab.load, issue 30): the main-level rule written once, each kind's unit, axis,
warm-up and what a level means to the model; a study's [load] read into its kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support import trace_samples

from servelab import load as L
from servelab.config.sections import LoadSpec
from servelab.config.study import Study

BASE = {
    "study": {"name": "k"},
    "model": {"path": "Qwen3-30B-A3B"},
    "host": {"gpu": "h100-sxm", "num_gpus": 1},
    "engine": {"name": "sim", "options": {"speed": 10}},
    "candidates": [{"name": "a", "tp": 1}],
    "workload": {"num_requests": 8},
}


def _study(load: dict[str, object], **extra: object) -> Study:
    return Study.model_validate(BASE | {"load": load} | extra)


def test_the_main_level_is_the_given_one_else_the_highest() -> None:
    assert L.make("concurrency", [1, 8, 4]).main == 8
    assert L.make("concurrency", [1, 8, 4], main=4).main == 4
    assert L.make("rate", [1.5, 2.5]).main == 2.5  # a rate stays a rate: never int(2.5)
    assert L.make("trace", [5.0, 10.0], main=5.0).main == 5.0


@pytest.mark.parametrize(
    "load,kind,mode,unit,main",
    [
        ({"concurrency": [1, 4]}, L.ConcurrencyLoad, "concurrency", "in flight", 4),
        ({"rate": [0.5, 1.5]}, L.RateLoad, "rate", "req/s", 1.5),
        (
            {"trace": "t.jsonl", "time_scale": [2.0, 4.0], "main": 2.0},
            L.TraceLoad,
            "trace",
            "× trace time",
            2.0,
        ),
    ],
)
def test_a_study_load_is_its_kind(
    load: dict[str, object], kind: type, mode: str, unit: str, main: float
) -> None:
    k = _study(load).load_kind()
    assert type(k) is kind and k.mode == mode and k.unit == unit
    assert k.main == main and k.describe() == {"mode": mode, "level": main, "unit": unit}
    assert L.from_spec(load) == k


def test_sessions_are_a_closed_loop_of_conversations() -> None:
    st = _study({"concurrency": [2, 4]}, workload={"kind": "sessions", "turns": 2})
    k = st.load_kind()
    assert isinstance(k, L.SessionsLoad) and k.mode == "concurrency" and k.closed_loop
    assert k.as_concurrency_for_model(4, lambda c: None) == L.ModelConcurrency(4)


def test_a_trace_study_refuses_what_a_trace_brings_itself() -> None:
    with pytest.raises(ValueError, match="requests_per_stream"):
        _study({"trace": "t.jsonl"}, workload={"requests_per_stream": 2})
    with pytest.raises(ValueError, match="capacity"):
        _study({"trace": "t.jsonl"}, objective="capacity", slo={"tpot_ms": {"p99": 50}})
    with pytest.raises(ValueError, match="exactly one"):
        LoadSpec.model_validate({"rate": [1.0], "trace": "t.jsonl"})
    with pytest.raises(ValueError, match="need trace"):
        LoadSpec.model_validate({"rate": [1.0], "time_scale": [2.0]})


def test_with_levels_keeps_the_kind() -> None:
    assert LoadSpec.model_validate({"concurrency": [1, 8]}).with_levels([8.0]).concurrency == [8]
    assert LoadSpec.model_validate({"rate": [1.5, 2.5]}).with_levels([2.5]).rate == [2.5]
    t = LoadSpec.model_validate({"trace": "t.jsonl", "time_scale": [2.0, 4.0]}).with_levels([4.0])
    assert t.mode == "trace" and t.levels == [4.0] and t.main is None


def test_an_open_loop_is_the_model_concurrency_that_reaches_its_rate() -> None:
    def rate_at(c: int) -> float | None:  # 2 req/s per request in flight, up to 64
        return 2.0 * c if c <= 64 else None

    rate = L.make("rate", [10.0, 30.0])
    assert rate.as_concurrency_for_model(10.0, rate_at) == L.ModelConcurrency(5)
    assert rate.as_concurrency_for_model(30.0, rate_at, speed=10) == L.ModelConcurrency(2)  # 3 req/s GPU time
    over = rate.as_concurrency_for_model(1000.0, lambda c: min(2.0 * c, 128.0))
    assert over.concurrency == 4096 and over.reason and "peak" in over.reason
    # a trace offers its own rate × the time scale; unread, the model has none
    assert L.make("trace", [2.0]).as_concurrency_for_model(2.0, rate_at).concurrency is None
    assert L.make("trace", [2.0], trace_rate=5.0).as_concurrency_for_model(2.0, rate_at).concurrency == 5


def test_a_trace_study_reads_its_rate_for_the_model() -> None:
    path = Path(trace_samples.DIR / "mooncake.jsonl")
    k = _study({"trace": str(path), "time_scale": [1.0]}).load_kind(read_trace=True)
    assert isinstance(k, L.TraceLoad) and k.trace_rate is not None and k.trace_rate > 0


def test_measured_concurrency_and_warmup_follow_the_kind() -> None:
    assert L.kind_of("concurrency").measured_concurrency(8, 3.0, 1000.0) == 8
    assert L.kind_of("rate").measured_concurrency(2.0, 2.0, 1500.0) == 3  # Little's law
    assert L.kind_of("trace").measured_concurrency(2.0, None, None) == 1
    assert L.kind_of("concurrency").warmup_streams(8, None) == 8
    assert L.kind_of("rate").warmup_streams(2.0, None) == 4
    assert L.kind_of("rate").axis_label == "request rate (req/s)"
    with pytest.raises(ValueError, match="unknown load mode"):
        L.kind_of("bursts")

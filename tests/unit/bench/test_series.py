"""`LevelScrape.series`: the samples of a level on the client's timeline, counters as per-sample changes."""

from __future__ import annotations

from servelab.bench.scrape import GpuReading, LevelScrape, parse_prometheus, pick
from servelab.bench.telemetry import on_this_machine


def _sample(waiting: int, preempted: int, generated: int) -> dict[str, float]:
    text = (
        f"vllm:num_requests_waiting {waiting}\nvllm:num_requests_running 3\n"
        f"vllm:kv_cache_usage_perc 0.25\nvllm:num_preemptions_total {preempted}\n"
        f"vllm:generation_tokens_total {generated}\n"
    )
    return pick(parse_prometheus(text))


def test_times_are_from_the_level_start_and_counters_become_changes() -> None:
    scrape = LevelScrape(before=_sample(0, 5, 100))
    for at, (w, p, g) in zip((10.5, 11.0, 11.5), ((2, 5, 150), (7, 8, 260), (4, 1, 30)), strict=True):
        scrape.samples.append(_sample(w, p, g))
        scrape.sample_at.append(at)
        scrape.gpu_samples.append(GpuReading(power_w=300.0, util=0.9, memory_used_mib=1000.0, gpus=2))
    series = scrape.series(origin=10.0, interval_s=0.5, gpu_source="nvml")
    assert [p.t_s for p in series.points] == [0.5, 1.0, 1.5]
    assert [p.requests_waiting for p in series.points] == [2, 7, 4]
    assert [p.kv_cache_usage for p in series.points] == [0.25] * 3
    # since the sample before (the first: since the level's opening snapshot); the last counter went
    # down (a restarted server), so it counts from zero
    assert [p.preemptions for p in series.points] == [0, 3, 1]
    assert [p.generation_tokens for p in series.points] == [50, 110, 30]
    assert series.points[0].gpu_power_w == 300.0 and series.gpu_source == "nvml"
    shown = series.in_gpu_time(20.0)
    assert [p.t_s for p in shown.points] == [10.0, 20.0, 30.0] and shown.interval_s == 10.0
    assert [p.requests_waiting for p in shown.points] == [2, 7, 4]


def test_a_counter_the_server_does_not_report_stays_none() -> None:
    scrape = LevelScrape(before={})
    scrape.samples.append(pick(parse_prometheus("sglang:num_queue_reqs 3\n")))
    scrape.sample_at.append(1.0)
    scrape.gpu_samples.append(None)
    (p,) = scrape.series(origin=0.0, interval_s=1.0).points
    assert p.requests_waiting == 3 and p.preemptions is None and p.gpu_power_w is None


def test_only_a_loopback_server_reached_directly_has_this_machines_gpus() -> None:
    assert on_this_machine("http://127.0.0.1:8000", None)
    assert on_this_machine("http://localhost:8000", "direct")
    assert on_this_machine("http://[::1]:8000", None)
    assert not on_this_machine("http://127.0.0.1:8000", "ssh-forward")  # the GPUs are the far end's
    assert not on_this_machine("http://10.1.2.3:8000", None)
    assert not on_this_machine("http://gpubox:8000", None)

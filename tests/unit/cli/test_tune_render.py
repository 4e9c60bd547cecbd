"""The tune CLI's pieces that need no server: names fitted to a column, the live line's arithmetic."""

from __future__ import annotations

from servelab.cli.output import fit_labels
from servelab.cli.tune import LiveLevel
from servelab.events import RequestDone


def test_names_that_fit_are_kept_whole_and_too_long_ones_get_a_legend() -> None:
    names = ["tp8-cutlass", "tp8-cutlass-arfusion"]
    assert fit_labels(names, 24) == ({n: n for n in names}, [])
    shown, legend = fit_labels(names, 12)
    assert shown == {"tp8-cutlass": "tp8-cutlass", "tp8-cutlass-arfusion": "#1"}
    assert legend == ["#1  tp8-cutlass-arfusion"]


def test_live_line_counts_tokens_and_ttft_in_gpu_time_and_projects_the_eta() -> None:
    t = [100.0]
    live = LiveLevel("tp8", "c=8", 4, now=lambda: t[0])
    t[0] = 102.0
    # the first request ended 2 s after it was due: the level's clock starts then; speed 20: GPU time
    live.request_done(RequestDone(0, done=1, ok=True, output_tokens=40, ttft_s=0.01, end_s=2.0, speed=20))
    live.request_done(RequestDone(0, done=2, ok=False, output_tokens=None, ttft_s=None, end_s=None, speed=20))
    t[0] = 104.0
    assert live.text() == (
        "tp8 level c=8: 2/4 requests (1 failed) · 0 tok/s · TTFT p50 200.0 ms · 0:04 elapsed · ETA 0:04"
    )
    live.request_done(RequestDone(0, done=3, ok=True, output_tokens=1560, ttft_s=0.03, end_s=None, speed=20))
    live.request_done(RequestDone(0, done=4, ok=True, output_tokens=0, ttft_s=0.02, end_s=None, speed=20))
    assert live.text().endswith("· 20 tok/s · TTFT p50 400.0 ms · 0:04 elapsed · ETA 0:00")

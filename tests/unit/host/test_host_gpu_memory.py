"""servelab.host.gpu_memory: waiting for GPU memory to return, with an injected reader."""

from __future__ import annotations

import shutil

from servelab.host.gpu_memory import nvidia_smi_reader, wait_for_baseline


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_no_gpus_is_ok() -> None:
    report = wait_for_baseline(None, reader=lambda: None)
    assert report.status == "no GPUs" and report.ok
    assert report.to_dict()["ok"] is True


def test_waits_until_memory_is_back() -> None:
    readings = iter([[9000, 500], [4000, 500], [600, 510]])
    clock = _Clock()
    report = wait_for_baseline(
        [500, 500],
        reader=lambda: next(readings),
        timeout_s=30,
        tolerance_mib=256,
        poll_s=1.0,
        sleep=clock.sleep,
        clock=clock,
    )
    assert report.status == "back to baseline" and report.ok
    assert report.final_mib == [600, 510]
    assert report.waited_s == 2.0


def test_reports_what_is_still_held_at_the_timeout() -> None:
    clock = _Clock()
    report = wait_for_baseline(
        [500, 500],
        reader=lambda: [500, 20000],
        timeout_s=5,
        tolerance_mib=100,
        sleep=clock.sleep,
        clock=clock,
    )
    assert report.status == "not back" and not report.ok
    assert report.over_mib == [0, 19400]


def test_a_changed_gpu_count_has_no_baseline() -> None:
    assert wait_for_baseline([1, 2], reader=lambda: [1]).status == "no baseline"


def test_nvidia_smi_reader_without_gpus() -> None:
    if shutil.which("nvidia-smi") is None:
        assert nvidia_smi_reader() is None
    else:
        got = nvidia_smi_reader()
        assert got is None or all(v >= 0 for v in got)

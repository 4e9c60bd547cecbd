"""The decode breakdown adds up: its parts make the step, and the allreduce line's count × time each is
the allreduce part, for several models, GPUs, layouts and batch sizes."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from servelab.cli.main import cli
from servelab.model.predict import Workload, predict

CASES = [
    ("GLM-5-NVFP4", "rtx-pro-6000", 8, {"tp": 8}),
    ("GLM-5-NVFP4", "rtx-pro-6000", 8, {"tp": 4, "pp": 2}),
    ("GLM-5-NVFP4", "rtx-pro-6000", 8, {"tp": 2, "dp": 4}),
    ("Llama-3.1-70B", "h100-sxm", 4, {"quant": "fp8"}),
    ("Qwen3-32B", "l40s", 4, {}),
    ("DeepSeek-V3", "h200-sxm", 8, {"tp": 8}),
]


@pytest.mark.parametrize(("model", "gpu", "n", "kw"), CASES)
@pytest.mark.parametrize("conc", [1, 16, 64, 256])
def test_parts_add_up_to_the_step_and_allreduces_to_their_part(
    model: str, gpu: str, n: int, kw: dict[str, object], conc: int
) -> None:
    p = predict(model, gpu, n, Workload(1024, 1024, conc), **kw)
    assert p.feasible, p.reason
    parts = p.decode_breakdown_ms
    assert p.decode_step_ms is not None
    assert sum(parts.values()) == pytest.approx(p.decode_step_ms, abs=1e-3)
    if p.allreduces_per_step:
        assert p.allreduce_us_each is not None and p.allreduce_latency_us_each is not None
        assert p.allreduces_per_step * p.allreduce_us_each / 1e3 == pytest.approx(
            parts["allreduce"], abs=1e-4
        )
        assert 0 < p.allreduce_latency_us_each <= p.allreduce_us_each
        assert p.allreduce_bytes_each and p.allreduce_bytes_each > 0
    else:
        assert parts["allreduce"] == 0
    # the compute part is what the work adds beyond the reads it overlaps: never more than the work
    assert p.decode_compute_work_ms is not None and p.decode_compute_work_ms > 0
    assert parts["compute"] <= p.decode_compute_work_ms + 1e-9


def test_allreduce_time_each_grows_with_the_batch_message() -> None:
    """The bandwidth share of an allreduce grows with the tokens in the step; the latency does not."""
    small = predict("GLM-5-NVFP4", "rtx-pro-6000", 8, Workload(1024, 1024, 1), tp=8)
    big = predict("GLM-5-NVFP4", "rtx-pro-6000", 8, Workload(1024, 1024, 64), tp=8)
    assert small.allreduce_latency_us_each == pytest.approx(big.allreduce_latency_us_each)
    assert big.allreduce_bytes_each == pytest.approx(64 * small.allreduce_bytes_each)  # type: ignore[operator]
    assert big.allreduce_us_each > small.allreduce_us_each + 20  # type: ignore[operator]


def test_printed_breakdown_adds_up_at_c64() -> None:
    """What a person reads: `N allreduces at X µs each: T ms` is the table's allreduce row, and the compute
    row is explained, not a bare 0.000."""
    r = CliRunner().invoke(
        cli, ["predict", "-m", "GLM-5-NVFP4", "--gpu", "rtx-pro-6000", "-n", "8", "--tp", "8", "-c", "64"]
    )
    assert r.exit_code == 0, r.output
    row = re.search(r"│ allreduce\s+│\s+([\d.]+) │", r.output)
    line = re.search(r"(\d+) allreduces per step at ([\d.]+) µs each .*?: ([\d.]+) ms", r.output)
    assert row and line, r.output
    n, each, total = int(line.group(1)), float(line.group(2)), float(line.group(3))
    assert n == 156
    assert total == pytest.approx(float(row.group(1)), abs=0.01)
    assert n * each / 1e3 == pytest.approx(total, abs=0.02)
    work = re.search(r"compute: ([\d.]+) ms of GEMM and attention work", r.output)
    assert work and float(work.group(1)) > 1.0, r.output

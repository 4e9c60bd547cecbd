"""`servelab predict`, `explain` and `calibrate` through the CLI: printed output and what is stored."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from servelab.cli.main import cli


def run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, (r.stdout if "--json" in args and r.exit_code == 0 else r.output)


def test_predict_json_has_the_documented_keys() -> None:
    code, out = run("predict", "-m", "GLM-5-NVFP4", "--gpu", "rtx-pro-6000", "-n", "8", "--tp", "8", "--json")
    assert code == 0, out
    d = json.loads(out)
    for key in (
        "feasible",
        "tpot_ms",
        "ttft_ms",
        "output_throughput",
        "decode_breakdown_ms",
        "allreduce_share",
        "allreduces_per_step",
        "memory_gb_per_gpu",
        "kv_cache_tokens",
        "max_concurrency",
        "single_stream_ceiling_tok_s",
    ):
        assert key in d
    assert d["allreduces_per_step"] == 156


def test_predict_human_view() -> None:
    code, out = run(
        "predict", "-m", "Llama-3.1-70B", "--gpu", "h100-sxm", "-n", "4", "--quant", "fp8", "-c", "16"
    )
    assert code == 0, out
    assert "TPOT" in out and "allreduce" in out


def test_predict_infeasible_says_why_with_numbers() -> None:
    code, out = run("predict", "-m", "Llama-3.1-405B", "--gpu", "rtx-pro-6000", "-n", "2", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["feasible"] is False and "GB per GPU" in d["reason"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpu", "nope", "-n", "1", "-m", "Qwen3-8B"], "known GPUs"),
        (["--gpu", "h100-sxm", "-n", "1", "-m", "nope"], "catalog models"),
        (["--gpu", "h100-sxm", "-n", "8", "--tp", "3", "-m", "Qwen3-8B"], "GPUs"),
        (["--gpu", "h100-sxm", "-n", "1", "-m", "Qwen3-8B", "--quant", "fp3"], "unknown quantization"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], needle: str) -> None:
    r = CliRunner().invoke(cli, ["predict", *args])
    assert r.exit_code == 2
    assert needle in r.output
    assert "Traceback" not in r.output


def test_compare_layouts_and_sweep() -> None:
    code, out = run(
        "predict", "-m", "GLM-5-NVFP4", "--gpu", "rtx-pro-6000", "-n", "8", "--compare-layouts", "--json"
    )
    assert code == 0
    d = json.loads(out)
    assert d["layouts"][0]["rank"] == 1 and d["layouts"][0]["verdict"] == "best"
    code, out = run(
        "predict", "-m", "Qwen3-32B", "--gpu", "h200-sxm", "-n", "2", "--sweep", "1,8,32", "--json"
    )
    assert code == 0
    pts = json.loads(out)["points"]
    assert [p["concurrency"] for p in pts] == [1, 8, 32]


# `explain RUN` and `calibrate fit --run` read runs the real `servelab bench` wrote:
# tests/integration/test_results_contract.py.


@pytest.mark.slow
def test_calibrate_host_with_gloo_stores_measurements() -> None:
    # The engines' torch (scripts/install-engines.sh); missing, engines_python() fails loudly.
    from tests.support.engines import engines_python

    code, out = run(
        "calibrate",
        "host",
        "--name",
        "here",
        "--python",
        str(engines_python()),
        "--ranks",
        "2",
        "--iters",
        "3",
        "--json",
    )
    assert code == 0, out
    d = json.loads(out)
    assert d["report"]["probe"]["backend"] == "gloo"
    assert "2" in d["factors"]["allreduce_us"] and d["factors"]["mem_bw_gbs"] > 0
    code, out = run(
        "predict", "-m", "Qwen3-8B", "--gpu", "l40s", "-n", "2", "--calibration", "here", "--json"
    )
    assert code == 0


def test_calibrate_host_without_torch_says_so() -> None:
    import sys

    code, out = run("calibrate", "host", "--name", "x", "--python", sys.executable)
    assert code != 0 and "torch" in out

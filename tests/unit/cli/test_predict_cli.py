"""`servelab predict`, `explain` and `calibrate` through the CLI: printed output and what is stored."""

from __future__ import annotations

import json

import orjson
import pytest
from click.testing import CliRunner

from servelab.cli.main import cli
from servelab.store import open_store
from servelab.store.calibrations import get


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


def _insert_run(config: dict) -> str:
    with open_store() as store:
        c = store.conn
        c.execute(
            "INSERT INTO bench_runs (uid, created_at, status, url, model, api, engine, config_json) VALUES (?,?,?,?,?,?,?,?)",
            (
                "run-abc",
                "2026-01-01",
                "completed",
                "http://x",
                "Llama-3.1-70B",
                "chat",
                "vllm",
                orjson.dumps(config).decode(),
            ),
        )
        rid = c.execute("SELECT id FROM bench_runs WHERE uid='run-abc'").fetchone()[0]
        for i, (conc, tpot, ttft) in enumerate([(1, 12.0, 90.0), (16, 30.0, 400.0)]):
            summary = {
                "median_tpot_ms": tpot,
                "median_ttft_ms": ttft,
                "output_throughput": conc * 1000 / tpot,
                "mean_input_tokens": 1000,
                "mean_output_tokens": 500,
            }
            c.execute(
                "INSERT INTO bench_levels (run_id, idx, mode, value, started_at, status, summary_json) VALUES (?,?,?,?,?,?,?)",
                (rid, i, "concurrency", conc, "2026-01-01", "completed", json.dumps(summary)),
            )
    return "run-abc"


def test_explain_sets_run_beside_prediction() -> None:
    uid = _insert_run({})
    code, out = run("explain", uid, "--gpu", "h100-sxm", "-n", "4", "--tp", "4", "--quant", "fp8", "--json")
    assert code == 0, out
    d = json.loads(out)
    assert len(d["levels"]) == 2
    assert d["levels"][1]["measured"]["tpot_ms"] == 30.0
    assert d["largest_gap"]
    assert "measured_comm_overhead_ms" in d["levels"][0]["attribution"]


def test_explain_reads_host_and_layout_from_run_config() -> None:
    uid = _insert_run({"host": {"gpu": "h100-sxm", "num_gpus": 4}, "layout": {"tp": 4}, "quant": "fp8"})
    code, out = run("explain", uid, "--json")
    assert code == 0, out
    assert json.loads(out)["layout"]["tp"] == 4


def test_explain_without_gpu_asks_for_it() -> None:
    uid = _insert_run({})
    code, out = run("explain", uid)
    assert code == 2 and "--gpu" in out


def test_calibrate_fit_from_runs_and_apply() -> None:
    _insert_run({"host": {"gpu": "h100-sxm", "num_gpus": 4}, "layout": {"tp": 4}, "quant": "fp8"})
    code, out = run("calibrate", "fit", "--name", "mine", "--run", "run-abc", "--json")
    assert code == 0, out
    with open_store() as store:
        cal = get(store, "mine")
    assert cal.kind == "fit" and "bw_eff" in cal.factors
    code, out = run(
        "predict",
        "-m",
        "Llama-3.1-70B",
        "--gpu",
        "h100-sxm",
        "-n",
        "4",
        "--quant",
        "fp8",
        "--calibration",
        "mine",
        "--json",
    )
    assert code == 0
    code, out = run("predict", "-m", "Llama-3.1-70B", "--gpu", "h100-sxm", "-n", "4", "--calibration", "nope")
    assert code == 2 and "no calibration" in out


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

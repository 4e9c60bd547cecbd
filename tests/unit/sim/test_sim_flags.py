"""Engine flags as each engine spells them; unknown flags fail the engine's way."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from servelab.bench.scrape import parse_prometheus, pick
from servelab.cli.main import cli
from servelab.cli.sim import build_config
from servelab.engines import sglang as G
from servelab.engines import vllm as V
from servelab.sim.engine_args import sglang_parser, sglang_server_args, vllm_parser
from servelab.sim.faults import parse_faults
from servelab.sim.personalities import parse_engine_args
from servelab.sim.render import render_metrics
from servelab.sim.server import effective

BASE = {
    "model": "Qwen3-8B",
    "gpu": "h100-sxm",
    "num_gpus": 8,
    "tp": None,
    "pp": None,
    "ep": None,
    "dp": None,
    "quant": None,
    "personality": "vllm",
    "host": "127.0.0.1",
    "port": 0,
    "speed": 1.0,
    "seed": 0,
    "faults": (),
    "fault_rate": 1.0,
    "fast_start": True,
    "eos_mean": 256.0,
    "cpu": None,
}


def cfg(personality="vllm", argv=(), **kw):
    return build_config({**BASE, "personality": personality, **kw}, list(argv))


def test_vllm_flags():
    c = cfg(
        "vllm", ["--tensor-parallel-size", "4", "--max-num-seqs", "64", "--gpu-memory-utilization", "0.8"]
    )
    assert c.setup.layout.tp == 4
    assert effective(c).max_running == 64 and effective(c).mem_fraction == 0.8
    assert c.engine.non_default["tensor_parallel_size"] == 4
    assert cfg("vllm", ["-tp", "2"]).setup.layout.tp == 2


def test_sglang_flags():
    c = cfg(
        "sglang",
        [
            "--tp",
            "2",
            "--mem-fraction-static",
            "0.7",
            "--disable-radix-cache",
            "--max-running-requests",
            "32",
            "--chunked-prefill-size",
            "4096",
        ],
    )
    assert c.setup.layout.tp == 2 and not c.engine.prefix_caching
    eff = effective(c)
    assert (eff.max_running, eff.max_batched_tokens, eff.mem_fraction) == (32, 4096, 0.7)
    assert "tp_size=2" in sglang_server_args(c.engine, eff)
    assert "disable_radix_cache=True" in sglang_server_args(c.engine, eff)


def test_servelab_tp_option():
    assert cfg("sglang", tp=4).setup.layout.tp == 4
    assert cfg("vllm", tp=2, pp=2).setup.layout.pp == 2


@pytest.mark.parametrize(
    ("personality", "expected"),
    [
        ("vllm", "vllm serve: error: unrecognized arguments: --no-such-flag"),
        ("sglang", "launch_server.py: error: unrecognized arguments: --no-such-flag"),
    ],
)
def test_unknown_flag_fails_like_the_engine(personality, expected, capsys):
    with pytest.raises(SystemExit) as exc:
        cfg(personality, ["--no-such-flag"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ")
    assert expected in err


def test_vllm_rejects_sglang_only_flag(capsys):
    with pytest.raises(SystemExit):
        cfg("vllm", ["--moe-runner-backend", "triton"])
    assert "unrecognized arguments: --moe-runner-backend" in capsys.readouterr().err


def test_moe_backend_replaced_on_sm120():
    args, warnings = parse_engine_args(
        "sglang", ["--model-path", "m", "--moe-runner-backend", "flashinfer_trtllm"], sm=120, is_moe=True
    )
    assert args.moe_runner_backend == "flashinfer_cutlass"
    assert args.requested_moe_runner_backend == "flashinfer_trtllm"
    assert warnings and "Use flashinfer_cutlass as MoE runner backend on SM120" in warnings[0]
    args, warnings = parse_engine_args(
        "sglang", ["--model-path", "m", "--moe-runner-backend", "flashinfer_trtllm"], sm=100, is_moe=True
    )
    assert args.moe_runner_backend == "flashinfer_trtllm" and not warnings


def test_allreduce_fusion_flags():
    c = cfg("sglang", ["--enable-flashinfer-allreduce-fusion"], model="GLM-5-NVFP4", gpu="rtx-pro-6000", tp=8)
    from servelab.sim.server import allreduce_collapse

    assert allreduce_collapse(c)
    c = cfg(
        "vllm",
        ["--compilation-config", '{"pass_config": {"enable_fi_allreduce_fusion": true}}'],
        model="GLM-5-NVFP4",
        gpu="rtx-pro-6000",
        tp=8,
    )
    assert allreduce_collapse(c)
    assert not allreduce_collapse(cfg("vllm", model="GLM-5-NVFP4", gpu="rtx-pro-6000", tp=8))


def test_bad_servelab_options_are_config_errors():
    runner = CliRunner()
    res = runner.invoke(cli, ["sim", "--model", "Qwen3-8B", "--gpu", "h100-sxm", "--speed", "0"])
    assert res.exit_code == 2 and "--speed must be positive" in res.output
    res = runner.invoke(cli, ["sim", "--model", "Qwen3-8B", "--gpu", "h100-sxm", "--fault", "nope"])
    assert res.exit_code == 2 and "unknown fault" in res.output
    res = runner.invoke(cli, ["sim", "--model", "Qwen3-8B", "--gpu", "h100-sxm", "--tp", "8"])
    assert res.exit_code == 2


def test_faults_parse():
    f = parse_faults(["stall_stream:5", "garbage"])
    assert f["stall_stream"].n == 5 and f["garbage"].arg is None
    assert parse_faults(["die_after_ready"])["die_after_ready"].n == 5
    assert "hang" in parse_faults(["hang"])


def test_vllm_parser_defaults_have_no_surprises():
    assert vllm_parser().parse_args(["m"]).tensor_parallel_size == 1


def test_metric_names():
    s = dict.fromkeys(
        [
            "running",
            "waiting",
            "kv_usage",
            "kv_tokens_used",
            "preemptions",
            "prompt_tokens",
            "generation_tokens",
            "gen_throughput",
            "finished",
            "success_stop",
            "success_length",
            "success_abort",
            "prefix_cache_queries",
            "prefix_cache_hits",
            "cache_hit_rate",
            *(f"{h}_{part}" for h in ("ttft", "itl", "e2e") for part in ("sum", "count")),
        ],
        1,
    )
    v = render_metrics("vllm", "m", s).decode()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:request_success_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_sum",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
    ):
        assert name in v
    g = render_metrics("sglang", "m", s).decode()
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:gen_throughput",
        "sglang:generation_tokens_total",
        "sglang:prompt_tokens_total",
        "sglang:cache_hit_rate",
        "sglang:time_to_first_token_seconds_count",
        "sglang:inter_token_latency_seconds_sum",
        "sglang:e2e_request_latency_seconds_count",
    ):
        assert name in g
    # what bench's scraper reads of them: the step clock's sums and counts, per histogram
    picked = pick(parse_prometheus(v))
    assert picked["ttft_sum"] == picked["itl_count"] == picked["e2e_count"] == 1


@pytest.mark.parametrize(("parser", "spelling"), [(vllm_parser, V.SPELLING), (sglang_parser, G.SPELLING)])
def test_the_personality_parses_the_flags_its_adapter_spells(parser, spelling):
    """An engine's flags are spelled once (engines/vllm.py, engines/sglang.py): every flag the simulator's
    parser takes is a spelling of the adapter's table (or argparse's own --help, --no-X)."""
    names = {n for s in spelling.values() for n in (*s.names, s.off)}
    taken = {o for a in parser()._actions for o in a.option_strings} - {"-h", "--help"}
    assert taken <= names
    assert all(a.dest in spelling for a in parser()._actions if a.option_strings and a.dest != "help")

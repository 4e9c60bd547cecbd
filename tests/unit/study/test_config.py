"""Study files: validation with field paths, matrix expansion, the shipped examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.config.loading import load_study, parse_study
from servelab.config.matrix import expand_matrix
from servelab.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def _base(**over: object) -> dict:
    d: dict = {
        "study": {"name": "s"},
        "model": {"path": "m"},
        "engine": {"name": "sim"},
        "workload": {"num_requests": 8},
        "load": {"concurrency": [1, 4]},
        "candidates": [{"tp": 1}],
    }
    d.update(over)
    return d


def test_every_error_names_its_field_path() -> None:
    bad = _base(candidates=[{"tp": 1}, {"tp": 0, "colour": "red"}], slo={"ttft_ms": {"p77": 1}})
    with pytest.raises(ConfigError) as exc:
        parse_study(bad)
    msg = exc.value.message
    assert "candidates[1].tp" in msg
    assert "candidates[1].colour: unknown field" in msg
    assert "slo.ttft_ms: unknown statistic 'p77'" in msg


def test_load_needs_exactly_one_kind_and_main_must_be_a_level() -> None:
    with pytest.raises(ConfigError, match="exactly one of concurrency"):
        parse_study(_base(load={"concurrency": [1], "rate": [2.0]}))
    with pytest.raises(ConfigError, match="main = 3 is not one of the levels"):
        parse_study(_base(load={"concurrency": [1, 4], "main": 3}))


def test_workload_size_is_exactly_one_of_three() -> None:
    with pytest.raises(ConfigError, match="exactly one of num_requests"):
        parse_study(_base(workload={"num_requests": 4, "duration_s": 3}))


def test_matrix_is_a_cartesian_product_with_variants() -> None:
    got = expand_matrix(
        {
            "variants": [{"tp": 8}, {"tp": 4, "pp": 2}],
            "args": [
                ["--moe-runner-backend", "flashinfer_cutlass"],
                ["--moe-runner-backend", "flashinfer_trtllm"],
            ],
        }
    )
    assert [(c.tp, c.pp, c.args[-1]) for c in got] == [
        (8, 1, "flashinfer_cutlass"),
        (8, 1, "flashinfer_trtllm"),
        (4, 2, "flashinfer_cutlass"),
        (4, 2, "flashinfer_trtllm"),
    ]
    assert len({c.label() for c in got}) == 4


def test_matrix_rejects_unknown_axes_and_duplicate_names() -> None:
    with pytest.raises(ConfigError, match=r"matrix\.flavour is not a candidate field"):
        parse_study(_base(matrix={"flavour": [1, 2]}))
    with pytest.raises(ConfigError, match=r"candidate names must be unique; repeated: tp2"):
        parse_study(_base(candidates=[{"tp": 2}, {"tp": 2}]))


def test_bad_toml_and_missing_file_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_study(tmp_path / "nope.toml")
    p = tmp_path / "bad.toml"
    p.write_text("[study\nname = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_study(p)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_examples_are_valid(path: Path) -> None:
    study = load_study(path)
    assert study.candidates or (study.adaptive and study.space_checks())  # listed, or a search's space
    assert study.load.levels


def test_slo_turns_into_the_bench_goodput_string() -> None:
    s = parse_study(_base(slo={"ttft_ms": {"p50": 200, "p99": 900}, "tpot_ms": {"p50": 40}}))
    assert s.slo.bench_slo() == "ttft_ms<=900,tpot_ms<=40"
    assert ("ttft_ms", "p99", 900.0) in s.slo.limits()


def test_executor_is_local_by_default_and_ray_excludes_one_ssh_box() -> None:
    assert parse_study(_base()).executor.kind == "local"
    s = parse_study(_base(executor={"kind": "ray", "address": "10.0.0.1:6379", "baseline_nodes": 3}))
    assert s.executor.kind == "ray" and s.executor.baseline_nodes == 3
    with pytest.raises(ConfigError, match=r"executor\.kind"):
        parse_study(_base(executor={"kind": "slurm"}))
    with pytest.raises(ConfigError, match=r"\[host\] ssh"):
        parse_study(_base(executor={"kind": "ray"}, host={"ssh": "gpubox"}))
    with pytest.raises(ConfigError, match=r"executor\.baseline_nodes"):
        parse_study(_base(executor={"kind": "ray", "baseline_nodes": 0}))


def test_where_the_trials_run_is_not_part_of_the_study_hash() -> None:
    from servelab.tune import spec_hash

    assert spec_hash(parse_study(_base())) == spec_hash(parse_study(_base(executor={"kind": "ray"})))


def test_objective_capacity_needs_slo_limits() -> None:
    with pytest.raises(ConfigError, match='objective = "capacity"'):
        parse_study(_base(objective="capacity"))
    study = parse_study(_base(objective="capacity", slo={"tpot_ms": {"p99": 100}, "ttft_ms": {"p50": 900}}))
    assert study.slo.capacity_slo() == "p50_ttft_ms<=900,p99_tpot_ms<=100"
    # the search's defaults: 10 % in at most 8 probes (bench.capacity: was 5 %, which needs 9-12)
    assert (study.load.resolution, study.load.max_probes) == (0.10, 8)


def test_a_sessions_workload_is_benched_with_its_options() -> None:
    """kind = "sessions" takes bench's --workload sessions options, under the same names as BenchConfig's
    fields, and the benchmark's configuration (`trial.bench_config`, built by the dry run and the real
    run alike) carries them."""
    from servelab.trial.prepare import bench_config

    wl = {
        "kind": "sessions",
        "api": "chat",
        "input_len": 40,
        "output_len": 8,
        "turns": 3,
        "think_time_s": 0.5,
    }
    wl |= {"think_dist": "constant", "system_prompt_len": 64, "tool_turns": 0.25, "tool_result_len": 32}
    cfg = bench_config(parse_study(_base(workload=wl)), "http://127.0.0.1:1", "m")
    assert (cfg.workload, cfg.mode, cfg.levels, cfg.api) == ("sessions", "concurrency", [1.0, 4.0], "chat")
    got = {k: getattr(cfg, k) for k in ("turns", "think_time_s", "think_dist", "system_prompt_len")}
    assert got == {"turns": 3, "think_time_s": 0.5, "think_dist": "constant", "system_prompt_len": 64}
    assert (cfg.tool_turns, cfg.tool_result_len, cfg.input_len, cfg.output_len) == (0.25, 32, 40, 8)
    assert cfg.num_requests is None and cfg.requests_per_stream is None and cfg.duration_s is None
    capped = bench_config(
        parse_study(_base(workload={"kind": "sessions", "duration_s": 30})), "http://x", "m"
    )
    assert capped.duration_s == 30 and capped.turns == 8  # bench's defaults otherwise


@pytest.mark.parametrize(
    "over,words",
    [
        ({"workload": {"kind": "sessions", "num_requests": 8}}, 'workload: kind = "sessions": a level is'),
        ({"workload": {"kind": "sessions", "requests_per_stream": 2}}, "give duration_s to cap its time"),
        ({"workload": {"kind": "sessions"}, "load": {"rate": [1.0]}}, "runs load.concurrency"),
        (
            {"workload": {"kind": "sessions"}, "objective": "capacity", "slo": {"tpot_ms": {"p99": 50}}},
            'does not search over workload.kind = "sessions"',
        ),
        ({"workload": {"kind": "sessions", "think_dist": "gamma"}}, "workload.think_dist"),
        ({"workload": {"kind": "sessions", "tool_turns": 2}}, "workload.tool_turns"),
        ({"workload": {"kind": "sessions", "turns": 0}}, "workload.turns"),
    ],
)
def test_a_sessions_workload_refuses_what_bench_refuses(over: dict, words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_study(_base(**over))
    assert words in exc.value.message


def test_model_silicon_orders_the_candidates_by_the_measured_allreduce(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`[model] silicon = true`: the candidates' predictions read the allreduce off the measured tables
    (their order can change with it); without the extra the file is refused at parse, naming the field."""
    from servelab import tune
    from servelab.model import silicon

    def study(flag: bool) -> object:
        return parse_study(
            _base(
                model={"path": "GLM-5-NVFP4", "silicon": flag},
                host={"gpu": "rtx-pro-6000", "num_gpus": 8},
                engine={"name": "sim", "options": {"personality": "sglang"}},
                load={"concurrency": [1]},
                candidates=[{"name": "tp8", "tp": 8}, {"name": "tp4pp2", "tp": 4, "pp": 2}],
            )
        )

    on, off = study(True), study(False)
    thr = {
        flag: {c.name: (p or {}).get("output_throughput") or 0.0 for c, p in tune.order_candidates(st)}  # type: ignore[arg-type]
        for flag, st in ((True, on), (False, off))
    }
    # at one stream the measured 8-GPU allreduce (27 µs) puts TP8 ahead; the formula's (67 µs) TP4+PP2
    assert thr[True]["tp8"] > thr[True]["tp4pp2"] and thr[False]["tp8"] < thr[False]["tp4pp2"], thr
    shares = {
        flag: next(p for c, p in tune.order_candidates(st) if c.name == "tp8")["allreduce_share"]  # type: ignore[index, arg-type]
        for flag, st in ((True, on), (False, off))
    }
    assert shares[True] < shares[False], shares
    monkeypatch.setattr(silicon, "data_root", lambda: None)
    with pytest.raises(ConfigError) as exc:
        study(True)
    assert "model.silicon" in exc.value.message and "servelab[silicon]" in exc.value.message

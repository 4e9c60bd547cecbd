"""Issue 15, items 2, 6, 7, 8: any candidate the validator accepts can run (its marker, log file and
command line are derived safely), `[engine.options]` is a typed model checked with field paths before
anything launches, a matrix labels its items by every field it varies and can name them, and no two
candidates share a log file."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from servelab import naming
from servelab.cli.main import cli
from servelab.config.loading import parse_study
from servelab.engines import registry
from servelab.errors import ConfigError
from servelab.lifecycle.handle import check_marker
from servelab.naming import STUDY_MARKER_PREFIX as MARKER_PREFIX
from servelab.tune import TuneOptions, preflight, tune

MODEL, GPU = "Qwen3-30B-A3B", "h100-sxm"


def study(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "study": {"name": "s"},
        "model": {"path": MODEL},
        "host": {"gpu": GPU, "num_gpus": 8},
        "engine": {"name": "sim", "options": {"speed": 50.0}},
        "workload": {"num_requests": 8},
        "load": {"concurrency": [1]},
        "candidates": [{"tp": 1}],
    }
    d.update(over)
    return d


def errors(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_study(data)
    return exc.value.message


# -- item 2: a label with `=` (or any text) still runs ------------------------------------------------


def test_an_unnamed_candidate_with_env_gets_a_marker_the_launcher_accepts() -> None:
    s = parse_study(study(candidates=[{"tp": 8, "env": {"NCCL_P2P_DISABLE": "1"}}]))
    label = s.candidates[0].label()
    assert label == "tp8-NCCL_P2P_DISABLE=1"  # the label stays human
    marker = naming.run_marker(MARKER_PREFIX, "st-1", label, 0)
    check_marker(marker)  # main raised "invalid run marker" here, at launch
    assert marker.startswith(f"{MARKER_PREFIX}:st-1:") and "=" not in marker
    preflight(s, registry.get("sim"))


@pytest.mark.parametrize("name", ["a=b", "a\nb", "a\0b", "x" * 500, "日本語", "../../etc", " "])
def test_any_accepted_name_derives_a_safe_marker_and_file_name(name: str) -> None:
    s = parse_study(study(candidates=[{"name": name}]))
    preflight(s, registry.get("sim"))
    check_marker(naming.run_marker(MARKER_PREFIX, "u", name, 0))
    file = naming.log_name(name, 0, 7)
    assert "/" not in file and not file.startswith((".", "-")) and len(file) < 100 and file.isascii()


def test_a_study_the_preflight_refuses_stores_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    """tp 6 of 8 GPUs passes the box check but the model's heads do not split 6 ways: the simulator would
    refuse it at start-up, so the real run refuses it before opening the study."""
    monkeypatch.setenv("SERVELAB_HOME", str(tmp_path))
    from servelab.store import open_store

    s = parse_study(study(candidates=[{"tp": 1}, {"name": "six", "tp": 6}]))
    with open_store() as store:
        with pytest.raises(ConfigError, match=r"candidates\[1\]: 'six': .*heads"):
            asyncio.run(tune(s, store, None, TuneOptions()))
        assert store.conn.execute("SELECT count(*) FROM studies").fetchone()[0] == 0
    path = tmp_path / "s.toml"
    path.write_text(TOML.format(options="speed = 50.0", candidates='[[candidates]]\nname = "six"\ntp = 6'))
    res = CliRunner().invoke(cli, ["tune", str(path), "--dry-run"], env={"SERVELAB_HOME": str(tmp_path)})
    assert res.exit_code == 2 and "heads" in res.output and "Traceback" not in res.output


TOML = (
    '[study]\nname = "s"\n[model]\npath = "Qwen3-30B-A3B"\n[host]\ngpu = "h100-sxm"\nnum_gpus = 8\n'
    '[engine]\nname = "sim"\n[engine.options]\n{options}\n{candidates}\n'
    "[workload]\nnum_requests = 8\n[load]\nconcurrency = [1]\n"
)


def test_a_workload_the_benchmark_refuses_is_refused_before_any_launch() -> None:
    """The benchmark's configuration is built after the server is ready; a sharegpt workload without a
    dataset used to fail there, once per candidate. The preflight builds it first."""
    s = parse_study(study(workload={"kind": "sharegpt", "num_requests": 8}))
    with pytest.raises(ConfigError, match="workload/load: the study's workload/load cannot be benchmarked"):
        preflight(s, registry.get("sim"))


# -- item 6: typed engine options, checked with field paths ------------------------------------------


def test_engine_options_are_typed_with_field_paths() -> None:
    msg = errors(
        study(
            engine={"name": "sim", "options": {"cpus": "0", "faults": "hang", "speed": -1}},
            candidates=[{"tp": 1, "options": {"faults": ["nope"], "colour": 1}}],
        )
    )
    assert "engine.options.cpus: Input should be a valid list" in msg
    assert "engine.options.speed: Input should be greater than 0" in msg
    assert "candidates[0].options.faults[0]: unknown fault 'nope'" in msg
    assert "candidates[0].options.colour: unknown field" in msg
    # the candidate's own faults replace the engine's, yet the engine's "hang" string is still checked
    assert "engine.options.faults: Input should be a valid list" in msg


def test_engine_options_errors_name_the_candidate_that_inherits_them() -> None:
    msg = errors(study(engine={"name": "sim", "options": {"personality": "trt", "cpus": [-1]}}))
    assert "engine.options.personality: Input should be 'vllm' or 'sglang'" in msg
    assert "engine.options.cpus[0]: Input should be greater than or equal to 0" in msg


def test_each_candidate_with_a_bad_option_is_named_and_a_matrix_reports_it_once() -> None:
    bad = {"faults": ["nope"]}
    msg = errors(study(candidates=[{"name": "x", "options": bad}, {"name": "y", "options": bad}]))
    assert "candidates[0].options.faults[0]" in msg and "candidates[1].options.faults[0]" in msg
    msg = errors(study(candidates=[], matrix={"options": [bad], "max_concurrency": list(range(1, 500))}))
    assert msg.count("unknown fault") == 1 and "matrix.options.faults[0]" in msg


def test_a_layout_larger_than_the_box_is_a_spec_error() -> None:
    msg = errors(study(host={"gpu": GPU, "num_gpus": 4}, candidates=[{"tp": 8}, {"tp": 2, "pp": 4}]))
    assert "candidates[0].tp: tp×pp×dp = 8×1×1 = 8 GPUs, more than the 4" in msg
    assert "candidates[1].tp: tp×pp×dp = 2×4×1 = 8 GPUs" in msg
    msg = errors(study(engine={"name": "sim", "options": {"num_gpus": 2}}, candidates=[{"tp": 4}]))
    assert "candidates[0].tp" in msg and "more than the 2" in msg


def test_every_built_in_engine_declares_its_options() -> None:
    from servelab.engines.options import AnyOptions, options_model

    for name in registry.names():
        assert options_model(registry.get(name)) is not AnyOptions, name
    bad = study(engine={"name": "vllm", "options": {"cpu": "yes", "kv_cache_space_gib": 0}}, host={})
    msg = errors(bad)
    assert "engine.options.cpu: Input should be a valid boolean" in msg
    assert "engine.options.kv_cache_space_gib: Input should be greater than 0" in msg
    assert "engine.name: unknown engine 'nope'" in errors(study(engine={"name": "nope"}))


def test_bad_options_exit_2_on_the_cli_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(TOML.format(options='cpus = "0"', candidates="[[candidates]]\ntp = 1"))
    for extra in (["--dry-run"], []):
        res = CliRunner().invoke(cli, ["tune", str(path), *extra], env={"SERVELAB_HOME": str(tmp_path)})
        assert res.exit_code == 2, res.output
        assert "engine.options.cpus" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "servelab.db").exists() or _no_studies(tmp_path)


def _no_studies(home: Path) -> bool:
    import sqlite3

    with sqlite3.connect(home / "servelab.db") as db:
        return bool(db.execute("SELECT count(*) FROM studies").fetchone()[0] == 0)


# -- item 7: the matrix -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("max_concurrency", [64, 128]),
        ("mem_fraction", [0.8, 0.9]),
        ("quantization", ["fp8", "nvfp4"]),
        ("kv_cache_dtype", ["auto", "fp8"]),
        ("max_model_len", [4096, 8192]),
        ("options", [{"seed": 1}, {"seed": 2}]),
    ],
)
def test_a_matrix_over_any_field_gets_distinct_labels(field: str, values: list[Any]) -> None:
    s = parse_study(study(candidates=[], matrix={"tp": [1, 2], field: values}))
    labels = [c.label() for c in s.candidates]
    assert len(set(labels)) == 4, labels


def test_matrix_items_can_be_named() -> None:
    s = parse_study(
        study(
            candidates=[],
            matrix={
                "variants": [{"name": "wide", "tp": 8}, {"name": "deep", "tp": 4, "pp": 2}],
                "max_concurrency": [64, 128],
            },
        )
    )
    assert [c.label() for c in s.candidates] == ["wide-c64", "wide-c128", "deep-c64", "deep-c128"]
    assert s.candidates[2].pp == 2 and s.candidates[2].max_concurrency == 64
    msg = errors(study(candidates=[], matrix={"variants": [{"name": "x", "tp": 1}, {"name": "x", "tp": 2}]}))
    assert "repeated: x" in msg
    assert "(top level): matrix.variants[0].name must be a non-empty string" in errors(
        study(candidates=[], matrix={"variants": [{"name": 3, "tp": 1}]})
    )


def test_a_matrix_items_bad_option_names_the_matrix_and_the_item() -> None:
    msg = errors(study(candidates=[], matrix={"options": [{"faults": ["hang"]}, {"faults": ["nope"]}]}))
    assert "matrix.options.faults[0]: unknown fault 'nope'" in msg and "(candidate 'tp1-faults=nope'" in msg


def test_a_large_matrix_validates_and_reports_repeats_once() -> None:
    """The duplicate check is one pass over the labels (benchmarks/study_dry_run.py times it)."""
    s = parse_study(study(candidates=[], matrix={"max_concurrency": list(range(1, 3001)), "tp": [1, 2]}))
    assert len(s.candidates) == 6000
    msg = errors(study(candidates=[{"tp": 1}, {"tp": 1}, {"tp": 2}, {"tp": 2}]))
    assert "repeated: tp1, tp2 (give each a name" in msg


# -- item 8: one log file per candidate ---------------------------------------------------------------


def test_labels_that_share_a_slug_get_different_log_files() -> None:
    names = {naming.log_name(label, 0) for label in ("a/b", "a_b", "a?b", "a b", "a\nb")}
    assert len(names) == 5
    assert naming.log_name("a/b", 0, 3) != naming.log_name("a/b", 0, 4)  # a retry keeps the old log
    assert all(n.startswith("a_b-") for n in names)


def test_a_rerun_after_a_lost_node_carries_its_own_marker() -> None:
    """The lost attempt's teardown (late, on a node of the same machine) ends the processes carrying its
    marker: the rerun's server must not be one of them (a Ray test once saw the rerun's simulator get
    SIGTERM before it was ready). Real processes, found by their environment as teardown finds them."""
    import os
    import subprocess

    from servelab.host import processes

    first, rerun = (naming.run_marker(MARKER_PREFIX, "st-1", "tp4-pp2", 0, attempt) for attempt in (0, 1))
    assert first == f"{MARKER_PREFIX}:st-1:{naming.token('tp4-pp2')}:0" and rerun == f"{first}:1"
    assert first.startswith(naming.study_markers("st-1")) and rerun.startswith(naming.study_markers("st-1"))
    procs = [subprocess.Popen(["sleep", "60"], env={**os.environ, "SERVELAB_RUN": m}) for m in (first, rerun)]
    try:
        assert [p.pid for p in processes.with_marker(first)] == [procs[0].pid]
        assert [p.pid for p in processes.with_marker(rerun)] == [procs[1].pid]
        found = {p.pid for p in processes.with_marker(prefix=naming.study_markers("st-1"))}
        assert found >= {procs[0].pid, procs[1].pid}  # a resume's sweep still finds both
    finally:
        for p in procs:
            p.kill()
            p.wait()

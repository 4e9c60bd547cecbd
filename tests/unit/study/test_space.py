"""The study file's [search]: typed parameters, constraints, candidates, labels, and every error with its
field path under `search`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servelab import space as sp
from servelab.config.loading import load_study, parse_study
from servelab.errors import ConfigError
from servelab.search.base import candidate

ROOT = Path(__file__).resolve().parents[3]


def _study(search: dict[str, Any], **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "study": {"name": "s"},
        "model": {"path": "GLM-5-NVFP4"},
        "host": {"gpu": "rtx-pro-6000", "num_gpus": 8},
        "engine": {"name": "sim", "options": {"personality": "sglang"}},
        "workload": {"num_requests": 8},
        "load": {"concurrency": [4]},
        "search": search,
    }
    d.update(over)
    return d


SPACE = {
    "layout": ["tp8", "tp4-pp2"],
    "moe_runner_backend": ["flashinfer_cutlass", "flashinfer_trtllm"],
    "max_running_requests": [64, 256],
    "chunked_prefill_size": {"low": 2048, "high": 16384, "log": True},
    "env": {"NCCL_PROTO": ["LL", "Simple"]},
    "enable_flashinfer_allreduce_fusion": [False, True],
}


def test_the_issue_spelling_parses_into_typed_parameters() -> None:
    study = parse_study(_study({"strategy": "optuna", "budget_trials": 12, "seed": 7, "space": SPACE}))
    assert study.adaptive and study.candidates == []
    space = sp.build(study.search)  # type: ignore[arg-type]
    by = {p.key: p for p in space.params}
    assert isinstance(by["layout"], sp.Categorical) and by["layout"].values == ("tp8", "tp4-pp2")
    cps = by["chunked_prefill_size"]
    assert isinstance(cps, sp.Range) and cps.integer and cps.log and cps.values() is None
    assert "env.NCCL_PROTO" in by
    assert space.size() is None and not space.finite()
    # the dry run's checks cover every value of every parameter
    checks = study.space_checks()
    seen = {a for c in checks for a in c.args} | {c.env.get("NCCL_PROTO") for c in checks}
    assert {"flashinfer_trtllm", "--enable-flashinfer-allreduce-fusion", "2048", "16384", "Simple"} <= seen


def test_a_point_is_the_candidate_it_names() -> None:
    space = sp.build(parse_study(_study({"strategy": "optuna", "space": SPACE})).search)  # type: ignore[arg-type]
    point: sp.Point = {
        "layout": "tp4-pp2",
        "moe_runner_backend": "flashinfer_trtllm",
        "max_running_requests": 256,
        "chunked_prefill_size": 4096,
        "env.NCCL_PROTO": "LL",
        "enable_flashinfer_allreduce_fusion": True,
    }
    c = candidate(point, space)
    assert (c.tp, c.pp) == (4, 2)
    assert c.args == [
        "--moe-runner-backend",
        "flashinfer_trtllm",
        "--max-running-requests",
        "256",
        "--chunked-prefill-size",
        "4096",
        "--enable-flashinfer-allreduce-fusion",
    ]
    assert c.env == {"NCCL_PROTO": "LL"}
    assert (
        c.label()
        == "tp4-pp2-flashinfer_trtllm-mrr256-cps4096-NCCL_PROTO=LL-enable-flashinfer-allreduce-fusion"
    )
    off = candidate({**point, "enable_flashinfer_allreduce_fusion": False}, space)
    assert "--enable-flashinfer-allreduce-fusion" not in off.args and off.label() != c.label()


def test_a_grid_space_becomes_the_study_candidates_with_constraints_applied() -> None:
    search = {
        "strategy": "grid",
        "space": {"layout": ["tp8", "tp4-pp2"], "max_running_requests": [16, 64, 256]},
        "constraints": [
            {"when": {"pp": {"gt": 1}}, "allow": {"max_running_requests": {"ge": 64}}},
            {"when": {"layout": "tp8"}, "set": {"disable_radix_cache": True}},
        ],
    }
    study = parse_study(_study(search))
    labels = [c.label() for c in study.candidates]
    assert len(labels) == 5  # tp4-pp2 with 16 is ruled out
    assert not any(lb.startswith("tp4-pp2") and "mrr16" in lb for lb in labels)
    tp8 = [c for c in study.candidates if c.tp == 8]
    assert tp8 and all("--disable-radix-cache" in c.args for c in tp8)
    assert all("--disable-radix-cache" not in c.args for c in study.candidates if c.pp == 2)
    assert study.where(0) == "search.space"


@pytest.mark.parametrize(
    ("search", "path", "words"),
    [
        ({"strategy": "optuna", "space": {"layout": ["tp8", "pp"]}}, "search.space.layout", "not a layout"),
        ({"strategy": "optuna", "space": {"Max-Batch": [1]}}, "search.space.Max-Batch", "without dashes"),
        ({"strategy": "optuna", "space": {"x": {"low": 8, "high": 2}}}, "search.space.x", "above high"),
        (
            {"strategy": "optuna", "space": {"x": {"low": 0, "high": 2, "log": True}}},
            "search.space.x",
            "low > 0",
        ),
        ({"strategy": "optuna", "space": {"x": 3}}, "search.space.x", "a single value"),
        ({"strategy": "optuna", "space": {"x": []}}, "search.space.x", "empty list"),
        ({"strategy": "grid", "space": {"x": {"low": 0.1, "high": 0.9}}}, "search.space", "finite space"),
        ({"strategy": "halving", "space": {}}, "search.space", "needs a [search.space]"),
        ({"strategy": "bayes", "space": {"x": [1]}}, "search.strategy", "grid"),
        (
            {"strategy": "optuna", "objectives": ["speed"], "space": {"x": [1]}},
            "search.objectives",
            "unknown",
        ),
        (
            {
                "strategy": "optuna",
                "space": {"x": [1]},
                "constraints": [{"when": {"x": {"gtt": 1}}, "allow": {"x": [1]}}],
            },
            "search.constraints[0].when.x",
            "unknown comparison",
        ),
        (
            {"strategy": "optuna", "space": {"x": [1, 2]}, "constraints": [{"when": {"x": 1}}]},
            "search.constraints[0]",
            "allow",
        ),
        (
            {"strategy": "grid", "space": {"x": [1, 2]}, "constraints": [{"allow": {"x": [3]}}]},
            "search.constraints",
            "rule out every point",
        ),
        ({"strategy": "optuna", "space": {"layout": ["tp16"]}}, "search.space", "16 GPUs"),
        (
            {"strategy": "optuna", "space": {"env": {"HF_TOKEN": ["a", "b"]}}},
            "search.space.env.HF_TOKEN",
            "secret",
        ),
    ],
)
def test_bad_search_tables_name_the_field(search: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_study(_study(search))
    msg = exc.value.message
    assert f"{path}" in msg and words in msg, msg


def test_the_shipped_search_example_is_valid_and_dry_runs_its_space() -> None:
    study = load_study(ROOT / "examples" / "glm5-search.toml")
    assert study.search is not None and study.search.strategy == "optuna"
    space = sp.build(study.search)
    assert space.size() == 72 and len(list(space.points())) == 56  # tp*-pp* with a cap of 16 ruled out
    assert len(study.space_checks()) == 56


def test_corners_show_every_value_and_respect_constraints() -> None:
    space = sp.build(
        parse_study(
            _study(
                {
                    "strategy": "optuna",
                    "space": {"layout": ["tp8", "tp4-pp2"], "mem_fraction_static": {"low": 0.7, "high": 0.9}},
                    "constraints": [{"when": {"pp": 2}, "allow": {"mem_fraction_static": {"le": 0.8}}}],
                }
            )
        ).search  # type: ignore[arg-type]
    )
    pts = sp.corners(space)
    assert {p["layout"] for p in pts} == {"tp8", "tp4-pp2"}
    assert {p["mem_fraction_static"] for p in pts} == {0.7, 0.9}
    assert all(not (p["layout"] == "tp4-pp2" and float(p["mem_fraction_static"]) > 0.8) for p in pts)

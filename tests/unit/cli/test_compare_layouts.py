"""`predict --compare-layouts`: says the load it ranks at, ranks at a study's main level, and lists layouts
that predict the same (EP splits the model cannot tell apart) as one row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from servelab.cli.main import cli
from servelab.model.architecture import load_model
from servelab.model.layouts import candidate_layouts

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "glm5-pcie.toml"
GLM = ["-m", "GLM-5-NVFP4", "--gpu", "rtx-pro-6000", "-n", "8"]


def invoke(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["predict", *args])
    return r.exit_code, (r.stdout if "--json" in args and r.exit_code == 0 else r.output)


def compare(*args: str) -> dict[str, Any]:
    code, out = invoke("--compare-layouts", "--json", *args)
    assert code == 0, out
    data: dict[str, Any] = json.loads(out)
    return data


def rank_of(d: dict[str, Any], label: str) -> int:
    return int(next(r["rank"] for r in d["layouts"] if r["label"] == label))


def test_default_says_it_ranks_one_stream() -> None:
    d = compare(*GLM)
    assert d["workload"]["concurrency"] == 1 and d["concurrency_source"] == "default"
    code, out = invoke("--compare-layouts", *GLM)
    assert code == 0, out
    assert "at concurrency 1 (the default: one stream)" in " ".join(out.split())
    assert "--concurrency N or --study" in out


def test_study_ranks_at_its_main_level_and_workload() -> None:
    d = compare("--study", str(EXAMPLE))
    assert d["workload"] == {"isl": 1024, "osl": 128, "concurrency": 64}
    assert d["concurrency_source"] == "study" and d["study"] == "glm5-pcie"
    # at the study's load TP8 beats TP4+PP2 (at one stream it is the other way round)
    assert rank_of(d, "TP8") < rank_of(d, "TP4+PP2")
    one = compare("--study", str(EXAMPLE), "-c", "1")
    assert one["concurrency_source"] == "--concurrency"
    assert rank_of(one, "TP4+PP2") < rank_of(one, "TP8")
    tp8 = next(r for r in d["layouts"] if r["label"] == "TP8")
    assert tp8["study_candidates"] == ["tp8-cutlass", "tp8-trtllm", "tp8-cutlass-arfusion"]
    code, out = invoke("--compare-layouts", "--study", str(EXAMPLE))
    assert code == 0, out
    assert "at concurrency 64 (the study's main level)" in " ".join(out.split())
    assert "tp4-pp2-cutlass" in out


def test_explicit_flags_override_the_study() -> None:
    d = compare("--study", str(EXAMPLE), "-c", "16", "--osl", "256", "-n", "4")
    assert d["workload"] == {"isl": 1024, "osl": 256, "concurrency": 16}
    assert d["num_gpus"] == 4


def test_ep_variants_that_predict_the_same_are_one_row() -> None:
    d = compare(*GLM, "-c", "64")
    labels = [r["label"] for r in d["layouts"]]
    folded = [s for r in d["layouts"] for s in r["same_as"]]
    assert len(labels) == len(set(labels))
    assert "TP8+EP8" in folded and "TP8+EP8" not in labels
    tp8 = next(r for r in d["layouts"] if r["label"] == "TP8")
    assert tp8["same_as"] == ["TP8+EP2", "TP8+EP4", "TP8+EP8"]
    assert "EP does not change the prediction" in d["ep_note"]
    # nothing is lost: every full-host layout is a row or folded into one
    full = {lay.label for lay in candidate_layouts(load_model("GLM-5-NVFP4"), 8)}
    assert full <= set(labels) | set(folded)
    # and no two listed rows of one TP/PP/DP shape predict the same
    shown = {
        (r["layout"]["tp"], r["layout"]["pp"], r["layout"]["dp_attention"], r["label"].split(" ")[-1])
        for r in d["layouts"]
    }
    assert len(shown) == len(d["layouts"])


def test_dense_model_has_no_folded_rows() -> None:
    d = compare("-m", "Qwen3-32B", "--gpu", "h100-sxm", "-n", "8", "-c", "32")
    assert all(r["layout"]["ep"] == 1 and not r["same_as"] for r in d["layouts"])
    assert d["ep_note"] is None


def test_rate_study_and_missing_model_exit_2(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace(
        "concurrency = [1, 4, 16, 64, 256, 1024]\nmain = 64", "rate = [1.0, 2.0]"
    )
    study = tmp_path / "rate.toml"
    study.write_text(text)
    # a rate study is ranked at the concurrency the model reaches its main rate with (issue 30: it was
    # refused), and says which rate that was
    code, out = invoke("--compare-layouts", "--study", str(study), "--json")
    assert code == 0, out
    d = json.loads(out)
    assert d["concurrency_source"] == "study" and d["load"] == {"mode": "rate", "level": 2.0, "unit": "req/s"}
    assert d["workload"]["concurrency"] >= 1
    code, out = invoke("--study", str(study), "-c", "8", "--json")
    assert code == 0 and json.loads(out)["workload"]["concurrency"] == 8
    code, out = invoke("--gpu", "h100-sxm", "-n", "1")
    assert code == 2 and "--model is required" in out

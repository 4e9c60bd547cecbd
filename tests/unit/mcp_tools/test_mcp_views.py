"""The MCP tools' typed results (servelab/mcp/models.py) against the models the CLI's `--json` comes from,
the bench caps, and secrets in results built from the store: each through the SDK's own in-process client
(`mcp.Client(server)`), reading the output schemas a real client reads."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest
from click.testing import CliRunner
from mcp import Client
from pydantic import BaseModel

from servelab.cli.main import cli
from servelab.cli.output import dumps_json
from servelab.energy import LevelCost, LevelEnergy
from servelab.engines.base import Diagnosis, EffectiveConfig, Setting
from servelab.engines.signatures import diagnose
from servelab.host.ports import free_port
from servelab.mcp import models as M
from servelab.mcp.base import Options
from servelab.mcp.server import build
from servelab.model.explain import Explanation, explain_levels
from servelab.model.explain import LevelComparison as ExplainedLevel
from servelab.model.predict import LayoutResult, Prediction, Workload, evaluate, make_setup
from servelab.plan.checks import Finding
from servelab.plan.items import Item
from servelab.results import Clock, Level, LevelSummary, Run, RunContext, Stats
from servelab.store import open_store
from servelab.store.bench import BenchRepo
from servelab.store.db import utcnow
from servelab.store.studies import StudyRepo


def _keys(view: type[BaseModel]) -> set[str]:
    return {f.alias or name for name, f in view.model_fields.items()}


def _required(view: type[BaseModel]) -> set[str]:
    return set(view.model_json_schema().get("required", []))


# (view, the dataclass its document is, keys the document adds or spells otherwise: {field: key})
MIRRORS: list[tuple[type[BaseModel], type[Any], dict[str, str | None]]] = [
    (M.PredictionView, Prediction, {}),
    (M.LevelComparison, ExplainedLevel, {}),
    (M.PlanItem, Item, {}),
    (M.PlanFinding, Finding, {}),
    (M.LogsParseView, EffectiveConfig, {}),
    (M.DiagnosisView, Diagnosis, {"klass": "class"}),
    (M.DiagnosisSetting, Setting, {}),
    (M.LayoutRow, LayoutResult, {"study_candidates": None}),
]


@pytest.mark.parametrize("view,dc,spelled", MIRRORS, ids=lambda x: getattr(x, "__name__", ""))
def test_each_view_declares_its_dataclass_fields(
    view: type[BaseModel], dc: type[Any], spelled: dict[str, str | None]
) -> None:
    """A field added to, renamed in or removed from the dataclass is a failure here until the view follows."""
    fields = {spelled.get(f.name, f.name) for f in dataclasses.fields(dc)} | {
        k for k, v in spelled.items() if v is None
    }
    assert _keys(view) == fields
    assert view.model_config.get("extra") == "forbid"
    # to_dict leaves them out when empty
    optional = {Diagnosis: {"tail", "setting"}, Setting: {"tried", "flags"}}.get(dc, set())
    assert _required(view) == fields - optional, "every key the document always has is required"


def test_explain_declares_the_explanation_and_its_setup() -> None:
    assert {f.name for f in dataclasses.fields(Explanation)} <= _keys(M.ExplainView)
    assert _keys(M.ExplainView) == _required(M.ExplainView)
    assert _keys(M.ExplainView) == {
        "run", "time_base", "model", "gpu", "num_gpus", "layout", "levels", "largest_gap",
    }  # fmt: skip


def _run(simulated: bool) -> Run:
    clock = Clock(speed=10.0 if simulated else 1.0, source="server")
    return Run(
        id=1,
        uid="b-0123456789",
        created_at="2025-01-01T00:00:00+00:00",
        status="completed",
        url="http://127.0.0.1:1",
        model="glm-5",
        api="completions",
        context=RunContext(engine="sglang", model_config="GLM-5-NVFP4", clock=clock),
        levels=[
            Level(
                index=0,
                status="completed",
                mode="concurrency",
                value=2,
                summary=LevelSummary(label="c=2", value=2, completed=4, num_requests=4),
                wall=LevelSummary(label="c=2", value=2, completed=4, num_requests=4),
            )
        ],
    )


def test_a_runs_view_is_its_to_json() -> None:
    sim = json.loads(dumps_json(_run(simulated=True).to_json()))
    real = json.loads(dumps_json(_run(simulated=False).to_json()))
    assert set(sim) == _keys(M.RunView) == _required(M.RunView)
    assert set(sim["levels"][0]) == _keys(M.LevelView)
    assert set(real["levels"][0]) == _keys(M.LevelView) - {"wall_clock_summary"}
    assert set(sim["levels"][0]["summary"]) == _keys(M.LevelSummaryView)
    assert M.RunView.model_validate(sim).context.model_config_ref == "GLM-5-NVFP4"


@pytest.fixture(scope="module")
def schemas() -> dict[str, dict[str, Any]]:
    """Every tool's output schema, as a client lists it."""
    out: dict[str, dict[str, Any]] = {}

    async def main() -> None:
        async with Client(build(Options())) as c:
            out.update({t.name: t.output_schema or {} for t in (await c.list_tools()).tools})

    anyio.run(main)
    return out


def _documents() -> Iterator[tuple[str, dict[str, Any], str]]:
    """(tool, a real document of its command, a key of it to drop and rename)."""
    setup = make_setup("GLM-5-NVFP4", "rtx-pro-6000", 8, tp=8)
    yield "predict", evaluate(setup, Workload(1024, 128, 4)).to_dict(), "tpot_ms"
    yield "predict", evaluate(setup, Workload(1024, 128, 4)).to_dict(), "decode_breakdown_ms"
    measured = LevelSummary(value=2, completed=4, output_throughput=40.0, tpot_ms=Stats(p50=45.0))
    explained = explain_levels(setup, [measured], 1024, 128)
    explain = {
        "run": "b-0123456789", "time_base": "wall clock", "model": "GLM-5", "gpu": "rtx-pro-6000",
        "num_gpus": 8, "layout": {"tp": 8, "pp": 1, "ep": 1, "dp_attention": 1},
        "levels": [lv.__dict__ for lv in explained.levels], "largest_gap": explained.largest_gap,
    }  # fmt: skip
    yield "explain", explain, "largest_gap"
    yield "runs_show", _run(simulated=True).to_json(), "levels"
    yield "bench", _run(simulated=False).to_json(), "time_base"
    diag = Diagnosis("nccl_error", "NCCL error: unhandled system error", "check the fabric", fatal=True)
    yield "logs_diagnose", diag.to_dict(), "class"
    kv_log = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "real" / "vllm_10517_kv_29k.log"
    kv = diagnose(kv_log.read_text())  # a new class, with the setting to change from the log's figures
    assert kv.klass == "kv_cache_too_small" and kv.setting is not None
    yield "logs_diagnose", kv.to_dict(), "class"
    item = Item("1", "restart the server", created_at=utcnow(), updated_at=utcnow())
    yield "plan_get", {"plan": "workspace", "items": [item.to_dict()], "counts": {"pending": 1}}, "items"
    finding = Finding("1", "server_healthy", "warning", "it answers", {"server": {"up": True}})
    check = {
        "plan": "workspace",
        "checked": 1,
        "observed": {"servers": 1, "services": 0},
        "findings": [finding.to_dict()],
    }
    yield "plan_check", check, "findings"


DOCS = list(_documents())


@pytest.mark.parametrize("tool,doc,key", DOCS, ids=[f"{t}-{k}" for t, _, k in DOCS])
def test_the_schema_passes_the_document_and_fails_a_missing_or_renamed_key(
    schemas: dict[str, dict[str, Any]], tool: str, doc: dict[str, Any], key: str
) -> None:
    doc = json.loads(dumps_json(doc))
    jsonschema.validate(doc, schemas[tool])
    missing = {k: v for k, v in doc.items() if k != key}
    with pytest.raises(jsonschema.ValidationError, match=key):
        jsonschema.validate(missing, schemas[tool])
    renamed = missing | {key + "_renamed": doc[key]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(renamed, schemas[tool])


def test_a_nested_key_is_checked_too(schemas: dict[str, dict[str, Any]]) -> None:
    run = json.loads(dumps_json(_run(simulated=True).to_json()))
    run["levels"][0]["summary"]["output_tput"] = run["levels"][0]["summary"].pop("output_throughput")
    with pytest.raises(jsonschema.ValidationError, match="output_tput"):
        jsonschema.validate(run, schemas["runs_show"])
    layouts = {
        "model": "m", "gpu": "g", "num_gpus": 8, "workload": {"isl": 1, "osl": 1, "concurrency": 1},
        "concurrency_source": "default", "study": None, "ep_note": None,
        "layouts": [{"label": "tp8", "rank": 1, "layout": {"tp": 8}, "verdict": "best", "same_as": [],
                     "study_candidates": [], "prediction": {"feasible": True}}],
    }  # fmt: skip
    with pytest.raises(jsonschema.ValidationError, match="required"):
        jsonschema.validate(layouts, schemas["compare_layouts"])


def test_runs_show_declares_a_levels_energy_and_cost(schemas: dict[str, dict[str, Any]]) -> None:
    """`summary.energy` and `summary.cost` (servelab.energy) are in the tool's schema with their units'
    names: a document with them passes, one with a figure of the wrong type or missing does not."""
    run = json.loads(dumps_json(_run(simulated=True).to_json()))
    summary = run["levels"][0]["summary"]
    summary["energy"] = LevelEnergy(
        energy_j=2100.0, window_s=10.0, mean_power_w=210.0, j_per_output_token=3.0, idle_w=60.0, samples=10
    ).model_dump(mode="json")
    summary["cost"] = LevelCost(
        usd_per_m_output_tokens=6.5, gpu_hour_usd=3.0, gpus=8, price_source="catalog default (2025-10-01)"
    ).model_dump(mode="json")
    jsonschema.validate(run, schemas["runs_show"])
    text = json.dumps(schemas["runs_show"])
    for key in (
        "j_per_output_token",
        "j_per_output_token_above_idle",
        "usd_per_m_output_tokens",
        "price_source",
    ):
        assert f'"{key}"' in text, key
    summary["energy"]["energy_j"] = "a lot"
    with pytest.raises(jsonschema.ValidationError, match="a lot"):
        jsonschema.validate(run, schemas["runs_show"])
    del summary["energy"]["energy_j"]  # a figure every energy has
    with pytest.raises(jsonschema.ValidationError, match="energy_j"):
        jsonschema.validate(run, schemas["runs_show"])


def _call(opts: Options, tool: str, args: dict[str, Any]) -> tuple[bool, str, dict[str, Any] | None]:
    got: list[tuple[bool, str, dict[str, Any] | None]] = []

    async def main() -> None:
        async with Client(build(opts)) as c:
            res = await c.call_tool(tool, args)
            text = " ".join(getattr(b, "text", "") for b in res.content)
            got.append((res.is_error, text, res.structured_content))

    anyio.run(main)
    return got[0]


@pytest.mark.parametrize(
    "args,field,cap,option",
    [
        ({"concurrency": [1, 2, 4, 8, 16]}, "concurrency: 5 levels", "cap of 4 levels", "--bench-max-levels"),
        ({"concurrency": [1, 128]}, "concurrency: 128 streams", "cap of 64", "--bench-max-concurrency"),
        ({"num_requests": 201}, "num_requests: 201", "cap of 200", "--bench-max-requests"),
        ({"duration": 61.0}, "duration: 61 s", "cap of 60 s", "--bench-max-duration"),
    ],
)
def test_bench_over_a_cap_is_a_tool_error_naming_the_field_and_the_cap(
    args: dict[str, Any], field: str, cap: str, option: str
) -> None:
    is_error, text, _ = _call(Options(), "bench", {"url": "http://127.0.0.1:9", "model": "m", **args})
    assert is_error
    assert f"error: {field} is above this server's cap" in text and cap in text
    assert f"hint: ask for less, or start `servelab mcp {option}" in text


def test_bench_within_the_caps_runs_the_command() -> None:
    """Four levels up to 64 streams pass the caps: the error is the command's own (nothing listens)."""
    url = f"http://127.0.0.1:{free_port()}"
    opts = Options(bench_max_levels=4, bench_max_concurrency=64)
    is_error, text, _ = _call(opts, "bench", {"url": url, "model": "m", "concurrency": [1, 4, 16, 64]})
    assert is_error and "cap of" not in text and url.split("//")[1] in text


@pytest.mark.parametrize("option", ["--bench-max-levels", "--bench-max-concurrency"])
def test_the_caps_are_server_options(option: str) -> None:
    res = CliRunner().invoke(cli, ["mcp", option, "0"])
    assert res.exit_code == 2 and option in res.output


TOKEN = "hf_AbCdEfGh12345678"
KEY = "sk-abcdef1234567890XYZ"
PASSWORD = "s3cretPassw0rd"


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A store holding secrets as a store written before masking (or copied from elsewhere) could: a
    failed trial's error and a run's URL and warnings, written around the repositories' own masking."""
    monkeypatch.setenv("SERVELAB_HOME", str(tmp_path / "home"))
    with open_store() as store:
        repo = StudyRepo(store)
        spec = {"repeats": 1, "load": {"concurrency": [1]}}
        sid, uid = repo.create_study("leaky", str(tmp_path / "s.toml"), spec, "h")
        cand = repo.add_candidate(sid, 0, "tp8-token", {"tp": 8, "env": {"HF_TOKEN": "***"}}, None)
        trial = repo.start_trial(cand, 0, f"{uid}:a:0")
        store.execute(
            "UPDATE study_trials SET status = 'failed', finished_at = ?, error = ? WHERE id = ?",
            (utcnow(), f"launch failed: --hf-token {TOKEN} with HF_TOKEN={TOKEN} set", trial),
        )
        bench = BenchRepo(store)
        run_id, run = bench.create_run(f"http://agent:{PASSWORD}@127.0.0.1:1", "m", "completions", {}, None)
        store.execute(
            "UPDATE bench_runs SET warnings_json = ? WHERE id = ?",
            (json.dumps([f"the server wants Authorization: Bearer {KEY}"]), run_id),
        )
        bench.finish_run(run_id, "completed", [])
    return {"study": uid, "run": run}


def test_secrets_are_masked_in_results_read_from_the_store(planted: dict[str, str]) -> None:
    with open_store() as store:  # the store does hold them: the masking below is the tools'
        (cand,) = StudyRepo(store).candidates(StudyRepo(store).resolve(planted["study"]).id)
        assert TOKEN in str(StudyRepo(store).trials(cand.id)[0].error)
    is_error, text, progress = _call(Options(), "tune_progress", {"study": planted["study"]})
    assert not is_error, text
    assert progress is not None
    (failed,) = [f for f in progress["findings"] if f["kind"] == "failed"]
    assert failed["detail"] == "launch failed: --hf-token *** with HF_TOKEN=*** set"
    is_error, text, run = _call(Options(), "runs_show", {"run": planted["run"]})
    assert not is_error, text
    assert run is not None
    assert run["url"] == "http://agent:***@127.0.0.1:1"
    assert run["warnings"] == ["the server wants Authorization: Bearer ***"]
    for secret in (TOKEN, KEY, PASSWORD):
        assert secret not in json.dumps(progress) + json.dumps(run) + text


def test_a_document_its_tool_does_not_declare_is_a_tool_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command whose `--json` lost (or renamed) a declared key fails the call, naming the key, instead of
    handing the agent a result its schema does not describe."""
    from servelab.mcp import base

    doc = evaluate(make_setup("GLM-5-NVFP4", "rtx-pro-6000", 8, tp=8), Workload(1024, 128, 4)).to_dict()
    doc["tpot"] = doc.pop("tpot_ms")
    monkeypatch.setattr(base, "run_cli", lambda args, timeout: json.loads(dumps_json(doc)))
    is_error, text, _ = _call(Options(), "predict", {"model": "GLM-5-NVFP4"})
    assert is_error and "servelab predict --json gave a document that does not match" in text
    assert "PredictionView" in text and "tpot_ms: Field required" in text and "hint:" in text


@pytest.mark.parametrize(
    "tool,args,command",
    [
        (
            "predict",
            {"model": "GLM-5-NVFP4", "silicon": True},
            ["predict", "--model", "GLM-5-NVFP4", "--silicon"],
        ),
        ("predict_sweep", {"sweep": [1, 16], "tp": 8}, ["predict", "--tp", "8", "--sweep", "1,16"]),
        ("explain", {"run": "last", "silicon": True}, ["explain", "last", "--silicon"]),
    ],
)
def test_the_arguments_are_the_commands_options(
    monkeypatch: pytest.MonkeyPatch, tool: str, args: dict[str, Any], command: list[str]
) -> None:
    from servelab.mcp import base

    seen: list[list[str]] = []

    def run_cli(argv: list[str], timeout: float) -> Any:
        seen.append(argv)
        return {}

    monkeypatch.setattr(base, "run_cli", run_cli)
    is_error, text, _ = _call(Options(), tool, args)
    assert seen == [command] and is_error and "does not match" in text  # {} is no document of it

"""`servelab mcp` driven by the MCP SDK's own client (ClientSession over stdio, and over streamable HTTP
on 127.0.0.1) through the seed story, against one simulator server and one store shared by the module:

- stdio: `status` sees the idle simulator; `plan_update` records the agent's todo list; `plan_check`
  flags the item whose assumption the observed state contradicts (a server the plan says crashed answers
  healthy); `tune_start` returns the reduced GLM-5 study's id at once, `tune_progress` moves while it
  runs, and the not-applied candidate (tp8-trtllm) and the throughput collapse (the allreduce-fusion
  flag) are in its findings; `report` writes the files; an error is the CLI's message and hint;
- a second stdio client disconnects mid-study: its driver stops cleanly (no process of the study left),
  and over HTTP `tune_resume` continues the study to its end; the other tools run there.

Every structured result is validated against the output schema its tool declares. The study is
examples/glm5-pcie.toml reduced to its not-applied and collapse story: three candidates, levels 1 and 4,
one request per stream, one repeat, the simulated clock at 100x."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import psutil
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from tests.support import simruns

from servelab.host import processes
from servelab.host.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240)
TRTLLM = 'args = ["--moe-runner-backend", "flashinfer_trtllm"]'
TOKEN = "hf_Zq8mNw4RtY6uIo2PaS"  # the not-applied candidate's environment carries it: no result may show it


def reduced_study(text: str) -> str:
    """examples/glm5-pcie.toml with the candidates that tell the story (the baseline, the backend SM120
    cannot run, the collapsing flag), the smallest load that still shows a collapse at two levels; the
    candidate SM120 cannot run has a token in its environment (HF_TOKEN)."""
    head, rest = text.split("[[candidates]]", 1)
    cands, tail = ("[[candidates]]" + rest).split("[workload]", 1)
    keep = [
        "[[candidates]]" + b for b in cands.split("[[candidates]]")[1:] if 'name = "tp4-pp2-cutlass"' not in b
    ]
    out = head + "".join(keep) + "[workload]" + tail
    for old, new in (
        ("repeats = 2", "repeats = 1"),
        ("concurrency = [1, 4, 16, 64, 256, 1024]\nmain = 64", "concurrency = [1, 4]\nmain = 4"),
        ("requests_per_stream = 2", "requests_per_stream = 1"),
        ("speed = 20 ", "speed = 100 "),
        (TRTLLM, f'{TRTLLM}\nenv = {{ HF_TOKEN = "{TOKEN}" }}'),
    ):
        assert old in out, f"examples/glm5-pcie.toml changed: {old!r} is gone; update reduced_study"
        out = out.replace(old, new)
    return out


@dataclass
class World:
    home: Path
    study: Path
    sim: simruns.SimProcess

    def env(self) -> dict[str, str]:
        return {**os.environ, "SERVELAB_HOME": str(self.home)}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("mcp")
    study = root / "glm5-pcie.toml"
    study.write_text(reduced_study((ROOT / "examples/glm5-pcie.toml").read_text()))
    sim = simruns.start_sim(root / "logs", *simruns.SIM_ARGS, speed=100)
    try:
        yield World(root / "home", study, sim)
    finally:
        sim.stop()


class Client:
    """A ClientSession that checks every structured result against its tool's declared output schema."""

    def __init__(self, session: ClientSession) -> None:
        self.s = session
        self.schemas: dict[str, dict[str, Any]] = {}

    async def start(self) -> None:
        await self.s.initialize()
        for t in (await self.s.list_tools()).tools:
            assert t.output_schema, f"{t.name} declares no output schema"
            assert t.input_schema.get("properties") is not None, t.name
            self.schemas[t.name] = t.output_schema

    async def call(self, name: str, **args: Any) -> dict[str, Any]:
        res = await self.s.call_tool(name, args)
        assert not res.is_error, f"{name}: {res.content[0].text if res.content else res}"
        assert res.structured_content is not None, name
        jsonschema.validate(res.structured_content, self.schemas[name])
        return res.structured_content

    async def error(self, name: str, **args: Any) -> str:
        res = await self.s.call_tool(name, args)
        assert res.is_error, f"{name} did not fail: {res.structured_content}"
        return str(res.content[0].text)


@contextlib.asynccontextmanager
async def stdio(world: World, *args: str) -> AsyncIterator[Client]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "servelab", "mcp", *args],
        env=world.env(),
        cwd=str(world.home.parent),
    )
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        c = Client(s)
        await c.start()
        yield c


async def wait_study(c: Client, uid: str, until_running: bool = False) -> list[dict[str, Any]]:
    """tune_progress until the study's driver ended (or, `until_running`, until a trial is under way)."""
    seen: list[dict[str, Any]] = []
    end = time.monotonic() + 120
    while time.monotonic() < end:
        p = await c.call("tune_progress", study=uid)
        seen.append(p)
        if until_running and p["running"]:
            return seen
        if p["exit_code"] is not None:
            return seen
        await anyio.sleep(0.3)
    raise AssertionError(f"study {uid} did not end: {seen[-1]}")


def cli_json(world: World, *argv: str) -> Any:
    cp = subprocess.run(
        [sys.executable, "-m", "servelab", *argv, "--json"], capture_output=True, env=world.env(), check=False
    )
    return json.loads(cp.stdout)


@pytest.fixture(scope="module")
def story(world: World) -> dict[str, Any]:
    """The seed story over stdio; what it saw, for the tests below to assert on."""
    out: dict[str, Any] = {}

    async def main() -> None:
        async with stdio(world) as c:
            out["tools"] = sorted(c.schemas)
            out["schemas"] = c.schemas
            out["status"] = await c.call("status", url=[world.sim.url], gpu_source=f"sim:{world.sim.url}")
            todos = [
                {"content": f"restart the crashed GLM-5 server {world.sim.url}", "status": "pending"},
                {"content": "tune GLM-5 on the PCIe box (examples/glm5-pcie.toml)", "status": "in_progress"},
                {"content": "deploy the winner", "status": "pending", "priority": "high"},
            ]
            out["plan_update"] = await c.call("plan_update", todos=todos)
            out["plan_get"] = await c.call("plan_get")
            out["plan_check"] = await c.call("plan_check")
            t0 = time.monotonic()
            out["started"] = await c.call("tune_start", study_file=str(world.study))
            out["start_s"] = time.monotonic() - t0
            out["progress"] = await wait_study(c, out["started"]["study"])
            out["report"] = await c.call("report", study=out["started"]["study"])
            out["report_md"] = await c.s.read_resource(f"servelab://studies/{out['started']['study']}/report")
            out["plan_md"] = await c.s.read_resource("servelab://plan")
            out["signatures"] = await c.s.read_resource("servelab://signatures")
            secret = await c.call(
                "plan_update",
                todos=[
                    {"id": "9", "content": "bench with --api-key sk-abcdefgh12345678", "status": "pending"}
                ],
            )
            out["secret_todo"] = next(t for t in secret["todos"] if t["id"] == "9")["content"]
            out["bad_type"] = await c.error(
                "predict", model="GLM-5-NVFP4", gpu="rtx-pro-6000", num_gpus="eight"
            )
            notes: list[tuple[float, float | None]] = []

            async def note(progress: float, total: float | None, _message: str | None) -> None:
                notes.append((progress, total))

            await c.s.call_tool("tune_progress", {"study": out["started"]["study"]}, progress_callback=note)
            out["notified"] = notes
            out["bad_model"] = await c.error("predict", model="no-such-model", gpu="rtx-pro-6000", num_gpus=8)
            out["bad_todo"] = await c.error("plan_update", todos=[{"content": "x", "status": "doing"}])

    anyio.run(main)
    return out


def test_the_tools_are_the_loop(story: dict[str, Any]) -> None:
    assert story["tools"] == sorted(
        [
            "status", "doctor", "logs_diagnose", "logs_parse", "plan_get", "plan_update", "plan_check",
            "predict", "predict_sweep", "compare_layouts", "explain", "bench", "tune_start", "tune_progress",
            "tune_stop", "tune_resume", "runs_show", "report", "deploy_preview",
        ]
    )  # fmt: skip


def test_a_documented_result_is_its_model_every_field_declared(story: dict[str, Any]) -> None:
    """The results that come from a typed model declare all of its fields and no other: the validation
    of every result against its schema (Client.call) then checks them."""
    for tool, key in (
        ("predict", "tpot_ms"), ("explain", "largest_gap"), ("runs_show", "levels"), ("bench", "run"),
        ("logs_parse", "evidence"), ("logs_diagnose", "class"), ("plan_get", "items"),
        ("plan_check", "findings"), ("tune_progress", "eta_s"), ("compare_layouts", "layouts"),
    ):  # fmt: skip
        schema = story["schemas"][tool]
        assert schema["additionalProperties"] is False and key in schema["required"], tool


def test_status_sees_the_idle_simulator(story: dict[str, Any], world: World) -> None:
    (srv,) = story["status"]["servers"]
    assert srv["up"] and srv["url"].rstrip("/") == world.sim.url
    assert srv["running"] == 0 and srv["waiting"] == 0
    assert story["status"]["gpus"]["available"]


def test_the_plan_is_the_agents_todo_list(story: dict[str, Any]) -> None:
    up = story["plan_update"]
    assert [t["content"] for t in up["todos"]][1] == "tune GLM-5 on the PCIe box (examples/glm5-pcie.toml)"
    assert [t["status"] for t in up["todos"]] == ["pending", "in_progress", "pending"]
    assert len(up["added"]) == 3 and all(t["id"] for t in up["todos"])
    assert story["plan_get"]["counts"]["in_progress"] == 1
    assert "deploy the winner" in str(story["plan_md"].contents[0].text)


def test_plan_check_flags_the_server_the_plan_says_crashed(story: dict[str, Any], world: World) -> None:
    found = story["plan_check"]["findings"]
    healthy = [f for f in found if f["kind"] == "server_healthy"]
    assert len(healthy) == 1, found
    assert healthy[0]["item"] == story["plan_update"]["todos"][0]["id"]
    assert world.sim.url in healthy[0]["message"] and healthy[0]["evidence"]["server"]["up"]


def test_tune_start_answers_at_once_and_progress_moves(story: dict[str, Any]) -> None:
    first, seen = story["progress"][0], story["progress"]
    assert story["started"]["study"].startswith("s-") and story["start_s"] < 15
    assert first["trials_done"] < 3, "the study had ended before the first poll: not in the background"
    done = [p["levels_done"] for p in seen]
    assert done == sorted(done) and done[-1] > done[0]
    assert any(p["running"] for p in seen), "no poll saw a trial under way"
    assert any(p["eta_s"] and p["status"] == "running" for p in seen)
    last = seen[-1]
    assert last["status"] == "completed" and last["exit_code"] == 0 and last["eta_s"] == 0
    assert last["trials_done"] == last["trials_total"] == 3


def test_the_not_applied_candidate_and_the_collapse_are_found(story: dict[str, Any]) -> None:
    last = story["progress"][-1]
    status = {c["label"]: c["status"] for c in last["candidates"]}
    assert status == {
        "tp8-cutlass": "measured",
        "tp8-trtllm": "not_applied",
        "tp8-cutlass-arfusion": "anomalous",
    }
    kinds = {(f["candidate"], f["kind"]) for f in last["findings"]}
    assert ("tp8-trtllm", "not_applied") in kinds
    assert ("tp8-cutlass-arfusion", "throughput_collapse") in kinds
    na = next(f for f in last["findings"] if f["kind"] == "not_applied")
    assert "flashinfer_trtllm" in na["detail"] and "flashinfer_cutlass" in na["detail"]


def test_report_writes_the_files(story: dict[str, Any]) -> None:
    written = [Path(p) for p in story["report"]["written"]]
    assert {p.suffix for p in written} >= {".html", ".md", ".svg"}
    assert all(p.is_file() and p.stat().st_size > 0 for p in written)
    md = next(p for p in written if p.suffix == ".md").read_text()
    assert "tp8-trtllm" in md
    assert "tp8-trtllm" in str(story["report_md"].contents[0].text)
    assert "[[signature]]" in str(story["signatures"].contents[0].text) or "pattern" in str(
        story["signatures"].contents[0].text
    )


def test_an_error_is_the_clis_message_and_hint(story: dict[str, Any], world: World) -> None:
    cli = cli_json(world, "predict", "--model", "no-such-model", "--gpu", "rtx-pro-6000", "--num-gpus", "8")
    assert f"error: {cli['message']}\nhint: {cli['hint']}" in story["bad_model"]
    assert "todo #1" in story["bad_todo"] and "hint:" in story["bad_todo"]


def test_secrets_are_masked_and_bad_arguments_name_their_field(story: dict[str, Any]) -> None:
    assert story["secret_todo"] == "bench with --api-key ***"
    trtllm = next(c for c in story["report"]["candidates"] if c["label"] == "tp8-trtllm")
    assert trtllm["settings"]["env"] == {"HF_TOKEN": "***"} and "HF_TOKEN='***'" in trtllm["command"]
    seen = json.dumps([story["report"], story["progress"], str(story["report_md"].contents[0].text)])
    assert TOKEN not in seen
    assert "num_gpus" in story["bad_type"]


def test_progress_is_also_a_notification(story: dict[str, Any]) -> None:
    last = story["progress"][-1]
    assert story["notified"] == [(last["levels_done"], last["levels_total"])]


def test_progress_shows_each_levels_energy_and_cost_as_the_study_stored_them(
    story: dict[str, Any], world: World
) -> None:
    """`tune_progress`'s per-level figures are the trial digests `runs study` reads from the same store:
    the simulator's GPUs drew power, so every measured level has joules and a price."""
    uid = story["started"]["study"]
    stored = {
        c["label"]: [(t["repeat"], lv) for t in c["trials"] for lv in t["levels"] or []]
        for c in cli_json(world, "runs", "study", uid)["candidates"]
    }
    shown = {c["label"]: c["levels"] for c in story["progress"][-1]["candidates"]}
    assert set(shown) == set(stored) and shown["tp8-trtllm"] == []
    keys = ("energy_j", "j_per_output_token", "j_per_output_token_above_idle", "usd_per_m_output_tokens")
    for label in ("tp8-cutlass", "tp8-cutlass-arfusion"):
        assert [(lv["repeat"], lv["level"]) for lv in shown[label]] == [
            (r, d["level"]) for r, d in stored[label]
        ]
        for lv, (_, d) in zip(shown[label], stored[label], strict=True):
            assert lv["output_throughput"] == pytest.approx(d["output_throughput"])
            assert all(lv[k] is not None and lv[k] == pytest.approx(d[k]) for k in keys), (lv, d)
            assert lv["j_per_output_token"] > 0 and lv["usd_per_m_output_tokens"] > 0
    # the collapsing flag's GPUs idle on the fused all-reduce: more joules per token than the baseline's
    base, flag = (shown[label][0]["j_per_output_token"] for label in ("tp8-cutlass", "tp8-cutlass-arfusion"))
    assert flag > base


def test_the_report_declares_its_fronts_typed(story: dict[str, Any], world: World) -> None:
    """The report tool's `pareto_front` and `energy_front` are the command's and its schema types each
    member: one with a figure missing or of the wrong type does not pass."""
    report, schema = story["report"], story["schemas"]["report"]
    cli = cli_json(world, "report", story["started"]["study"])
    assert report["pareto_front"] == cli["pareto_front"] and report["energy_front"] == cli["energy_front"]
    assert report["pareto_front"] and report["energy_front"]
    names = {lv["candidate"] for lv in report["pareto_front"] + report["energy_front"]}
    assert names <= {"tp8-cutlass", "tp8-cutlass-arfusion"}
    for key, figure in (("pareto_front", "tps_per_user"), ("energy_front", "j_per_output_token")):
        bad = json.loads(json.dumps(report))
        bad[key][0][figure] = "fast"
        with pytest.raises(jsonschema.ValidationError, match="fast"):
            jsonschema.validate(bad, schema)
        del bad[key][0][figure]
        with pytest.raises(jsonschema.ValidationError, match=figure):
            jsonschema.validate(bad, schema)


def _study_processes(uid: str) -> list[processes.ProcInfo]:
    return [p for p in processes.with_marker(prefix=f"{uid}:") if p.alive()]


@pytest.fixture(scope="module")
def http_server(world: World, story: dict[str, Any]) -> Iterator[str]:
    port = free_port()
    err = world.home / "mcp-http.err"
    with open(err, "wb") as e:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "servelab",
                "mcp",
                "--http",
                f"127.0.0.1:{port}",
                "--bench-max-requests",
                "8",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=e,
            env=world.env(),
        )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        end = time.monotonic() + 60
        while "servelab mcp on" not in err.read_text():
            assert proc.poll() is None and time.monotonic() < end, err.read_text()[-3000:]
            time.sleep(0.05)
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
            except urllib.error.HTTPError:
                break  # it answers (a bare GET is not an MCP request)
            except OSError:
                assert time.monotonic() < end, err.read_text()[-3000:]
                time.sleep(0.05)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_a_client_that_disconnects_mid_study_leaves_nothing_and_resume_continues_it(
    world: World, http_server: str
) -> None:
    got: dict[str, Any] = {}

    async def leave() -> None:
        async with stdio(world) as c:
            got["started"] = await c.call("tune_start", study_file=str(world.study))
            got["mid"] = (await wait_study(c, got["started"]["study"], until_running=True))[-1]
        # the client is gone: its server stopped the driver (SIGINT); the driver tears down on its own

    anyio.run(leave)
    uid, pid = got["started"]["study"], got["started"]["pid"]
    assert got["mid"]["status"] == "running" and got["mid"]["driver"]["pid"] == pid
    end = time.monotonic() + 60
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < end, f"the study's driver {pid} is still alive"
        time.sleep(0.1)
    assert _study_processes(uid) == []

    async def resume() -> None:
        async with streamable_http_client(http_server) as (r, w), ClientSession(r, w) as s:
            c = Client(s)
            await c.start()
            before = await c.call("tune_progress", study=uid)
            got["before"] = before
            got["resumed"] = await c.call("tune_resume", study=uid)
            got["busy"] = await c.error("tune_resume", study=uid)
            await wait_study(c, uid, until_running=True)
            got["stopped"] = await c.call("tune_stop", study=uid)
            got["again"] = await c.call("tune_resume", study=uid)
            got["end"] = (await wait_study(c, uid))[-1]
            await more_tools(c, world, uid, got)

    anyio.run(resume)
    assert got["before"]["status"] == "interrupted" and got["before"]["driver"] is None
    assert got["before"]["trials_done"] < 3
    assert got["resumed"]["study"] == uid
    assert "running" in got["busy"] and "hint:" in got["busy"]
    assert got["stopped"]["exit_code"] == 130 and got["stopped"]["status"] == "interrupted"
    assert got["again"]["study"] == uid and got["again"]["pid"] != got["resumed"]["pid"]
    end_ = got["end"]
    assert end_["status"] == "completed" and end_["exit_code"] == 0
    assert {c["label"]: c["status"] for c in end_["candidates"]}["tp8-trtllm"] == "not_applied"
    assert _study_processes(uid) == []


async def more_tools(c: Client, world: World, uid: str, got: dict[str, Any]) -> None:
    """The rest of the tools, over HTTP, on what the story stored."""
    layouts = await c.call(
        "compare_layouts", model="GLM-5-NVFP4", gpu="rtx-pro-6000", num_gpus=8, engine="sglang"
    )
    assert {"tp8"} <= {lay["label"] for lay in layouts["layouts"]} or layouts["layouts"]
    pred = await c.call("predict", model="GLM-5-NVFP4", gpu="rtx-pro-6000", num_gpus=8, tp=8, concurrency=4)
    assert pred["feasible"] and pred["output_throughput"] > 0
    bench = await c.call("bench", url=world.sim.url, model=simruns.MODEL, concurrency=[2], num_requests=4)
    run = bench["run"]
    assert run.startswith("b-") and [lv["label"] for lv in bench["levels"]] == ["c=2"]
    shown = await c.call("runs_show", run=run)
    assert shown["run"] == run and shown["levels"][0]["summary"]["completed"] == 4
    explained = await c.call("explain", run=run)
    assert explained["run"] == run and [lv["concurrency"] for lv in explained["levels"]] == [2]
    assert explained["levels"][0]["measured"]["output_throughput"] > 0
    curve = await c.call(
        "predict_sweep", model="GLM-5-NVFP4", gpu="rtx-pro-6000", num_gpus=8, tp=8, sweep=[1, 16]
    )
    assert [p["concurrency"] for p in curve["points"]] == [1, 16]
    over = await c.error("bench", url=world.sim.url, model=simruns.MODEL, concurrency=[1, 2, 4, 8, 16])
    assert "concurrency: 5 levels is above this server's cap of 4 levels" in over
    capped = await c.error("bench", url=world.sim.url, model=simruns.MODEL, num_requests=9)
    assert "num_requests" in capped and "--bench-max-requests" in capped
    logs = sorted((world.home / "logs").glob("*/*.log"))
    parsed = await c.call("logs_parse", engine="sglang", file=str(logs[0]))
    assert parsed["effective"]
    diag = await c.call("logs_diagnose", file=str(logs[0]))
    assert diag["class"]
    doc = await c.call("doctor", gpu_source=f"sim:{world.sim.url}")
    assert doc["checks"] and doc["worst"] in ("ok", "warn", "fail")
    unit = await c.call("deploy_preview", run=uid)
    assert unit["dry_run"] and "ExecStart=" in unit["content"] and "candidate tp8-cutlass" in unit["content"]
    assert not Path(unit["file"]).exists()
    refused = await c.error("deploy_preview", run=uid, install=True)
    assert "--allow-install" in refused

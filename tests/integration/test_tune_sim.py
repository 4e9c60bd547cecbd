"""`servelab tune` end to end on the simulator: not-applied settings, the throughput collapse, every fault,
SIGKILL of servelab mid-study then --resume. Real processes, real HTTP, the real store."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def write_study(
    path: Path,
    name: str,
    candidates: list[dict[str, Any]],
    *,
    model: str = "Qwen3-30B-A3B",
    gpu: str = "h100-sxm",
    num_gpus: int = 1,
    personality: str = "vllm",
    levels: list[int] | None = None,
    speed: float = 50,
    extra_engine: dict[str, Any] | None = None,
    top: str = "",
    options: dict[str, Any] | None = None,
) -> Path:
    lines = [
        top,
        "[study]",
        f"name = {_toml_value(name)}",
        "[model]",
        f"path = {_toml_value(model)}",
        "[host]",
        f"gpu = {_toml_value(gpu)}",
        f"num_gpus = {num_gpus}",
        "[engine]",
        'name = "sim"',
        "startup_timeout_s = 60",
    ]
    for k, v in (extra_engine or {}).items():
        lines.append(f"{k} = {_toml_value(v)}")
    lines += [
        "[engine.options]",
        f"personality = {_toml_value(personality)}",
        f"speed = {speed}",
        "fast_start = true",
        "cpus = [0]",
    ]
    lines += [f"{k} = {_toml_value(v)}" for k, v in (options or {}).items()]
    for c in candidates:
        lines.append("[[candidates]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in c.items()]
    lines += [
        "[workload]",
        "input_len = 256",
        "output_len = 32",
        "requests_per_stream = 2",
        "timeout_s = 20",
        "[load]",
        f"concurrency = {_toml_value(levels or [1, 8])}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def servelab(
    *args: str, home: Path, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    cmd = [sys.executable, "-m", "servelab", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    if check and res.returncode != 0:
        raise AssertionError(
            f"{cmd} exited {res.returncode}\nstdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-3000:]}"
        )
    return res


def markers_alive(prefix: str) -> list[int]:
    """Live processes whose SERVELAB_RUN starts with `prefix`."""
    from servelab.host import processes

    return [p.pid for p in processes.with_marker(prefix=prefix)]


def by_label(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["label"]: c for c in result["candidates"]}


def test_glm5_story_not_applied_collapse_and_winner(tmp_path: Path) -> None:
    """The GLM-5 story: trtllm silently replaced (not applied, never benchmarked), the allreduce-fusion
    flag collapsing throughput with GPU power falling, TP8 vs TP4+PP2 ranked."""
    study = write_study(
        tmp_path / "glm5.toml",
        "glm5",
        [
            {
                "name": "tp8-cutlass",
                "tp": 8,
                "args": ["--moe-runner-backend", "flashinfer_cutlass"],
                "baseline": True,
            },
            {"name": "tp8-trtllm", "tp": 8, "args": ["--moe-runner-backend", "flashinfer_trtllm"]},
            {"name": "tp4-pp2", "tp": 4, "pp": 2, "args": ["--moe-runner-backend", "flashinfer_cutlass"]},
            {
                "name": "arfusion",
                "tp": 8,
                "args": [
                    "--moe-runner-backend",
                    "flashinfer_cutlass",
                    "--enable-flashinfer-allreduce-fusion",
                ],
            },
        ],
        model="GLM-5-NVFP4",
        gpu="rtx-pro-6000",
        num_gpus=8,
        personality="sglang",
        levels=[1, 8],
        speed=20,
        extra_engine={"args": ["--disable-radix-cache"]},
    )
    res = servelab("tune", str(study), "--json", home=tmp_path / "home")
    out = json.loads(res.stdout)
    c = by_label(out)
    assert out["status"] == "completed"

    trt = c["tp8-trtllm"]
    assert trt["status"] == "not_applied"
    [m] = trt["not_applied"]
    assert (m["key"], m["requested"], m["effective"]) == (
        "moe_runner_backend",
        "flashinfer_trtllm",
        "flashinfer_cutlass",
    )
    assert "flashinfer_cutlass" in m["evidence"]  # the log line that proves it
    assert trt["levels"] == []  # never benchmarked, never reported as trtllm

    fusion = c["arfusion"]
    assert fusion["status"] == "anomalous"
    kinds = {a["kind"] for a in fusion["anomalies"]}
    assert "throughput_collapse" in kinds and "power_drop" in kinds

    for label in ("tp8-cutlass", "tp4-pp2"):
        assert c[label]["status"] == "measured"
        assert [lv["level"] for lv in c[label]["levels"]] == [1.0, 8.0]
        assert all(lv["failed"] == 0 for lv in c[label]["levels"])
    # measured in real-GPU time (speed 20 rescaled): single-stream TPOT near the model's prediction
    tpot1 = c["tp8-cutlass"]["levels"][0]["tpot_ms_p50"]
    assert 5 < tpot1 < 100
    assert out["ranking"]["winner"] in ("tp8-cutlass", "tp4-pp2")
    assert out["ranking"]["runner_up"] in ("tp8-cutlass", "tp4-pp2")

    # `servelab runs` lists the study with its candidates and outcomes; nothing of it is left running.
    runs = json.loads(servelab("runs", "--json", home=tmp_path / "home").stdout)
    [st] = runs["studies"]
    assert {x["label"]: x["status"] for x in st["candidates"]}["tp8-trtllm"] == "not_applied"
    assert markers_alive(f"servelab-study:{out['study']}:") == []

    # The study's plan is the todo list: one item per candidate, moved by what the runs showed.
    plan = json.loads(servelab("plan", "--plan", out["study"], "--json", home=tmp_path / "home").stdout)
    items = {i["binding"]["candidate"]: i for i in plan["items"]}
    assert items["tp8-cutlass"]["status"] == "completed"
    assert items["tp8-cutlass"]["evidence"][-1]["applied"] is True
    trt_item = items["tp8-trtllm"]
    assert trt_item["status"] == "cancelled"  # closed as not applied when the study finished
    assert trt_item["evidence"][-1]["applied"] is False
    assert trt_item["binding"]["requested"]["moe_runner_backend"] == "flashinfer_trtllm"


STARTUP_FAULTS = {
    "cuda_init": "cuda_init",
    "oom_init": "oom_init",
    "worker_init": "nccl_error",  # the root cause under `WorkerProc initialization failed`
    "port_in_use": "port_in_use",
    "nccl_shm": "nccl_shm",
}


def test_every_fault_is_diagnosed_and_the_study_goes_on(tmp_path: Path) -> None:
    cands: list[dict[str, Any]] = [{"name": "healthy", "baseline": True}]
    cands += [{"name": f"f-{f}", "options": {"faults": [f]}} for f in STARTUP_FAULTS]
    cands += [
        {"name": "f-garbage", "options": {"faults": ["garbage"]}},
        {"name": "f-die", "options": {"faults": ["die_after_ready:22"]}},
        {"name": "f-drop", "options": {"faults": ["drop_stream:3"]}},
        {"name": "f-orphan", "options": {"faults": ["orphan"]}},
        {"name": "f-slow", "options": {"faults": ["slow_start:3000"]}},  # 60 s at speed 50 > 20 s timeout
        {"name": "f-hang", "options": {"faults": ["hang"]}},
        {"name": "f-stall", "options": {"faults": ["stall_stream:3"]}},
        {"name": "f-malformed", "options": {"faults": ["malformed_sse:2"]}},
    ]
    study = write_study(
        tmp_path / "faults.toml", "faults", cands, levels=[4], options={"verify": {"timeout_s": 10.0}}
    )
    res = servelab("tune", str(study), "--json", "--startup-timeout", "20", home=tmp_path / "home")
    out = json.loads(res.stdout)
    c = by_label(out)
    assert c["healthy"]["status"] == "measured"
    for fault, klass in STARTUP_FAULTS.items():
        cand = c[f"f-{fault}"]
        assert cand["status"] == "failed", fault
        assert cand["diagnosis"]["class"] == klass, (fault, cand["diagnosis"])
        assert cand["diagnosis"]["advice"]
    assert c["f-garbage"]["status"] == "failed"
    assert c["f-garbage"]["diagnosis"]["class"] == "wrong_output"
    assert c["f-die"]["status"] == "failed"
    assert c["f-die"]["diagnosis"]["class"] == "illegal_memory_access"  # the root cause of the death
    assert c["f-die"]["died_during_benchmark"] is True
    drop = c["f-drop"]
    assert drop["status"] in ("anomalous", "failed")
    if drop["status"] == "anomalous":
        assert "error_rate" in {a["kind"] for a in drop["anomalies"]}
    assert c["f-slow"]["diagnosis"]["class"] == "startup_timeout"
    assert c["f-hang"]["status"] == "failed"
    assert c["f-hang"]["diagnosis"]["class"] in ("startup_timeout", "server_unresponsive")
    # broken streams: verify-output or the benchmark catches them; never a clean "measured"
    for label in ("f-stall", "f-malformed"):
        assert c[label]["status"] in ("failed", "anomalous"), c[label]
    # the orphan fault's child was found and killed by teardown
    detail = json.loads(servelab("runs", "study", out["study"], "--json", home=tmp_path / "home").stdout)
    orphan_trials = {x["label"]: x for x in detail["candidates"]}["f-orphan"]["trials"]
    assert orphan_trials[0]["teardown"]["orphans"], orphan_trials[0]["teardown"]
    assert orphan_trials[0]["teardown"]["survivors"] == []
    assert markers_alive(f"servelab-study:{out['study']}:") == []
    assert out["ranking"]["winner"] in ("healthy", "f-orphan")  # the only two that serve correctly


def _db_trials(home: Path) -> list[tuple[str, str]]:
    db = home / "servelab.db"
    if not db.exists():
        return []
    con = sqlite3.connect(db, timeout=10)
    try:
        return con.execute(
            "SELECT c.label, t.status FROM study_trials t JOIN study_candidates c"
            " ON c.id = t.candidate_id ORDER BY t.id"
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def test_sigkill_mid_study_then_resume(tmp_path: Path) -> None:
    home = tmp_path / "home"
    study = write_study(
        tmp_path / "resume.toml",
        "resume",
        [
            {"name": "first"},
            {"name": "second", "max_concurrency": 64},
            {"name": "third", "max_concurrency": 32},
        ],
        levels=[1, 8, 16],
        speed=10,
    )
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "servelab", "tune", str(study), "--quiet"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        trials = _db_trials(home)
        if ("first", "measured") in trials and ("second", "benchmarking") in trials:
            break
        assert proc.poll() is None, "the study ended before it could be killed"
        time.sleep(0.2)
    else:
        pytest.fail(f"never reached the second candidate's benchmark: {_db_trials(home)}")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    con = sqlite3.connect(home / "servelab.db")
    uid = con.execute("SELECT uid FROM studies").fetchone()[0]
    con.close()
    left = markers_alive(f"servelab-study:{uid}:")
    assert left, "the killed servelab's server should still be running (own session)"

    res = servelab("tune", str(study), "--resume", "--json", home=home)
    out = json.loads(res.stdout)
    assert out["study"] == uid and out["status"] == "completed"
    assert {p["pid"] for p in out["orphans_cleaned"]} >= set(left)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in left)
    trials = _db_trials(home)
    assert trials.count(("first", "measured")) == 1  # not redone
    assert ("second", "interrupted") in trials and ("second", "measured") in trials
    assert ("third", "measured") in trials
    assert all(c["status"] == "measured" for c in out["candidates"])
    # a second --resume has nothing left to do
    again = servelab("tune", str(study), "--resume", home=home, check=False)
    assert again.returncode == 2 and "no unfinished study" in again.stderr


def test_resume_refuses_a_changed_study_and_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[study]\nname = "x"\n[model]\npath = "m"\n[engine]\nname = "nope"\n[workload]\nnum_requests = 2\n'
        "[load]\nconcurrency = [1]\n[[candidates]]\ntp = 1\n"
    )
    res = servelab("tune", str(bad), home=home, check=False)
    assert res.returncode == 2
    assert "unknown engine 'nope'" in res.stderr and "sim" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_port_already_served_with_so_reuseport_fails_the_candidate(tmp_path: Path) -> None:
    """vLLM binds with SO_REUSEPORT: a second server on a busy port would silently share it. The study
    refuses the port and names the process holding it; the study goes on."""
    from servelab.host.ports import free_port

    port = free_port()
    holder = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/support/reuseport_server.py"), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().startswith("LISTENING")
        study = write_study(
            tmp_path / "port.toml",
            "port",
            [{"name": "on-busy-port"}],
            levels=[1],
            extra_engine={"port": port},
        )
        out = json.loads(servelab("tune", str(study), "--json", home=tmp_path / "home").stdout)
        [cand] = out["candidates"]
        assert cand["status"] == "failed"
        assert cand["diagnosis"]["class"] in ("port_in_use", "port_shared")
        assert str(holder.pid) in json.dumps(cand["diagnosis"])
        assert holder.poll() is None  # someone else's process: never killed
    finally:
        holder.terminate()
        holder.wait(10)


def test_ctrl_c_tears_down_records_the_interruption_and_resumes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    study = write_study(
        tmp_path / "int.toml",
        "interrupt",
        [{"name": "a"}, {"name": "b", "max_concurrency": 32}],
        levels=[1, 8, 16],
        speed=10,
    )
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "servelab", "tune", str(study), "--quiet"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while ("a", "benchmarking") not in _db_trials(home):
        assert time.monotonic() < deadline and proc.poll() is None, _db_trials(home)
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "--resume" in err  # the hint says how to continue
    con = sqlite3.connect(home / "servelab.db")
    uid, status = con.execute("SELECT uid, status FROM studies").fetchone()
    con.close()
    assert status == "interrupted"
    assert ("a", "interrupted") in _db_trials(home)
    assert markers_alive(f"servelab-study:{uid}:") == []  # torn down on the way out, nothing to sweep
    out = json.loads(servelab("tune", str(study), "--resume", "--json", home=home).stdout)
    assert out["status"] == "completed" and out["orphans_cleaned"] == []
    assert {c["label"]: c["status"] for c in out["candidates"]} == {"a": "measured", "b": "measured"}


# -- results people read: the live line, 80 columns, a closed plan, the noise verdict ----------------

GLM5_NAMES = ("tp8-cutlass", "tp8-trtllm", "tp4-pp2-cutlass", "tp8-cutlass-arfusion")
LIVE_LINE = re.compile(
    r"(?P<cand>[\w-]+) level (?P<level>\S+): (?P<done>\d+)/(?P<total>\d+) requests · (?P<tok>[\d,]+) tok/s · "
    r"TTFT p50 (?P<ttft>[\d,.]+) ms · (?P<elapsed>\d+:\d\d) elapsed · ETA (?P<eta>\d+:\d\d)"
)


def _glm5_names_study(tmp_path: Path, repeats: int = 2) -> Path:
    """examples/glm5-pcie.toml's candidates under its names (long shared prefixes), on the simulator."""
    return write_study(
        tmp_path / "glm5-names.toml",
        "glm5-names",
        [
            {
                "name": "tp8-cutlass",
                "tp": 8,
                "args": ["--moe-runner-backend", "flashinfer_cutlass"],
                "baseline": True,
            },
            {"name": "tp8-trtllm", "tp": 8, "args": ["--moe-runner-backend", "flashinfer_trtllm"]},
            {
                "name": "tp4-pp2-cutlass",
                "tp": 4,
                "pp": 2,
                "args": ["--moe-runner-backend", "flashinfer_cutlass"],
            },
            {
                "name": "tp8-cutlass-arfusion",
                "tp": 8,
                "args": [
                    "--moe-runner-backend",
                    "flashinfer_cutlass",
                    "--enable-flashinfer-allreduce-fusion",
                ],
            },
        ],
        model="GLM-5-NVFP4",
        gpu="rtx-pro-6000",
        num_gpus=8,
        personality="sglang",
        levels=[1, 8],
        speed=20,
        extra_engine={"args": ["--disable-radix-cache"]},
        top=f"repeats = {repeats}",
    )


@pytest.fixture(scope="module")
def glm5_names(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real study, run once for the tests below: `tune --json` with stderr a pipe (not a terminal)."""
    tmp = tmp_path_factory.mktemp("glm5-names")
    home = tmp / "home"
    res = servelab("tune", str(_glm5_names_study(tmp)), "--json", home=home)
    return {"home": home, "out": json.loads(res.stdout), "stderr": res.stderr, "tmp": tmp}


def _lines_80(render: Any, data: Any) -> list[str]:
    from rich.console import Console

    buf = io.StringIO()
    render(data, Console(width=80, file=buf, highlight=False, color_system=None))
    return buf.getvalue().splitlines()


def test_tables_fit_80_columns_with_every_candidate_name_whole(glm5_names: dict[str, Any]) -> None:
    from servelab.cli.runs import _render_studies
    from servelab.cli.tune import render

    out = glm5_names["out"]
    runs = json.loads(servelab("runs", "--json", home=glm5_names["home"]).stdout)
    study = json.loads(servelab("runs", "study", out["study"], "--json", home=glm5_names["home"]).stdout)
    for name, lines in (
        ("tune", _lines_80(render, out)),
        ("runs study", _lines_80(render, study)),
        ("runs", _lines_80(_render_studies, runs["studies"])),
    ):
        text = "\n".join(lines)
        assert max(len(line) for line in lines) <= 80, (name, text)
        assert "…" not in text, (name, text)
        # every name whole on one line, in its own cell: never two names looking alike
        cells = {cell.strip() for line in lines for cell in re.split(r"[│┃|]", line)}
        for label in GLM5_NAMES:
            assert label in cells or f"{label} (winner)" in cells, (name, label, text)


def test_tables_abbreviate_too_long_names_with_a_legend(glm5_names: dict[str, Any]) -> None:
    from servelab.cli.tune import render

    out = json.loads(json.dumps(glm5_names["out"]))
    for c in out["candidates"]:  # the same study, as if its names were longer than any column can hold
        c["label"] = "glm5-nvfp4-sglang-" + c["label"] + "-with-a-long-suffix"
    lines = _lines_80(render, out)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 80 and "…" not in text
    legend = [line for line in lines if re.match(r"#\d+  ", line)]
    assert sorted(line.split("  ", 1)[1] for line in legend) == sorted(c["label"] for c in out["candidates"])
    assert len({line.split("  ", 1)[0] for line in legend}) == len(GLM5_NAMES)


def test_a_finished_study_leaves_no_plan_item_pending(glm5_names: dict[str, Any]) -> None:
    out, home = glm5_names["out"], glm5_names["home"]
    assert by_label(out)["tp8-trtllm"]["status"] == "not_applied"
    plan = json.loads(servelab("plan", "--plan", out["study"], "--json", home=home).stdout)
    items = {i["binding"]["candidate"]: i for i in plan["items"]}
    assert set(items) == set(GLM5_NAMES)
    assert [k for k, i in items.items() if i["status"] == "pending"] == []
    trt = items["tp8-trtllm"]
    assert trt["status"] == "cancelled"  # closed as not applied
    ev = trt["evidence"][-1]
    assert ev["applied"] is False and ev["status"] == "not_applied"
    [m] = [m for m in ev["mismatches"] if m["key"] == "moe_runner_backend"]
    assert (m["requested"], m["effective"]) == ("flashinfer_trtllm", "flashinfer_cutlass")
    assert "flashinfer_cutlass" in m["evidence"]  # the log line
    assert ev["run"].startswith(f"{out['study']}/tp8-trtllm/t")
    hist = json.loads(
        servelab("plan", "history", trt["id"], "--plan", out["study"], "--json", home=home).stdout
    )["events"]
    assert hist[-1]["to_status"] == "cancelled" and "not applied" in hist[-1]["reason"]
    assert "flashinfer_trtllm" in hist[-1]["reason"]


def test_the_noise_verdict_is_a_seeded_cluster_bootstrap_and_says_so(glm5_names: dict[str, Any]) -> None:
    from servelab import analyze
    from servelab.config.loading import load_study
    from servelab.store import open_store
    from servelab.store.studies import StudyRepo
    from servelab.tune.spread import samples as bootstrap_samples

    out, home = glm5_names["out"], glm5_names["home"]
    noise = out["ranking"]["noise"]
    assert noise["method"] == "cluster bootstrap over trials and their requests (B=2000, seed 0)"
    assert noise["trials"] == {out["ranking"]["winner"]: 2, out["ranking"]["runner_up"]: 2}
    assert noise["method"] in out["ranking"]["verdict"]
    lo, hi = noise["difference_ci95"]
    assert lo < hi and (lo > 0) is out["ranking"]["significant"]
    # the report states the method in its verdict sentence
    md = servelab("report", out["study"], "--no-host-checks", home=home).stdout
    assert (
        f"the margin {'exceeds' if out['ranking']['significant'] else 'is within'} the noise (judged by {noise['method']}"
        in md
    )

    # the same stored data, read in other orders and bootstrapped with other seeds: the same verdict
    study = load_study(glm5_names["tmp"] / "glm5-names.toml")
    with open_store(home / "servelab.db") as store:
        repo = StudyRepo(store)
        st = repo.resolve(out["study"])
        cands = repo.candidates(st.id)
        scores = [analyze.Score(**(c.outcome or {})["score"]) for c in cands]
        samples = bootstrap_samples(store, study, cands, scores)
    assert set(samples) >= {out["ranking"]["winner"], out["ranking"]["runner_up"]}
    again = analyze.rank(scores, study.objective, samples)
    assert again.verdict == out["ranking"]["verdict"] and again.noise == noise
    shuffled = {
        k: [analyze.Cluster(c.value, c.num[::-1], c.den[::-1]) for c in reversed(v)]
        for k, v in samples.items()
    }
    assert analyze.rank(list(reversed(scores)), study.objective, shuffled).noise == noise
    verdicts = {analyze.rank(scores, study.objective, samples, seed=s).significant for s in range(1, 6)}
    assert verdicts == {out["ranking"]["significant"]}


def test_not_a_terminal_shows_no_live_line(glm5_names: dict[str, Any]) -> None:
    err = glm5_names["stderr"]
    assert "launching" in err and "level 8:" in err  # the step lines are there, with --json too
    assert " requests · " not in err and "ETA" not in err


def _tune_on_a_terminal(study: Path, home: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    """`servelab tune --json` with stderr a pseudo-terminal (as on a user's screen), stdout a pipe."""
    import pty
    import threading

    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    env = {**os.environ, "SERVELAB_HOME": str(home), "COLUMNS": "120", "LINES": "40"}
    env.pop("NO_COLOR", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "servelab", "tune", str(study), "--json"],
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            env=env,
            timeout=600,
            cwd=ROOT,
        )
    finally:
        os.close(slave)
        reader.join(timeout=10)
        os.close(master)
    raw = b"".join(chunks).decode(errors="replace")
    return proc, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw).replace("\r", "\n")


def test_live_line_on_a_terminal_and_identical_candidates_are_within_the_noise(tmp_path: Path) -> None:
    """One real study of two identical candidates, stderr a terminal: the live line shows requests done of
    the total, tok/s and TTFT p50 so far, elapsed and ETA; the repeats run in rounds across candidates; the
    verdict on two identical configurations is that the margin is within the noise."""
    same = {"max_concurrency": 16}
    study = write_study(
        tmp_path / "twins.toml",
        "twins",
        [{"name": "twin-a", "baseline": True, **same}, {"name": "twin-b", **same}],
        levels=[8],
        speed=20,
        top="repeats = 2",
    )
    proc, screen = _tune_on_a_terminal(study, tmp_path / "home")
    assert proc.returncode == 0, screen[-3000:]
    out = json.loads(proc.stdout)  # stdout stays JSON: the progress is on stderr

    lines = [m for m in LIVE_LINE.finditer(screen)]
    assert lines, screen[-3000:]
    assert {m["cand"] for m in lines} == {"twin-a", "twin-b"}
    assert {int(m["total"]) for m in lines} == {16}  # 8 streams × 2 requests each
    final = [m for m in lines if m["done"] == m["total"]]
    assert final and all(m["eta"] == "0:00" for m in final)
    for m in final:
        assert float(m["tok"].replace(",", "")) > 0 and float(m["ttft"].replace(",", "")) > 0
    # the live tok/s agrees with what the level measured (same time base: the GPU's), within its ramp
    measured = [lv["output_throughput"] for c in out["candidates"] for lv in c["levels"]]
    last_tok = float(final[-1]["tok"].replace(",", ""))
    assert 0.5 * min(measured) < last_tok < 1.5 * max(measured), (last_tok, measured)

    # the repeats ran in rounds (a, b, a, b): a load that changes between trials spreads both candidates
    detail = json.loads(servelab("runs", "study", out["study"], "--json", home=tmp_path / "home").stdout)
    ran = sorted((t["id"], c["label"], t["repeat"]) for c in detail["candidates"] for t in c["trials"])
    assert [(label, rep) for _, label, rep in ran] == [
        ("twin-a", 0),
        ("twin-b", 0),
        ("twin-a", 1),
        ("twin-b", 1),
    ]

    r = out["ranking"]
    assert {r["winner"], r["runner_up"]} == {"twin-a", "twin-b"}
    assert r["noise"]["method"].startswith("cluster bootstrap")
    assert r["significant"] is False and "is within the noise" in r["verdict"], r

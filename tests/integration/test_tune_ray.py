"""`servelab tune --executor ray`: a simulator study on a real Ray cluster (a head and two worker nodes on
this machine, tests/support/raycluster.py). Trials are placed by the GPUs their layout needs and run in
parallel; a worker node killed mid-trial costs one rerun elsewhere; the driver killed or stopped leaves no
server on any node."""

from __future__ import annotations

import itertools
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

import pytest
from tests.integration.test_tune_sim import by_label, markers_alive, write_study
from tests.support.raycluster import RayCluster

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

CANDIDATES = [
    {"name": "tp8", "tp": 8, "args": ["--moe-runner-backend", "flashinfer_cutlass"], "baseline": True},
    {"name": "tp8-trtllm", "tp": 8, "args": ["--moe-runner-backend", "flashinfer_trtllm"]},
    {"name": "tp4", "tp": 4, "args": ["--moe-runner-backend", "flashinfer_cutlass"]},
    {"name": "tp4-pp2", "tp": 4, "pp": 2, "args": ["--moe-runner-backend", "flashinfer_cutlass"]},
]


# Not a test of anomalies: a candidate's client-timed throughput and the simulator's busy share
# swing with the box's load (three nodes' simulators on two cores), so the flags are set out of reach
NO_ANOMALIES = "\n[anomalies]\ncollapse_ratio = 0.01\npower_drop_ratio = 0.01\n"


def ray_study(path: Path, name: str, candidates: list[dict[str, Any]], **kw: Any) -> Path:
    kw.setdefault("model", "GLM-5-NVFP4")
    kw.setdefault("gpu", "rtx-pro-6000")
    kw.setdefault("num_gpus", 8)
    kw.setdefault("personality", "sglang")
    kw.setdefault("speed", 50)
    kw.setdefault("extra_engine", {"args": ["--disable-radix-cache"]})
    write_study(path, name, candidates, **kw)
    text = path.read_text().replace("[engine]\n", '[executor]\nkind = "ray"\n[engine]\n', 1)
    path.write_text(text + NO_ANOMALIES)
    return path


def tune(
    cluster: RayCluster, *args: str, home: Path, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SERVELAB_HOME": str(home), **cluster.env}
    argv = cluster.wrap([sys.executable, "-m", "servelab", "tune", *args])
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    if check and res.returncode != 0:
        raise AssertionError(f"{argv} exited {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-4000:]}")
    return res


def trial_rows(home: Path) -> list[dict[str, Any]]:
    con = sqlite3.connect(home / "servelab.db", timeout=10)
    con.row_factory = sqlite3.Row
    try:
        rows = con.execute(
            "SELECT c.label, t.status, t.repeat, t.node_json, t.error, t.started_at, t.finished_at,"
            " t.diagnosis_json"
            " FROM study_trials t JOIN study_candidates c ON c.id = t.candidate_id ORDER BY t.id"
        ).fetchall()
    finally:
        con.close()
    return [
        {
            **dict(r),
            "node": json.loads(r["node_json"]) if r["node_json"] else None,
            "diagnosis": json.loads(r["diagnosis_json"]) if r["diagnosis_json"] else None,
        }
        for r in rows
    ]


def test_study_on_three_nodes_runs_in_parallel_and_records_each_node(
    ray_nodes: RayCluster, tmp_path: Path
) -> None:
    study = ray_study(tmp_path / "ray.toml", "ray-glm5", CANDIDATES, levels=[1, 16])
    home = tmp_path / "home"
    res = tune(ray_nodes, str(study), "--ray-address", ray_nodes.address, "--json", home=home)
    out = json.loads(res.stdout)
    assert out["status"] == "completed"
    c = by_label(out)
    assert c["tp8-trtllm"]["status"] == "not_applied"  # the trtllm test never ran, on a cluster too
    assert c["tp8"]["status"] == "measured" and c["tp4-pp2"]["status"] == "measured"
    # GLM-5 does not fit four GPUs: a finding of the trial on its node, as on one box
    assert c["tp4"]["status"] == "failed" and c["tp4"]["diagnosis"]["class"] == "oom_init"
    assert "plan:" not in res.stderr  # one plan worker per candidate: no refusal
    rows = trial_rows(home)
    nodes = {r["node"]["id"] for r in rows}
    assert len(nodes) >= 2, rows  # placed on more than one node
    for r in rows:
        assert r["node"]["address"] == "127.0.0.1"
        want = 8 if r["label"] in ("tp8", "tp8-trtllm", "tp4-pp2") else 4
        assert len(r["node"]["gpu_ids"]) == want, r
    # the baseline ran on two different nodes (the node-to-node spread is measured on it)
    base = [r for r in rows if r["label"] == "tp8" and r["status"] == "measured"]
    assert len(base) == 2 and base[0]["node"]["id"] != base[1]["node"]["id"]
    # in parallel: some trial started before another had finished
    spans = sorted((r["started_at"], r["finished_at"]) for r in rows)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans)), spans
    spread = out["ranking"]["noise"]["node_spread"]
    assert spread["measured"] is True and len(spread["per_node"]) == 2
    assert spread["spread"] == pytest.approx(
        max(spread["per_node"].values()) - min(spread["per_node"].values())
    )
    assert len(c["tp8"]["nodes"]) == 2 and "different nodes" in c["tp8"]["node_note"]
    # the store's readers see the nodes: `runs study` (its table notes, its JSON per trial)
    env = {**os.environ, "SERVELAB_HOME": str(home)}
    shown = subprocess.run(
        [sys.executable, "-m", "servelab", "runs", "study", out["study"], "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    study_json = json.loads(shown.stdout)
    tp8 = next(x for x in study_json["candidates"] if x["label"] == "tp8")
    assert {t["node"]["id"] for t in tp8["trials"]} == {r["node"]["id"] for r in base}
    table = subprocess.run(
        [sys.executable, "-m", "servelab", "runs", "study", out["study"]],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "200"},
        timeout=60,
        check=True,
    )
    assert "different nodes" in table.stdout and "node-to-node spread" in table.stdout
    assert markers_alive(f"servelab-study:{out['study']}:") == []


class Driver:
    """`servelab tune --executor ray` running in the background, its progress lines read as they come."""

    def __init__(self, cluster: RayCluster, study: Path, home: Path, *extra: str) -> None:
        env = {**os.environ, "SERVELAB_HOME": str(home), **cluster.env}
        argv = cluster.wrap([sys.executable, "-m", "servelab", "tune", str(study), "--json", *extra])
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        self.lines: list[str] = []

    def wait_for(self, pattern: str, timeout: float = 240) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        for line in self.lines:
            if m := re.search(pattern, line):
                return m
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line)
            if m := re.search(pattern, line):
                return m
        self.proc.kill()
        raise AssertionError(f"no line matching {pattern!r}:\n{''.join(self.lines)[-4000:]}")

    def finish(self, timeout: float = 600) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, "".join(self.lines) + err


def wait_gone(prefix: str, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := markers_alive(prefix)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def study_uid(home: Path) -> str:
    con = sqlite3.connect(home / "servelab.db", timeout=10)
    try:
        return str(con.execute("SELECT uid FROM studies ORDER BY id DESC LIMIT 1").fetchone()[0])
    finally:
        con.close()


SLOW = [
    {"name": "tp8", "tp": 8, "args": ["--moe-runner-backend", "flashinfer_cutlass"], "baseline": True},
    {"name": "tp4-pp2", "tp": 4, "pp": 2, "args": ["--moe-runner-backend", "flashinfer_cutlass"]},
]


def test_a_worker_node_killed_mid_trial_costs_one_rerun_on_another_node(
    ray_nodes: RayCluster, tmp_path: Path
) -> None:
    study = ray_study(tmp_path / "kill.toml", "ray-node-kill", SLOW, levels=[1, 16, 64], speed=10)
    study.write_text(study.read_text().replace('kind = "ray"\n', 'kind = "ray"\nbaseline_nodes = 1\n', 1))
    home = tmp_path / "home"
    head = ray_nodes.nodes[0].node_id()
    drv = Driver(ray_nodes, study, home, "--ray-address", ray_nodes.address)
    try:
        victim_label = victim_node = None
        while victim_node is None:  # the first trial placed on a worker node (never kill the head)
            m = drv.wait_for(r"^(\S+): on Ray node 127\.0\.0\.1/(\w+)")
            drv.lines.remove(m.string)
            rows = {r["label"]: r for r in trial_rows(home) if r["status"] not in ("measured", "failed")}
            row = rows.get(m.group(1))
            if row and row["node"] and row["node"]["id"] != head:
                victim_label, victim_node = m.group(1), row["node"]["id"]
        drv.wait_for(rf"^{re.escape(victim_label)}: level 1:")
        node = ray_nodes.by_id(victim_node)
        node.kill()  # the whole node: raylet, its workers
        rc, out, err = drv.finish()
    finally:
        if drv.proc.poll() is None:
            drv.proc.kill()
        ray_nodes.wait_dead(2)
        ray_nodes.add_node()  # the next tests get three nodes again
    assert rc == 0, err[-4000:]
    assert f"{victim_label}: node 127.0.0.1/{victim_node[:8]} lost" in err and "running it again" in err
    result = json.loads(out)
    assert by_label(result)[victim_label]["status"] == "measured"
    rows = [r for r in trial_rows(home) if r["label"] == victim_label]
    assert [r["status"] for r in rows] == ["lost", "measured"], rows
    assert rows[0]["node"]["id"] == victim_node and rows[1]["node"]["id"] != victim_node
    assert "was lost" in rows[0]["error"]
    assert wait_gone(f"servelab-study:{result['study']}:") == []  # the killed node's server too


def test_driver_killed_then_resume_finishes_without_redoing_a_trial(
    ray_nodes: RayCluster, tmp_path: Path
) -> None:
    cands = [*SLOW, {"name": "tp8-b", "tp": 8, "args": ["--moe-runner-backend", "flashinfer_cutlass"]}]
    study = ray_study(tmp_path / "crash.toml", "ray-crash", cands, levels=[1, 16, 64], speed=10)
    home = tmp_path / "home"
    drv = Driver(ray_nodes, study, home, "--ray-address", ray_nodes.address)
    drv.wait_for(r"^tp8: level 16:")
    done_before = {(r["label"], r["repeat"]) for r in trial_rows(home) if r["status"] == "measured"}
    os.kill(drv.proc.pid, signal.SIGKILL)
    drv.proc.wait(30)
    uid = study_uid(home)
    # Ray ends the dead driver's actors; each node's agent then tears its servers down
    assert wait_gone(f"servelab-study:{uid}:", timeout=60) == []
    res = tune(ray_nodes, str(study), "--resume", "--ray-address", ray_nodes.address, "--json", home=home)
    result = json.loads(res.stdout)
    assert result["status"] == "completed"
    rows = trial_rows(home)
    measured = [(r["label"], r["repeat"]) for r in rows if r["status"] == "measured"]
    assert sorted(measured) == sorted(set(measured)), rows  # no repeat measured twice
    assert done_before <= set(measured)
    assert {c["label"]: c["status"] for c in result["candidates"]} == {
        "tp8": "measured",
        "tp4-pp2": "measured",
        "tp8-b": "measured",
    }
    assert wait_gone(f"servelab-study:{uid}:") == []


def test_ctrl_c_tears_down_every_node_and_a_layout_no_node_holds_fails_clearly(
    ray_nodes: RayCluster, tmp_path: Path
) -> None:
    cands = [
        *SLOW,
        {"name": "tp8-pp2", "tp": 8, "pp": 2, "args": ["--moe-runner-backend", "flashinfer_cutlass"]},
    ]
    study = ray_study(tmp_path / "int.toml", "ray-int", cands, levels=[1, 16, 64], speed=10, num_gpus=16)
    home = tmp_path / "home"
    drv = Driver(ray_nodes, study, home, "--ray-address", ray_nodes.address)
    drv.wait_for(r"^tp8-pp2:\s+failed: does_not_fit")
    drv.wait_for(r"^tp4-pp2: level 1:")
    uid = study_uid(home)
    assert markers_alive(f"servelab-study:{uid}:")  # servers are running on the nodes now
    drv.proc.send_signal(signal.SIGINT)
    rc, _out, err = drv.finish(timeout=120)
    assert rc == 130, err[-3000:]
    assert markers_alive(f"servelab-study:{uid}:") == []  # torn down before the driver exited
    rows = trial_rows(home)
    fit = next(r for r in rows if r["label"] == "tp8-pp2")
    assert fit["status"] == "failed" and fit["node"] is None  # never placed
    assert fit["diagnosis"]["class"] == "does_not_fit" and "16 GPUs" in fit["diagnosis"]["evidence"]


def test_a_search_on_the_cluster_runs_its_trials_in_parallel(ray_nodes: RayCluster, tmp_path: Path) -> None:
    """`[search]` with the Ray executor: as many proposals at once as the cluster holds of the space's
    largest layout (three 8-GPU slots here), each stored before it runs; the budget holds."""
    study = ray_study(tmp_path / "search.toml", "ray-search", [], levels=[8])
    study.write_text(
        study.read_text()
        + '[search]\nstrategy = "optuna"\nbudget_trials = 6\nseed = 1\n'
        + '[search.space]\nlayout = ["tp8", "tp4-pp2"]\nmax_running_requests = [16, 64, 256]\n'
    )
    home = tmp_path / "home"
    out = json.loads(
        tune(ray_nodes, str(study), "--ray-address", ray_nodes.address, "--json", home=home).stdout
    )
    rows = trial_rows(home)
    assert 4 <= len(rows) <= 6 and out["search"]["used"]["trials"] == len(rows)
    assert len({r["label"] for r in rows}) == len(rows)  # one trial per point: repeats = 1
    spans = sorted((r["started_at"], r["finished_at"]) for r in rows)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans)), spans  # in parallel
    assert len({r["node"]["id"] for r in rows}) >= 2
    assert out["ranking"]["winner"] in {r["label"] for r in rows}

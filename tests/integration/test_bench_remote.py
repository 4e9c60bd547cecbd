"""`[host] bench_from = "remote"`: the benchmark client runs on the SSH host (a real sshd: this machine,
reached only through OpenSSH), next to the server; its runs come back into the control machine's store,
each saying it was measured over there and the round trip of that path."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

import pytest
from tests.integration.test_tune_remote import (
    GLM5,
    _master_pid,
    _start,
    remote_study,
    run,
    study_uid,
    wait_benchmarking,
    wait_gone,
)
from tests.integration.test_tune_sim import _db_trials as trials
from tests.integration.test_tune_sim import by_label, markers_alive
from tests.support.sshd import SshdHandle

pytestmark = pytest.mark.integration


def test_a_study_benched_from_the_remote_stores_its_runs_here(tmp_path: Path, sshd: SshdHandle) -> None:
    home = tmp_path / "home"
    study = remote_study(
        tmp_path / "glm5.toml",
        "glm5-bench-remote",
        sshd.alias,
        GLM5[:2],
        model="GLM-5-NVFP4",
        gpu="rtx-pro-6000",
        num_gpus=8,
        personality="sglang",
        levels=[1, 8],
        speed=50,
        extra_engine={"args": ["--disable-radix-cache"]},
    )
    study.write_text(study.read_text().replace("[host]\n", '[host]\nbench_from = "remote"\n', 1))
    res = run("tune", str(study), "--json", home=home, env=sshd.env())
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    # The outcomes of the same study benched from the control machine (test_tune_remote).
    got = by_label(out)
    assert got["tp8-cutlass"]["status"] == "measured"
    assert got["tp8-trtllm"]["status"] == "not_applied"
    assert out["ranking"]["winner"] == "tp8-cutlass"

    con = sqlite3.connect(home / "servelab.db")
    uids = [r[0] for r in con.execute("SELECT uid FROM bench_runs ORDER BY id")]
    con.close()
    assert len(uids) == 2  # one run per level of the measured candidate
    for uid in uids:
        shown = run("runs", "show", uid, "--json", home=home, env=sshd.env())
        assert shown.returncode == 0, shown.stderr
        stored = json.loads(shown.stdout)
        path = stored["context"]["path"]
        assert path["via"] == "remote" and path["target"] == sshd.alias
        assert path["rtt_ms"] is not None and 0 < path["rtt_ms"] < 1000
        assert stored["status"] == "completed" and stored["context"]["clock"]["speed"] == 50
        assert stored["url"].startswith("http://127.0.0.1:")  # the server's own address over there
        # Every request is in this store, as many as the level says it ran.
        from servelab.store.bench import BenchRepo
        from servelab.store.db import open_store

        with open_store(home / "servelab.db") as store:
            repo = BenchRepo(store)
            loaded = repo.load(uid)
            ids = repo.level_ids(loaded.id)
            for lv in loaded.levels:
                records = repo.requests(ids[lv.index])
                assert records and len(records) == lv.wall.num_requests
                assert sum(r.ok for r in records) == lv.wall.completed
    # The throwaway stores over there are gone, and nothing of the study runs on either side.
    remote = tmp_path / "remote"
    assert remote.is_dir() and list(remote.rglob("*.db*")) == []
    assert markers_alive(f"servelab-study:{out['study']}:") == []


def test_a_dropped_link_mid_level_interrupts_the_study_and_stops_the_remote_client(
    tmp_path: Path, sshd: SshdHandle
) -> None:
    home = tmp_path / "home"
    env = sshd.env()
    study = remote_study(
        tmp_path / "drop.toml", "drop-remote", sshd.alias, [{"name": "first"}], levels=[1, 8, 16], speed=10
    )
    study.write_text(study.read_text().replace("[host]\n", '[host]\nbench_from = "remote"\n', 1))
    proc = _start(study, home, env)
    wait_benchmarking(proc, home, "first")
    os.kill(_master_pid(sshd, env), signal.SIGKILL)  # the link drops while the client runs over there
    _, err = proc.communicate(timeout=60)
    text = err.decode()
    assert proc.returncode == 1, text[-2000:]
    assert "dropped" in text and "--resume" in text and "Traceback" not in text
    assert ("first", "interrupted") in trials(home)
    # The agent saw its request pipe close mid-level: it stopped the client, tore the server down and
    # removed its throwaway store.
    assert wait_gone(f"servelab-study:{study_uid(home)}:", timeout=15) == []
    assert list((tmp_path / "remote").rglob("*.db*")) == []

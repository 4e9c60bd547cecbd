"""`servelab deploy` / `preflight` / `wait-ready` commands: files written, the store, --json, and --install
refusing before it touches anything on a host without systemd (this one, and CI's containers)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from servelab.cli.deploy import deploy_cmd, preflight_cmd, wait_ready_cmd
from servelab.deploy import install
from servelab.deploy.records import DeploymentRepo
from servelab.errors import ConfigError, HostError
from servelab.host.ports import free_port
from servelab.store.db import Store

MakeStudy = Callable[..., dict[str, Any]]


def _deploy(*args: str) -> tuple[int, str, BaseException | None]:
    res = CliRunner().invoke(deploy_cmd, list(args))
    exc = res.exception if not isinstance(res.exception, SystemExit) else None
    return res.exit_code, res.output, exc


def test_dry_run_writes_and_records_nothing(store: Store, make_study: MakeStudy, tmp_path: Path) -> None:
    ids = make_study("sim")
    code, out, exc = _deploy(ids["uid"], "--out", str(tmp_path / "o"), "--dry-run", "--json")
    assert code == 0, (out, exc)
    d = json.loads(out)
    assert d["dry_run"] and "ExecStart=" in d["content"] and not (tmp_path / "o").exists()
    assert "systemctl daemon-reload" not in d["actions"] and any("write" in a for a in d["actions"])
    assert DeploymentRepo(store).list() == []


@pytest.mark.parametrize(
    "target,filename",
    [("systemd", "web.service"), ("compose", "compose.yaml"), ("kubernetes", "web.k8s.yaml")],
)
def test_writes_the_file_and_records_it(
    target: str, filename: str, store: Store, make_study: MakeStudy, tmp_path: Path
) -> None:
    ids = make_study("sim")
    extra = ["--image", "img:1"] if target != "systemd" else []
    code, out, exc = _deploy(
        f"{ids['uid']}:tp1",
        "--target",
        target,
        "--name",
        "web",
        "--out",
        str(tmp_path),
        "--port",
        "9001",
        "--json",
        *extra,
    )
    assert code == 0, (out, exc)
    d = json.loads(out)
    assert d["file"] == str(tmp_path / filename) and (tmp_path / filename).is_file()
    assert "9001" in (tmp_path / filename).read_text()
    if target == "systemd":
        assert d["verify"] == {"ok": True, "problems": []}
    (rec,) = DeploymentRepo(store).list()
    assert (rec["name"], rec["target"], rec["trial_id"], rec["status"]) == (
        "web",
        target,
        ids["trials"]["tp1"],
        "written",
    )
    assert rec["source"] == f"{ids['uid']}:tp1" and not rec["installed"]


def test_redacted_secret_is_refused_with_the_way_out(make_study: MakeStudy, tmp_path: Path) -> None:
    ids = make_study("vllm", env={"HF_TOKEN": "hf_abcdefghijk"})
    code, _out, exc = _deploy(ids["uid"], "--out", str(tmp_path / "o"))
    assert isinstance(exc, ConfigError) and "HF_TOKEN" in exc.message
    assert "HF_TOKEN=VALUE" in exc.hint and "--env-file" in exc.hint
    assert not (tmp_path / "o").exists()
    # A secret given on the command line would be written into the unit: refused too.
    code, _out, exc = _deploy(ids["uid"], "--out", str(tmp_path / "o"), "--env", "HF_TOKEN=hf_x y$")
    assert isinstance(exc, ConfigError) and "--env HF_TOKEN" in exc.message
    assert not (tmp_path / "o").exists()
    code, out, exc = _deploy(ids["uid"], "--out", str(tmp_path / "o"), "--env-file", "/etc/llm.env", "--json")
    assert code == 0, exc
    unit = Path(json.loads(out)["file"]).read_text()
    assert "EnvironmentFile=/etc/llm.env" in unit and "HF_TOKEN" not in unit


def test_install_without_systemd_stops_before_touching_anything(
    make_study: MakeStudy, tmp_path: Path, servelab_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if install.systemd_missing() is None:  # a host running systemd: pretend it does not (CI has none)
        monkeypatch.setattr(install, "SYSTEMD_RUNTIME", tmp_path / "no-systemd")
    ids = make_study("sim")
    db_before = sorted(p.name for p in servelab_home.rglob("*"))
    _code, _out, exc = _deploy(ids["uid"], "--install", "--out", str(tmp_path / "o"))
    assert isinstance(exc, HostError)
    assert (
        "--install needs systemd" in exc.message
        and "nothing was written, installed or started" in exc.message
    )
    assert "--out DIR" in exc.hint
    assert not (tmp_path / "o").exists()
    assert sorted(p.name for p in servelab_home.rglob("*")) == db_before


def test_install_is_for_systemd_only(make_study: MakeStudy) -> None:
    ids = make_study("sim")
    _code, _out, exc = _deploy(ids["uid"], "--install", "--target", "compose")
    assert isinstance(exc, ConfigError) and "kubectl apply" in exc.hint and "docker compose" in exc.hint


def test_systemd_detection(tmp_path: Path) -> None:
    assert "does not exist" in (install.systemd_missing(tmp_path, tmp_path / "nope") or "")


def test_preflight_cli_exit_codes() -> None:
    port = free_port()
    res = CliRunner().invoke(preflight_cmd, ["--port", str(port), "--gpus", "none", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["ok"] is True
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        res = CliRunner().invoke(preflight_cmd, ["--port", str(port), "--gpus", "none"])
    assert res.exit_code == 1 and "preflight refuses" in res.output and f"port {port}" in res.output


def test_wait_ready_rejects_a_bad_url() -> None:
    res = CliRunner().invoke(wait_ready_cmd, ["localhost:8000", "--model", "m"])
    assert isinstance(res.exception, ConfigError)


def test_compare_verdicts() -> None:
    tuned = {"output_throughput": 1000.0, "tpot_ms_p50": 10.0, "ttft_ms_p50": 100.0}
    ok = install.compare(tuned, {**tuned, "output_throughput": 950.0, "failed": 0}, 0.1, 4.0)
    assert ok.ok and "within ±10 %" in ok.verdict
    slow = install.compare(tuned, {**tuned, "tpot_ms_p50": 12.0, "failed": 0}, 0.1, 4.0)
    assert (
        not slow.ok
        and "NOT as tuned" in slow.verdict
        and "tpot_ms_p50" in slow.verdict
        and "+20.0 %" in slow.verdict
    )
    faster = install.compare(tuned, {**tuned, "output_throughput": 2000.0, "ttft_ms_p50": 1.0}, 0.1, 4.0)
    assert faster.ok
    failed = install.compare(tuned, {**tuned, "failed": 2}, 0.1, 4.0)
    assert not failed.ok and "2 request(s) failed" in failed.verdict
    assert not install.compare(None, tuned, 0.1, 4.0).ok

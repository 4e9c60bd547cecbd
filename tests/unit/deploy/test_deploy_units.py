"""Units generated from stored runs of vLLM, SGLang and the simulator: content, exact argv, systemd-analyze."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.unit.deploy.systemd_reader import systemd_analyze, unquote_words

from servelab.deploy import source, spec, systemd
from servelab.store.db import Store

MakeStudy = Callable[..., dict[str, Any]]


def _lines(text: str, key: str) -> list[str]:
    return [ln.removeprefix(key + "=") for ln in text.splitlines() if ln.startswith(key + "=")]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "sim"])
def test_unit_for_each_engine(engine: str, store: Store, make_study: MakeStudy, tmp_path: Path) -> None:
    ids = make_study(engine, env={"NCCL_DEBUG": "WARN", "ODD": 'x y "z" 5% $HOME'}, ready_s=250.0)
    rec = source.resolve(store, ids["uid"])
    assert rec.candidate == "tp2" and rec.trial_id == ids["trials"]["tp2"]
    dep = spec.build(rec, "llm-api", user="svc")
    text = systemd.render_unit(dep)
    # the exact command line of the measured trial
    (start,) = _lines(text, "ExecStart")
    assert unquote_words(start, dollar=True) == ids["argv"]
    env = [unquote_words(v, dollar=False)[0] for v in _lines(text, "Environment")]
    assert 'ODD=x y "z" 5% $HOME' in env and "NCCL_DEBUG=WARN" in env
    assert "SERVELAB_RUN=servelab-deploy:llm-api" in env
    (pre,) = _lines(text, "ExecStartPre")
    pre_words = unquote_words(pre, dollar=True)
    assert pre_words[2:5] == ["servelab", "preflight", "--address"] and "--port" in pre_words
    assert pre_words[pre_words.index("--gpus") + 1] == ("none" if engine == "sim" else "0,1")  # tp2
    (post,) = _lines(text, "ExecStartPost")
    post_words = unquote_words(post, dollar=True)
    assert post_words[3] == "wait-ready" and post_words[4] == "http://127.0.0.1:8123"
    timeout = math.ceil(250 * 3 + 120)
    assert _lines(text, "TimeoutStartSec") == [str(timeout)]
    assert post_words[post_words.index("--timeout") + 1] == str(timeout - 30)
    for key, value in (
        ("Restart", "on-failure"),
        ("KillMode", "mixed"),
        ("TimeoutStopSec", "60"),
        ("RestartSec", "15"),
        ("StartLimitBurst", "3"),
        ("User", "svc"),
        ("Type", "exec"),
    ):
        assert _lines(text, key) == [value], key
    for forbidden in (
        "PrivateDevices",
        "NoNewPrivileges",
        "MemoryDenyWriteExecute",
        "DevicePolicy",
        "PrivateIPC",
    ):
        assert not _lines(text, forbidden), forbidden
    unit = tmp_path / "llm-api.service"
    unit.write_text(text.replace("User=svc\n", "User=root\n"))  # verify resolves the user on this host
    assert systemd.verify_unit(unit) == []
    assert systemd_analyze()


def test_start_timeout_defaults_and_override(store: Store, make_study: MakeStudy) -> None:
    assert spec.start_timeout(10.0) == 300  # the floor
    assert spec.start_timeout(600.0) == 1920
    assert spec.start_timeout(None) == 1800
    assert spec.start_timeout(600.0, override=90) == 90
    ids = make_study("sim", ready_s=None)
    dep = spec.build(source.resolve(store, ids["uid"]), "x1", start_timeout_s=4000)
    assert "TimeoutStartSec=4000" in systemd.render_unit(dep)


def test_verify_reports_a_broken_unit(tmp_path: Path) -> None:
    unit = tmp_path / "bad.service"
    unit.write_text("[Service]\nExecStart=/nonexistent/engine --x\nKillMode=bogus\n")
    problems = systemd.verify_unit(unit)
    assert any("kill mode" in p for p in problems) and any("/nonexistent/engine" in p for p in problems)


@pytest.mark.parametrize("name", ["Bad", "-x", "a_b", "x" * 60, "a.b"])
def test_invalid_names_are_refused(name: str, store: Store, make_study: MakeStudy) -> None:
    from servelab.errors import ConfigError

    ids = make_study("sim")
    with pytest.raises(ConfigError, match="invalid deployment name"):
        spec.build(source.resolve(store, ids["uid"]), name)


def test_default_name_and_no_hardening(store: Store, make_study: MakeStudy) -> None:
    ids = make_study("sim")
    dep = spec.build(source.resolve(store, ids["uid"]))
    assert dep.name == "servelab-demo-study"
    assert "ProtectSystem" not in systemd.render_unit(dep, hardening=False)
    assert "--kill-stale" in systemd.render_unit(dep, kill_stale=True)


def test_gpus_of_the_unit_and_api_key(store: Store, make_study: MakeStudy, tmp_path: Path) -> None:
    ids = make_study(
        "vllm", env={"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, args=["--api-key", "sk-abcdefghij"]
    )
    env_file = tmp_path / "llm.env"
    env_file.write_text("# the unit's secrets\nVLLM_API_KEY='k 1'\n")
    rec = source.apply_overrides(source.resolve(store, ids["uid"]), env_file=True)
    dep = spec.build(rec, "x1", env_file=str(env_file))
    pre = dep.preflight_args()
    assert pre[pre.index("--gpus") + 1] == "GPU-aa,GPU-bb" and dep.gpu_count == 2
    # The key stays in the EnvironmentFile: wait-ready reads it from there, the install's checks too.
    assert dep.api_key == "k 1" and dep.api_key_env == "VLLM_API_KEY" and "--api-key" not in dep.argv
    wait = dep.wait_ready_args()
    assert wait[wait.index("--api-key-env") + 1] == "VLLM_API_KEY"
    unit = systemd.render_unit(dep)
    assert f"EnvironmentFile={env_file}" in unit and "k 1" not in unit and "sk-abc" not in unit


def test_user_and_env_file_lines(store: Store, make_study: MakeStudy) -> None:
    from servelab.errors import ConfigError

    rec = source.resolve(store, make_study("sim")["uid"])
    text = systemd.render_unit(spec.build(rec, "x1", user="llm", env_file="/etc/llm%.env"))
    assert _lines(text, "User") == ["llm"] and _lines(text, "EnvironmentFile") == ["/etc/llm%%.env"]
    with pytest.raises(ConfigError, match="invalid user"):
        systemd.render_unit(spec.build(rec, "x1", user="a b"))
    with pytest.raises(ConfigError, match="without spaces"):
        systemd.render_unit(spec.build(rec, "x1", env_file="/etc/a b.env"))

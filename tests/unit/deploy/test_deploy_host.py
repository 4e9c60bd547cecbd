"""The parts of `deploy --install --host` that need no SSH: the stand-in systemctl and unit directory read from
the environment of the host the unit goes to, the EnvironmentFile written 0600, and `--host` without
`--install` refused. Over SSH: tests/integration/test_deploy_remote.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.support import fake_systemctl

from servelab.cli.deploy import deploy_cmd
from servelab.deploy import install, unit_state
from servelab.errors import ConfigError
from servelab.host import systemd


def test_systemctl_and_unit_dir_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    units = tmp_path / "units"
    units.mkdir()
    monkeypatch.setenv("SERVELAB_UNIT_DIR", str(units))
    monkeypatch.setenv("SERVELAB_SYSTEMCTL", str(tmp_path / "nothing"))
    assert "not an executable" in (install.systemd_missing() or "")
    exe = fake_systemctl.write_executable(tmp_path / "systemctl")
    monkeypatch.setenv("SERVELAB_SYSTEMCTL", str(exe))
    assert install.systemd_missing() is None and install.default_unit_dir() == units
    assert systemd.systemd_running(tmp_path / "no-such-runtime")
    # the stand-in answers as systemctl would for a unit it never started
    res = systemd.systemctl("is-active", "x.service", timeout=60)
    assert (res.returncode, res.stdout.strip()) == (3, "inactive")
    assert unit_state.unit_status("x").state == "inactive"


def test_env_file_is_written_private(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "llm.env"
    install.write_env_file(path, b"HF_TOKEN=hf_x\n")
    assert path.read_bytes() == b"HF_TOKEN=hf_x\n" and path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)
    install.write_env_file(path, b"HF_TOKEN=hf_y\n")
    assert path.read_bytes() == b"HF_TOKEN=hf_y\n" and path.stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(path.parent)) == ["llm.env"]  # no temporary file left


def test_host_without_install_is_refused() -> None:
    res = CliRunner().invoke(deploy_cmd, ["some-study", "--host", "gpubox"])
    assert isinstance(res.exception, ConfigError) and "--install" in res.exception.message

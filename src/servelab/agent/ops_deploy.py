"""Agent operations of `servelab deploy --install --host` and `servelab preflight --host`: the unit file,
its EnvironmentFile, systemctl and the journal, and preflight itself, all on the host the unit runs on.

Each is the function servelab runs for a local install or preflight (servelab.deploy.install / .preflight),
so a remote host follows the local rules exactly: preflight ends only what it may end locally. systemctl is
$SERVELAB_SYSTEMCTL when set there and the unit directory $SERVELAB_UNIT_DIR (tests, containers without
systemd): this agent reads its own environment, the remote one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servelab.agent import registry


def op_deploy_systemd_missing(state: registry.AgentState) -> str | None:
    """Why units cannot be installed on this host (None: they can)."""
    from servelab.deploy.install import systemd_missing

    return systemd_missing()


def op_deploy_write_unit(state: registry.AgentState, name: str, text: str) -> str:
    """Write NAME.service (mode 0644) into this host's unit directory; returns its path."""
    from servelab.deploy.install import default_unit_dir, write_unit
    from servelab.deploy.spec import NAME_RE
    from servelab.errors import ConfigError

    if not NAME_RE.match(name):
        raise ConfigError(f"invalid deployment name {name!r}")
    return str(write_unit(default_unit_dir(), name, text))


def op_deploy_write_env_file(state: registry.AgentState, path: str, data: str) -> None:
    """Write the unit's EnvironmentFile (its secrets) with mode 0600; the content came on our stdin."""
    from servelab.deploy.install import write_env_file
    from servelab.errors import ConfigError
    from servelab.host.wire import unb64

    p = Path(path)
    if not p.is_absolute():
        raise ConfigError(f"--env-file must be an absolute path (got {path!r})")
    write_env_file(p, unb64(data))


def op_deploy_systemctl(state: registry.AgentState, args: list[str], timeout: float = 120) -> dict[str, Any]:
    from servelab.host.systemd import systemctl

    res = systemctl(*args, timeout=timeout)
    return {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}


def op_deploy_journal(state: registry.AgentState, name: str, lines: int = 40) -> str:
    from servelab.deploy.install import journal_tail

    return journal_tail(name, lines)


def op_deploy_unit_status(state: registry.AgentState, name: str) -> dict[str, Any]:
    from servelab.deploy.unit_state import unit_status

    return unit_status(name)


def op_preflight(
    state: registry.AgentState,
    address: str,
    port: int,
    gpus: str = "all",
    marker: str = "",
    kill_stale: bool = False,
    engine: str | None = None,
    reset_compile_cache: bool = False,
    compile_caches: list[str] | None = None,
) -> dict[str, Any]:
    """servelab preflight on this host; the report as `PreflightReport.to_dict`."""
    from servelab.deploy.preflight import preflight

    return preflight(
        address,
        port,
        gpus=gpus,
        marker=marker,
        kill_stale=kill_stale,
        engine=engine,
        reset_compile_cache=reset_compile_cache,
        compile_caches=compile_caches or (),
    ).to_dict()


OPS: dict[str, registry.Op] = {
    "deploy_systemd_missing": op_deploy_systemd_missing,
    "deploy_write_unit": op_deploy_write_unit,
    "deploy_write_env_file": op_deploy_write_env_file,
    "deploy_systemctl": op_deploy_systemctl,
    "deploy_journal": op_deploy_journal,
    "deploy_unit_status": op_deploy_unit_status,
    "preflight": op_preflight,
}

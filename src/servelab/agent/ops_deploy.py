"""Agent operations of `servelab deploy --install --host` and `servelab preflight --host`: the unit file,
its EnvironmentFile, systemctl and the journal, and preflight itself, all on the host the unit runs on.
Their contracts are servelab.deploy.ops's.

Each is the function servelab runs for a local install or preflight (servelab.deploy.install / .preflight),
so a remote host follows the local rules exactly: preflight ends only what it may end locally. systemctl is
$SERVELAB_SYSTEMCTL when set there and the unit directory $SERVELAB_UNIT_DIR (tests, containers without
systemd): this agent reads its own environment, the remote one."""

from __future__ import annotations

from pathlib import Path

from servelab.agent import registry
from servelab.deploy import ops as d
from servelab.deploy.preflight import PreflightAnswer, PreflightRequest, run_preflight
from servelab.host.agent_op import NoArgs


def op_deploy_systemd_missing(state: registry.AgentState, req: NoArgs) -> str | None:
    """Why units cannot be installed on this host (None: they can)."""
    from servelab.deploy.install import systemd_missing

    return systemd_missing()


def op_deploy_write_unit(state: registry.AgentState, req: d.WriteUnitRequest) -> str:
    """Write NAME.service (mode 0644) into this host's unit directory; returns its path."""
    from servelab.deploy.install import default_unit_dir, write_unit
    from servelab.deploy.spec import NAME_RE
    from servelab.errors import ConfigError

    if not NAME_RE.match(req.name):
        raise ConfigError(f"invalid deployment name {req.name!r}")
    return str(write_unit(default_unit_dir(), req.name, req.text))


def op_deploy_write_env_file(state: registry.AgentState, req: d.WriteEnvFileRequest) -> None:
    """Write the unit's EnvironmentFile (its secrets) with mode 0600; the content came on our stdin."""
    from servelab.deploy.install import write_env_file
    from servelab.errors import ConfigError
    from servelab.host.wire import unb64

    p = Path(req.path)
    if not p.is_absolute():
        raise ConfigError(f"--env-file must be an absolute path (got {req.path!r})")
    write_env_file(p, unb64(req.data))


def op_deploy_systemctl(state: registry.AgentState, req: d.SystemctlRequest) -> d.SystemctlAnswer:
    from servelab.host.systemd import systemctl

    res = systemctl(*req.args, timeout=req.timeout)
    return d.SystemctlAnswer(rc=res.returncode, stdout=res.stdout, stderr=res.stderr)


def op_deploy_journal(state: registry.AgentState, req: d.JournalRequest) -> str:
    from servelab.deploy.install import journal_tail

    return journal_tail(req.name, req.lines)


def op_deploy_unit_status(state: registry.AgentState, req: d.UnitRequest) -> d.UnitStatus:
    from servelab.deploy.unit_state import unit_status

    return d.UnitStatus.model_validate(unit_status(req.name))


def op_preflight(state: registry.AgentState, req: PreflightRequest) -> PreflightAnswer:
    """servelab preflight on this host: the one implementation the local command runs too."""
    return run_preflight(req)


OPS: dict[str, registry.Op] = dict(
    [
        d.DEPLOY_SYSTEMD_MISSING.entry(op_deploy_systemd_missing),
        d.DEPLOY_WRITE_UNIT.entry(op_deploy_write_unit),
        d.DEPLOY_WRITE_ENV_FILE.entry(op_deploy_write_env_file),
        d.DEPLOY_SYSTEMCTL.entry(op_deploy_systemctl),
        d.DEPLOY_JOURNAL.entry(op_deploy_journal),
        d.DEPLOY_UNIT_STATUS.entry(op_deploy_unit_status),
        d.PREFLIGHT.entry(op_preflight),
    ]
)

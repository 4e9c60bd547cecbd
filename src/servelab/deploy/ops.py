"""The agent operations of `servelab deploy --install --host` and `servelab preflight --host`, as typed
contracts (servelab.host.agent_op): the unit file, its EnvironmentFile, systemctl, the journal, the unit's
state, and preflight. The agent serves them with this room's own functions (servelab.agent.ops_deploy);
`deploy.install.UnitHost` and the preflight command call them."""

from __future__ import annotations

from pydantic import TypeAdapter

from servelab.deploy.preflight import PreflightAnswer, PreflightRequest
from servelab.deploy.unit_state import UnitStatus as UnitStatus  # unit_state's, DEPLOY_UNIT_STATUS's answer
from servelab.host.agent_op import AgentOp, Answer, NoArgs, Request


class WriteUnitRequest(Request):
    name: str
    text: str


class WriteEnvFileRequest(Request):
    path: str  # absolute, on the unit's host
    data: str  # base64: the file's content (its secrets) travels on the agent's stdin


class SystemctlRequest(Request):
    args: list[str]
    timeout: float = 120


class SystemctlAnswer(Answer):
    rc: int
    stdout: str
    stderr: str


class JournalRequest(Request):
    name: str
    lines: int = 40


class UnitRequest(Request):
    name: str


DEPLOY_SYSTEMD_MISSING: AgentOp[NoArgs, str | None] = AgentOp(
    "deploy_systemd_missing", NoArgs, TypeAdapter(str | None)
)
DEPLOY_WRITE_UNIT = AgentOp("deploy_write_unit", WriteUnitRequest, TypeAdapter(str))  # the unit's path
DEPLOY_WRITE_ENV_FILE: AgentOp[WriteEnvFileRequest, None] = AgentOp(
    "deploy_write_env_file", WriteEnvFileRequest, TypeAdapter(None)
)
DEPLOY_SYSTEMCTL = AgentOp("deploy_systemctl", SystemctlRequest, TypeAdapter(SystemctlAnswer))
DEPLOY_JOURNAL = AgentOp("deploy_journal", JournalRequest, TypeAdapter(str))
DEPLOY_UNIT_STATUS = AgentOp("deploy_unit_status", UnitRequest, TypeAdapter(UnitStatus), exclude_unset=True)
PREFLIGHT = AgentOp("preflight", PreflightRequest, TypeAdapter(PreflightAnswer))

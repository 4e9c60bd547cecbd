"""What systemd says of an installed unit now: `servelab status` (through `records.installed_units`) and
`deploy --install` both read it here, so neither imports the other. Finding and running systemctl, and
whether systemd runs here, are host.systemd's."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from servelab.host.agent_op import Answer
from servelab.host.systemd import systemctl, systemctl_exe, systemd_running
from servelab.jsontypes import JsonObject

Systemctl = Callable[..., subprocess.CompletedProcess[str]]
# For tests and containers without systemd: the directory units are written to (the stand-in systemctl is
# host.systemd's $SERVELAB_SYSTEMCTL). Read on the host the unit lives on.
UNIT_DIR_ENV = "SERVELAB_UNIT_DIR"


class UnitStatus(Answer):
    """What systemd says of the unit (only `unit` and `state` without systemd). Also the agent's answer
    (deploy.ops.DEPLOY_UNIT_STATUS): it keeps the keys it was given, so `to_json` writes those alone."""

    unit: str
    state: str | None
    sub: str | None = None
    main_pid: str | None = None
    restarts: str | None = None
    since: str | None = None

    def to_json(self) -> JsonObject:
        """The keys `servelab status` and `deploy --install` print: those set, in this order."""
        return self.model_dump(mode="json", exclude_unset=True)


def unit_status(name: str, *, runtime: Path | None = None, run: Systemctl | None = None) -> UnitStatus:
    """What systemd says of the unit now (for `servelab status`). `runtime` and `run` stand for
    /run/systemd/system and `systemctl` (install passes its own, so that both read the same systemd)."""
    if not systemd_running(runtime) or systemctl_exe() is None:
        return UnitStatus(unit=f"{name}.service", state="unknown (no systemd)")
    out = (run or systemctl)(
        "show",
        f"{name}.service",
        "--property=ActiveState,SubState,MainPID,NRestarts,ExecMainStartTimestamp",
        timeout=20,
    )
    props = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return UnitStatus(
        unit=f"{name}.service",
        state=props.get("ActiveState"),
        sub=props.get("SubState"),
        main_pid=props.get("MainPID"),
        restarts=props.get("NRestarts"),
        since=props.get("ExecMainStartTimestamp"),
    )

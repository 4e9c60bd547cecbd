"""What systemd says of an installed unit now: `servelab status` (through `records.installed_units`) and
`deploy --install` both read it here, so neither imports the other. Finding and running systemctl, and
whether systemd runs here, are host.systemd's."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servelab.host.systemd import systemctl, systemctl_exe, systemd_running

Systemctl = Callable[..., subprocess.CompletedProcess[str]]
# For tests and containers without systemd: the directory units are written to (the stand-in systemctl is
# host.systemd's $SERVELAB_SYSTEMCTL). Read on the host the unit lives on.
UNIT_DIR_ENV = "SERVELAB_UNIT_DIR"


def unit_status(name: str, *, runtime: Path | None = None, run: Systemctl | None = None) -> dict[str, Any]:
    """What systemd says of the unit now (for `servelab status`). `runtime` and `run` stand for
    /run/systemd/system and `systemctl` (install passes its own, so that both read the same systemd)."""
    if not systemd_running(runtime) or systemctl_exe() is None:
        return {"unit": f"{name}.service", "state": "unknown (no systemd)"}
    out = (run or systemctl)(
        "show",
        f"{name}.service",
        "--property=ActiveState,SubState,MainPID,NRestarts,ExecMainStartTimestamp",
        timeout=20,
    )
    props = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return {
        "unit": f"{name}.service",
        "state": props.get("ActiveState"),
        "sub": props.get("SubState"),
        "main_pid": props.get("MainPID"),
        "restarts": props.get("NRestarts"),
        "since": props.get("ExecMainStartTimestamp"),
    }

"""What systemd says of an installed unit now: `servelab status` (through `records.installed_units`) and
`deploy --install` both read it here, so neither imports the other."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

SYSTEMD_RUNTIME = Path("/run/systemd/system")
Systemctl = Callable[..., subprocess.CompletedProcess[str]]


def systemctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("systemctl") or "systemctl"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, check=False)


def unit_status(name: str, *, runtime: Path | None = None, run: Systemctl | None = None) -> dict[str, Any]:
    """What systemd says of the unit now (for `servelab status`). `runtime` and `run` stand for
    /run/systemd/system and `systemctl` (install passes its own, so that both read the same systemd)."""
    if not (runtime or SYSTEMD_RUNTIME).is_dir() or shutil.which("systemctl") is None:
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

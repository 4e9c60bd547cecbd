"""What systemd says of an installed unit now: `servelab status` (through `records.installed_units`) and
`deploy --install` both read it here, so neither imports the other."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

SYSTEMD_RUNTIME = Path("/run/systemd/system")
Systemctl = Callable[..., subprocess.CompletedProcess[str]]
# For tests and containers without systemd: an executable that stands in for `systemctl` (its path, no
# arguments), and the directory units are written to. Read on the host the unit lives on (a remote one's
# agent reads its own environment), so they reach a stand-in where a monkeypatch cannot.
SYSTEMCTL_ENV = "SERVELAB_SYSTEMCTL"
UNIT_DIR_ENV = "SERVELAB_UNIT_DIR"


def systemctl_override() -> str | None:
    """$SERVELAB_SYSTEMCTL: the stand-in systemctl (None: the real one)."""
    return os.environ.get(SYSTEMCTL_ENV) or None


def systemctl_exe() -> str | None:
    """The systemctl to run: $SERVELAB_SYSTEMCTL, else systemctl on PATH (None: neither)."""
    return systemctl_override() or shutil.which("systemctl")


def systemd_running(runtime: Path | None = None) -> bool:
    """Whether a systemd (or its stand-in, $SERVELAB_SYSTEMCTL) manages units here."""
    return systemctl_override() is not None or (runtime or SYSTEMD_RUNTIME).is_dir()


def systemctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    exe = systemctl_exe() or "systemctl"
    return subprocess.run(
        [exe, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


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

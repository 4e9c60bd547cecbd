"""State of servelab's systemd units (`servelab deploy` installs them as `servelab-*.service`).

Why `systemctl show` and not `status`: `show` prints stable `Key=value` properties meant for programs;
`status` is for people and changes between versions. A host without systemd (containers, CI) is reported
as such, not as an error: `systemctl` may be installed while PID 1 is something else, which
`/run/systemd/system` tells apart (the check sd_booted() does).

This is the one place that finds and runs systemctl and asks whether systemd is running: `deploy`
(`unit_state`, `install`, `preflight`) and the agent call these.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from servelab.jsontypes import JsonObject

PROPERTIES: tuple[str, ...] = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "NRestarts",
    "ExecMainStartTimestamp",
    "ExecMainPID",
    "Result",
)
UNIT_PATTERN = "servelab*"

Systemctl = Callable[[list[str]], str | None]
SYSTEMD_RUNTIME = Path("/run/systemd/system")
# For tests and containers without systemd: an executable that stands in for `systemctl` (its path, no
# arguments). Read on the host the unit lives on (a remote one's agent reads its own environment), so it
# reaches a stand-in where a monkeypatch cannot.
SYSTEMCTL_ENV = "SERVELAB_SYSTEMCTL"


@dataclass(frozen=True)
class UnitState:
    unit: str
    active_state: str
    sub_state: str
    restarts: int | None
    since: str | None  # ExecMainStartTimestamp as systemd prints it ("Sun 2026-11-29 18:02:11 UTC")
    load_state: str = ""
    main_pid: int | None = None
    result: str = ""

    @property
    def failed(self) -> bool:
        return self.active_state == "failed" or self.result not in ("", "success")

    def to_dict(self) -> JsonObject:
        d = asdict(self)
        d["failed"] = self.failed
        return d


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v not in (None, "", "[not set]") else None
    except ValueError:
        return None


def parse_show(text: str) -> list[UnitState]:
    """`systemctl show -p ... UNIT...`: one block of Key=value lines per unit, blocks split by a blank line."""
    out: list[UnitState] = []
    for block in text.strip().split("\n\n"):
        props: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                props[key.strip()] = value.strip()
        if "Id" not in props:
            continue
        pid = _int(props.get("ExecMainPID"))
        out.append(
            UnitState(
                unit=props["Id"],
                active_state=props.get("ActiveState", ""),
                sub_state=props.get("SubState", ""),
                restarts=_int(props.get("NRestarts")),
                since=props.get("ExecMainStartTimestamp") or None,
                load_state=props.get("LoadState", ""),
                main_pid=pid or None,
                result=props.get("Result", ""),
            )
        )
    return out


def parse_list_units(text: str) -> list[str]:
    """Unit names from `systemctl list-units --all --plain --no-legend` (first column; a leading '●' dropped)."""
    names = []
    for line in text.splitlines():
        cells = line.replace("●", " ").split()
        if cells and "." in cells[0]:
            names.append(cells[0])
    return names


def systemctl_override() -> str | None:
    """$SERVELAB_SYSTEMCTL: the stand-in systemctl (None: the real one)."""
    return os.environ.get(SYSTEMCTL_ENV) or None


def systemctl_exe() -> str | None:
    """The systemctl to run: $SERVELAB_SYSTEMCTL, else systemctl on PATH (None: neither)."""
    return systemctl_override() or shutil.which("systemctl")


def booted(run_dir: Path = SYSTEMD_RUNTIME) -> bool:
    """Whether systemd is this host's init (sd_booted)."""
    return run_dir.is_dir()


def systemd_running(runtime: Path | None = None) -> bool:
    """Whether a systemd (or its stand-in, $SERVELAB_SYSTEMCTL) manages units here."""
    return systemctl_override() is not None or booted(runtime or SYSTEMD_RUNTIME)


def systemctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `systemctl ARGS` (the stand-in where $SERVELAB_SYSTEMCTL names one); raises as subprocess does."""
    exe = systemctl_exe() or "systemctl"
    return subprocess.run(
        [exe, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_systemctl(args: list[str]) -> str | None:
    """stdout of `systemctl ARGS` (None: no systemctl, or it failed)."""
    if systemctl_exe() is None:
        return None
    try:
        out = systemctl(*args, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode in (0, 3) else None  # 3: some unit inactive (list/show still print)


@dataclass(frozen=True)
class UnitStates:
    """What `states` found: whether systemd answered, why not (or that no unit is installed), the units."""

    available: bool
    note: str
    units: list[UnitState] = field(default_factory=list)


def states(
    units: list[str] | None = None, run: Systemctl = run_systemctl, is_booted: Callable[[], bool] = booted
) -> UnitStates:
    """The state of `units` (default: every servelab* unit)."""
    if not is_booted():
        return UnitStates(False, "no systemd on this host (PID 1 is not systemd)")
    names = list(units or [])
    if not names:
        listed = run(["list-units", "--all", "--plain", "--no-legend", "--no-pager", UNIT_PATTERN])
        if listed is None:
            return UnitStates(False, "systemctl did not answer")
        names = parse_list_units(listed)
    if not names:
        return UnitStates(True, f"no {UNIT_PATTERN} units installed")
    text = run(["show", "--no-pager", "-p", ",".join(PROPERTIES), *names])
    if text is None:
        return UnitStates(False, "systemctl show failed")
    return UnitStates(True, "", parse_show(text))

"""A stand-in for `systemctl`, for hosts without a running systemd (this container, CI): `start` does what
systemd does with a written unit — ExecStartPre, ExecStart in a session of its own with the unit's
Environment= and EnvironmentFile=, ExecStartPost with $MAINPID — so everything after it (wait-ready,
verify-output, the benchmark, the check) is real.

Two ways in, one code path (:func:`start_unit`):
- in-process: tests/integration/test_deploy.py's ``FakeSystemd`` (monkeypatched into ``install._systemctl``);
- as an executable: ``python tests/support/fake_systemctl.py ARGS...``, what ``$SERVELAB_SYSTEMCTL`` names on a
  "remote" host the tests reach over SSH (a monkeypatch does not cross it). The unit directory is
  ``$SERVELAB_UNIT_DIR``; the started server's pid is kept in ``UNIT_DIR/.fake-systemctl/NAME.pid``, so
  ``stop`` (SIGTERM to the server's session, then SIGKILL to every process with the unit's marker, as
  KillMode=mixed does to the cgroup), ``show`` and ``is-active`` work across invocations.

The server inherits this process's environment, ``SERVELAB_TEST_SESSION`` included (the remote sessions of
the test sshd get it through ``SetEnv``), so the leftover check at the end of the run finds it too.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: tests.* importable
    sys.path.insert(0, str(ROOT))

from tests.unit.deploy.systemd_reader import unquote_words  # noqa: E402

STOP_GRACE_S = 10.0


def read_unit(text: str, env: dict[str, str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The environment a unit's commands get (`env` + EnvironmentFile= + Environment=, in systemd's order:
    Environment= lines first, then files override them) and its Exec* command lines as words."""
    own: dict[str, str] = {}
    files: list[str] = []
    cmds: dict[str, list[str]] = {}
    for ln in text.splitlines():
        key, _, value = ln.partition("=")
        if key == "Environment":
            k, _, v = unquote_words(value, dollar=False)[0].partition("=")
            own[k] = v
        elif key == "EnvironmentFile":
            files.append(value.strip().replace("%%", "%"))
        elif key.startswith("ExecStart"):
            cmds[key] = unquote_words(value, dollar=True)
    out = {**env, **own}
    for f in files:
        optional = f.startswith("-")
        try:
            lines = Path(f.removeprefix("-")).read_text().splitlines()
        except OSError:
            if optional:
                continue
            raise
        for line in lines:
            name, eq, val = line.strip().removeprefix("export ").partition("=")
            if eq and name.strip() and not name.startswith("#"):
                out[name.strip()] = val.strip().strip("'\"")
    return out, cmds


def start_unit(
    unit_path: Path, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], subprocess.Popen[bytes] | None]:
    """`systemctl start` of the unit at `unit_path`: its result, and the server it started (None: preflight
    refused, nothing started)."""
    env, cmds = read_unit(unit_path.read_text(), dict(os.environ))
    args = ["start", unit_path.name]
    pre = subprocess.run(
        cmds["ExecStartPre"], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    if pre.returncode:
        return subprocess.CompletedProcess(args, 1, "", pre.stdout + pre.stderr), None
    server = subprocess.Popen(
        [*cmds["ExecStart"], "--cpu", "0"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    post = subprocess.run(
        cmds["ExecStartPost"],
        env={**env, "MAINPID": str(server.pid)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return subprocess.CompletedProcess(args, post.returncode, "", post.stderr), server


# -- the executable -------------------------------------------------------------------------------


def write_executable(path: Path) -> Path:
    """A one-line executable at `path` that runs this stand-in with this very interpreter (the venv's):
    what ``$SERVELAB_SYSTEMCTL`` names (a path, no arguments)."""
    path.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} "$@"\n'
    )
    path.chmod(0o755)
    return path


def _unit_dir() -> Path:
    return Path(os.environ["SERVELAB_UNIT_DIR"])


def _pid_file(unit: str) -> Path:
    d = _unit_dir() / ".fake-systemctl"
    d.mkdir(exist_ok=True)
    return d / f"{unit.removesuffix('.service')}.pid"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _main_pid(unit: str) -> int | None:
    try:
        pid = int(_pid_file(unit).read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _stop(unit: str) -> int:
    from servelab.host import processes

    pid = _main_pid(unit)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        end = time.monotonic() + STOP_GRACE_S
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
    # KillMode=mixed: what is left in the unit's "cgroup" (its marked processes) gets SIGKILL
    marker = f"servelab-deploy:{unit.removesuffix('.service')}"
    processes.kill_processes(processes.with_marker(value=marker), 0.0)
    _pid_file(unit).unlink(missing_ok=True)
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print("fake systemctl: no command", file=sys.stderr)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "start":
        res, server = start_unit(_unit_dir() / rest[0])
        if server is not None:
            _pid_file(rest[0]).write_text(str(server.pid))
        sys.stderr.write(res.stderr)
        return res.returncode
    if cmd == "stop":
        return _stop(rest[0])
    if cmd == "is-active":
        active = _main_pid(rest[0]) is not None
        print("active" if active else "inactive")
        return 0 if active else 3
    if cmd == "show":
        pid = _main_pid(rest[0])
        state = ("active", "running") if pid is not None else ("inactive", "dead")
        print(f"ActiveState={state[0]}\nSubState={state[1]}\nMainPID={pid or 0}\nNRestarts=0")
        return 0
    return 0  # daemon-reload, enable, ...: nothing to do without a systemd


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A real OpenSSH server for the remote-host tests: Debian's ``/usr/sbin/sshd`` on a free port of 127.0.0.1.

Why a real one: servelab drives the user's own ``ssh`` client (ControlMaster, BatchMode), so only a real
sshd shows what that client does on a changed host key, a refused key, a host that goes away with live
master connections, and a host that comes back. Everything lives in ``workdir``: a host key and a user key
generated per call (ed25519, no passphrase), ``authorized_keys``, ``sshd_config``, the server log, and an
ssh *client* config (``ssh_config``, what ``SERVELAB_SSH_CONFIG`` points at) with the alias ``gpubox``
and a ``Host 127.0.0.1`` block, so ``gpubox`` and ``ssh://USER@127.0.0.1:PORT`` both work through it.

ControlMaster sockets go to a short directory under /tmp (``SERVELAB_SSH_CONTROL_DIR``): unix socket paths
are limited to ~104 bytes and pytest's tmp paths are longer than that. :meth:`SshdHandle.close` ends the
masters and removes the directory.

With ``netns=True`` sshd runs inside a fresh network namespace with only loopback up (needs root and
``ip netns``): nothing in it is reachable from the host except through ssh itself (the client config's
``ProxyCommand`` is ``ip netns exec NAME python tests/support/tcpbridge.py 127.0.0.1 %p``), so a test can
prove that a port on the "remote" 127.0.0.1 is reached only through an ``ssh -L`` forward.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it ("Missing privilege separation directory")
ALIAS = "gpubox"
HOST = "127.0.0.1"
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
_BRIDGE = Path(__file__).with_name("tcpbridge.py")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def keygen(path: Path, comment: str) -> Path:
    """An ed25519 key pair at ``path``/``path.pub`` without a passphrase; returns the private key's path."""
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    return path


def _public(key: Path) -> str:
    """``ssh-ed25519 AAAA...`` of a key pair (no comment), the form known_hosts wants."""
    kind, blob = key.with_name(key.name + ".pub").read_text().split()[:2]
    return f"{kind} {blob}"


def _log_tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


@dataclass
class SshdHandle:
    """A running (or stopped, restartable) sshd and the client files that reach it."""

    port: int
    workdir: Path
    config_path: Path  # the ssh client config: SERVELAB_SSH_CONFIG
    known_hosts: Path
    identity: Path  # the user's private key
    log_path: Path
    server_config: Path
    host_key: Path
    control_dir: Path  # SERVELAB_SSH_CONTROL_DIR: short, under /tmp
    user: str
    netns: str | None = None
    alias: str = ALIAS
    set_env: dict[str, str] = field(default_factory=dict)  # what every remote session gets (sshd SetEnv)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _orphans: list[psutil.Process] = field(default_factory=list, repr=False)

    @property
    def pid(self) -> int:
        """The listener's pid (the last one's when stopped)."""
        assert self.proc is not None, "sshd was never started"
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        """What a servelab process needs to reach this host: the client config and the control-socket dir."""
        return {
            "SERVELAB_SSH_CONFIG": str(self.config_path),
            "SERVELAB_SSH_CONTROL_DIR": str(self.control_dir),
        }

    def ssh(self, *remote: str, config: Path | None = None, opts: tuple[str, ...] = ()) -> list[str]:
        """``ssh -F CONFIG [opts] gpubox REMOTE...`` as an argument list."""
        return ["ssh", "-F", str(config or self.config_path), *opts, self.alias, *remote]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start sshd (again) on the same port with the same keys; returns once a real ``ssh true`` works."""
        if self.alive():
            return
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        argv = [SSHD, "-D", "-e", "-f", str(self.server_config)]
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]  # ip execs sshd: the pid stays sshd's
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}:\n{_log_tail(self.log_path)}")
            if self.netns is not None or _port_open(self.port):
                r = subprocess.run(
                    self.ssh("true", opts=("-o", "ConnectTimeout=3")),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                if r.returncode == 0:
                    return
                last = r.stderr
            time.sleep(0.05)
        self.stop(kill_sessions=True)
        raise RuntimeError(f"sshd not ready in {timeout}s; ssh said: {last}\n{_log_tail(self.log_path)}")

    def sessions(self) -> list[psutil.Process]:
        """The listener's descendants: per-connection ``sshd:`` processes and what their sessions run."""
        if not self.alive():
            return []
        assert self.proc is not None
        with contextlib.suppress(psutil.Error):
            return psutil.Process(self.proc.pid).children(recursive=True)
        return []

    def stop(self, kill_sessions: bool = False) -> None:
        """SIGTERM the listener. Its per-connection children keep established sessions (and masters) alive,
        as on a real host whose sshd restarts; ``kill_sessions=True`` SIGKILLs them too: the host went away."""
        if self.proc is None:
            return
        children = self.sessions()
        if kill_sessions:  # before the listener goes: it reaps them, no zombies left for init
            _signal_all([*children, *self._orphans], signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        if kill_sessions:
            _kill_all([*children, *self._orphans])
            self._orphans = []
        else:
            self._orphans += children

    def end_masters(self) -> None:
        """End every ControlMaster under ``control_dir``: ``ssh -O exit`` on each socket, then SIGKILL the
        ``ssh`` processes whose command line names the dir (a master's title is ``ssh: SOCKET [mux]``)."""
        configs = [self.config_path, *self.workdir.glob("ssh_config.*")]
        sockets = sorted(self.control_dir.iterdir()) if self.control_dir.is_dir() else []
        runs = [["-O", "exit", self.alias], ["-O", "exit", HOST]]  # when a config names the ControlPath
        runs += [["-o", f"ControlPath={s}", "-O", "exit", self.alias] for s in sockets]
        for extra in runs:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run(
                    ["ssh", "-F", str(configs[0]), *extra],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=5,
                )
        marker = str(self.control_dir)
        masters: list[psutil.Process] = []
        for p in psutil.process_iter(["name", "cmdline"]):
            cmdline = " ".join(p.info["cmdline"] or [])
            if p.info["name"] == "ssh" and marker in cmdline:
                masters.append(p)
        _kill_all(masters)

    def close(self) -> None:
        """Stop everything this handle started: sshd, its sessions, ssh masters, the control dir, the netns."""
        self.stop(kill_sessions=True)
        self.end_masters()
        shutil.rmtree(self.control_dir, ignore_errors=True)
        if self.netns is not None:
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, timeout=10)

    # Fault configurations: each writes its own client config file and returns its path.

    def config_with_wrong_host_key(self) -> Path:
        """known_hosts holds another (fresh) host key for [127.0.0.1]:PORT: "REMOTE HOST IDENTIFICATION HAS
        CHANGED", "Host key verification failed", exit 255."""
        other = keygen(self.workdir / "other_host_ed25519", "another host")
        known = self.workdir / "known_hosts.wrong"
        known.write_text(f"[{HOST}]:{self.port} {_public(other)}\n")
        return self._write_client("wrong-host-key", identity=self.identity, known_hosts=known)

    def config_with_unknown_host(self) -> Path:
        """An empty known_hosts with StrictHostKeyChecking yes: "No ED25519 host key is known", exit 255."""
        known = self.workdir / "known_hosts.empty"
        known.write_text("")
        return self._write_client("unknown-host", identity=self.identity, known_hosts=known)

    def config_with_refused_key(self) -> Path:
        """A fresh user key that authorized_keys does not hold: "Permission denied (publickey)", exit 255."""
        key = keygen(self.workdir / "refused_ed25519", "refused")
        return self._write_client("refused-key", identity=key, known_hosts=self.known_hosts)

    def _write_client(self, name: str | None, *, identity: Path, known_hosts: Path) -> Path:
        path = self.config_path if name is None else self.workdir / f"ssh_config.{name}"
        path.write_text(
            client_config(
                self.port, user=self.user, identity=identity, known_hosts=known_hosts, netns=self.netns
            )
        )
        return path


def client_config(port: int, *, user: str, identity: Path, known_hosts: Path, netns: str | None) -> str:
    """Two blocks with the same settings: the alias ``gpubox`` and ``127.0.0.1`` itself (for URL targets)."""
    body = [
        f"HostName {HOST}",
        f"Port {port}",
        f"User {user}",
        f"IdentityFile {identity}",
        "IdentitiesOnly yes",
        "IdentityAgent none",
        f"UserKnownHostsFile {known_hosts}",
        "GlobalKnownHostsFile /dev/null",
        "StrictHostKeyChecking yes",
        "UpdateHostKeys no",
        "CheckHostIP no",
        "BatchMode yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "ConnectTimeout 10",
    ]
    if netns is not None:
        body.append(f"ProxyCommand ip netns exec {netns} {sys.executable} {_BRIDGE} {HOST} %p")
    lines: list[str] = []
    for host in (ALIAS, HOST):
        lines.append(f"Host {host}")
        lines += [f"    {line}" for line in body]
        lines.append("")
    return "\n".join(lines)


def server_config(port: int, workdir: Path, host_key: Path, set_env: dict[str, str] | None = None) -> str:
    """Loopback only, keys only, root allowed by key; no PAM (no login stack in a container), no StrictModes
    (pytest's tmp dirs are not the 0700 ~/.ssh sshd insists on), no environment accepted from clients.
    ``set_env``: variables every session gets (sshd's ``SetEnv``, OpenSSH >= 7.8), e.g. the stand-in
    systemctl the deploy tests name with ``SERVELAB_SYSTEMCTL``."""
    # Debian's bash sources ~/.bashrc for a command sshd runs (SSH_SOURCE_BASHRC) unless SHLVL says it is
    # nested. This machine's root .bashrc runs `pyenv init`, whose rehash takes a lock file: a session
    # killed mid-rehash (the tests kill SSH masters) leaves it, and every later shell waits 60 s for it.
    # Remote sessions of the tests run commands, not an interactive setup. PATH: `python3` over there is
    # this venv's, which has servelab (a real remote has it installed; `[host] python` names another).
    env = {
        "SHLVL": "1",
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        **(set_env or {}),
    }
    env_lines = []
    for name, value in env.items():
        if not name.isidentifier() or any(c in value for c in '"\\\n'):
            raise ValueError(f"SetEnv cannot carry {name}={value!r}")
        env_lines.append(f'"{name}={value}"')
    env_lines = ["SetEnv " + " ".join(env_lines)]  # one line: only the first SetEnv line counts
    return "\n".join(
        [
            *env_lines,
            f"ListenAddress {HOST}",
            f"Port {port}",
            f"HostKey {host_key}",
            f"AuthorizedKeysFile {workdir / 'authorized_keys'}",
            f"PidFile {workdir / 'sshd.pid'}",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "MaxSessions 100",
            "MaxStartups 100",
            "LogLevel VERBOSE",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "AllowTcpForwarding yes",
            "PermitUserEnvironment no",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def _signal_all(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def _kill_all(procs: list[psutil.Process]) -> None:
    """SIGKILL and wait until each is gone or a zombie (orphans are reaped by init, whenever it gets to it)."""
    _signal_all(procs, signal.SIGKILL)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while procs and time.monotonic() < deadline:
        procs = [p for p in procs if _running(p)]
        if procs:
            time.sleep(0.02)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def start_sshd(workdir: Path, *, netns: bool = False, set_env: dict[str, str] | None = None) -> SshdHandle:
    """Generate keys and configs in ``workdir`` and start sshd on a free port of 127.0.0.1 (inside a fresh
    network namespace with ``netns=True``; every session with ``set_env`` in its environment). The caller
    owns the handle: :meth:`SshdHandle.close` it."""
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if not os.access(SSHD, os.X_OK):
        raise RuntimeError(f"{SSHD} is missing: bash scripts/test.sh installs Debian's openssh-server")
    host_key = keygen(workdir / "host_ed25519", "servelab test host")
    identity = keygen(workdir / "id_ed25519", "servelab test user")
    (workdir / "authorized_keys").write_text(_public(identity) + "\n")
    known_hosts = workdir / "known_hosts"
    control_dir = Path(tempfile.mkdtemp(prefix="slcm-", dir="/tmp"))
    ns = None
    if netns:
        ns = f"slsshd-{uuid.uuid4().hex[:8]}"
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=10)
        subprocess.run(
            ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
            check=True,
            capture_output=True,
            timeout=10,
        )
    attempts = 3  # the free port can be taken between probing it and sshd binding it
    for attempt in range(attempts):
        port = _free_port()
        known_hosts.write_text(f"[{HOST}]:{port} {_public(host_key)}\n")
        handle = SshdHandle(
            port=port,
            workdir=workdir,
            config_path=workdir / "ssh_config",
            known_hosts=known_hosts,
            identity=identity,
            log_path=workdir / "sshd.log",
            server_config=workdir / "sshd_config",
            host_key=host_key,
            control_dir=control_dir,
            user=getpass.getuser(),
            netns=ns,
            set_env=dict(set_env or {}),
        )
        handle.server_config.write_text(server_config(port, workdir, host_key, set_env))
        handle._write_client(None, identity=identity, known_hosts=known_hosts)
        try:
            handle.start()
            return handle
        except RuntimeError:
            if attempt == attempts - 1:
                handle.close()
                raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def sshd_server(
    workdir: Path, *, netns: bool = False, set_env: dict[str, str] | None = None
) -> Iterator[SshdHandle]:
    """:func:`start_sshd`, closed (sshd, sessions, masters, control dir) on exit."""
    handle = start_sshd(workdir, netns=netns, set_env=set_env)
    try:
        yield handle
    finally:
        handle.close()

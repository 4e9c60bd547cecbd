"""Where a command acts: this machine, or a GPU box reached with the user's own OpenSSH.

    host = open_host("ssh://root@gpu-box:2222")     # or an alias from ~/.ssh/config; None: this machine
    host.run(["nvidia-smi", "-L"])                   # argv, quoted with shlex.join for the remote shell
    SWEEP.call(host, SweepRequest(prefix="s-ab12:"))  # an agent operation, typed (servelab.host.agent_op)
    with host.forward("127.0.0.1", 8000) as (h, p):  # reach a server bound to the remote's loopback
        ...

Why OpenSSH (`ssh` as a subprocess) and not a library: `~/.ssh/config`, agents, `ProxyJump`,
certificates and known_hosts then work exactly as they do for the user's own `ssh`, and one master
connection (ControlMaster) carries every command, the agent and the port forwards, so a command costs a
few milliseconds instead of a handshake. `BatchMode=yes`: a missing key or an unknown host key is an
error, never a prompt; `ServerAliveInterval`: a dead link is noticed in seconds, never a hang.

Why an agent (`python -m servelab.agent` on the remote, one JSON line per request on its stdin):
the marker scan, the process-tree kill, the /dev/shm ledger and the port-ownership guard read /proc of
the machine the server runs on. Running the very code servelab runs locally over there keeps local and
remote one code path; the launch spec (environment, API keys included) travels on the agent's stdin,
never on a command line. When the connection ends (a dropped link, a killed control-side servelab),
the agent's stdin closes and it tears down every server it launched.

The agent (servelab.agent) stands above every room whose operations it runs, so this module never imports
it: a `LocalHost` is handed its `Dispatcher` by whoever builds it (the fronts: `servelab.agent.serve.local_host()`),
as httpx's WSGITransport is handed its app; an `SshHost` starts it by its module name over there.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson

from servelab import __version__
from servelab.errors import HostError, HostLost, HostUnusable
from servelab.host.wire import AGENT_MODULE, PROTOCOL, rebuild_error
from servelab.host.wire import b64 as b64  # re-exported: callers decode what `call("read")` returns
from servelab.host.wire import unb64 as unb64
from servelab.jsontypes import JsonObject

CONTROL_PERSIST_S = 600  # a warm master serves the next command of the user (status --host) at once
CONNECT_TIMEOUT_S = 10
ALIVE_INTERVAL_S = 3
ALIVE_COUNT = 3  # a link silent for ALIVE_INTERVAL_S * ALIVE_COUNT seconds is dead
CALL_TIMEOUT_S = 120.0

_ALIAS = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.@%+:\[\]-]*$")


@dataclass(frozen=True)
class Completed:
    """A finished command: its exit status and output (rc 127: the program was not found)."""

    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class SshTarget:
    """`ssh://[user@]host[:port]`, or a bare alias that `~/.ssh/config` resolves."""

    raw: str
    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> SshTarget:
        raw = text.strip()
        bad = HostUnusable(
            f"invalid host target {text!r}",
            hint="use ssh://[user@]host[:port] or an alias from ~/.ssh/config, e.g. ssh://root@gpu-box:22",
        )
        if raw.startswith("ssh://"):
            try:
                parts = urlsplit(raw)
                port = parts.port
            except ValueError:
                raise bad from None
            if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.password:
                raise bad
            host = parts.hostname
            user = parts.username
            if not _ALIAS.match(host) or (user is not None and not _ALIAS.match(user)):
                raise bad
            return cls(raw, host, user, port)
        if "://" in raw or not _ALIAS.match(raw) or raw.startswith("-"):
            raise bad
        return cls(raw, raw)

    def destination(self) -> list[str]:
        """The ssh arguments that name the machine (options first, the host last)."""
        out: list[str] = []
        if self.port is not None:
            out += ["-p", str(self.port)]
        if self.user is not None:
            out += ["-l", self.user]
        return [*out, self.host]


class Host(Protocol):
    """What a room needs of a machine."""

    @property
    def name(self) -> str: ...
    @property
    def is_local(self) -> bool: ...
    def run(self, argv: list[str], *, input: bytes | None = None, timeout: float = 60.0) -> Completed: ...
    def call(self, op: str, **args: Any) -> Any: ...
    def forward(self, host: str, port: int) -> contextlib.AbstractContextManager[tuple[str, int]]: ...
    def check(self) -> None: ...
    def close(self) -> None: ...


class AgentHost(Host, Protocol):
    """A machine whose servers a servelab agent runs (over SSH, or on a Ray node): what lifecycle needs to
    launch there and reach the server from here."""

    python: str  # the interpreter servelab runs under over there

    def open_forward(self, host: str, port: int) -> tuple[str, int]: ...
    def close_forward(self, host: str, port: int) -> None: ...


def run_local(argv: list[str], input: bytes | None, timeout: float) -> Completed:
    try:
        out = subprocess.run(
            argv,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        return Completed(tuple(argv), 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired as exc:
        return Completed(tuple(argv), 124, "", f"{argv[0]}: timed out after {exc.timeout:g} s")
    except OSError as exc:
        return Completed(tuple(argv), 126, "", f"{argv[0]}: {exc.strerror or exc}")
    return Completed(
        tuple(argv),
        out.returncode,
        out.stdout.decode("utf-8", "replace"),
        out.stderr.decode("utf-8", "replace"),
    )


class Dispatcher(Protocol):
    """The agent's operations as `LocalHost` runs them in this process: a fresh state per host, an operation
    by name over it, and the teardown of what that state launched (servelab.agent.serve.DISPATCHER)."""

    def new_state(self) -> Any: ...
    def dispatch(self, state: Any, op: str, args: JsonObject) -> Any: ...
    def shutdown(self, state: Any) -> None: ...


class LocalHost:
    """This machine: commands run directly, agent operations in this process, through the `dispatcher`
    its builder hands it (the agent stands above this room: it is never imported from here)."""

    name = "local"
    is_local = True

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._state: Any = None

    def run(self, argv: list[str], *, input: bytes | None = None, timeout: float = 60.0) -> Completed:
        return run_local(argv, input, timeout)

    def call(self, op: str, **args: Any) -> Any:
        if self._state is None:
            self._state = self._dispatcher.new_state()
        args.pop("_timeout", None)  # an SshHost's answer deadline; nothing to wait for in-process
        return self._dispatcher.dispatch(self._state, op, args)

    @contextlib.contextmanager
    def forward(self, host: str, port: int) -> Iterator[tuple[str, int]]:
        yield (_loopback(host), port)

    def check(self) -> None:
        """This machine is always there."""

    def close(self) -> None:
        if self._state is not None:
            self._dispatcher.shutdown(self._state)
            self._state = None


# -- SSH -------------------------------------------------------------------------------------------


def control_dir() -> Path:
    """Where the ControlMaster sockets live: short (a unix socket path has ~104 bytes), private."""
    d = Path(os.environ.get("SERVELAB_SSH_CONTROL_DIR") or f"/tmp/servelab-ssh-{os.getuid()}")
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def ssh_options() -> list[str]:
    """The options every ssh of ours carries; `SERVELAB_SSH_CONFIG` names a client config (`ssh -F`)."""
    cfg = os.environ.get("SERVELAB_SSH_CONFIG")
    return [
        *(["-F", cfg] if cfg else []),
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o",
        f"ServerAliveInterval={ALIVE_INTERVAL_S}",
        "-o",
        f"ServerAliveCountMax={ALIVE_COUNT}",
        "-o",
        f"ControlPath={control_dir()}/%C",
    ]


# What OpenSSH prints for each way a connection can fail, and what the user should do (exit 2: theirs).
_SSH_FAULTS: tuple[tuple[str, str, str], ...] = (
    (
        "REMOTE HOST IDENTIFICATION HAS CHANGED",
        "the host key of {host} has changed since it was recorded in known_hosts",
        "if the machine was reinstalled, remove the old key (`ssh-keygen -R HOST`) and connect once with "
        "ssh to check and accept the new one; otherwise someone may be intercepting the connection",
    ),
    (
        "Host key verification failed",
        "{host} is not in known_hosts (or its key does not match), and servelab never accepts a key blindly",
        "connect once with `ssh HOST` to check and accept its host key, then run servelab again",
    ),
    (
        "Permission denied",
        "{host} refused our key",
        "check that `ssh HOST true` works without a password (the key in your agent or IdentityFile, "
        "and the user in the target, e.g. ssh://root@HOST)",
    ),
    (
        "Could not resolve hostname",
        "the host name {host} does not resolve",
        "check the spelling, or define the alias in ~/.ssh/config",
    ),
    (
        "Connection refused",
        "{host} refused the connection (no sshd on that port)",
        "check the port (ssh://HOST:PORT) and that sshd runs there",
    ),
    (
        "Connection timed out",
        "{host} did not answer within the connect timeout",
        "check the network path (VPN, ProxyJump in ~/.ssh/config) and that the machine is up",
    ),
    (
        "No route to host",
        "there is no route to {host}",
        "check the network path and that the machine is up",
    ),
    (
        "Network is unreachable",
        "the network to {host} is unreachable",
        "check the network path and that the machine is up",
    ),
)


def ssh_error(target: SshTarget, stderr: str) -> HostError:
    """The servelab error for an ssh that could not connect; unknown text keeps ssh's own words."""
    for needle, what, hint in _SSH_FAULTS:
        if needle in stderr:
            cls = HostUnusable if needle not in ("Connection timed out", "No route to host") else HostError
            return cls(f"cannot connect to {target.raw}: " + what.format(host=target.host), hint=hint)
    last = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return HostError(
        f"cannot connect to {target.raw}: {last[-1] if last else 'ssh failed without a message'}",
        hint="run `ssh HOST true` by hand to see what fails",
    )


def _master_pid(text: str) -> int | None:
    m = re.search(r"pid=(\d+)", text)
    return int(m.group(1)) if m else None


class ChannelClosed(Exception):
    """The agent's pipe ended or stayed silent: `why` says which (the host turns it into HostLost)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass
class AgentChannel:
    """One agent process (`argv`: over ssh, or this machine's python): requests and answers, one JSON line
    each. `detached`: the agent forked itself away (`--detach`), so the process we started exits at once
    and only the pipe tells whether the agent lives."""

    proc: subprocess.Popen[bytes]
    stderr_path: Path
    detached: bool = False
    buf: bytearray = field(default_factory=bytearray)
    next_id: int = 1

    @classmethod
    def start(cls, argv: list[str], *, detached: bool = False) -> AgentChannel:
        fd, name = tempfile.mkstemp(prefix="servelab-agent-", suffix=".err")
        with os.fdopen(fd, "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        return cls(proc, Path(name), detached)

    def stderr_text(self) -> str:
        return self.stderr_path.read_text(errors="replace").strip() if self.stderr_path.exists() else ""

    def alive(self) -> bool:
        """Whether the agent is still there: its process (or, detached, its pipe) has not ended."""
        if not self.detached:
            return self.proc.poll() is None
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return False
            self.buf += chunk
        return True

    def readline(self, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelClosed(f"no answer within {timeout:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise ChannelClosed("the agent's output ended")
            self.buf += chunk
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        return line

    def answer(self, op: str, args: JsonObject, timeout: float) -> JsonObject:
        """The agent's answer to one request, as it sent it (`ok` and `result`, or `error`)."""
        rid = self.next_id
        self.next_id += 1
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(orjson.dumps({"id": rid, "op": op, "args": args}) + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise ChannelClosed("the agent is gone") from None
        while True:
            answer: JsonObject = orjson.loads(self.readline(timeout))
            if answer.get("id") == rid:
                return answer

    def request(self, op: str, args: JsonObject, timeout: float) -> Any:
        """The result of one request; the agent's error is raised as the error it was over there."""
        answer = self.answer(op, args, timeout)
        if answer.get("ok"):
            return answer.get("result")
        error = answer.get("error")
        raise rebuild_error(error if isinstance(error, dict) else {})

    def close(self) -> None:
        """End the agent: its stdin closes, so it tears down whatever it launched and exits."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        if not self.detached:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        with contextlib.suppress(OSError):
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        with contextlib.suppress(OSError):
            self.stderr_path.unlink()


class SshHost:
    """A machine reached over OpenSSH; one ControlMaster connection carries everything."""

    is_local = False

    def __init__(self, target: SshTarget, *, python: str = "python3", workdir: str | None = None) -> None:
        self.target = target
        self.python = python
        self.workdir = workdir
        self.ssh = shutil.which("ssh") or "ssh"
        self._lock = threading.RLock()
        self._channel: AgentChannel | None = None
        self._forwards: dict[tuple[str, int], int] = {}
        self.hello: JsonObject = {}  # the agent's `hello` answer, as it sent it
        # Set when an agent died under us: the servers it held went with it, so a new agent must not
        # quietly take its place (it would know none of them). close() clears it.
        self._lost: HostLost | None = None

    @property
    def name(self) -> str:
        return self.target.raw

    def _base(self) -> list[str]:
        return [self.ssh, *ssh_options()]

    # -- the master connection --------------------------------------------------------------------
    def master_pid(self) -> int | None:
        """The pid of the running master connection (None: there is none)."""
        out = run_local([*self._base(), "-O", "check", *self.target.destination()], None, 10)
        return _master_pid(out.stderr + out.stdout) if out.rc == 0 else None

    def connect(self) -> None:
        """Start (or reuse) the master connection; a failure is a HostError that says what to fix."""
        if self.master_pid() is not None:
            return
        with tempfile.TemporaryFile() as err:
            # -f: into the background once authenticated; its stderr is a file, not a pipe we would wait on.
            try:
                rc = subprocess.run(
                    [
                        *self._base(),
                        "-o",
                        "ControlMaster=auto",
                        "-o",
                        f"ControlPersist={CONTROL_PERSIST_S}",
                        "-f",
                        "-N",
                        *self.target.destination(),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    timeout=CONNECT_TIMEOUT_S * 3,
                    check=False,
                ).returncode
            except subprocess.TimeoutExpired:
                raise HostError(
                    f"cannot connect to {self.target.raw}: no answer within {CONNECT_TIMEOUT_S * 3} s",
                    hint="run `ssh HOST true` by hand to see what hangs",
                ) from None
            err.seek(0)
            text = err.read().decode("utf-8", "replace")
        if rc != 0:
            raise ssh_error(self.target, text)

    def _remote(self, argv: list[str]) -> list[str]:
        """An ssh invocation running `argv` over the master (never a second connection)."""
        return [*self._base(), "-o", "ControlMaster=no", *self.target.destination(), "--", shlex.join(argv)]

    # -- commands ---------------------------------------------------------------------------------
    def run(self, argv: list[str], *, input: bytes | None = None, timeout: float = 60.0) -> Completed:
        """`argv` on the remote host; rc 255 with ssh's words when the connection failed."""
        self.connect()
        out = run_local(self._remote(argv), input, timeout)
        if out.rc == 255 and self.master_pid() is None:
            raise HostLost(
                f"the connection to {self.target.raw} dropped ({out.stderr.strip()[-200:] or 'no message'})",
                hint="check the host and the network; `servelab tune STUDY --resume` continues a study",
            )
        return Completed(tuple(argv), out.rc, out.stdout, out.stderr)

    # -- the agent --------------------------------------------------------------------------------
    def _open_channel(self) -> AgentChannel:
        self.connect()
        ch = AgentChannel.start(self._remote([self.python, "-m", AGENT_MODULE]))
        self._channel = ch
        try:
            hello = self._request(ch, "hello", {"workdir": self.workdir}, timeout=60)
        except HostLost as exc:
            self._drop(ch)
            raise self._agent_missing(ch, exc) from None
        if hello.get("protocol") != PROTOCOL or hello.get("version") != __version__:
            self._drop(ch)
            raise HostUnusable(
                f"{self.target.raw} runs servelab {hello.get('version')} (protocol {hello.get('protocol')}); "
                f"this is servelab {__version__} (protocol {PROTOCOL})",
                hint="install the same servelab version on both machines",
            )
        self.hello = hello
        return ch

    def _agent_missing(self, ch: AgentChannel, exc: HostLost) -> HostError:
        # What the agent printed (its stderr file; `_gone` quoted its last line when it removed the file).
        text = ch.stderr_text() or exc.message
        if "No module named" in text or "not found" in text or "No such file" in text:
            return HostUnusable(
                f"servelab is not installed on {self.target.raw} for {self.python} ({text.strip()[-160:]})",
                hint="install servelab there (`pip install servelab`, the same version as here), or name the "
                'interpreter of the venv that has it: [host] python = "/opt/servelab/.venv/bin/python" '
                "(or --remote-python)",
            )
        if self.master_pid() is None:
            return exc
        return HostError(
            f"the servelab agent on {self.target.raw} did not start: {text.strip()[-300:] or exc.message}",
            hint=f"run `ssh HOST {self.python} -m {AGENT_MODULE} --check` to see why",
        )

    def _drop(self, ch: AgentChannel) -> None:
        if self._channel is ch:
            self._channel = None
        ch.close()

    def _gone(self, ch: AgentChannel, why: str) -> HostLost:
        text = ch.stderr_text()
        self._drop(ch)
        detail = f": {text.splitlines()[-1]}" if text else ""
        self._lost = HostLost(
            f"the connection to {self.target.raw} dropped ({why}{detail})",
            hint="check the host and the network; `servelab tune STUDY --resume` continues a study once it "
            "is back, ending what the interrupted trial left running there",
        )
        return self._lost

    def _request(self, ch: AgentChannel, op: str, args: JsonObject, timeout: float) -> Any:
        try:
            return ch.request(op, args, timeout)
        except ChannelClosed as exc:
            raise self._gone(ch, exc.why) from None

    def call(self, op: str, **args: Any) -> Any:
        """Run agent operation `op` on the remote host (servelab.agent.serve.OPS)."""
        timeout = float(args.pop("_timeout", CALL_TIMEOUT_S))
        with self._lock:
            ch = self._live_channel() or self._open_channel()
            return self._request(ch, op, args, timeout)

    def _live_channel(self) -> AgentChannel | None:
        """The agent's channel (None: none opened yet); HostLost once the link dropped. An agent that ended
        under us (between two calls) is a lost host, not a reconnect: a new agent would know none of the
        servers this one held."""
        if self._lost is not None:
            raise HostLost(self._lost.message, hint=self._lost.hint)
        ch = self._channel
        if ch is not None and not ch.alive():
            raise self._gone(ch, "the agent's ssh exited")
        return ch

    # -- port forwards ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def forward(self, host: str, port: int) -> Iterator[tuple[str, int]]:
        """A local port that reaches `host:port` as seen from the remote machine (e.g. its loopback)."""
        reach = self.open_forward(host, port)
        try:
            yield reach
        finally:
            self.close_forward(host, port)

    def open_forward(self, host: str, port: int) -> tuple[str, int]:
        """The local address that reaches `host:port` over there (a port forward over the master)."""
        remote = _loopback(host)
        with self._lock:
            if (remote, port) in self._forwards:
                return ("127.0.0.1", self._forwards[(remote, port)])
            self.connect()
            for _ in range(5):  # the free port may be taken between our probe and ssh's bind
                local = _free_local_port()
                spec = f"127.0.0.1:{local}:{remote}:{port}"
                out = run_local(
                    [*self._base(), "-O", "forward", "-L", spec, *self.target.destination()], None, 20
                )
                if out.rc == 0:
                    self._forwards[(remote, port)] = local
                    return ("127.0.0.1", local)
            raise HostError(
                f"cannot forward a local port to {remote}:{port} on {self.target.raw}: {out.stderr.strip()}",
                hint="check that the sshd there allows TCP forwarding (AllowTcpForwarding yes)",
            )

    def close_forward(self, host: str, port: int) -> None:
        remote = _loopback(host)
        with self._lock:
            local = self._forwards.pop((remote, port), None)
            if local is None:
                return
            spec = f"127.0.0.1:{local}:{remote}:{port}"
            run_local([*self._base(), "-O", "cancel", "-L", spec, *self.target.destination()], None, 10)

    def check(self) -> None:
        """Raise HostLost when the connection (or the agent on it) dropped."""
        with self._lock:
            ch = self._live_channel()
            if ch is not None and self.master_pid() is None:
                raise self._gone(ch, "the master connection is gone")

    def close(self) -> None:
        """Cancel our forwards and end the agent (the master stays, for the user's next command)."""
        with self._lock:
            self._lost = None
            for h, p in list(self._forwards):
                self.close_forward(h, p)
            if self._channel is not None:
                self._drop(self._channel)

    def exit_master(self) -> None:
        """End the master connection too (tests; `servelab host disconnect`)."""
        self.close()
        run_local([*self._base(), "-O", "exit", *self.target.destination()], None, 10)


def _loopback(host: str) -> str:
    """Where to connect to a server bound to `host` (a wildcard means its loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- choosing the host -----------------------------------------------------------------------------

HOST_ENV = "SERVELAB_HOST"


def target_of(flag: str | None, study: str | None = None) -> str | None:
    """The host a command acts on: `--host`, else $SERVELAB_HOST, else the study's `[host] ssh`, else None
    (this machine). "local" names this machine explicitly."""
    for value in (flag, os.environ.get(HOST_ENV), study):
        if value:
            return None if value.strip() == "local" else value.strip()
    return None


def open_host(
    target: str | None, local: Dispatcher, *, python: str | None = None, workdir: str | None = None
) -> Host:
    """LocalHost for None (running the agent's operations through `local`), else an SshHost (not yet
    connected: the first command connects)."""
    if target is None:
        return LocalHost(local)
    return SshHost(SshTarget.parse(target), python=python or "python3", workdir=workdir)

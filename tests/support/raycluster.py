"""A real Ray cluster on this machine, on loopback only: a head and worker nodes, each its own raylet started
by its own `ray start --block` in a session of its own, so one node can be killed alone (the whole
session: raylet, its workers, what they started) exactly as a machine dying would.

The cluster lives in a network namespace of its own with only its loopback up: Ray replaces a loopback
`--node-ip-address` with the machine's interface address (and listens on every interface), so on the
host's own network it would not stay on 127.0.0.1. In the namespace the interface address is 127.0.0.1;
drivers (`servelab tune --executor ray`) run in it too (`cluster.wrap(argv)`).

Never `ray stop` here: it stops every Ray process of the machine, other jobs' included. Ray's
`cluster_utils.Cluster` binds the machine's interface address; these nodes bind 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))
# Death noticed in seconds, not the default half minute: the node-loss tests wait on it.
FAST_HEALTH = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
START_TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RayNode:
    proc: subprocess.Popen[bytes]
    log: Path
    head: bool

    @property
    def pid(self) -> int:
        return self.proc.pid

    def members(self) -> list[psutil.Process]:
        """Every live process of this node's session (raylet, its workers, what those started there)."""
        out = []
        for p in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getsid(p.pid) == self.proc.pid and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    def kill(self) -> None:
        """The node dies at once, as its machine would (SIGKILL to its whole session)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for p in self.members():
            with contextlib.suppress(psutil.Error):
                p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def node_id(self) -> str | None:
        """The Ray node id of this node's raylet (None: it is not running)."""
        for p in self.members():
            with contextlib.suppress(psutil.Error):
                if p.name() == "raylet":
                    for arg in p.cmdline():
                        if arg.startswith("--node_id="):
                            return arg.split("=", 1)[1]
        return None


@dataclass
class RayCluster:
    port: int
    temp_dir: Path
    netns: str
    nodes: list[RayNode] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"RAY_ADDRESS": self.address}

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run inside the cluster's network namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def _start(self, head: bool, gpus: int) -> RayNode:
        log = self.temp_dir.parent / f"node-{len(self.nodes)}.log"
        argv = [RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--num-gpus", str(gpus)]
        argv += ["--num-cpus", "1", "--disable-usage-stats"]
        if head:
            argv += ["--head", "--port", str(self.port), "--include-dashboard=false"]
            # No --ray-client-server-port: naming it demands `ray[client]`, and the plain `ray` the project
            # installs has no client server (nor needs one: drivers join the GCS address).
            argv += ["--temp-dir", str(self.temp_dir)]
        else:
            argv += ["--address", self.address]
        argv += ["--dashboard-agent-listen-port", str(_free_port())]
        argv += ["--metrics-export-port", str(_free_port())]
        env = {**os.environ, **FAST_HEALTH, "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                self.wrap(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        node = RayNode(proc, log, head)
        self.nodes.append(node)
        return node

    def add_node(self, gpus: int = 8) -> RayNode:
        before = self.alive_nodes()
        node = self._start(head=False, gpus=gpus)
        self._wait(lambda: self.alive_nodes() > before, f"worker node {len(self.nodes) - 1}", node)
        return node

    def alive_nodes(self) -> int:
        out = subprocess.run(
            self.wrap([sys.executable, "-c", _COUNT, self.address]),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, **self.env},
        )
        try:
            return int(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return -1

    def _wait(self, ok: object, what: str, node: RayNode) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not node.alive():
                raise RuntimeError(f"{what} exited: {node.log.read_text(errors='replace')[-3000:]}")
            if ok():  # type: ignore[operator]
                return
            time.sleep(0.5)
        raise RuntimeError(f"{what} did not join within {START_TIMEOUT_S} s: {node.log.read_text()[-3000:]}")

    def wait_dead(self, count: int, timeout: float = 60) -> None:
        """Until the head counts `count` live nodes (a killed node's death noticed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive_nodes() == count:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the head still counts {self.alive_nodes()} live nodes, not {count}")

    def stop(self) -> None:
        for node in reversed(self.nodes):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(max(0.1, deadline - time.monotonic()))
        for node in self.nodes:
            node.kill()

    def by_id(self, node_id: str) -> RayNode:
        return next(n for n in self.nodes if n.alive() and n.node_id() == node_id)

    def leftovers(self) -> list[psutil.Process]:
        """Processes of our nodes' sessions still alive (after `stop`: there must be none)."""
        return [p for n in self.nodes for p in n.members()]


_COUNT = (
    "import sys, ray\n"
    "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
    "print(sum(1 for n in ray.nodes() if n['Alive']))\n"
)


@contextlib.contextmanager
def ray_cluster(workers: int = 2, gpus: int = 8) -> Iterator[RayCluster]:
    """A head and `workers` worker nodes, `gpus` GPUs and one CPU each (declared: Ray places by them)."""
    root = Path(tempfile.mkdtemp(prefix="servelab-ray-", dir="/tmp"))  # short: Ray's socket paths
    netns = f"servelab-ray-{os.getpid()}-{root.name[-6:]}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
    cluster = RayCluster(_free_port(), root / "t", netns)
    try:
        head = cluster._start(head=True, gpus=gpus)
        cluster._wait(lambda: cluster.alive_nodes() >= 1, "the head node", head)
        for _ in range(workers):
            cluster.add_node(gpus)
        yield cluster
    finally:
        cluster.stop()
        subprocess.run(["ip", "netns", "del", netns], check=False)

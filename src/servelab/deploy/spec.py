"""What every deployment target renders: one launch record plus the service's own settings (name, user,
timeouts, GPUs, how to call servelab), so systemd, Compose and Kubernetes cannot drift apart."""

from __future__ import annotations

import math
import re
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from servelab.deploy.source import LaunchRecord
from servelab.engines import registry
from servelab.engines.base import Readiness
from servelab.errors import ConfigError
from servelab.host.processes import MARKER_ENV
from servelab.naming import deploy_marker
from servelab.redact import env_route, knowledge

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?$")  # a unit name that is also a DNS-1123 label


class _Table(BaseModel):
    model_config = ConfigDict(frozen=True)


class Timeouts(_Table):
    """defaults.toml [timeouts]: how long systemd waits for a start, a stop, a restart."""

    start_factor: float
    start_extra_s: float
    min_start_s: int
    unknown_start_s: int
    wait_ready_margin_s: int
    stop_s: float
    restart_s: int
    start_limit_burst: int


class Image(_Table):
    """defaults.toml [container.images.ENGINE]: the engine's published image and how its tag is pinned."""

    repository: str
    tag: str  # takes the trial's {version}
    published: str  # a regular expression: the versions that are published releases
    unpinned: str


class Container(_Table):
    shm_size: str
    images: dict[str, Image]


class SystemdTable(_Table):
    hardening: list[str]


class Defaults(_Table):
    """defaults.toml, read once: the numbers every target renders with, typed where they are read."""

    timeouts: Timeouts
    container: Container
    compile_cache: dict[str, list[str]]  # per engine: what `preflight --reset-compile-cache` empties
    systemd: SystemdTable


@cache
def defaults() -> Defaults:
    with open(Path(__file__).with_name("defaults.toml"), "rb") as f:
        return Defaults.model_validate(tomllib.load(f))


@dataclass(frozen=True)
class DeploySpec:
    name: str
    record: LaunchRecord
    argv: list[str]
    env: dict[str, str]  # the run's added environment plus the deployment's marker
    host: str
    port: int
    served_model: str
    readiness: Readiness
    gpu: bool  # the engine needs GPUs
    gpu_ids: list[str] | None  # CUDA_VISIBLE_DEVICES of the run (None: the first gpu_count GPUs)
    gpu_count: int
    start_timeout_s: int
    stop_timeout_s: int
    restart_s: int
    user: str | None = None
    env_file: str | None = None
    api_key_env: str | None = None  # the EnvironmentFile's variable holding the key the server demands
    servelab: list[str] = field(default_factory=list)  # how the unit calls servelab (preflight, wait-ready)
    notes: list[str] = field(default_factory=list)

    @property
    def marker(self) -> str:
        return deploy_marker(self.name)

    @property
    def local_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{host}:{self.port}"

    @property
    def api_key(self) -> str | None:
        """The key the server demands, for the install's checks: read from the EnvironmentFile (the unit
        holds none) when this user can read it."""
        if not (self.api_key_env and self.env_file):
            return None
        try:
            text = Path(self.env_file).read_text()
        except OSError:
            return None
        return api_key_in(text, self.api_key_env)

    @property
    def wait_timeout_s(self) -> int:
        return max(30, self.start_timeout_s - defaults().timeouts.wait_ready_margin_s)

    def preflight_args(self, kill_stale: bool = False) -> list[str]:
        if not self.gpu:
            gpus = "none"
        elif self.gpu_ids:
            gpus = ",".join(self.gpu_ids)
        else:  # no CUDA_VISIBLE_DEVICES: the engine takes the first TP×PP×DP GPUs
            gpus = ",".join(str(i) for i in range(max(1, self.gpu_count)))
        args = [
            "preflight",
            "--address",
            self.host,
            "--port",
            str(self.port),
            "--marker",
            self.marker,
            "--gpus",
            gpus,
            "--engine",
            self.record.engine,
        ]
        return args + (["--kill-stale"] if kill_stale else [])

    def wait_ready_args(self) -> list[str]:
        return [
            "wait-ready",
            self.local_url,
            "--engine",
            self.record.engine,
            "--model",
            self.served_model,
            "--timeout",
            str(self.wait_timeout_s),
            *(["--api-key-env", self.api_key_env] if self.api_key_env else []),
        ]


def api_key_in(text: str, name: str | None) -> str | None:
    """The value of `name` in an EnvironmentFile's text (`NAME=value` lines, `export ` and quotes allowed)."""
    if not name:
        return None
    found = None
    for line in text.splitlines():
        key, eq, value = line.strip().removeprefix("export ").partition("=")
        if eq and key.strip() == name:
            found = value.strip().strip("'\"")
    return found or None


def start_timeout(ready_s: float | None, override: float | None = None) -> int:
    """TimeoutStartSec from the measured start-up time with a margin (defaults.toml [timeouts])."""
    if override is not None:
        if override <= 0:
            raise ConfigError(f"--start-timeout must be positive (got {override:g})")
        return math.ceil(override)
    t = defaults().timeouts
    if ready_s is None:
        return t.unknown_start_s
    return max(t.min_start_s, math.ceil(ready_s * t.start_factor + t.start_extra_s))


def _gpus(record: LaunchRecord) -> tuple[list[str] | None, int]:
    ids = record.env.get("CUDA_VISIBLE_DEVICES")
    eff, cand = record.effective, record.candidate_spec
    count = 1
    for key, ckey in (("tp_size", "tp"), ("pp_size", "pp"), ("dp_size", "dp")):
        v = eff.get(key) or cand.get(ckey) or 1
        count *= int(str(v)) if str(v).isdigit() else 1
    if ids:
        listed = [x.strip() for x in ids.split(",") if x.strip()]
        return listed, len(listed)
    return None, count


def _absolute(argv: list[str], notes: list[str]) -> list[str]:
    """systemd wants an absolute executable; resolve a bare name the way the run's PATH did."""
    exe = argv[0]
    if exe.startswith("/"):
        return argv
    found = shutil.which(exe)
    if found is None:
        raise ConfigError(
            f"the run's executable {exe!r} is not on PATH here",
            hint="deploy on the host that ran the study, or install the engine",
        )
    notes.append(f"{exe} resolved to {found}")
    return [found, *argv[1:]]


def build(
    record: LaunchRecord,
    name: str | None = None,
    *,
    user: str | None = None,
    start_timeout_s: float | None = None,
    stop_timeout_s: float | None = None,
    env_file: str | None = None,
    servelab: list[str] | None = None,
) -> DeploySpec:
    """The deployment of `record` (after `source.apply_overrides`)."""
    name = name or _default_name(record)
    if not NAME_RE.match(name):
        raise ConfigError(
            f"invalid deployment name {name!r}",
            hint="use lowercase letters, digits and '-', starting and ending with a letter or digit "
            "(it names the systemd unit and the Kubernetes objects)",
        )
    engine = registry.get(record.engine)
    notes: list[str] = []
    measured = urlsplit(record.url).port if record.url else None
    if measured is not None and measured != record.port:
        notes.append(
            f"serves on port {record.port}, not the trial's {measured} (a free port picked for the study); "
            "--port changes it"
        )
    argv = _absolute(record.argv, notes)
    gpu_ids, count = _gpus(record)
    t = defaults().timeouts
    if env_file is not None and not env_file.startswith("/"):
        raise ConfigError(f"--env-file must be an absolute path (got {env_file!r})")
    env = {**record.env, MARKER_ENV: deploy_marker(name), "SPT_NOENV": "1"}
    key_env = next((n for f in knowledge().client_key_flags if (n := env_route(record.engine, f))), None)
    return DeploySpec(
        name=name,
        record=record,
        argv=argv,
        env=env,
        host=record.host,
        port=record.port,
        served_model=record.served_model,
        readiness=engine.readiness,
        gpu=engine.capabilities.gpu,
        gpu_ids=gpu_ids,
        gpu_count=count if engine.capabilities.gpu else 0,
        start_timeout_s=start_timeout(record.ready_s, start_timeout_s),
        stop_timeout_s=math.ceil(stop_timeout_s if stop_timeout_s is not None else t.stop_s),
        restart_s=t.restart_s,
        user=user,
        env_file=env_file,
        api_key_env=key_env if key_env in record.secret_env else None,
        servelab=list(servelab) if servelab else [sys.executable, "-m", "servelab"],
        notes=notes,
    )


def _default_name(record: LaunchRecord) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", f"servelab-{record.study_name}".lower()).strip("-")
    return base[:52].strip("-") or "servelab"

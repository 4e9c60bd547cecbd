"""`servelab deploy --install`: put the unit in place, start it, and prove the deployment serves what was tuned.

Steps: write /etc/systemd/system/NAME.service, `daemon-reload`, `enable`, `start` (which returns once
ExecStartPost's wait-ready passed), wait-ready again from here, `verify-output`, one benchmark at the study's
main load level, and a deployment check against the trial's digest at that level within a stated tolerance.
Without a running systemd (a container, CI) it says so before anything is written or started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from servelab.config.loading import parse_study
from servelab.deploy import ops
from servelab.deploy.records import DeploymentRepo
from servelab.deploy.spec import DeploySpec, api_key_in
from servelab.deploy.unit_state import UNIT_DIR_ENV, UnitStatus, unit_status
from servelab.engines import registry
from servelab.engines.base import LaunchSpec
from servelab.errors import ConfigError, HostError, ServelabError
from servelab.events import BenchEvent, Observer, Systemctl, TrialBench
from servelab.host.agent_op import NoArgs
from servelab.host.ops import READ, ReadRequest
from servelab.host.systemd import SYSTEMCTL_ENV, SYSTEMD_RUNTIME, systemctl_override
from servelab.host.systemd import systemctl as _systemctl
from servelab.host.transport import Host, b64, unb64
from servelab.jsontypes import JsonObject, JsonValue
from servelab.lifecycle.ready import Endpoint, wait_url_ready
from servelab.store.db import Store
from servelab.trial.outcome import Target, TrialObserver
from servelab.trial.pipeline import Trial
from servelab.trial.prepare import run_context, settings_for

UNIT_DIR = Path("/etc/systemd/system")
DEFAULT_TOLERANCE = 0.10
# metric: +1 higher is better, -1 lower is better
CHECKED: dict[str, int] = {"output_throughput": 1, "tpot_ms_p50": -1, "ttft_ms_p50": -1}


def default_unit_dir() -> Path:
    """Where units go on this host: $SERVELAB_UNIT_DIR (tests, containers), else /etc/systemd/system."""
    env = os.environ.get(UNIT_DIR_ENV)
    return Path(env) if env else UNIT_DIR


def systemd_missing(unit_dir: Path | None = None, runtime: Path | None = None) -> str | None:
    """Why units cannot be installed here (None: they can). $SERVELAB_SYSTEMCTL (a stand-in) counts as a
    running systemd."""
    unit_dir, runtime = unit_dir or default_unit_dir(), runtime or SYSTEMD_RUNTIME
    override = systemctl_override()
    if override is not None:
        if not os.access(override, os.X_OK):
            return f"${SYSTEMCTL_ENV} names {override}, which is not an executable"
    elif not runtime.is_dir():
        return f"systemd is not running on this host ({runtime} does not exist: a container or CI?)"
    elif shutil.which("systemctl") is None:
        return "systemctl is not installed"
    if not os.access(unit_dir, os.W_OK):
        return f"{unit_dir} is not writable (run as root)"
    return None


def require_systemd(
    unit_dir: Path | None = None, runtime: Path | None = None, *, reason: str | None = None, where: str = ""
) -> None:
    """Refuse (HostError) when units cannot be installed; `reason`: one found on another host (`where`)."""
    reason = reason if where else systemd_missing(unit_dir, runtime)
    if reason:
        raise HostError(
            f"--install needs systemd{' on ' + where if where else ''}: {reason}; nothing was written, "
            "installed or started",
            hint="write the unit with `servelab deploy RUN --out DIR` and install it on a host that "
            "runs systemd, or use --target compose / --target kubernetes",
        )


@dataclass
class Comparison:
    metric: str
    tuned: JsonValue  # the digests' value as stored (None: not measured on that side)
    measured: JsonValue
    ratio: float | None
    ok: bool

    def to_dict(self) -> JsonObject:
        return {
            "metric": self.metric,
            "tuned": self.tuned,
            "measured": self.measured,
            "ratio": self.ratio,
            "ok": self.ok,
        }


@dataclass
class CheckResult:
    ok: bool
    verdict: str
    tolerance: float
    level: float | None
    comparisons: list[Comparison] = field(default_factory=list)

    def to_dict(self) -> JsonObject:
        return {
            "ok": self.ok,
            "verdict": self.verdict,
            "tolerance": self.tolerance,
            "level": self.level,
            "comparisons": [c.to_dict() for c in self.comparisons],
        }


def compare(
    tuned: JsonObject | None, measured: JsonObject, tolerance: float, level: float | None
) -> CheckResult:
    """The deployment's digest against the tuned one: each checked metric within ±tolerance in the bad
    direction (faster is always fine), and no failed request."""
    if not tuned:
        return CheckResult(
            False, f"the tuned run has no result at level {level}: nothing to compare with", tolerance, level
        )
    at = "?" if level is None else f"{level:g}"
    comps = []
    for metric, sign in CHECKED.items():
        t, m = tuned.get(metric), measured.get(metric)
        if not isinstance(t, int | float) or not isinstance(m, int | float) or t <= 0:
            comps.append(Comparison(metric, t, m, None, True))  # not measured on one side: not judged
            continue
        ratio = m / t
        ok = ratio >= 1 - tolerance if sign > 0 else ratio <= 1 + tolerance
        comps.append(Comparison(metric, t, m, ratio, ok))
    bad = [c for c in comps if not c.ok]
    failed = _count(measured.get("failed"))
    if failed:
        verdict = f"NOT as tuned: {failed} request(s) failed at level {at}"
    elif bad:
        verdict = f"NOT as tuned (±{tolerance * 100:.0f} %): " + "; ".join(
            f"{c.metric} {c.measured:.4g} vs tuned {c.tuned:.4g} ({(c.ratio or 0) * 100 - 100:+.1f} %)"
            for c in bad
        )
    else:
        verdict = f"as tuned: every checked metric within ±{tolerance * 100:.0f} % at level {at}"
    return CheckResult(not failed and not bad, verdict, tolerance, level, comps)


def _count(value: JsonValue) -> int:
    """A digest's count as `int()` reads it (None, 0 and a missing one: 0)."""
    if not value:
        return 0
    if isinstance(value, bool | int | float | str):
        return int(value)
    raise TypeError(f"int() argument must be a string or a real number, not {type(value).__name__!r}")


def journal_tail(name: str, lines: int = 40) -> str:
    exe = shutil.which("journalctl")
    if exe is None:
        return ""
    try:
        return subprocess.run(
            [exe, "-u", f"{name}.service", "-n", str(lines), "--no-pager"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def write_unit(unit_dir: Path, name: str, text: str) -> Path:
    """NAME.service in `unit_dir`, mode 0644 (a unit holds no secret: those are in its EnvironmentFile)."""
    path = unit_dir / f"{name}.service"
    path.write_text(text)
    path.chmod(0o644)
    return path


def write_env_file(path: Path, content: bytes) -> None:
    """The unit's EnvironmentFile, mode 0600 from its creation on (never readable by others, not even
    briefly): written to a private temporary file next to it, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.servelab-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class UnitHost:
    """Where the unit is installed: this machine (the module's UNIT_DIR / SYSTEMD_RUNTIME / _systemctl, which
    the tests replace) or a remote host, through its agent's `deploy_*` operations (servelab.agent.ops_deploy).
    The server is reached from here: directly, or through a port forward."""

    def __init__(self, host: Host | None = None, unit_dir: Path | None = None) -> None:
        self.host = host if host is not None and not host.is_local else None
        self.unit_dir = unit_dir

    @property
    def where(self) -> str:
        return "" if self.host is None else self.host.name

    def missing(self) -> str | None:
        if self.host is None:
            return systemd_missing(self.unit_dir)
        return ops.DEPLOY_SYSTEMD_MISSING.call(self.host, NoArgs())

    def write_unit(self, name: str, text: str) -> str:
        if self.host is None:
            return str(write_unit(self.unit_dir or default_unit_dir(), name, text))
        return ops.DEPLOY_WRITE_UNIT.call(self.host, ops.WriteUnitRequest(name=name, text=text))

    def write_env_file(self, path: str, content: bytes) -> None:
        """Only for a remote host (locally the file is the user's own): its content travels in the agent's
        request on its stdin, never on a command line."""
        assert self.host is not None
        ops.DEPLOY_WRITE_ENV_FILE.call(self.host, ops.WriteEnvFileRequest(path=path, data=b64(content)))

    def systemctl(self, *args: str, timeout: float) -> tuple[int, str, str]:
        if self.host is None:
            res = _systemctl(*args, timeout=timeout)
            return res.returncode, res.stdout, res.stderr
        req = ops.SystemctlRequest(args=list(args), timeout=timeout)
        out = ops.DEPLOY_SYSTEMCTL.call(self.host, req, timeout=timeout + 30)
        return out.rc, out.stdout, out.stderr

    def journal(self, name: str) -> str:
        if self.host is None:
            return journal_tail(name)
        return ops.DEPLOY_JOURNAL.call(self.host, ops.JournalRequest(name=name))

    def status(self, name: str) -> UnitStatus:
        if self.host is None:
            return unit_status(name, runtime=SYSTEMD_RUNTIME, run=_systemctl)
        return ops.DEPLOY_UNIT_STATUS.call(self.host, ops.UnitRequest(name=name))

    def reach(self, host: str, port: int) -> contextlib.AbstractContextManager[tuple[str, int]]:
        """host:port as the machine the unit runs on sees it, reachable from here."""
        if self.host is None:
            return contextlib.nullcontext(("127.0.0.1" if host in ("0.0.0.0", "", "::") else host, port))
        return self.host.forward(host, port)


async def install(
    spec: DeploySpec,
    unit_text: str,
    store: Store,
    dep_id: int,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    unit_dir: Path | None = None,
    observe: Observer | None = None,
    host: Host | None = None,
    env_content: bytes | None = None,
) -> JsonObject:
    """Install and start the unit, then verify and benchmark it; returns the steps and the check.

    The verify and benchmark steps are the trial pipeline's (`servelab.trial.pipeline.Trial`), attached to the server
    systemd started: the same verify-output arguments, workload, telemetry and level digest the study
    measured the tuned result with. The unit holds no secret (they are in its EnvironmentFile): mode 0644.

    `host` (remote): the unit file, the EnvironmentFile (`env_content`, mode 0600) and systemctl are over
    there; the checks run from here through a port forward; the records land in this machine's store."""
    box = UnitHost(host, unit_dir)
    require_systemd(unit_dir, reason=box.missing(), where=box.where)
    notify: Observer = observe or (lambda _e: None)
    repo = DeploymentRepo(store)
    steps: list[JsonValue] = []
    api_key = spec.api_key
    if box.host is not None and spec.env_file:
        if env_content is not None:
            box.write_env_file(spec.env_file, env_content)
            steps.append({"step": "write", "path": spec.env_file, "mode": "0600"})
            api_key = api_key_in(env_content.decode("utf-8", "replace"), spec.api_key_env)
        else:  # the user's file over there: read it for the key the checks need, when we may
            got = READ.call(box.host, ReadRequest(path=spec.env_file))
            text = unb64(got.data).decode("utf-8", "replace") if got.exists else ""
            api_key = api_key_in(text, spec.api_key_env)
    path = box.write_unit(spec.name, unit_text)
    steps.append({"step": "write", "path": path})
    for args in (("daemon-reload",), ("enable", f"{spec.name}.service"), ("start", f"{spec.name}.service")):
        notify(Systemctl(list(args)))
        rc, _out, err = box.systemctl(*args, timeout=spec.start_timeout_s + 60 if args[0] == "start" else 120)
        steps.append({"step": "systemctl " + " ".join(args), "rc": rc, "stderr": err.strip()})
        if rc != 0:
            repo.set_status(dep_id, "failed", installed=args[0] != "daemon-reload")
            on = f" on {box.where}" if box.where else ""
            raise HostError(
                f"systemctl {' '.join(args)} failed{on}: {err.strip()}\n{box.journal(spec.name)}",
                hint=f"`journalctl -u {spec.name}`{on} shows the unit's log; the ExecStartPre/ExecStartPost "
                "lines say whether preflight or wait-ready refused",
            )
    repo.set_status(dep_id, "installed", installed=True)
    engine = registry.get(spec.record.engine)
    try:
        study = parse_study(spec.record.study)
    except ServelabError as exc:
        raise ConfigError(
            f"the stored study of {spec.record.ref} no longer validates: {exc.message}"
        ) from exc
    with box.reach(spec.host, spec.port) as (h, p):
        endpoint = Endpoint(
            LaunchSpec([], {}, h, p, spec.served_model),
            time.monotonic(),
            log_path=f"`journalctl -u {spec.name}`" + (f" on {box.where}" if box.where else ""),
        )
        ready = await wait_url_ready(endpoint, engine.readiness, spec.wait_timeout_s, engine.name, api_key)
        steps.append({"step": "wait-ready", **ready.to_dict()})
        target = Target(f"http://{h}:{p}", spec.served_model, api_key=api_key)
        trial = Trial(study, engine, store, _Forward(notify))
        vres = await trial.verify(target)
        steps.append({"step": "verify-output", "ok": vres.ok})
        level = spec.record.main_level
        cand = next((c for c in study.candidates if c.label() == spec.record.candidate), None)
        context = run_context(study, settings_for(study, cand)) if cand is not None else None
        (main,) = (await trial.bench(target, [level or 0.0], context=context)).levels
    measured = main.digest
    check = compare(spec.record.main_digest(), measured, tolerance, level)
    if not vres.ok:
        check.ok = False
        check.verdict = (
            "NOT as tuned: verify-output failed ("
            + ", ".join(c.name for c in vres.failures)
            + "); "
            + check.verdict
        )
    repo.add_check(
        dep_id,
        check.ok,
        tolerance,
        level,
        spec.record.main_digest(),
        measured,
        vres.to_dict(),
        main.bench_run_id,
        check.verdict,
    )
    repo.set_status(dep_id, "ready" if check.ok else "degraded", installed=True)
    return {
        "unit": path,
        "host": box.where or None,
        "steps": steps,
        "check": check.to_dict(),
        "bench_run": main.bench_uid,
        "status": box.status(spec.name).to_json(),
    }


class _Forward(TrialObserver):
    """The trial's benchmark progress, as `install`'s observer hears it (`bench_*` events)."""

    def __init__(self, notify: Observer) -> None:
        self.notify = notify

    def bench_event(self, event: BenchEvent) -> None:
        self.notify(TrialBench(None, event))

"""`servelab deploy --install`: put the unit in place, start it, and prove the deployment serves what was tuned.

Steps: write /etc/systemd/system/NAME.service, `daemon-reload`, `enable`, `start` (which returns once
ExecStartPost's wait-ready passed), wait-ready again from here, `verify-output`, one benchmark at the study's
main load level, and a deployment check against the trial's digest at that level within a stated tolerance.
Without a running systemd (a container, CI) it says so before anything is written or started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab import lifecycle
from servelab.config import parse_study
from servelab.deploy.records import DeploymentRepo
from servelab.deploy.spec import DeploySpec
from servelab.deploy.unit_state import SYSTEMD_RUNTIME, unit_status
from servelab.deploy.unit_state import systemctl as _systemctl
from servelab.engines import registry
from servelab.engines.base import LaunchSpec
from servelab.errors import ConfigError, HostError, ServelabError
from servelab.store.db import Store
from servelab.trial import Target, Trial, TrialObserver, run_context, settings_for

Observer = Callable[[str, dict[str, Any]], None]
UNIT_DIR = Path("/etc/systemd/system")
DEFAULT_TOLERANCE = 0.10
# metric: +1 higher is better, -1 lower is better
CHECKED: dict[str, int] = {"output_throughput": 1, "tpot_ms_p50": -1, "ttft_ms_p50": -1}


def systemd_missing(unit_dir: Path | None = None, runtime: Path | None = None) -> str | None:
    """Why units cannot be installed here (None: they can)."""
    unit_dir, runtime = unit_dir or UNIT_DIR, runtime or SYSTEMD_RUNTIME
    if not runtime.is_dir():
        return f"systemd is not running on this host ({runtime} does not exist: a container or CI?)"
    if shutil.which("systemctl") is None:
        return "systemctl is not installed"
    if not os.access(unit_dir, os.W_OK):
        return f"{unit_dir} is not writable (run as root)"
    return None


def require_systemd(unit_dir: Path | None = None, runtime: Path | None = None) -> None:
    reason = systemd_missing(unit_dir, runtime)
    if reason:
        raise HostError(
            f"--install needs systemd: {reason}; nothing was written, installed or started",
            hint="write the unit with `servelab deploy RUN --out DIR` and install it on a host that "
            "runs systemd, or use --target compose / --target kubernetes",
        )


@dataclass
class Comparison:
    metric: str
    tuned: float | None
    measured: float | None
    ratio: float | None
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class CheckResult:
    ok: bool
    verdict: str
    tolerance: float
    level: float | None
    comparisons: list[Comparison] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verdict": self.verdict,
            "tolerance": self.tolerance,
            "level": self.level,
            "comparisons": [c.to_dict() for c in self.comparisons],
        }


def compare(
    tuned: dict[str, Any] | None, measured: dict[str, Any], tolerance: float, level: float | None
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
    failed = int(measured.get("failed") or 0)
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


def journal_tail(name: str, lines: int = 40) -> str:
    exe = shutil.which("journalctl")
    if exe is None:
        return ""
    try:
        return subprocess.run(
            [exe, "-u", f"{name}.service", "-n", str(lines), "--no-pager"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


async def install(
    spec: DeploySpec,
    unit_text: str,
    store: Store,
    dep_id: int,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    unit_dir: Path | None = None,
    observe: Observer | None = None,
) -> dict[str, Any]:
    """Install and start the unit, then verify and benchmark it; returns the steps and the check.

    The verify and benchmark steps are the trial pipeline's (`servelab.trial.Trial`), attached to the server
    systemd started: the same verify-output arguments, workload, telemetry and level digest the study
    measured the tuned result with. The unit holds no secret (they are in its EnvironmentFile): mode 0644."""
    require_systemd(unit_dir)
    unit_dir = unit_dir or UNIT_DIR
    notify: Observer = observe or (lambda _e, _d: None)
    repo = DeploymentRepo(store)
    steps: list[dict[str, Any]] = []
    path = unit_dir / f"{spec.name}.service"
    path.write_text(unit_text)
    path.chmod(0o644)
    steps.append({"step": "write", "path": str(path)})
    for args in (("daemon-reload",), ("enable", f"{spec.name}.service"), ("start", f"{spec.name}.service")):
        notify("systemctl", {"args": list(args)})
        res = _systemctl(*args, timeout=spec.start_timeout_s + 60 if args[0] == "start" else 120)
        steps.append(
            {"step": "systemctl " + " ".join(args), "rc": res.returncode, "stderr": res.stderr.strip()}
        )
        if res.returncode != 0:
            repo.set_status(dep_id, "failed", installed=args[0] != "daemon-reload")
            raise HostError(
                f"systemctl {' '.join(args)} failed: {res.stderr.strip()}\n{journal_tail(spec.name)}",
                hint=f"`journalctl -u {spec.name}` shows the unit's log; the ExecStartPre/ExecStartPost "
                "lines say whether preflight or wait-ready refused",
            )
    repo.set_status(dep_id, "installed", installed=True)
    engine = registry.get(spec.record.engine)
    endpoint = lifecycle.Endpoint(
        LaunchSpec([], {}, spec.host, spec.port, spec.served_model),
        time.monotonic(),
        log_path=f"`journalctl -u {spec.name}`",
    )
    ready = await lifecycle.wait_url_ready(
        endpoint, engine.readiness, spec.wait_timeout_s, engine.name, spec.api_key
    )
    steps.append({"step": "wait-ready", **ready.to_dict()})
    try:
        study = parse_study(spec.record.study)
    except ServelabError as exc:
        raise ConfigError(
            f"the stored study of {spec.record.ref} no longer validates: {exc.message}"
        ) from exc
    target = Target(spec.local_url, spec.served_model, api_key=spec.api_key)
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
            + ", ".join(vres.to_dict().get("failed", []))
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
        "unit": str(path),
        "steps": steps,
        "check": check.to_dict(),
        "bench_run": main.bench_uid,
        "status": unit_status(spec.name, runtime=SYSTEMD_RUNTIME, run=_systemctl),
    }


class _Forward(TrialObserver):
    """The trial's benchmark progress, as `install`'s observer hears it (`bench_*` events)."""

    def __init__(self, notify: Observer) -> None:
        self.notify = notify

    def bench_event(self, event: str, data: dict[str, Any]) -> None:
        self.notify(f"bench_{event}", data)

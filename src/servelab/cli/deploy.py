"""`servelab deploy`, `servelab preflight`, `servelab wait-ready` (see docs/cli/deploy.md)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from servelab import arguments as A
from servelab.agent.serve import DISPATCHER
from servelab.cli.args import option
from servelab.cli.output import emit, host_option, stderr, stdout
from servelab.errors import ConfigError
from servelab.events import Event, Systemctl
from servelab.redact import redact

TARGETS = ("systemd", "compose", "kubernetes")


def remote_python_option(fn: Any) -> Any:
    return click.option(
        "--remote-python",
        envvar="SERVELAB_REMOTE_PYTHON",
        default=None,
        metavar="PATH",
        help="With --host: the interpreter that has servelab on that host (default: the study's "
        "[host] python, else python3).",
    )(fn)


def _pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, value = v.partition("=")
        if not sep or not name:
            raise ConfigError(f"{what} {v!r} is not NAME=VALUE", hint=f"e.g. {what} HF_TOKEN=hf_...")
        out[name] = value
    return out


@click.command("deploy")
@option(A.DeployRun)
@option(A.DeployTarget, type=click.Choice(TARGETS), default="systemd", show_default=True)
@option(A.DeployName, default=None)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write the file (default: $SERVELAB_HOME/deployments/NAME).",
)
@click.option(
    "--install",
    is_flag=True,
    help="systemd only: install, enable and start the unit, then verify and "
    "benchmark it against the tuned result.",
)
@click.option(
    "--dry-run", is_flag=True, help="Print what would be written and done; write and record nothing."
)
@option(A.DeployUser, default=None)
@option(A.DeployPort, type=click.IntRange(1, 65535), default=None)
@click.option(
    "--env",
    "env_values",
    multiple=True,
    metavar="NAME=VALUE",
    help="Set an environment variable (never a secret: those go in --env-file). Repeatable.",
)
@click.option(
    "--arg",
    "arg_values",
    multiple=True,
    metavar="FLAG=VALUE",
    help="Replace the value of an engine flag (never a secret: those go in --env-file). Repeatable.",
)
@option(A.EnvFile, default=None)
@click.option(
    "--start-timeout",
    type=float,
    default=None,
    help="TimeoutStartSec in seconds (default: measured start-up × 3 + 120, at least 300).",
)
@click.option("--stop-timeout", type=float, default=None, help="TimeoutStopSec in seconds (default 60).")
@click.option("--kill-stale", is_flag=True, help="The unit's preflight ends leftover processes in its way.")
@click.option("--no-hardening", is_flag=True, help="Leave out the systemd hardening lines.")
@click.option(
    "--image", default=None, help="Container image (default: the engine's image at the measured version)."
)
@click.option("--shm-size", default=None, help="/dev/shm size for containers (default 16g).")
@click.option("--namespace", default=None, help="Kubernetes namespace.")
@click.option(
    "--tolerance",
    type=float,
    default=0.10,
    show_default=True,
    help="--install: largest relative shortfall against the tuned result that still passes.",
)
@host_option
@remote_python_option
@click.option("--json", "as_json", is_flag=True, help="The result as JSON (keys in docs/cli/deploy.md).")
def deploy_cmd(
    run: str, target: str, out_dir: Path | None, install: bool, dry_run: bool, as_json: bool, **opts: Any
) -> None:
    """Deploy RUN (STUDY for its winner, STUDY:CANDIDATE, or trial:ID) as a systemd unit, a Docker Compose
    service or a Kubernetes Deployment + Service, from the exact command line and environment it ran with."""
    from servelab.deploy import install as inst
    from servelab.deploy import source
    from servelab.host import transport
    from servelab.store import open_store

    if install and target != "systemd":
        raise ConfigError(
            f"--install installs systemd units, not {target}",
            hint="apply the file yourself: `docker compose -f FILE up -d` / `kubectl apply -f FILE`",
        )
    if opts["host"] and not install:
        raise ConfigError(
            "--host applies to --install (the unit file is written here)",
            hint="add --install to install and check the unit on that host, or copy the file there yourself",
        )
    if not 0 <= opts["tolerance"] < 1:
        raise ConfigError(f"--tolerance must be in [0, 1) (got {opts['tolerance']})")
    host: transport.Host | None = None
    with open_store() as store:
        stored = source.resolve(store, run)  # as stored: secrets masked, so safe to show and record
        study_host = _study_host(stored.study)
        where = transport.target_of(opts["host"], study_host.get("ssh")) if install else None
        if install and not dry_run and where is None:
            inst.require_systemd()  # before anything is written or recorded
        try:
            servelab_cmd = None
            if where is not None and not dry_run:
                host = transport.open_host(
                    where,
                    DISPATCHER,
                    python=opts["remote_python"] or study_host.get("python"),
                    workdir=study_host.get("workdir"),
                )
                from servelab.deploy.ops import DEPLOY_SYSTEMD_MISSING
                from servelab.host.agent_op import NoArgs
                from servelab.host.ops import HELLO, HelloRequest

                inst.require_systemd(reason=DEPLOY_SYSTEMD_MISSING.call(host, NoArgs()), where=host.name)
                servelab_cmd = [HELLO.call(host, HelloRequest()).python, "-m", "servelab"]
            result = _deploy(
                store, stored, target, out_dir, install, dry_run, opts, host, where, servelab_cmd, as_json
            )
        finally:
            if host is not None:
                host.close()
    emit(result, as_json, _render_result)
    if result["install"] and not result["install"]["check"]["ok"]:
        sys.exit(1)


def _study_host(study: dict[str, Any]) -> dict[str, Any]:
    """The stored study's [host] table (ssh, python, workdir), as stored."""
    h = study.get("host") if isinstance(study, dict) else None
    return h if isinstance(h, dict) else {}


def _deploy(
    store: Any,
    stored: Any,
    target: str,
    out_dir: Path | None,
    install: bool,
    dry_run: bool,
    opts: dict[str, Any],
    host: Any,
    where: str | None,
    servelab_cmd: list[str] | None,
    as_json: bool,
) -> dict[str, Any]:
    from servelab.deploy import install as inst
    from servelab.deploy import source
    from servelab.deploy import spec as specmod
    from servelab.deploy.records import DeploymentRepo
    from servelab.paths import data_home

    rec = source.apply_overrides(
        stored,
        env=_pairs(opts["env_values"], "--env"),
        args=_pairs(opts["arg_values"], "--arg"),
        port=opts["port"],
        env_file=opts["env_file"] is not None,
    )
    spec = specmod.build(
        rec,
        opts["name"],
        user=opts["user"],
        start_timeout_s=opts["start_timeout"],
        stop_timeout_s=opts["stop_timeout"],
        env_file=opts["env_file"],
        servelab=servelab_cmd,
    )
    text, filename, notes = _render(spec, target, opts)
    out = (out_dir or data_home() / "deployments" / spec.name) / filename
    env_content = None
    if where is not None and spec.env_file:
        try:
            env_content = Path(spec.env_file).read_bytes()
            notes.append(f"--env-file {spec.env_file}: copied to {where} (mode 0600)")
        except OSError:
            notes.append(f"--env-file {spec.env_file} is not readable here: it must exist on {where}")
    result: dict[str, Any] = {
        "name": spec.name,
        "target": target,
        "host": where,
        "source": redact(stored.to_dict()),
        "file": str(out),
        "dry_run": dry_run,
        "start_timeout_s": spec.start_timeout_s,
        "stop_timeout_s": spec.stop_timeout_s,
        "url": spec.local_url,
        "notes": notes,
        "verify": None,
        "install": None,
    }
    if dry_run:
        result["content"] = text
        result["actions"] = _actions(spec, target, out, install, where)
        return result
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if target == "systemd":
        result["verify"] = _verify(out)
    dep_id = DeploymentRepo(store).add(
        spec.name,
        target,
        f"{rec.study_uid}:{rec.candidate}",
        rec.trial_id,
        str(out),
        {**result, "argv": stored.argv, "env": sorted(spec.env)},
    )
    result["deployment_id"] = dep_id
    if install:

        def observe(event: Event) -> None:
            if not as_json and isinstance(event, Systemctl):
                on = f" (on {where})" if where else ""
                stderr.print(f"systemctl {' '.join(event.args)}{escape(on)}")

        result["install"] = asyncio.run(
            inst.install(
                spec,
                text,
                store,
                dep_id,
                tolerance=opts["tolerance"],
                observe=observe,
                host=host,
                env_content=env_content,
            )
        )
    return result


def _render(spec: Any, target: str, opts: dict[str, Any]) -> tuple[str, str, list[str]]:
    from servelab.deploy import compose, containers, kubernetes, systemd

    if target == "systemd":
        return (
            systemd.render_unit(spec, kill_stale=opts["kill_stale"], hardening=not opts["no_hardening"]),
            f"{spec.name}.service",
            list(spec.notes),
        )
    cp = containers.plan(spec, opts["image"], opts["shm_size"])
    if target == "compose":
        return compose.dump(compose.render(spec, cp)), "compose.yaml", cp.notes
    notes = [*cp.notes, "--host is 0.0.0.0 in the pod (probes and the Service reach the pod's IP)"]
    if spec.user:
        notes.append("--user is not applied to Kubernetes (set securityContext.runAsUser to a numeric uid)")
    return kubernetes.dump(kubernetes.render(spec, cp, opts["namespace"])), f"{spec.name}.k8s.yaml", notes


def _verify(path: Path) -> dict[str, Any]:
    from servelab.deploy import systemd
    from servelab.errors import HostError

    try:
        problems = systemd.verify_unit(path)
    except HostError as exc:
        return {"ok": None, "problems": [], "note": exc.message}
    return {"ok": not problems, "problems": problems}


def _actions(spec: Any, target: str, out: Path, install: bool, where: str | None = None) -> list[str]:
    acts = [f"write {out}", "record the deployment in the store"]
    if target == "systemd":
        acts.append(f"systemd-analyze verify {out}")
    if install:
        on = f" on {where}" if where else ""
        remote = [
            *(
                [f"write the EnvironmentFile {spec.env_file}{on} (mode 0600)"]
                if where and spec.env_file
                else []
            ),
            f"write /etc/systemd/system/{spec.name}.service{on}",
            f"systemctl daemon-reload{on}",
            f"systemctl enable {spec.name}.service{on}",
            f"systemctl start {spec.name}.service{on}",
        ]
        via = f" through a port forward to {where}" if where else ""
        acts += [
            *remote,
            f"wait-ready {spec.local_url}{via}",
            "verify-output",
            f"benchmark at the study's main level ({spec.record.main_level})",
            "compare with the tuned result and record the check",
        ]
    return acts


def _render_result(d: dict[str, Any]) -> None:
    src = d["source"]
    stdout.print(
        f"[bold]{escape(d['name'])}[/bold] ({d['target']}) from study {escape(src['study'])}, "
        f"candidate {escape(src['candidate'])}, trial {src['trial']}: {escape(src['engine'])} "
        f"{escape(str(src['engine_version'] or '?'))}, model {escape(src['model_path'])}"
    )
    stdout.print(
        f"serves {escape(d['url'])}; start timeout {d['start_timeout_s']} s, stop timeout "
        f"{d['stop_timeout_s']} s"
    )
    for n in d["notes"]:
        stdout.print(f"note: {escape(n)}")
    if d["dry_run"]:
        stdout.print(f"[yellow]dry run[/yellow]: nothing written. Would: {escape('; '.join(d['actions']))}")
        stdout.print(escape(d["content"]), soft_wrap=True)
        return
    stdout.print(f"wrote {escape(d['file'])}")
    v = d.get("verify")
    if v is not None:
        if v["ok"] is None:
            stdout.print(f"[yellow]not verified[/yellow]: {escape(v['note'])}")
        elif v["ok"]:
            stdout.print("systemd-analyze verify: [green]ok[/green]")
        else:
            stdout.print(
                "[red]systemd-analyze verify found problems:[/red]\n  " + escape("\n  ".join(v["problems"]))
            )
    ins = d.get("install")
    if ins:
        c = ins["check"]
        color = "green" if c["ok"] else "red"
        on = f" on {ins['host']}" if ins.get("host") else ""
        stdout.print(
            f"installed {escape(ins['unit'])}{escape(on)}; state {escape(str(ins['status'].get('state')))}"
        )
        stdout.print(f"deployment check: [{color}]{escape(c['verdict'])}[/{color}]")
    elif d["target"] == "systemd":
        stdout.print(
            f"install: sudo cp {escape(d['file'])} /etc/systemd/system/ && sudo systemctl daemon-reload && "
            f"sudo systemctl enable --now {escape(d['name'])}.service (or servelab deploy --install)"
        )


@click.command("preflight")
@click.option(
    "--address", default="127.0.0.1", show_default=True, help="The address the server will listen on."
)
@click.option(
    "--port", type=click.IntRange(1, 65535), required=True, help="The port the server will listen on."
)
@click.option(
    "--gpus", default="all", show_default=True, help="GPUs the server uses: all, none, or indices 0,1."
)
@click.option(
    "--marker", default="", help="This unit's SERVELAB_RUN value (its own leftovers count as stale)."
)
@click.option("--engine", default=None, help="Engine name (picks the compile caches to reset).")
@click.option(
    "--kill-stale", is_flag=True, help="End the processes in the way that are not live servelab units."
)
@click.option("--reset-compile-cache", is_flag=True, help="Empty the engine's compile caches.")
@click.option(
    "--compile-cache", "compile_caches", multiple=True, help="A compile cache directory (repeatable)."
)
@host_option
@remote_python_option
@click.option("--json", "as_json", is_flag=True)
def preflight_cmd(as_json: bool, host: str | None, remote_python: str | None, **opts: Any) -> None:
    """Refuse to start a server while its port or GPUs are held, and clean stale /dev/shm segments.

    Exits 1 with the reasons when the server must not start (systemd's ExecStartPre then stops the start).
    With --host, everything is checked (and with --kill-stale cleaned) on that host, by the same rules."""
    from servelab.deploy.ops import PREFLIGHT
    from servelab.deploy.preflight import PreflightRequest, run_preflight
    from servelab.host import transport

    req = PreflightRequest(
        address=opts["address"],
        port=opts["port"],
        gpus=opts["gpus"],
        marker=opts["marker"] or os.environ.get("SERVELAB_RUN", ""),
        kill_stale=opts["kill_stale"],
        engine=opts["engine"],
        reset_compile_cache=opts["reset_compile_cache"],
        compile_caches=list(opts["compile_caches"]),
    )
    where = transport.target_of(host)
    if where is None:
        report = run_preflight(req).model_dump(mode="json")
    else:
        box = transport.open_host(where, DISPATCHER, python=remote_python)
        try:
            report = PREFLIGHT.call(box, req).model_dump(mode="json")
        finally:
            box.close()
        report["on"] = where
    emit(report, as_json, _render_preflight)
    if not report["ok"]:
        sys.exit(1)


def _render_preflight(d: dict[str, Any]) -> None:
    for k in d["killed"]:
        stdout.print(
            f"ended pid {k['pid']} ({escape(k['cmdline'][:100])}) with {k['killed']}: it held {k['what']}"
        )
    if d["shm_removed"]:
        stdout.print(f"removed stale /dev/shm segments: {escape(', '.join(d['shm_removed']))}")
    if d["shm_held"]:
        stdout.print(f"/dev/shm segments in use (left alone): {escape(', '.join(d['shm_held']))}")
    for c in d["caches_reset"]:
        stdout.print(f"reset compile cache {escape(c)}")
    for n in d["notes"]:
        stdout.print(f"note: {escape(n)}")
    if d["ok"]:
        stdout.print(f"[green]preflight ok[/green]: port {d['host']}:{d['port']} free, GPUs {d['gpus']} free")
    else:
        stdout.print("[red]preflight refuses to start the server:[/red]")
        for r in d["refusals"]:
            stdout.print(f"  - {escape(r)}")


@click.command("wait-ready")
@click.argument("url")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds to wait.",
)
@click.option(
    "--engine", default=None, help="Engine whose readiness rule applies (default: /health 200 + model)."
)
@click.option("--model", required=True, help="The served model name /v1/models must list.")
@click.option(
    "--pid",
    type=int,
    envvar="MAINPID",
    default=None,
    help="Stop at once if this process exits (default: systemd's $MAINPID when set).",
)
@click.option("--api-key", envvar="SERVELAB_API_KEY", default=None, help="Bearer token; never stored.")
@click.option(
    "--api-key-env",
    metavar="NAME",
    default=None,
    help="Read the bearer token from this environment variable (a unit's EnvironmentFile defines it).",
)
@click.option(
    "--no-completion", is_flag=True, help="Skip the real completion after the engine's rule passed."
)
@host_option
@click.option("--json", "as_json", is_flag=True)
def wait_ready_cmd(
    url: str,
    timeout_s: float,
    engine: str | None,
    model: str,
    pid: int | None,
    api_key: str | None,
    api_key_env: str | None,
    no_completion: bool,
    host: str | None,
    as_json: bool,
) -> None:
    """Wait until the server at URL is ready by its engine's rule and answers a real completion.

    With --host, URL is as that machine sees it (its 127.0.0.1 is its own), reached through an SSH port
    forward. Exits 0 when ready, 1 when it timed out or the process exited (the reason on stderr)."""
    import dataclasses
    import time
    from urllib.parse import urlsplit

    from servelab.engines import registry
    from servelab.engines.base import LaunchSpec, Readiness
    from servelab.host import transport
    from servelab.lifecycle.ready import Endpoint, wait_url_ready

    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # urllib's "Port out of range 0-65535" does not say which argument
        raise ConfigError(
            f"{url!r}: the port must be a number from 1 to 65535", hint="e.g. http://127.0.0.1:8000"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or not port:
        raise ConfigError(f"{url!r} is not an http(s)://HOST:PORT URL", hint="e.g. http://127.0.0.1:8000")
    if api_key_env:
        api_key = os.environ.get(api_key_env) or api_key
        if not api_key:
            raise ConfigError(
                f"--api-key-env {api_key_env}: no such variable in the environment",
                hint="define it in the unit's EnvironmentFile (servelab deploy --env-file)",
            )
    readiness = registry.get(engine).readiness if engine else Readiness()
    target = transport.target_of(host)
    if target is not None and pid:
        raise ConfigError(
            f"--pid {pid} names a process of this machine; with --host {target} it cannot be watched",
            hint="leave --pid out (and unset MAINPID) when waiting for a server on another machine",
        )
    h = transport.open_host(target, DISPATCHER)
    try:
        with h.forward(parts.hostname, port) as (reach_host, reach_port):
            ep = Endpoint(
                LaunchSpec([], {}, reach_host, reach_port, model, scheme=parts.scheme),
                time.monotonic(),
                pid=pid or None,
            )
            report = asyncio.run(
                wait_url_ready(ep, readiness, timeout_s, engine, api_key, completion=not no_completion)
            )
    finally:
        h.close()
    if not h.is_local:
        report = dataclasses.replace(report, url=url.rstrip("/"))
    ready = report
    emit(
        ready.to_dict(),
        as_json,
        lambda _d: stdout.print(  # the typed report itself, rounded as its JSON is
            f"[green]ready[/green]: {escape(ready.url)} serves {escape(ready.served_model)} after "
            f"{round(ready.waited_s, 3):.1f} s "
            f"({', '.join(f'{k} {round(v, 3):.1f} s' for k, v in ready.phases.items())})"
        ),
    )

"""`servelab status` (what is true right now) and `servelab doctor` (host checks with fixes); docs/cli/status.md."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from servelab import arguments as A
from servelab.cli.args import option
from servelab.cli.output import emit, host_option, printable, stdout
from servelab.cli.remote import open_cli_host, remote_python_option
from servelab.host.transport import Completed, Host

_STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}


def _render_gpus(g: dict[str, Any]) -> None:
    if not g["available"]:
        stdout.print(f"[bold]GPUs:[/bold] {escape(g['note'])}")
        return
    src = f" ({g['source']}{', driver ' + g['driver_version'] if g.get('driver_version') else ''})"
    t = Table(
        "gpu",
        "name",
        "memory MiB",
        "power W",
        "util %",
        "temp C",
        "PCIe",
        "state",
        "processes",
        title=f"GPUs{src}",
        title_justify="left",
    )
    for x in g["gpus"]:
        mem = f"{x['memory_used_mib']}/{x['memory_total_mib']}"
        power = f"{x['power_w']}/{x['power_limit_w']}" if x["power_w"] is not None else "-"
        pcie = f"gen{x['pcie_gen']} x{x['pcie_width']}" if x["pcie_gen"] else "-"
        state = (
            "idle" if x["idle"] else ("memory held by nothing alive" if x["orphaned_memory"] else "in use")
        )
        procs = (
            "; ".join(
                f"{p['pid']} {p.get('owner') or ''} {p['name']} [{p.get('belongs_to', '')}]".strip()
                for p in x["processes"]
            )
            or "-"
        )
        t.add_row(
            str(x["index"]),
            escape(x["name"]),
            mem,
            power,
            str(x["utilization_pct"]),
            str(x["temperature_c"]),
            pcie,
            state,
            escape(procs),
        )
    stdout.print(t)


class _Warming:
    """A remote host whose agent starts in the background (SSH session, interpreter, imports: most of a
    `status --host`) while this process imports and reads its store; the first use waits for it and
    raises what the start raised (a bad target fails once, not twice)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="servelab-agent-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        from servelab.host.agent_op import NoArgs
        from servelab.host.ops import OBSERVE_READY

        try:
            OBSERVE_READY.call(self.host, NoArgs())
        except BaseException as exc:  # re-raised in the command's thread by _ready
            self._error = exc

    def _ready(self) -> None:
        self._thread.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def is_local(self) -> bool:
        return self.host.is_local

    def run(self, argv: list[str], *, input: bytes | None = None, timeout: float = 60.0) -> Completed:
        self._ready()
        return self.host.run(argv, input=input, timeout=timeout)

    def call(self, op: str, **args: Any) -> Any:
        self._ready()
        return self.host.call(op, **args)

    def forward(self, host: str, port: int) -> AbstractContextManager[tuple[str, int]]:
        self._ready()
        return self.host.forward(host, port)

    def check(self) -> None:
        self._ready()
        self.host.check()

    def close(self) -> None:
        self._thread.join()
        self.host.close()


@contextmanager
def opened_host(flag: str | None, python: str | None) -> Iterator[Host]:
    """The machine a command observes (--host, else $SERVELAB_HOST, else this one), closed afterwards
    (its agent ends; an SSH master stays for the next command). A remote one's agent starts at once."""
    host = open_cli_host(flag, python)
    try:
        yield host if host.is_local else _Warming(host)
    finally:
        host.close()


def _host_line(h: dict[str, Any]) -> str:
    return f"[bold]host:[/bold] {escape(h['hostname'])}" + (
        f" (via ssh {escape(h['target'])})" if h["via"] == "ssh" else ""
    )


def _render_status(obs: dict[str, Any]) -> None:
    stdout.print(_host_line(obs["host"]))
    stdout.print(f"[bold]verdict:[/bold] {escape(obs['verdict'])}")
    for s in obs["servers"]:
        if s["up"]:
            eff = ", ".join(f"{k}={v}" for k, v in s["effective"].items() if k not in ("model", "version"))
            stdout.print(
                f"[green]up[/green]   {escape(s['url'])}  engine={s['engine']}  version={s['version']}  "
                f"models={escape(str(s['models']))}  running={s['running']} waiting={s['waiting']}"
            )
            if eff:
                stdout.print(f"       effective: {escape(eff)}")
        else:
            stdout.print(f"[red]down[/red] {escape(s['url'])}  {escape(s.get('error', ''))}")
    _render_gpus(obs["gpus"])
    topo = obs["topology"]
    if topo.get("available"):
        summ = topo["summary"]
        stdout.print(
            f"[bold]topology:[/bold] links {summ['link_counts']}, worst {summ['worst_link']}, "
            f"NUMA nodes {summ['numa_nodes']}{', looks virtual' if summ['vm_all_phb'] else ''}"
        )
    else:
        stdout.print(
            f"[bold]topology:[/bold] {escape(topo.get('note', 'not available'))}; "
            f"NUMA nodes {sorted(topo.get('numa', {}))}; VM: {topo.get('virtual_machine')}"
        )
    if obs["services"]:
        for u in obs["services"]:
            stdout.print(
                f"[bold]service[/bold] {u['unit']}: {u['active_state']}/{u['sub_state']}, "
                f"restarts {u['restarts']}, since {u['since']}"
            )
    else:
        stdout.print(f"[bold]services:[/bold] {escape(obs['services_note'] or 'none')}")
    for d in obs.get("deployments") or []:
        chk = d.get("check")
        verdict = "never checked" if not chk else ("as tuned" if chk.get("ok") else "NOT as tuned")
        stdout.print(
            f"[bold]deployment[/bold] {escape(d['name'])} ({d['target']}, from {escape(str(d['source']))}): "
            f"{escape(str(d['unit'].get('state')))}; last check {verdict}"
        )
    for st in obs.get("studies") or []:
        o = st["owner"]
        who = f"pid {o['pid']} on {o['host']} since {o['since']}" if o else "no driver"
        stdout.print(
            f"[bold]study[/bold] {escape(st['uid'])} ({escape(st['name'])}): {st['state']}, {escape(who)}; "
            f"{len(st['processes'])} process(es) of it alive"
        )
    lo = obs["leftovers"]
    stdout.print(
        f"[bold]leftovers:[/bold] {len(lo['shm'])} shm segment(s) "
        f"({sum(1 for s in lo['shm'] if not s['owners_alive'])} orphaned), "
        f"{len(lo['compile_caches'])} compile cache(s), {len(lo['marked_processes'])} servelab process(es)"
    )
    log = obs["log"]
    if log and log.get("available"):
        tp = log.get("throughput")
        stdout.print(
            f"[bold]log:[/bold] {escape(log['path'])} ({log['engine']}); diagnosis {log['diagnosis']['class']}"
            + (f"; last generation throughput {tp['gen']:.1f} tok/s" if tp else "")
            + ("; clean shutdown" if log["clean_shutdown"] else "")
        )
    if obs["findings"]:
        t = Table("finding", "evidence", "next", title="findings", title_justify="left")
        for f in obs["findings"]:
            t.add_row(escape(printable(f["what"])), escape(printable(f["evidence"][:160])), escape(f["next"]))
        stdout.print(t)


@click.command("status")
@option(A.Urls, "urls")
@option(A.Units, "units")
@option(A.StatusLog, "log", default=None)
@option(A.GpuSource, default=None)
@host_option
@remote_python_option
@click.option("--json", "as_json", is_flag=True, help="The observation as JSON (keys: docs/cli/status.md).")
def status_cmd(
    urls: tuple[str, ...],
    units: tuple[str, ...],
    log: str | None,
    gpu_source: str | None,
    host: str | None,
    remote_python: str | None,
    as_json: bool,
) -> None:
    """What is true right now: GPUs, topology, servers, services, leftovers and the last log, with a verdict.

    With --host, all of it about that machine: --url and --log are as seen from there."""
    with opened_host(host, remote_python) as h:
        from servelab.status.service import observe  # imported while a remote agent starts

        obs = observe(list(urls) or None, list(units) or None, log, gpu_source, host=h)
    emit(obs, as_json, _render_status)


def _render_doctor(rep: dict[str, Any]) -> None:
    stdout.print(_host_line(rep["host"]))
    g = rep["gpus"]
    stdout.print(
        f"[bold]GPUs:[/bold] {g['count']} via {g['source']}"
        if g["available"]
        else f"[bold]GPUs:[/bold] {escape(g['note'])}"
    )
    t = Table("check", "status", "evidence", "fix")
    for c in rep["checks"]:
        style = _STATUS_STYLE.get(c["status"], "")
        t.add_row(
            c["name"], f"[{style}]{c['status']}[/{style}]", escape(printable(c["evidence"])), escape(c["fix"])
        )
    stdout.print(t)


@click.command("doctor")
@option(A.GpuSource, default=None)
@host_option
@remote_python_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='{"host", "gpus", "checks": [{name, status, evidence, fix}], "worst"}.',
)
def doctor_cmd(gpu_source: str | None, host: str | None, remote_python: str | None, as_json: bool) -> None:
    """Host checks with fixes: nvidia_uvm HMM, /dev/shm, open files, P2P, PCIe link, power limits, ECC, persistence.

    With --host, the facts are read on that machine and checked here. Exits 1 when a check fails."""
    with opened_host(host, remote_python) as h:
        from servelab.status.service import diagnose_host

        result = diagnose_host(h, gpu_source)
    emit(result, as_json, _render_doctor)
    if result["worst"] == "fail":
        raise SystemExit(1)

"""`servelab plan`: the persistent todo list (workspace or per study), its history, todowrite in/out, check."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click
import orjson
from rich.markup import escape
from rich.table import Table

from servelab import arguments as A
from servelab.cli.args import option
from servelab.cli.output import dumps_json, emit, host_option, stdout, write_out
from servelab.cli.plan_docs import (
    CandidateRef,
    Changed,
    Checked,
    EventDoc,
    FindingDoc,
    History,
    Imported,
    ItemDoc,
    Shown,
)
from servelab.cli.remote import remote_python_option
from servelab.errors import ConfigError, HostError, NotFoundError
from servelab.jsontypes import JsonObject, JsonValue
from servelab.plan import checks, formats, machine
from servelab.plan.items import DEFAULT_WORKER, JSON_FORMAT, STATUSES, TODO_HINT, Item, Outcome, Plan
from servelab.plan.study import assess
from servelab.store import Store, open_store
from servelab.store.db import utcnow
from servelab.store.plans import WORKSPACE, PlanRepo

if TYPE_CHECKING:
    from servelab.store.studies import StoredTrial, StudyRepo

_STYLE = {
    "pending": "white",
    "in_progress": "cyan",
    "completed": "green",
    "cancelled": "dim",
    "blocked": "red",
}


_APPLIED: dict[bool | None, str] = {True: "applied", False: "NOT applied"}


def _actor() -> str:
    return os.environ.get("SERVELAB_ACTOR") or os.environ.get("USER") or "cli"


def _plan_name(store: Store, ref: str | None) -> tuple[str, str | None]:
    """(plan name, study uid): the workspace plan, or the plan of the study `ref` names.

    `servelab plan --plan X start 1` works like `servelab plan start 1 --plan X`: the group's option is
    the default of every subcommand's."""
    ctx = click.get_current_context(silent=True)
    if not ref and ctx is not None:
        ref = (ctx.find_root().obj or {}).get("plan_ref")
    if ref in (None, "", WORKSPACE):
        return WORKSPACE, None
    from servelab.store.studies import StudyRepo

    try:
        uid = StudyRepo(store).resolve(str(ref)).uid
    except NotFoundError as exc:
        raise NotFoundError(
            f"no plan {ref!r}: {exc.message}", hint="use --plan workspace, or a study from `servelab runs`."
        ) from None
    return uid, uid


def _plan_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return option(A.PlanRef, "plan_ref", default=None, metavar="NAME")(f)


def _json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--json", "as_json", is_flag=True, help="Machine-readable output (docs/cli/plan.md)."
    )(f)


def _item_doc(item: Item) -> ItemDoc:
    return cast(ItemDoc, item.to_dict())


# -- show -------------------------------------------------------------------------------------------
def _show_data(plan: Plan) -> Shown:
    counts = {s: sum(1 for i in plan.items if i.status == s) for s in STATUSES}
    return {"plan": plan.name, "items": [_item_doc(i) for i in plan.items], "counts": counts}


def _render_show(d: Shown) -> None:
    if not d["items"]:
        flag = "" if d["plan"] == WORKSPACE else f" --plan {d['plan']}"
        stdout.print(f'plan {d["plan"]} is empty; `servelab plan add{flag} "what to do"` adds an item')
        return
    t = Table("id", "status", "priority", "content", "after", "worker", "evidence", title=f"plan {d['plan']}")
    for i in d["items"]:
        ev = i["evidence"][-1] if i["evidence"] else None
        evs = (
            "-"
            if ev is None
            else f"{ev.get('run') or '-'}: "
            + ", ".join(x for x in (ev.get("status"), _APPLIED.get(ev.get("applied"))) if x)
        )
        t.add_row(
            i["id"],
            f"[{_STYLE[i['status']]}]{i['status']}[/]",
            i["priority"],
            escape(i["content"]),
            ", ".join(i["depends_on"]) or "-",
            i["worker"] or "-",
            escape(evs),
        )
    stdout.print(t)
    stdout.print(" · ".join(f"{k} {v}" for k, v in d["counts"].items() if v))


@click.group(invoke_without_command=True)
@_plan_option
@_json_option
@click.pass_context
def plan(ctx: click.Context, plan_ref: str | None, as_json: bool) -> None:
    """A persistent todo list (per workspace or study) with dependencies, evidence and history.

    Without a subcommand: show the plan."""
    ctx.find_root().ensure_object(dict)["plan_ref"] = plan_ref
    if ctx.invoked_subcommand is None:
        ctx.invoke(show, plan_ref=plan_ref, as_json=as_json)


@plan.command("show")
@_plan_option
@_json_option
def show(plan_ref: str | None, as_json: bool) -> None:
    """Every item: status, priority, dependencies, worker, latest evidence."""
    with open_store() as store:
        name, _ = _plan_name(store, plan_ref)
        p = PlanRepo(store).load(name)
    emit(_show_data(p), as_json, _render_show)


# -- changes ----------------------------------------------------------------------------------------
def _change(plan_ref: str | None, as_json: bool, op: Callable[[Store, Plan], Outcome]) -> None:
    """Run one operation in one transaction and print what changed."""
    with open_store() as store:
        name, uid = _plan_name(store, plan_ref)
        out = PlanRepo(store).apply(name, lambda p: op(store, p), uid)
    key = out.info.get("item")
    item = _item_doc(out.plan.get(key)) if key else None
    data: Changed = {
        "plan": name,
        "item": item,
        "changed": bool(out.events),
        "events": [cast(EventDoc, e.to_dict()) for e in out.events],
    }

    def render(d: Changed) -> None:
        if not d["changed"]:
            item = d["item"]
            assert item is not None  # nothing changed: the item named is there
            stdout.print(f"item {key} is already {item['status']}; nothing changed")
            return
        for e in d["events"]:
            move = (
                f"added ({e['to_status']})"
                if e["from_status"] is None
                else f"{e['from_status']} → {e['to_status']}"
                if e["from_status"] != e["to_status"]
                else f"{e['reason']} {escape(e['detail'].get('note', ''))}".strip()
            )
            stdout.print(
                f"item {e['item']}: {move}"
                + (
                    f" — {escape(e['reason'])}"
                    if e["from_status"] is not None and e["from_status"] != e["to_status"]
                    else ""
                )
            )

    emit(data, as_json, render)


def _kv(pairs: tuple[str, ...], what: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"{what} {pair!r} is not KEY=VALUE", hint="e.g. --requested moe_runner_backend=triton"
            )
        out[key.strip()] = value.strip()
    return out


def _bind_candidate(store: Store, ref: str) -> CandidateRef:
    from servelab.store.studies import StudyRepo

    study, sep, label = ref.rpartition(":")
    if not sep or not study or not label:
        raise ConfigError(
            f"--bind-candidate {ref!r} is not STUDY:LABEL", hint="e.g. --bind-candidate last:tp2-triton"
        )
    repo = StudyRepo(store)
    st = repo.resolve(study)
    labels = [c.label for c in repo.candidates(st.id)]
    if label not in labels:
        raise NotFoundError(
            f"study {st.uid} has no candidate {label!r}",
            hint=f"its candidates: {', '.join(labels) or 'none'}",
        )
    return {"study": st.uid, "candidate": label}


@plan.command("add")
@click.argument("content")
@click.option("--priority", type=str, default="medium", show_default=True, help="high | medium | low")
@click.option(
    "--after", "after", multiple=True, metavar="ID", help="An item that must complete first (repeatable)."
)
@click.option("--id", "key", default=None, help="The item's id (default: the next number).")
@click.option(
    "--bind-candidate",
    default=None,
    metavar="STUDY:LABEL",
    help="Bind to a study candidate: it completes only with a run that shows its configuration applied.",
)
@click.option(
    "--requested",
    multiple=True,
    metavar="KEY=VALUE",
    help="Bind a requested configuration (normalized keys, e.g. moe_runner_backend=flashinfer_trtllm).",
)
@click.option("--url", default=None, help="Bind the server this item is about (for `plan check`).")
@click.option("--unit", default=None, help="Bind the systemd unit this item is about (for `plan check`).")
@_plan_option
@_json_option
def add(
    content: str,
    priority: str,
    after: tuple[str, ...],
    key: str | None,
    bind_candidate: str | None,
    requested: tuple[str, ...],
    url: str | None,
    unit: str | None,
    plan_ref: str | None,
    as_json: bool,
) -> None:
    """Add a pending item."""
    req = _kv(requested, "--requested")

    def op(store: Store, p: Plan) -> Outcome:
        binding: JsonObject = {}
        if bind_candidate:
            ref = _bind_candidate(store, bind_candidate)
            binding.update(study=ref["study"], candidate=ref["candidate"])
        if req:
            requested: JsonObject = dict(req)
            binding["requested"] = requested
        binding.update({k: v for k, v in (("url", url), ("unit", unit)) if v})
        return machine.add(
            p,
            content,
            now=utcnow(),
            actor=_actor(),
            priority=priority,
            depends_on=after,
            binding=binding or None,
            key=key,
        )

    _change(plan_ref, as_json, op)


@plan.command("start")
@click.argument("item")
@click.option(
    "--worker",
    default=None,
    help="Who works on it (default $SERVELAB_WORKER or `default`); one item in progress per worker.",
)
@_plan_option
@_json_option
def start(item: str, worker: str | None, plan_ref: str | None, as_json: bool) -> None:
    """Start an item (its dependencies must be completed)."""
    w = worker or os.environ.get("SERVELAB_WORKER") or DEFAULT_WORKER
    _change(plan_ref, as_json, lambda _s, p: machine.start(p, item, now=utcnow(), actor=_actor(), worker=w))


def _run_evidence(store: Store, ref: str) -> JsonObject:
    """Evidence from a run: a study trial (STUDY:LABEL, its latest trial) or a bench run uid (its trial if a
    study made it; otherwise a run that shows no configuration)."""
    from servelab.store.bench import BenchRepo
    from servelab.store.studies import StudyRepo

    srepo = StudyRepo(store)
    if ":" in ref:
        binding = _bind_candidate(store, ref)
        st = srepo.resolve(binding["study"])
        cand = next(c for c in srepo.candidates(st.id) if c.label == binding["candidate"])
        trials = [t for t in srepo.trials(cand.id) if t.status != "interrupted"]
        if not trials:
            raise NotFoundError(
                f"candidate {ref!r} has no finished trial yet", hint="run the study (`servelab tune`) first."
            )
        t = trials[-1]
        return _trial_evidence(t, f"{st.uid}:{cand.label}#{t.repeat}")
    run = BenchRepo(store).load(ref)
    trial_id = srepo.trial_of_run(run.id)
    if trial_id is not None:
        return _trial_evidence(_trial_by_id(srepo, trial_id), run.uid)
    return {"run": run.uid, "status": run.status, "effective": {}}


def _trial_by_id(srepo: StudyRepo, trial_id: int) -> StoredTrial:
    owner = srepo.trial_owner(trial_id)
    assert owner is not None  # trial_of_run just found it
    return next(t for t in srepo.trials(owner[1]) if t.id == trial_id)


def _trial_evidence(t: StoredTrial, ref: str) -> JsonObject:
    return {
        "run": ref,
        "trial": t.id,
        "status": t.status,
        "effective": t.effective or {},
        "not_applied": list(t.not_applied or []),
        "diagnosis": t.diagnosis,
    }


@plan.command("done")
@click.argument("item")
@click.option(
    "--run",
    "run_ref",
    default=None,
    metavar="RUN",
    help="Evidence: a bench run uid, or STUDY:LABEL (that candidate's latest trial).",
)
@click.option("--reason", default="", help="Why it is done (kept in the history).")
@click.option(
    "--accept-unconfirmed",
    is_flag=True,
    help="Complete a bound item whose run does not show its configuration (needs --reason).",
)
@_plan_option
@_json_option
def done(
    item: str, run_ref: str | None, reason: str, accept_unconfirmed: bool, plan_ref: str | None, as_json: bool
) -> None:
    """Complete an item; a bound item needs --run showing its configuration took effect."""

    def op(store: Store, p: Plan) -> Outcome:
        it = p.get(item)
        ev = None
        if run_ref:
            ev = assess((it.binding or {}).get("requested"), _run_evidence(store, run_ref), utcnow())
        return machine.done(
            p,
            item,
            now=utcnow(),
            actor=_actor(),
            evidence=ev,
            reason=reason,
            accept_unconfirmed=accept_unconfirmed,
        )

    _change(plan_ref, as_json, op)


@plan.command("block")
@click.argument("item")
@click.option("--reason", required=True, help="What it waits for.")
@_plan_option
@_json_option
def block(item: str, reason: str, plan_ref: str | None, as_json: bool) -> None:
    """Mark an item blocked, with the reason."""
    _change(
        plan_ref, as_json, lambda _s, p: machine.block(p, item, now=utcnow(), actor=_actor(), reason=reason)
    )


@plan.command("cancel")
@click.argument("item")
@click.option("--reason", required=True, help="Why it will not be done.")
@_plan_option
@_json_option
def cancel(item: str, reason: str, plan_ref: str | None, as_json: bool) -> None:
    """Cancel an item, with the reason (it stays in the plan and its history)."""
    _change(
        plan_ref, as_json, lambda _s, p: machine.cancel(p, item, now=utcnow(), actor=_actor(), reason=reason)
    )


@plan.command("reopen")
@click.argument("item")
@click.option("--reason", default="reopened", show_default=True)
@_plan_option
@_json_option
def reopen(item: str, reason: str, plan_ref: str | None, as_json: bool) -> None:
    """Put an item back to pending."""
    _change(
        plan_ref,
        as_json,
        lambda _s, p: machine.transition(p, item, "pending", now=utcnow(), actor=_actor(), reason=reason),
    )


@plan.command("note")
@click.argument("item")
@click.argument("text")
@_plan_option
@_json_option
def note(item: str, text: str, plan_ref: str | None, as_json: bool) -> None:
    """Attach a note to an item."""
    _change(plan_ref, as_json, lambda _s, p: machine.note(p, item, text, now=utcnow(), actor=_actor()))


# -- history, import, export ------------------------------------------------------------------------
@plan.command("history")
@click.argument("item", required=False)
@_plan_option
@_json_option
def history(item: str | None, plan_ref: str | None, as_json: bool) -> None:
    """Every change (of one item, or of the whole plan): time, from → to, reason, who."""
    with open_store() as store:
        name, _ = _plan_name(store, plan_ref)
        repo = PlanRepo(store)
        if item is not None:
            repo.load(name).get(item)
        events = repo.history(name, item)

    def render(d: History) -> None:
        if not d["events"]:
            stdout.print(f"no changes recorded in plan {d['plan']}")
            return
        t = Table("time", "item", "from", "to", "reason", "by", title=f"history of plan {d['plan']}")
        for e in d["events"]:
            t.add_row(
                e["at"][:19],
                e["item"],
                e["from_status"] or "(new)",
                e["to_status"],
                escape(e["reason"]),
                e["actor"],
            )
        stdout.print(t)

    doc: History = {"plan": name, "events": [cast(EventDoc, e.to_dict()) for e in events]}
    emit(doc, as_json, render)


def _read_json(path: str) -> Any:
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", hint="check the path.") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}", hint=TODO_HINT) from None


@plan.command("import")
@click.argument("file")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "todowrite", "json"]),
    default="auto",
    show_default=True,
    help="auto: a list is todowrite, a servelab export is json.",
)
@click.option("--prune", is_flag=True, help="todowrite: cancel open items the list does not mention.")
@_plan_option
@_json_option
def import_(file: str, fmt: str, prune: bool, plan_ref: str | None, as_json: bool) -> None:
    """Merge a todo list (todowrite JSON or a servelab JSON export; `-` reads stdin) into the plan."""
    data = _read_json(file)
    if fmt == "auto":
        fmt = "json" if isinstance(data, dict) and data.get("format") == JSON_FORMAT else "todowrite"
    source = "stdin" if file == "-" else Path(file).name

    def op(_s: Store, p: Plan) -> Outcome:
        if fmt == "json":
            return formats.import_json(p, data, now=utcnow(), actor=_actor(), source=source)
        return formats.import_todowrite(p, data, now=utcnow(), actor=_actor(), prune=prune, source=source)

    with open_store() as store:
        name, uid = _plan_name(store, plan_ref)
        out = PlanRepo(store).apply(name, lambda p: op(store, p), uid)
    info = out.info
    data_out: Imported = {
        "plan": name,
        "format": fmt,
        "added": info.get("added", []),
        "updated": info.get("updated", []),
        "unchanged": unchanged if isinstance(unchanged := info.get("unchanged", []), list) else [],
        "missing": info.get("missing", []),
        "pruned": info.get("pruned", []),
    }

    def render(d: Imported) -> None:
        stdout.print(
            f"plan {d['plan']}: {len(d['added'])} added, {len(d['updated'])} updated, "
            f"{len(d['unchanged'])} unchanged"
            + (f", {len(d['pruned'])} cancelled (--prune)" if d["pruned"] else "")
        )
        if d["missing"] and not d["pruned"]:
            stdout.print(
                f"not in the file and left as they are: {', '.join(d['missing'])} (--prune cancels them)"
            )

    emit(data_out, as_json, render)


@plan.command("export")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["todowrite", "markdown", "json"]),
    default="todowrite",
    show_default=True,
)
@click.option("--output", "-o", default=None, help="Write to a file instead of stdout.")
@_plan_option
def export(fmt: str, output: str | None, plan_ref: str | None) -> None:
    """Print the plan as todowrite JSON, Markdown, or a lossless servelab JSON export."""
    with open_store() as store:
        name, _ = _plan_name(store, plan_ref)
        repo = PlanRepo(store)
        p = repo.load(name)
        text = (
            formats.export_markdown(p, repo.history(name))
            if fmt == "markdown"
            else dumps_json(formats.export_todowrite(p) if fmt == "todowrite" else formats.export_json(p))
            + "\n"
        )
    if output:
        Path(output).write_text(text)
    else:
        write_out(text)


# -- check ------------------------------------------------------------------------------------------
def _observe(
    urls: tuple[str, ...], units: tuple[str, ...], host: str | None, remote_python: str | None
) -> JsonObject:
    """What `servelab status` observes, on this machine or (--host) on the remote one through its agent:
    the URLs are probed from there, the units are its own."""
    from servelab.cli.remote import open_cli_host

    try:
        from servelab.status.service import observe
    except ImportError:
        raise HostError(
            "servelab status is not available here, so there is no observed state to check against",
            hint="save an observation as JSON (`servelab status --json`) and pass --observation FILE.",
        ) from None
    h = open_cli_host(host, remote_python)
    try:
        return observe(urls=list(urls) or None, units=list(units) or None, host=h)
    finally:
        h.close()


def _count(entries: JsonValue) -> int:
    """How many servers (or services) an observation lists (none when the key is missing or null)."""
    return len(entries) if isinstance(entries, list | dict | str) else 0


@plan.command("check")
@option(A.PlanUrls, "urls")
@option(A.PlanUnits, "units")
@click.option(
    "--observation",
    default=None,
    metavar="FILE",
    help="Use this observation (the JSON `servelab status --json` prints) instead of observing now.",
)
@host_option
@remote_python_option
@_plan_option
@_json_option
def check(
    urls: tuple[str, ...],
    units: tuple[str, ...],
    observation: str | None,
    host: str | None,
    remote_python: str | None,
    plan_ref: str | None,
    as_json: bool,
) -> None:
    """Hold every open item against what is observed and flag stale assumptions."""
    with open_store() as store:
        name, _ = _plan_name(store, plan_ref)
        p = PlanRepo(store).load(name)
    if observation and host:
        raise ConfigError(
            "--observation and --host both say where the observed state comes from",
            hint="pass one: --observation FILE (saved before) or --host TARGET (observed there now).",
        )
    obs: JsonObject
    if observation:
        read = _read_json(observation)
        if not isinstance(read, dict):
            raise ConfigError(
                f"{observation} is not an observation object", hint="use `servelab status --json`."
            )
        obs = read
    else:
        named_urls, named_units = checks.referenced(p.items)
        obs = _observe(urls or tuple(named_urls), units or tuple(named_units), host, remote_python)
    found = checks.check(p.items, obs)
    data: Checked = {
        "plan": name,
        "checked": sum(1 for i in p.items if i.is_open),
        "observed": {"servers": _count(obs.get("servers")), "services": _count(obs.get("services"))},
        "findings": [cast(FindingDoc, f.to_dict()) for f in found],
    }
    where = obs.get("host") or {}
    if not observation and isinstance(where, dict) and where.get("via") == "ssh":
        data["observed"]["host"] = where.get("target")
        data["observed"]["hostname"] = where.get("hostname")

    def render(d: Checked) -> None:
        where = f" on {d['observed']['host']}" if d["observed"].get("host") else ""
        head = (
            f"plan {d['plan']}: {d['checked']} open item(s) checked against {d['observed']['servers']} "
            f"server(s) and {d['observed']['services']} service(s){where}"
        )
        stdout.print(head)
        if not d["findings"]:
            stdout.print("[green]no stale assumptions found[/green]")
        for f in d["findings"]:
            color = "yellow" if f["severity"] == "warning" else "cyan"
            stdout.print(f"[{color}]{f['severity']}[/{color}] {f['kind']}: {escape(f['message'])}")

    emit(data, as_json, render)

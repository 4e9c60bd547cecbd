"""The plan (the agent's todo list, kept in servelab): `plan_get` and `plan_update` read and merge into the
store in this process, `plan_check` runs `servelab plan check`; the plans as Markdown resources."""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import Field

from servelab import arguments as A
from servelab.mcp import models as M
from servelab.mcp.base import Group, Options, Resource, as_tool_errors, call, flags, typed
from servelab.mcp.studies import Studies
from servelab.plan.formats import export_markdown, export_todowrite, import_todowrite
from servelab.plan.items import STATUSES, Plan
from servelab.redact import redact_text


def _actor() -> str:
    return os.environ.get("SERVELAB_ACTOR") or "mcp"


def _plan_name(store: Any, ref: str | None) -> str:
    from servelab.store.plans import WORKSPACE
    from servelab.store.studies import StudyRepo

    return WORKSPACE if ref in (None, "", WORKSPACE) else str(StudyRepo(store).resolve(str(ref)).uid)


def _plan_view(p: Plan) -> M.PlanView:
    counts = {s: sum(1 for i in p.items if i.status == s) for s in STATUSES}
    return typed(M.PlanView, {"plan": p.name, "items": [i.to_dict() for i in p.items], "counts": counts})


def plan_get(plan: A.PlanRef = None) -> M.PlanView:
    """The plan (the agent's todo list, kept in servelab beside the state it is about)."""
    from servelab.store import open_store
    from servelab.store.plans import PlanRepo

    with as_tool_errors(), open_store() as store:
        return _plan_view(PlanRepo(store).load(_plan_name(store, plan)))


def plan_update(
    todos: Annotated[list[M.Todo], Field(description="todowrite's list: {id?, content, status, priority}.")],
    plan: A.PlanRef = None,
    prune: Annotated[bool, Field(description="Cancel open items the list does not mention.")] = False,
) -> M.PlanUpdateView:
    """Merge a todowrite list into the plan (servelab's rules hold: one item in progress per worker, an
    experiment completes only with evidence); returns the plan as a todowrite list."""
    from servelab.store import open_store
    from servelab.store.db import utcnow
    from servelab.store.plans import PlanRepo

    data = {"todos": [t.model_dump(exclude_none=True) for t in todos]}
    with as_tool_errors(), open_store() as store:
        name = _plan_name(store, plan)
        repo = PlanRepo(store)
        uid = None if name == "workspace" else name
        out = repo.apply(
            name,
            lambda p: import_todowrite(p, data, now=utcnow(), actor=_actor(), prune=prune, source="mcp"),
            uid,
        )
        now = export_todowrite(repo.load(name))
    return typed(
        M.PlanUpdateView,
        {
            "plan": name,
            "todos": now,
            **{k: out.info.get(k, []) for k in ("added", "updated", "unchanged", "missing", "pruned")},
        },
    )


async def plan_check(
    url: A.PlanUrls = None, unit: A.PlanUnits = None, plan: A.PlanRef = None, host: A.Host = None
) -> M.PlanCheckView:
    """Hold every open item against what is observed now (default: the servers and units the items
    name) and flag the assumptions the state contradicts."""
    return await call(M.PlanCheckView, ["plan", "check", *flags(url=url, unit=unit, plan=plan, host=host)])


def plan_resource() -> str:
    """The workspace plan as Markdown, with its history."""
    return _plan_markdown(None)


def study_plan_resource(ref: str) -> str:
    """A study's plan as Markdown."""
    return _plan_markdown(ref)


def _plan_markdown(ref: str | None) -> str:
    from servelab.store import open_store
    from servelab.store.plans import PlanRepo

    with as_tool_errors(), open_store() as store:
        name = _plan_name(store, ref)
        repo = PlanRepo(store)
        return redact_text(export_markdown(repo.load(name), repo.history(name)))


def group(opts: Options, runs: Studies) -> Group:
    return Group(
        [plan_get, plan_update, plan_check],
        [
            Resource("servelab://plan", "text/markdown", plan_resource),
            Resource("servelab://plan/{ref}", "text/markdown", study_plan_resource),
        ],
    )

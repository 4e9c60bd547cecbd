"""The plan's pure core: rules, transitions, study bindings, todowrite/json/markdown, check."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from servelab.errors import ConfigError, NotFoundError
from servelab.plan.checks import check, referenced, targets
from servelab.plan.formats import (
    export_json,
    export_markdown,
    export_todowrite,
    import_json,
    import_todowrite,
)
from servelab.plan.items import JSON_FORMAT, Item, Plan
from servelab.plan.machine import add, block, cancel, done, find_cycle, note, start, transition
from servelab.plan.study import assess, fill, on_trial

NOW = "2026-11-29T12:00:00.000+00:00"
KW: dict[str, Any] = {"now": NOW, "actor": "test"}


def plan_of(*contents: str, name: str = "workspace") -> Plan:
    p = Plan(name)
    for c in contents:
        p = add(p, c, **KW).plan
    return p


# -- rules ------------------------------------------------------------------------------------------
def test_add_start_done_records_every_change() -> None:
    p = plan_of("check the container")
    o = start(p, "1", **KW)
    assert o.plan.get("1").status == "in_progress" and o.plan.get("1").worker == "default"
    assert [(e.from_status, e.to_status) for e in o.events] == [("pending", "in_progress")]
    o2 = done(o.plan, "1", reason="container is fine", **KW)
    assert o2.plan.get("1").status == "completed" and o2.plan.get("1").worker is None
    assert o2.events[0].reason == "container is fine" and o2.events[0].actor == "test"
    assert p.get("1").status == "pending"  # operations never mutate their input


def test_ids_are_sequential_and_explicit_ids_are_unique() -> None:
    p = plan_of("a", "b")
    assert [i.id for i in p.items] == ["1", "2"]
    p = add(p, "c", key="kill-leftovers", **KW).plan
    assert add(p, "d", **KW).info["item"] == "3"
    with pytest.raises(ConfigError, match="already exists"):
        add(p, "e", key="kill-leftovers", **KW)


def test_one_item_in_progress_per_worker() -> None:
    p = start(plan_of("a", "b"), "1", **KW).plan
    with pytest.raises(ConfigError, match="two items in progress"):
        start(p, "2", **KW)
    p2 = start(p, "2", worker="agent-2", **KW).plan
    assert {i.worker for i in p2.items} == {"default", "agent-2"}


def test_dependencies_must_complete_before_start() -> None:
    p = add(plan_of("check the container"), "run the benchmark", depends_on=["1"], **KW).plan
    # the unmet dependency is named by id and by what it is
    with pytest.raises(ConfigError, match=r"waits for item 1 'check the container' \(pending\)"):
        start(p, "2", **KW)
    with pytest.raises(ConfigError, match="waits for"):
        done(p, "2", **KW)
    p = done(p, "1", **KW).plan
    assert start(p, "2", **KW).plan.get("2").status == "in_progress"
    with pytest.raises(NotFoundError, match="unknown item"):
        add(p, "x", depends_on=["9"], **KW)


def test_cancelled_dependency_never_completes() -> None:
    p = add(plan_of("a"), "b", depends_on=["1"], **KW).plan
    p = cancel(p, "1", reason="not needed", **KW).plan
    with pytest.raises(ConfigError, match=r"item 1 'a' \(cancelled\)"):
        start(p, "2", **KW)
    assert [f.kind for f in check(p.items, {})] == ["dependency_cancelled"]


def test_cycles_are_rejected() -> None:
    items = [
        Item("1", "a", depends_on=("3",)),
        Item("2", "b", depends_on=("1",)),
        Item("3", "c", depends_on=("2",)),
    ]
    cycle = find_cycle(items)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"1", "2", "3"}
    assert find_cycle(items[:2]) is None
    data = {"format": JSON_FORMAT, "items": [i.to_dict() for i in items]}
    with pytest.raises(ConfigError, match="dependency cycle"):
        import_json(Plan("workspace"), data, **KW)
    with pytest.raises(ConfigError, match="depends on itself"):
        import_json(
            Plan("workspace"),
            {"format": JSON_FORMAT, "items": [Item("1", "a", depends_on=("1",)).to_dict()]},
            **KW,
        )


def test_bad_values_and_unknown_items_are_clear_errors() -> None:
    p = plan_of("a")
    with pytest.raises(ConfigError, match="unknown priority 'urgent'") as e:
        add(p, "b", priority="urgent", **KW)
    assert "high, medium, low" in e.value.hint
    with pytest.raises(ConfigError, match="unknown status 'done'") as e2:
        transition(p, "1", "done", **KW)
    assert "in_progress" in e2.value.hint
    with pytest.raises(NotFoundError, match="no item '7'") as e3:
        start(p, "7", **KW)
    assert "plan show" in e3.value.hint
    with pytest.raises(ConfigError, match="needs a reason"):
        block(p, "1", reason=" ", **KW)
    with pytest.raises(ConfigError, match="needs a reason"):
        cancel(p, "1", reason="", **KW)
    with pytest.raises(ConfigError, match="non-empty"):
        add(p, "  ", **KW)


def test_same_status_is_a_no_op_and_notes_are_events() -> None:
    p = start(plan_of("a"), "1", **KW).plan
    assert start(p, "1", **KW).events == ()
    o = note(p, "1", "the container has 2 GPUs", **KW)
    assert o.plan.get("1").notes == ("the container has 2 GPUs",)
    assert o.events[0].detail == {"note": "the container has 2 GPUs"}
    b = block(o.plan, "1", reason="waiting for the GPU", **KW).plan
    assert b.get("1").status == "blocked" and b.get("1").worker is None
    assert start(b, "1", **KW).plan.get("1").status == "in_progress"


# -- experiment-bound items -------------------------------------------------------------------------
BIND = {"study": "s-1", "candidate": "trtllm", "requested": {"moe_runner_backend": "flashinfer_trtllm"}}


def bound_plan() -> Plan:
    return start(add(Plan("s-1"), "run trtllm", binding=BIND, **KW).plan, "1", **KW).plan


def test_bound_item_needs_a_run_that_shows_the_config_applied() -> None:
    p = bound_plan()
    with pytest.raises(ConfigError, match="completes only with a run"):
        done(p, "1", **KW)
    wrong = assess(
        BIND["requested"], {"run": "b-1", "effective": {"moe_runner_backend": "flashinfer_cutlass"}}
    )
    assert wrong["applied"] is False and "flashinfer_cutlass" in wrong["mismatches_text"][0]
    with pytest.raises(ConfigError, match="did not take effect"):
        done(p, "1", evidence=wrong, **KW)
    silent = assess(BIND["requested"], {"run": "b-2", "effective": {"tp_size": 1}})
    assert silent["applied"] is None and silent["unconfirmed"] == ["moe_runner_backend"]
    with pytest.raises(ConfigError, match="does not show"):
        done(p, "1", evidence=silent, **KW)
    with pytest.raises(ConfigError, match="needs a --reason"):
        done(p, "1", evidence=silent, accept_unconfirmed=True, **KW)
    ok = done(p, "1", evidence=silent, accept_unconfirmed=True, reason="log line 12 shows trtllm", **KW)
    assert ok.plan.get("1").evidence[-1]["accepted_reason"] == "log line 12 shows trtllm"
    good = assess(
        BIND["requested"],
        {
            "run": "b-3",
            "effective": {
                "effective": {"moe_runner_backend": "flashinfer_trtllm"},
                "evidence": {"moe_runner_backend": "line"},
            },
        },
    )
    assert good["applied"] is True
    assert done(p, "1", evidence=good, **KW).plan.get("1").status == "completed"


def test_a_not_applied_record_cannot_be_accepted() -> None:
    rec = assess(
        {},
        {
            "run": "x",
            "status": "not_applied",
            "not_applied": [
                {
                    "key": "moe_runner_backend",
                    "requested": "flashinfer_trtllm",
                    "effective": "flashinfer_cutlass",
                }
            ],
        },
    )
    assert rec["applied"] is False
    with pytest.raises(ConfigError, match="did not take effect"):
        done(bound_plan(), "1", evidence=rec, accept_unconfirmed=True, reason="trust me", **KW)


CANDS = [
    ("trtllm", 1200.0, {"moe_runner_backend": "flashinfer_trtllm"}),
    ("cutlass", 1100.0, {"moe_runner_backend": "flashinfer_cutlass"}),
    ("baseline", None, {}),
]


def test_fill_from_study_is_ordered_and_idempotent() -> None:
    o = fill(Plan("s-1"), "s-1", CANDS, now=NOW)
    assert o.info["added"] == ["1", "2", "3"]
    assert [i.binding["candidate"] for i in o.plan.items] == ["trtllm", "cutlass", "baseline"]  # type: ignore[index]
    assert "predicted 1,200" in o.plan.items[0].content
    again = fill(o.plan, "s-1", [*CANDS, ("extra", None, {})], now=NOW)
    assert again.info["added"] == ["4"] and len(again.plan.items) == 4


def test_on_trial_moves_items_with_evidence() -> None:
    p = fill(Plan("s-1"), "s-1", CANDS, now=NOW).plan
    p = on_trial(p, "s-1", "trtllm", "running", {"run": "b-1"}, now=NOW).plan
    assert p.items[0].status == "in_progress" and p.items[0].worker == "tune"
    o = on_trial(
        p,
        "s-1",
        "trtllm",
        "not_applied",
        {
            "run": "b-1",
            "effective": {"moe_runner_backend": "flashinfer_cutlass"},
            "not_applied": [
                {
                    "key": "moe_runner_backend",
                    "requested": "flashinfer_trtllm",
                    "effective": "flashinfer_cutlass",
                    "evidence": "log",
                }
            ],
        },
        now=NOW,
    )
    it = o.plan.items[0]
    assert it.status == "pending" and it.evidence[-1]["applied"] is False
    assert o.events[-1].reason.startswith("not applied: requested moe_runner_backend='flashinfer_trtllm'")
    # A run that claims "measured" but shows another backend also reopens it.
    p = on_trial(o.plan, "s-1", "cutlass", "running", {}, now=NOW).plan
    m = on_trial(
        p,
        "s-1",
        "cutlass",
        "measured",
        {"run": "b-2", "effective": {"moe_runner_backend": "triton"}},
        now=NOW,
    ).plan
    assert m.items[1].status == "pending"
    m = on_trial(
        m,
        "s-1",
        "cutlass",
        "measured",
        {"run": "b-3", "effective": {"moe_runner_backend": "flashinfer_cutlass"}},
        now=NOW,
    ).plan
    assert m.items[1].status == "completed" and m.items[1].evidence[-1]["run"] == "b-3"
    f = on_trial(
        m,
        "s-1",
        "baseline",
        "failed",
        {"run": "b-4", "diagnosis": {"class": "cuda_oom", "advice": "lower mem_fraction"}},
        now=NOW,
    )
    assert f.plan.items[2].status == "blocked" and "cuda_oom — lower mem_fraction" in f.events[-1].reason
    a = on_trial(
        m,
        "s-1",
        "cutlass",
        "anomalous",
        {
            "run": "b-3",
            "effective": {"moe_runner_backend": "flashinfer_cutlass"},
            "anomalies": ["ttft 3x baseline"],
        },
        now=NOW,
    )
    assert a.plan.items[1].status == "blocked" and a.plan.items[1].evidence[-1]["anomalies"]
    u = on_trial(m, "s-1", "baseline", "measured", {"run": "b-5"}, now=NOW)
    assert u.plan.items[2].status == "blocked"  # candidate-only binding: nothing shown, nothing proven
    with pytest.raises(ConfigError, match="unknown trial status"):
        on_trial(m, "s-1", "baseline", "exploded", {}, now=NOW)
    with pytest.raises(NotFoundError, match="no item for candidate"):
        on_trial(m, "s-1", "nope", "running", {}, now=NOW)


def test_a_new_running_trial_releases_an_item_a_killed_study_left_in_progress() -> None:
    p = fill(Plan("s-1"), "s-1", CANDS, now=NOW).plan
    p = on_trial(p, "s-1", "trtllm", "running", {}, now=NOW).plan
    o = on_trial(p, "s-1", "cutlass", "running", {}, now=NOW)
    assert [i.status for i in o.plan.items] == ["pending", "in_progress", "pending"]
    assert "moved on to candidate cutlass" in o.events[0].reason


# -- formats ----------------------------------------------------------------------------------------
def rich_plan() -> Plan:
    p = plan_of("check the container", "kill leftover processes")
    p = add(p, "run trtllm", binding=BIND, depends_on=["1"], priority="high", **KW).plan
    p = note(p, "2", "pid 4242 holds GPU 0", **KW).plan
    p = done(p, "1", **KW).plan
    good = assess(BIND["requested"], {"run": "b-3", "effective": {"moe_runner_backend": "flashinfer_trtllm"}})
    p = start(p, "3", **KW).plan
    p = done(p, "3", evidence=good, **KW).plan
    return block(p, "2", reason="need root", **KW).plan


def test_json_round_trip_is_lossless() -> None:
    p = rich_plan()
    exported = export_json(p)
    restored = import_json(Plan("workspace"), copy.deepcopy(exported), now="later", actor="x")
    assert export_json(restored.plan) == exported
    assert restored.plan == p
    assert restored.info["added"] == ["1", "2", "3"]
    # Importing the same export into the plan it came from changes nothing.
    same = import_json(p, exported, now="later", actor="x")
    assert same.events == () and same.info["unchanged"] == ["1", "2", "3"]


def test_todowrite_round_trip_and_merge_rules() -> None:
    p = rich_plan()
    todos = export_todowrite(p)
    assert todos[0] == {
        "id": "1",
        "content": "check the container",
        "status": "completed",
        "priority": "medium",
    }
    assert set(todos[2]) == {"id", "content", "status", "priority"}
    # Back into the same plan: nothing changes, servelab-only fields survive.
    back = import_todowrite(p, todos, **KW)
    assert back.events == () and back.plan == p
    # Into an empty plan, then out again: the same list.
    fresh = import_todowrite(Plan("other"), todos, **KW)
    assert export_todowrite(fresh.plan) == todos


def test_todowrite_updates_in_place_adds_new_and_never_deletes_silently() -> None:
    p = plan_of("check the container", "kill leftover processes", "read the logs")
    todos = [
        {
            "id": "1",
            "content": "check the container (GPUs visible?)",
            "status": "completed",
            "priority": "high",
        },
        {"content": "read the logs", "status": "in_progress", "priority": "medium"},  # matched by content
        {"content": "write the report", "status": "pending", "activeForm": "Writing the report"},
    ]
    o = import_todowrite(p, todos, **KW)
    assert o.info == {"added": ["4"], "updated": ["1", "3"], "unchanged": [], "missing": ["2"], "pruned": []}
    assert (
        o.plan.get("1").content == "check the container (GPUs visible?)"
        and o.plan.get("1").priority == "high"
    )
    assert o.plan.get("2").status == "pending"  # missing: kept as it was
    assert o.plan.get("4").extra == {"activeForm": "Writing the report"}
    assert export_todowrite(o.plan)[3]["activeForm"] == "Writing the report"
    pruned = import_todowrite(p, todos, prune=True, **KW)
    assert pruned.info["pruned"] == ["2"] and pruned.plan.get("2").status == "cancelled"
    assert any(e.item == "2" and "absent" in e.reason for e in pruned.events)


def test_todowrite_status_changes_obey_the_rules_in_any_order() -> None:
    p = start(plan_of("a", "b"), "1", **KW).plan
    # Finishing 1 and starting 2 in the same list is fine, whatever the order in the file.
    o = import_todowrite(
        p,
        [
            {"id": "2", "content": "b", "status": "in_progress"},
            {"id": "1", "content": "a", "status": "completed"},
        ],
        **KW,
    )
    assert [i.status for i in o.plan.items] == ["completed", "in_progress"]
    with pytest.raises(ConfigError, match="two items in progress"):
        import_todowrite(p, [{"id": "2", "content": "b", "status": "in_progress"}], **KW)
    with pytest.raises(ConfigError, match="completes only with a run"):
        import_todowrite(bound_plan(), [{"id": "1", "content": "run trtllm", "status": "completed"}], **KW)


@pytest.mark.parametrize(
    "data,msg",
    [
        ({"x": 1}, "JSON list"),
        ([{"content": "a"}], "needs content and status"),
        ([{"content": "a", "status": "done"}], "unknown status 'done'"),
        ([{"content": "a", "status": "pending", "priority": "p0"}], "unknown priority 'p0'"),
        ([{"content": "", "status": "pending"}], "non-empty"),
        (
            [
                {"id": "1", "content": "a", "status": "pending"},
                {"id": "1", "content": "b", "status": "pending"},
            ],
            "repeats id",
        ),
        (["a"], "not an object"),
    ],
)
def test_bad_todowrite_input(data: Any, msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        import_todowrite(plan_of("a"), data, **KW)


def test_todowrite_accepts_the_todos_wrapper() -> None:
    o = import_todowrite(Plan("w"), {"todos": [{"content": "a", "status": "pending"}]}, **KW)
    assert o.plan.items[0].priority == "medium"


def test_bad_json_import() -> None:
    with pytest.raises(ConfigError, match="not a servelab plan export"):
        import_json(Plan("w"), [{"content": "a"}], **KW)
    with pytest.raises(ConfigError, match="unknown field"):
        import_json(
            Plan("w"), {"format": JSON_FORMAT, "items": [{"id": "1", "content": "a", "colour": 1}]}, **KW
        )
    with pytest.raises(ConfigError, match="binding"):
        import_json(
            Plan("w"),
            {"format": JSON_FORMAT, "items": [{"id": "1", "content": "a", "binding": {"gpu": 1}}]},
            **KW,
        )


def test_markdown_export() -> None:
    p = rich_plan()
    events = [*block(start(plan_of("x"), "1", **KW).plan, "1", reason="waiting on ops", **KW).events]
    md = export_markdown(p)
    assert md.startswith("# Plan: workspace")
    assert "- [x] **1** [medium] check the container" in md
    assert "- [!] **2** [medium] kill leftover processes" in md and "  - note: pid 4242 holds GPU 0" in md
    assert "- [x] **3** [high] run trtllm (after 1)" in md and "evidence: run b-3 (-), config applied" in md
    assert "why: waiting on ops" in export_markdown(
        block(start(plan_of("x"), "1", **KW).plan, "1", reason="waiting on ops", **KW).plan, events
    )


# -- check ------------------------------------------------------------------------------------------
def server(url: str = "http://127.0.0.1:8000", up: bool = True, **eff: Any) -> dict[str, Any]:
    return {"url": url, "up": up, "models": ["m"], "effective": eff, "engine": "sglang"}


def svc(
    unit: str = "servelab-glm.service", active: str = "active", sub: str = "running", restarts: int = 0
) -> dict[str, Any]:
    return {
        "unit": unit,
        "active_state": active,
        "sub_state": sub,
        "restarts": restarts,
        "since": "Sun 10:00",
    }


def in_progress(content: str, binding: dict[str, Any] | None = None) -> Plan:
    return start(add(Plan("w"), content, binding=binding, **KW).plan, "1", **KW).plan


def kinds(p: Plan, obs: dict[str, Any]) -> list[str]:
    return [f.kind for f in check(p.items, obs)]


def test_check_flags_a_backend_the_server_does_not_run() -> None:
    p = in_progress("running flashinfer_trtllm on the GLM box")
    found = check(p.items, {"servers": [server(moe_runner_backend="flashinfer_cutlass")]})
    assert [f.kind for f in found] == ["config_mismatch"]
    f = found[0]
    assert f.severity == "warning" and "flashinfer_cutlass" in f.message
    assert f.evidence["requested"] == {"moe_runner_backend": "flashinfer_trtllm"}
    assert f.evidence["requested_from"] == "text"
    assert kinds(p, {"servers": [server(moe_runner_backend="flashinfer_trtllm")]}) == []
    # Any one observed server running it is enough; the item did not name which.
    assert (
        kinds(
            p,
            {
                "servers": [
                    server(moe_runner_backend="flashinfer_cutlass"),
                    server("http://h:2", moe_runner_backend="flashinfer_trtllm"),
                ]
            },
        )
        == []
    )
    assert kinds(p, {"servers": [server(tp_size=2)]}) == ["config_unconfirmed"]
    # A pending item assumes nothing about what runs now.
    assert (
        kinds(
            add(Plan("w"), "try flashinfer_trtllm", **KW).plan,
            {"servers": [server(moe_runner_backend="flashinfer_cutlass")]},
        )
        == []
    )


def test_check_flags_an_in_progress_item_whose_server_is_down() -> None:
    p = in_progress("benchmark http://127.0.0.1:8000/v1 at concurrency 64")
    assert kinds(p, {"servers": [server(up=False)]}) == ["server_down"]
    assert kinds(p, {"servers": [server()]}) == []
    assert kinds(p, {"servers": []}) == ["server_unobserved"]
    bound = in_progress("the experiment", {"url": "http://10.0.0.1:30000", "requested": {"tp_size": 8}})
    assert kinds(bound, {"servers": [server("http://10.0.0.1:30000/", up=False)]}) == ["server_down"]
    assert kinds(bound, {"servers": [server("http://10.0.0.1:30000", tp_size=4)]}) == ["config_mismatch"]
    exp = in_progress("run moe_runner_backend=deep_gemm")
    assert kinds(exp, {"servers": [server(up=False)]}) == ["server_down"]


def test_check_flags_a_repair_item_whose_service_is_healthy() -> None:
    p = add(Plan("w"), "fix the failing service", **KW).plan
    found = check(p.items, {"services": [svc(restarts=3)]})
    assert [f.kind for f in found] == ["service_healthy"]
    assert "restarted 3 time(s)" in found[0].message
    assert found[0].evidence["recognized_from"] == "the only observed service"
    assert kinds(p, {"services": [svc(active="failed", sub="failed")]}) == []
    assert kinds(p, {"services": [svc(), svc("other.service")]}) == []  # which one? not guessed
    named = add(Plan("w"), "restart servelab-glm after the driver update", **KW).plan
    assert kinds(named, {"services": [svc(), svc("other.service")]}) == ["service_healthy"]
    deploy = in_progress("roll out", {"unit": "servelab-glm.service"})
    assert kinds(deploy, {"services": [svc(active="failed", sub="failed")]}) == ["service_down"]
    assert kinds(deploy, {"services": []}) == ["service_unobserved"]


def test_check_ignores_closed_items() -> None:
    p = done(in_progress("running flashinfer_trtllm"), "1", **KW).plan
    assert kinds(p, {"servers": [server(moe_runner_backend="flashinfer_cutlass")]}) == []


def test_recognizers_are_narrow() -> None:
    t = targets(Item("1", "tp=4 with kv_cache_dtype fp8_e4m3 and attention_backend=fa3 on flashinfer"))
    assert t.requested == {"tp_size": "4", "kv_cache_dtype": "fp8_e4m3", "attention_backend": "fa3"}
    assert targets(Item("1", "compare flashinfer against triton")).requested == {}
    assert targets(Item("1", "see http://h:1/metrics.")).url == "http://h:1/metrics"
    assert referenced([Item("1", "check http://h:1 and foo.service")]) == (
        ["http://h:1"],
        ["foo.service"],
    )


def test_numbers_for_todos_without_ids_skip_ids_the_list_names() -> None:
    o = import_todowrite(
        Plan("w"),
        [{"content": "x", "status": "pending"}, {"id": "1", "content": "y", "status": "pending"}],
        **KW,
    )
    assert [(i.id, i.content) for i in o.plan.items] == [("2", "x"), ("1", "y")]


def test_json_import_checks_field_types() -> None:
    for item, msg in [
        ({"id": "1", "content": "a", "evidence": ["b-1"]}, "must be an object"),
        ({"id": "1", "content": "a", "worker": 3}, "worker must be"),
        ({"id": "1", "content": "a", "depends_on": "2"}, "must be a list"),
        ({"id": "a b", "content": "a"}, "without spaces"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            import_json(Plan("w"), {"format": JSON_FORMAT, "items": [item]}, **KW)


def test_check_flags_a_repair_item_whose_server_answers_healthy() -> None:
    p = add(Plan("w"), "restart the crashed server http://127.0.0.1:8000/v1", **KW).plan
    found = check(p.items, {"servers": [server()]})
    assert [f.kind for f in found] == ["server_healthy"]
    assert "answers healthy" in found[0].message and found[0].evidence["url"] == "http://127.0.0.1:8000/v1"
    assert kinds(p, {"servers": [server(up=False)]}) == []  # down, as the item assumes
    assert kinds(p, {"servers": [server("http://10.0.0.9:8000")]}) == []  # another server
    assert kinds(add(Plan("w"), "benchmark http://127.0.0.1:8000", **KW).plan, {"servers": [server()]}) == []

"""`systemctl show` parsing and the no-systemd path."""

from __future__ import annotations

from servelab.host import systemd

SHOW = """Id=servelab-qwen.service
LoadState=loaded
ActiveState=active
SubState=running
NRestarts=2
ExecMainStartTimestamp=Sun 2026-11-29 18:02:11 UTC
ExecMainPID=4242
Result=success

Id=servelab-glm.service
LoadState=loaded
ActiveState=failed
SubState=failed
NRestarts=5
ExecMainStartTimestamp=
ExecMainPID=0
Result=exit-code
"""


def test_parse_show_blocks() -> None:
    a, b = systemd.parse_show(SHOW)
    assert (a.unit, a.active_state, a.sub_state, a.restarts, a.main_pid) == (
        "servelab-qwen.service",
        "active",
        "running",
        2,
        4242,
    )
    assert a.since == "Sun 2026-11-29 18:02:11 UTC" and not a.failed
    assert b.failed and b.since is None and b.main_pid is None and b.restarts == 5
    assert b.to_dict()["failed"] is True


def test_list_units_names() -> None:
    text = (
        "servelab-qwen.service loaded active running servelab qwen\n"
        "● servelab-glm.service loaded failed failed servelab glm\n"
    )
    assert systemd.parse_list_units(text) == ["servelab-qwen.service", "servelab-glm.service"]


def test_states_lists_then_shows() -> None:
    calls: list[list[str]] = []

    def run(args: list[str]) -> str | None:
        calls.append(args)
        return (
            "servelab-qwen.service loaded active running x\n"
            if args[0] == "list-units"
            else SHOW.split("\n\n")[0]
        )

    out = systemd.states(run=run, is_booted=lambda: True)
    assert out.available and [u.unit for u in out.units] == ["servelab-qwen.service"]
    assert calls[1][0] == "show" and "servelab-qwen.service" in calls[1]


def test_no_systemd_and_no_units() -> None:
    out = systemd.states(run=lambda a: None, is_booted=lambda: False)
    assert out == systemd.UnitStates(False, "no systemd on this host (PID 1 is not systemd)", [])
    out = systemd.states(run=lambda a: "", is_booted=lambda: True)
    assert out.available and out.units == [] and "no servelab" in out.note

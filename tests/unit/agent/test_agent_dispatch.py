"""The agent's operation table, built at start from one explicit list, and LocalHost running it through the
dispatcher it is handed (host/ never imports the agent)."""

from __future__ import annotations

from typing import Any

import pytest

from servelab.agent import registry, serve
from servelab.errors import ConfigError
from servelab.host.transport import LocalHost
from servelab.host.wire import PROTOCOL

EXPECTED = {
    "core": {
        "hello",
        "ping",
        "launch",
        "poll",
        "record_shm",
        "port_owners",
        "append_log",
        "teardown",
        "sweep",
    }
    | {"shm_remove_orphaned", "free_port", "port_is_free", "port_open", "gpu_memory", "read"},
    "observe": {"observe_ready", "observe_host", "doctor_facts"},
    "logs": {"log_read", "host_facts"},
    "deploy": {"deploy_systemd_missing", "deploy_write_unit", "deploy_write_env_file", "deploy_systemctl"}
    | {"deploy_journal", "deploy_unit_status", "preflight"},
    "bench": {"bench"},
}


def test_every_group_is_in_the_one_list_and_every_operation_in_the_table() -> None:
    assert {name: set(ops) for name, ops in serve.GROUPS} == EXPECTED
    assert set(serve.OPS) == set().union(*EXPECTED.values())


def test_a_name_two_groups_define_fails_at_start() -> None:
    def op(state: registry.AgentState) -> None: ...

    with pytest.raises(RuntimeError, match="'ping' defined by both a and b"):
        registry.table([("a", {"ping": op}), ("b", {"ping": op})])


def test_local_host_runs_operations_through_the_dispatcher_it_is_handed() -> None:
    host = serve.local_host()
    hello = host.call("hello", _timeout=5)  # an SshHost's deadline: dropped in-process
    assert hello["protocol"] == PROTOCOL
    with pytest.raises(ConfigError, match="unknown agent operation"):
        host.call("no_such_op")
    host.close()


def test_local_host_knows_no_agent_of_its_own() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    class Fake:
        def new_state(self) -> list[str]:
            return ["state"]

        def dispatch(self, state: Any, op: str, args: dict[str, Any]) -> Any:
            calls.append((op, args))
            return state

        def shutdown(self, state: Any) -> None:
            calls.append(("shutdown", {"state": state}))

    host = LocalHost(Fake())
    assert host.call("anything", x=1) == ["state"]
    host.close()
    assert calls == [("anything", {"x": 1}), ("shutdown", {"state": ["state"]})]

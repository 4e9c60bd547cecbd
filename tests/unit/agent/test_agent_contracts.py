"""Every agent operation is a typed contract (servelab.host.agent_op) both halves read, and its wire stays
the JSON of before: the same operation names, the same argument and answer keys."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from servelab import __version__
from servelab.agent import serve
from servelab.bench.remote import BENCH
from servelab.deploy import ops as d
from servelab.deploy.preflight import PreflightRequest, run_preflight
from servelab.host import ops as h
from servelab.host.agent_op import AgentOp, NoArgs
from servelab.host.logs import LOG_READ, LogReadRequest
from servelab.host.ports import free_port
from servelab.host.wire import PROTOCOL, b64, unb64
from servelab.lifecycle import ops as lc
from servelab.report.host import HOST_FACTS

CONTRACTS: list[AgentOp[Any, Any]] = [
    *(getattr(h, n) for n in ("HELLO", "PING", "READ", "FREE_PORT", "PORT_IS_FREE", "PORT_OPEN")),
    *(getattr(h, n) for n in ("GPU_MEMORY", "SHM_REMOVE_ORPHANED", "OBSERVE_READY", "OBSERVE_HOST")),
    h.DOCTOR_FACTS,
    *(getattr(lc, n) for n in ("LAUNCH", "POLL", "RECORD_SHM", "PORT_OWNERS", "APPEND_LOG", "TEARDOWN")),
    lc.SWEEP,
    *(getattr(d, n) for n in ("DEPLOY_SYSTEMD_MISSING", "DEPLOY_WRITE_UNIT", "DEPLOY_WRITE_ENV_FILE")),
    *(getattr(d, n) for n in ("DEPLOY_SYSTEMCTL", "DEPLOY_JOURNAL", "DEPLOY_UNIT_STATUS", "PREFLIGHT")),
    LOG_READ,
    HOST_FACTS,
    BENCH,
]


def test_every_operation_of_the_table_has_one_contract() -> None:
    assert sorted(c.name for c in CONTRACTS) == sorted(serve.OPS)


def test_the_requests_keep_the_argument_keys_of_before() -> None:
    """The wire is unchanged: a request dumps to the keywords the untyped calls sent."""
    req = lc.TeardownRequest(marker="m", grace_s=3, offset=7)
    assert req.model_dump(mode="json") == {"marker": "m", "grace_s": 3.0, "offset": 7}
    assert set(h.ObserveRequest(urls=[]).model_dump()) == {
        "urls",
        "units",
        "log",
        "gpu_source",
        "telemetry_url",
        "telemetry",
        "want_log_text",
    }
    assert set(PreflightRequest(address="127.0.0.1", port=1).model_dump()) == {
        "address",
        "port",
        "gpus",
        "marker",
        "kill_stale",
        "engine",
        "reset_compile_cache",
        "compile_caches",
    }


def test_typed_calls_through_local_host_read_attributes(tmp_path: Path) -> None:
    host = serve.local_host()
    try:
        hello = h.HELLO.call(host, h.HelloRequest(workdir=str(tmp_path)))
        assert (hello.protocol, hello.version, hello.pid) == (PROTOCOL, __version__, os.getpid())
        assert hello.workdir == str(tmp_path)
        assert h.PING.call(host, NoArgs(), timeout=5) is None  # an SshHost's deadline: dropped in-process
        f = tmp_path / "a.log"
        f.write_bytes(b"0123456789")
        got = h.READ.call(host, h.ReadRequest(path=str(f), offset=-4))
        assert (got.exists, unb64(got.data), got.size, got.offset) == (True, b"6789", 10, 10)
        missing = h.READ.call(host, h.ReadRequest(path=str(tmp_path / "nope")))
        assert not missing.exists and missing.error
        chunk = LOG_READ.call(host, LogReadRequest(path=str(f), offset=2, max_bytes=3))
        assert (unb64(chunk.data), chunk.start, chunk.offset) == (b"234", 2, 5)
        port = h.FREE_PORT.call(host, h.FreePortRequest())
        assert isinstance(port, int)
        assert h.PORT_IS_FREE.call(host, h.PortRequest(host="127.0.0.1", port=port)) is True
        assert h.PORT_OPEN.call(host, h.PortOpenRequest(host="127.0.0.1", port=port, timeout_s=1)) is False
        assert isinstance(h.OBSERVE_READY.call(host, NoArgs()), str)
    finally:
        host.close()


def test_the_untyped_wire_answers_as_before(tmp_path: Path) -> None:
    """An older control side sends keywords and indexes the dict answers: they carry the keys of before."""
    host = serve.local_host()
    try:
        f = tmp_path / "a.log"
        f.write_bytes(b"abc")
        got = host.call("log_read", path=str(f))
        assert got == {"size": 3, "start": 0, "offset": 3, "data": b64(b"abc")}
        assert host.call("read", path=str(f))["exists"] is True
        hello = host.call("hello")
        assert {"version", "protocol", "hostname", "python", "pid", "uid", "workdir"} <= set(hello)
        assert host.call("sweep", prefix="servelab-test-nothing-carries-this:") == []
        with pytest.raises(ValidationError, match="no_such_key"):  # as a call refuses an unknown keyword
            host.call("ping", no_such_key=1)
    finally:
        host.close()


def test_preflight_here_and_through_the_agent_is_one_implementation() -> None:
    req = PreflightRequest(address="127.0.0.1", port=free_port(), gpus="none")
    here = run_preflight(req).model_dump(mode="json")
    host = serve.local_host()
    try:
        there = d.PREFLIGHT.call(host, req).model_dump(mode="json")
    finally:
        host.close()
    assert here["ok"] and there["ok"]
    assert {k: v for k, v in here.items() if k != "notes"} == {k: v for k, v in there.items() if k != "notes"}
    assert list(there) == [
        "ok",
        "host",
        "port",
        "gpus",
        "holders",
        "killed",
        "shm_removed",
        "shm_held",
        "caches_reset",
        "refusals",
        "notes",
    ]

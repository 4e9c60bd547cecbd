"""host.logs.read_log through LocalHost (the agent's log_read in this process, its dispatcher handed in): a
log longer than the limit keeps its start or its end in whole lines, read chunk by chunk."""

from __future__ import annotations

from pathlib import Path

from servelab.agent.serve import DISPATCHER
from servelab.host import logs as ops_logs
from servelab.host.transport import LocalHost

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "fail_oom_sglang_4330.log"


def test_a_log_under_the_limit_reads_whole() -> None:
    got = ops_logs.read_log(LocalHost(DISPATCHER), str(FIXTURE))
    assert got.text == FIXTURE.read_text(errors="replace") and not got.cut


def test_a_long_log_keeps_whole_lines_from_the_end_that_matters(tmp_path: Path) -> None:
    real = FIXTURE.read_bytes()
    log = tmp_path / "long.log"
    copies = ops_logs.CHUNK // len(real) + 2  # longer than one agent answer
    log.write_bytes(real * copies)
    limit = ops_logs.CHUNK + len(real) // 2
    head = ops_logs.read_log(LocalHost(DISPATCHER), str(log), keep="head", limit=limit)
    tail = ops_logs.read_log(LocalHost(DISPATCHER), str(log), keep="tail", limit=limit)
    assert head.cut and tail.cut and head.size == tail.size == len(real) * copies
    whole = (real * copies).decode(errors="replace")
    assert whole.startswith(head.text) and whole.endswith(tail.text)
    assert head.text.endswith("\n") and tail.text.startswith(
        whole.splitlines(keepends=True)[-len(tail.text.splitlines())]
    )
    assert len(head.text.encode()) <= limit and len(tail.text.encode()) <= limit

"""Agent operations that observe a host for status, doctor and logs, and that benchmark from it: registered
on import (the agent imports this module on the first operation it does not know)."""

from __future__ import annotations

# ops_bench: bench ([host] bench_from = "remote"); ops_logs: log_read, plan_observe, host_facts
from servelab.host import ops_bench, ops_logs  # noqa: F401

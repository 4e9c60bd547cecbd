"""Agent operations that observe a host for status, doctor and logs, and that benchmark from it: registered
on import (the agent imports this module on the first operation it does not know)."""

from __future__ import annotations

from servelab.host import (
    ops_bench,  # noqa: F401  (bench: [host] bench_from = "remote")
    ops_deploy,  # noqa: F401  (deploy --install --host, preflight --host)
    ops_logs,  # noqa: F401  (log_read, host_facts)
    ops_observe,  # noqa: F401  (status, doctor)
)

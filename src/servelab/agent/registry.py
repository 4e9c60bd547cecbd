"""The agent's operations by name, and the state they share. servelab.agent.serve builds its table from
one explicit list of op modules (`serve.GROUPS`), each of which names its operations in its own `OPS`; a
name defined twice is an error at start, not a silent override."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servelab.host.wire import READ_MAX as READ_MAX  # bytes of a file in one answer

if TYPE_CHECKING:
    from servelab.lifecycle.local import Server

Op = Callable[..., Any]  # fn(state, **args) -> a JSON-able answer


@dataclass
class AgentState:
    """The servers this agent launched (by run marker) and where their logs go."""

    servers: dict[str, Server] = field(default_factory=dict)  # by run marker
    workdir: Path | None = None
    # The request pipe (serve's stdin): a long operation watches it, to stop when the driver is gone.
    stdin_fd: int | None = None


def workdir(state: AgentState) -> Path:
    """Where this agent keeps logs and throwaway stores (created on first use)."""
    if state.workdir is None:
        state.workdir = Path(os.environ.get("SERVELAB_HOME") or Path.home() / ".servelab") / "remote"
    state.workdir.mkdir(parents=True, exist_ok=True)
    return state.workdir


def table(groups: Iterable[tuple[str, Mapping[str, Op]]]) -> dict[str, Op]:
    """One table of every group's operations; a name two groups define is a programming error."""
    out: dict[str, Op] = {}
    owner: dict[str, str] = {}
    for group, ops in groups:
        for name, fn in ops.items():
            if name in out:
                raise RuntimeError(f"agent operation {name!r} defined by both {owner[name]} and {group}")
            out[name] = fn
            owner[name] = group
    return out

"""The agent's operations by name, and the state they share (servelab.host.agent runs them; rooms above
register theirs from modules that servelab.host.agent_ops imports). Its own module, below the agent and
the rooms, so that a room registering an operation does not import the agent that imports the room."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READ_MAX = 4 * 1024 * 1024

OPS: dict[str, Callable[..., Any]] = {}


def register(name: str, fn: Callable[..., Any]) -> None:
    """Add an operation `fn(state, **args)` under `name`."""
    OPS[name] = fn


@dataclass
class AgentState:
    """The servers this agent launched (by run marker) and where their logs go."""

    servers: dict[str, Any] = field(default_factory=dict)  # marker -> lifecycle.Server
    workdir: Path | None = None
    # The request pipe (serve's stdin): a long operation watches it, to stop when the driver is gone.
    stdin_fd: int | None = None


def workdir(state: AgentState) -> Path:
    """Where this agent keeps logs and throwaway stores (created on first use)."""
    if state.workdir is None:
        state.workdir = Path(os.environ.get("SERVELAB_HOME") or Path.home() / ".servelab") / "remote"
    state.workdir.mkdir(parents=True, exist_ok=True)
    return state.workdir

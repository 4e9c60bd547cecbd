"""The options and the host a command without a study file acts on: `--host` and `--remote-python`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from servelab.host import transport

REMOTE_PYTHON_ENV = "SERVELAB_REMOTE_PYTHON"


def remote_python_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--remote-python PATH`: the interpreter that has servelab on the --host (for its agent)."""
    return click.option(
        "--remote-python",
        "remote_python",
        default=None,
        metavar="PATH",
        help=f"The interpreter that has servelab on the --host (default: ${REMOTE_PYTHON_ENV}, else the "
        "study's [host] python, else python3).",
    )(fn)


def open_cli_host(
    flag: str | None,
    remote_python: str | None,
    *,
    study_ssh: str | None = None,
    study_python: str | None = None,
    workdir: str | None = None,
) -> transport.Host:
    """The Host a command acts on (precedence of transport.target_of); not yet connected. This machine's runs
    the agent's operations in this process: the front hands the agent's dispatcher down to host/."""
    from servelab.agent.serve import DISPATCHER

    target = transport.target_of(flag, study_ssh)
    python = remote_python or os.environ.get(REMOTE_PYTHON_ENV) or study_python
    return transport.open_host(target, DISPATCHER, python=python, workdir=workdir)

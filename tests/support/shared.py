"""Where a session's shared results live: one directory for the whole run, every pytest-xdist worker's.

A fixture that makes something once per run (a study, a bench run) writes it under `shared_dir` behind a
file lock (`fcntl.flock`): the first worker to ask makes it, the others wait and read it. Under xdist each
worker has a base temp directory of its own (`.../pytest-N/popen-gwK`); their parent is the run's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name

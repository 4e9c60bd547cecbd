"""Test-wide fixtures: every test gets its own empty servelab data directory; and the run fails when a process
it started is still running at its end (tests/support/leftovers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.leftovers import pytest_sessionfinish  # noqa: F401  (the hook: pytest finds it here)


@pytest.fixture(autouse=True)
def servelab_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "servelab-home"
    monkeypatch.setenv("SERVELAB_HOME", str(home))
    return home

"""Test-wide fixtures: every test gets its own empty servelab data directory."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def servelab_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "servelab-home"
    monkeypatch.setenv("SERVELAB_HOME", str(home))
    return home

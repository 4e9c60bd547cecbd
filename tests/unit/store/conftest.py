"""Every store test runs twice: on a SQLite file and on a fresh PostgreSQL database."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where the test's store is: what `open_store` takes, as often as the test reopens it."""
    if request.param == "sqlite":
        return tmp_path / "servelab.db"
    url: str = request.getfixturevalue("pg_url")
    return url

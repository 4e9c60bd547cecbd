"""Fixtures for the report tests: the fixed study in a temp store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.sim_study import sim_study  # noqa: F401  (a session fixture)
from tests.unit.report.study_builder import build_study

from servelab.store.db import Store, open_store


@pytest.fixture
def golden_store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(tmp_path / "golden.sqlite")
    build_study(store, tmp_path)
    yield store
    store.close()

"""Fixtures: a real store, and a finished study in it (tests/unit/deploy/stored.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.support.sim_study import sim_study  # noqa: F401  (a session fixture)
from tests.unit.deploy.stored import store_study

from servelab.store import open_store
from servelab.store.db import Store


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store() as s:
        yield s


@pytest.fixture
def make_study(store: Store) -> Callable[..., dict[str, Any]]:
    """Store a completed study of an engine whose winner `tp2` has a measured trial; returns its ids."""
    return lambda *a, **kw: store_study(store, *a, **kw)

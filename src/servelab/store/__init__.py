"""The SQLite store: every run, level, request and plan change, written as it happens."""

from servelab.store.db import Store, open_store

__all__ = ["Store", "open_store"]

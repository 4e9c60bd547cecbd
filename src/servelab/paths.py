"""Where servelab keeps its data: `$SERVELAB_HOME`, else the XDG data directory."""

from __future__ import annotations

import os
from pathlib import Path


def data_home() -> Path:
    """The directory holding `servelab.db` and run artifacts (created on demand by the store)."""
    explicit = os.environ.get("SERVELAB_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "servelab"


def db_path() -> Path:
    return data_home() / "servelab.db"


def cache_home() -> Path:
    """What servelab may rebuild at any time (the installed engines' flag schemas): `$SERVELAB_CACHE`,
    else `$XDG_CACHE_HOME/servelab`, else `~/.cache/servelab`."""
    explicit = os.environ.get("SERVELAB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "servelab"

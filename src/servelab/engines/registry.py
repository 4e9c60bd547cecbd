"""The one engine registry. Built-in adapters register exactly as an outside one would.

An outside package adds an engine through the `servelab.engines` entry-point group, whose value is a
callable returning an `Engine` (or an Engine instance).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from servelab.engines.base import Engine
from servelab.errors import NotFoundError

# Built-in adapters: (name, module, attribute). Adding an engine is one line here.
BUILTIN: list[tuple[str, str, str]] = [
    ("vllm", "servelab.engines.vllm", "ENGINE"),
    ("sglang", "servelab.engines.sglang", "ENGINE"),
    ("transformers", "servelab.engines.transformers", "ENGINE"),
    ("llamacpp", "servelab.engines.llamacpp", "ENGINE"),
    ("sim", "servelab.engines.sim", "ENGINE"),
    ("external", "servelab.engines.external", "ENGINE"),
]

_registry: dict[str, Engine] = {}
_loaded = False


def register(engine: Engine) -> None:
    """Add (or replace) an engine under its name."""
    _registry[engine.name] = engine


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name, module, attr in BUILTIN:
        if name not in _registry:
            register(getattr(importlib.import_module(module), attr))
    for ep in entry_points(group="servelab.engines"):
        obj = ep.load()
        register(obj() if callable(obj) and not isinstance(obj, Engine) else obj)


def names() -> list[str]:
    _load()
    return sorted(_registry)


def get(name: str) -> Engine:
    """The engine called `name`; an unknown name lists the known ones."""
    _load()
    try:
        return _registry[name]
    except KeyError:
        raise NotFoundError(
            f"unknown engine {name!r}",
            hint=f"known engines: {', '.join(sorted(_registry))}",
        ) from None

"""Click options made from the declarations the MCP tools share (`servelab.arguments`): the flag, its
short form, its type and its help come from the one declaration; a command adds only what is its own
(its default, a parameter name of its own, a click type that checks more)."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import click

from servelab.arguments import declared

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def option(alias: Any, *decls: str, **kw: Any) -> Decorator:
    """The click option (or argument) of a declaration; `decls` adds the command's parameter name."""
    d = declared(alias)
    if d is None:
        raise TypeError(f"{alias!r} is not a servelab.arguments declaration")
    o = d.opt
    if not o.cli:
        raise TypeError(f"{o.name!r} is an MCP tool's own parameter: the CLI has no option for it")
    if o.argument:
        return click.argument(o.name, *decls, **kw)
    names = [o.flag, *([o.short] if o.short else []), *decls]
    kind = d.type
    if o.cli_list == "repeat":
        kw.setdefault("multiple", True)
        kind = typing.get_args(kind)[0] if typing.get_args(kind) else str
    elif o.cli_list == "comma":
        kind = str
    if kind is bool:
        kw.setdefault("is_flag", True)
    elif typing.get_origin(kind) is typing.Literal:
        kw.setdefault("type", click.Choice([str(c) for c in typing.get_args(kind)]))
    elif kind in (int, float):
        kw.setdefault("type", kind)
    return click.option(*names, help=d.help, **kw)

"""The MCP server: one tool per step of the loop, each a typed front on a servelab command.

A tool with a command runs `servelab COMMAND … --json` as a child process: its result is that command's
JSON view (validated into the tool's declared result, models.py) and its error the command's message and
hint, as an MCP tool error (isError). Nothing here re-implements a command. What only reads or merges
into the store (a study's progress, the plan) runs in this process; studies run as child `servelab
tune` processes (studies.py), so no call waits for long work. The tools live in one module per group
(tools_*.py); this module composes the groups of `GROUPS`, one explicit list."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from mcp.server.mcpserver import MCPServer

from servelab import __version__
from servelab.mcp import tools_deploy, tools_measure, tools_observe, tools_plan, tools_predict, tools_study
from servelab.mcp.base import Group, Options
from servelab.mcp.studies import Studies

INSTRUCTIONS = """servelab observes, predicts, benchmarks, tunes and deploys LLM servers.
Start with `status` (what runs now) and keep your todo list in servelab (`plan_update` takes your
todowrite list; `plan_check` says which items the observed state contradicts). Studies run in the
background: `tune_start` returns a study id at once; poll `tune_progress`; `report` writes the files.
Every error carries a hint: what to do next."""

# Every group of tools the server serves, in the order a client lists them.
GROUPS: tuple[Callable[[Options, Studies], Group], ...] = (
    tools_observe.group,
    tools_plan.group,
    tools_predict.group,
    tools_measure.group,
    tools_study.group,
    tools_deploy.group,
)


def build(options: Options | None = None, studies: Studies | None = None) -> MCPServer:
    """The server with every tool and resource of `GROUPS`; `studies` holds the study drivers it starts.
    A tool or resource named twice fails here, at start, rather than one silently replacing the other; a
    tool's description is its docstring, dedented (so it does not depend on where the function stands)."""
    opts = options or Options()
    runs = studies or Studies()
    mcp: MCPServer = MCPServer(
        "servelab", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )
    tools: set[str] = set()
    uris: set[str] = set()
    for make in GROUPS:
        group = make(opts, runs)
        for fn in group.tools:
            if fn.__name__ in tools:
                raise RuntimeError(f"MCP tool {fn.__name__!r} is defined twice")
            tools.add(fn.__name__)
            mcp.add_tool(fn, description=inspect.getdoc(fn))  # the same text wherever fn is defined
        for res in group.resources:
            if res.uri in uris:
                raise RuntimeError(f"MCP resource {res.uri!r} is defined twice")
            uris.add(res.uri)
            mcp.resource(res.uri, mime_type=res.mime_type)(res.read)
    return mcp

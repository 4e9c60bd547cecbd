"""`servelab mcp`: the loop as MCP tools for agents, over stdio or streamable HTTP (docs/cli/mcp.md)."""

from __future__ import annotations

import ipaddress
import signal
from typing import Any

import click

from servelab.cli.output import stderr
from servelab.errors import ConfigError

INSTALL_HINT = "install the MCP extra: `pip install 'servelab[mcp]'` (the official `mcp` Python SDK)"


def parse_http(value: str, allow_remote: bool) -> tuple[str, int]:
    """`HOST:PORT` for --http; a host that is not loopback only with --allow-remote (the tools can start
    servers and read the store: not for the network unless someone says so)."""
    host, sep, port_text = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"--http: {value!r} is not HOST:PORT", hint="e.g. --http 127.0.0.1:8765")
    loopback = host == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not loopback and not allow_remote:
        raise ConfigError(
            f"--http: {host} is not a loopback address; anyone who reaches it could drive this machine",
            hint="serve on 127.0.0.1 (and tunnel to it), or add --allow-remote if that is what you mean",
        )
    return host, int(port_text)


@click.command("mcp")
@click.option(
    "--http", "http", default=None, metavar="HOST:PORT", help="Serve streamable HTTP here instead of stdio."
)
@click.option("--allow-remote", is_flag=True, help="Let --http listen on an address that is not loopback.")
@click.option(
    "--allow-install", is_flag=True, help="Let deploy_preview install systemd units (install=true)."
)
@click.option(
    "--bench-max-requests", type=click.IntRange(min=1), default=200, show_default=True, help="A level's cap."
)
@click.option(
    "--bench-max-duration", type=click.FloatRange(min=0.1), default=60.0, show_default=True, help="Seconds."
)
@click.option(
    "--bench-max-levels", type=click.IntRange(min=1), default=4, show_default=True, help="Levels a call."
)
@click.option(
    "--bench-max-concurrency",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Streams a level.",
)
def mcp_cmd(
    http: str | None,
    allow_remote: bool,
    allow_install: bool,
    bench_max_requests: int,
    bench_max_duration: float,
    bench_max_levels: int,
    bench_max_concurrency: int,
) -> None:
    """Serve servelab's tools to an MCP client (an agent): status, plan, predict, bench, tune, report, deploy.

    Over stdio by default (the client starts `servelab mcp`). Studies it starts stop when it ends."""
    where = parse_http(http, allow_remote) if http else None
    try:
        from servelab.mcp.base import Options
        from servelab.mcp.server import build
        from servelab.mcp.studies import Studies
    except ImportError as exc:
        raise ConfigError(f"servelab mcp needs the MCP SDK ({exc})", hint=INSTALL_HINT) from None
    studies = Studies()
    opts = Options(
        allow_install, bench_max_requests, bench_max_duration, bench_max_levels, bench_max_concurrency
    )
    server = build(opts, studies)

    def _term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)  # a client's shutdown is ours: the studies are stopped below
    try:
        if where is None:
            server.run("stdio")
        else:
            stderr.print(f"servelab mcp on http://{where[0]}:{where[1]}/mcp")
            server.run("streamable-http", host=where[0], port=where[1])
    except KeyboardInterrupt:
        pass
    finally:
        left = studies.close()
        if left:
            stderr.print(
                f"studies still tearing down (pid {', '.join(map(str, left))}); they end on their own"
            )

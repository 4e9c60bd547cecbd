"""`servelab ui`: a read-only local web page over the store (studies, runs, comparisons, plans, live progress)."""

from __future__ import annotations

import signal
import sys

import click

from servelab.cli.output import dumps_json, stderr, warn


@click.command("ui")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Anything but loopback shows your results to the network.",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="Port (0: any free port)."
)
@click.option("--open", "open_browser", is_flag=True, help="Open the page in the default browser.")
@click.option("--json", "as_json", is_flag=True, help='Print {"url": ...} as one JSON line once listening.')
def ui(host: str, port: int, open_browser: bool, as_json: bool) -> None:
    """Serve the store as web pages until Ctrl-C: studies, candidates and plots, runs, two runs side by side,
    the plan, and the live progress of a running study. Read-only; GET only."""
    from servelab.ui.server import is_loopback, make_server, url_of

    if not is_loopback(host):
        warn(
            f"listening on {host}: anyone who can reach this machine can read every study, run and log "
            "excerpt in the store (no authentication). Use --host 127.0.0.1 and an SSH tunnel instead."
        )
    server = make_server(host, port)
    url = url_of(server)
    if as_json:
        sys.stdout.write(
            dumps_json({"url": url, "host": host, "port": server.server_address[1]}).replace("\n", " ") + "\n"
        )
        sys.stdout.flush()
    else:
        stderr.print(f"servelab ui on {url} (read-only; Ctrl-C stops it)")
    if open_browser:
        import webbrowser

        webbrowser.open(url)

    # Ctrl-C and SIGTERM stop it, also when it was started with SIGINT ignored (a background job of a
    # script inherits that, and Python then installs no KeyboardInterrupt handler of its own).
    def stop(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()

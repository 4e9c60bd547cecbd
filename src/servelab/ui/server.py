"""The HTTP side of `servelab ui`: stdlib ThreadingHTTPServer, GET and HEAD only, a read-only store per request.

Read-only twice over: only GET/HEAD are answered (anything else is 405), and each request's store
connection is switched to read-only (`Store.read_only`), so no page can change the store even by mistake.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from servelab.errors import ServelabError, UserError
from servelab.redact import redact_text
from servelab.store import open_store
from servelab.store.db import driver_errors
from servelab.ui.pages import Response, route

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


PAGE_ERRORS: tuple[type[Exception], ...] = (ServelabError, *driver_errors())


class _Handler(BaseHTTPRequestHandler):
    server_version = "servelab-ui"
    store_path: Path | str | None = None  # a SQLite file or a store URL (None: the default)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the terminal shows the URL, not every request

    def _answer(self, head_only: bool) -> None:
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query))
        try:
            store = open_store(self.store_path)
        except ServelabError as exc:
            resp = Response(500, f"store unavailable: {exc.message}".encode(), "text/plain; charset=utf-8")
        else:
            try:
                store.read_only()
                resp = route(store, url.path, query)
            except PAGE_ERRORS as exc:
                msg = exc.message if isinstance(exc, ServelabError) else redact_text(str(exc))
                resp = Response(500, f"error: {msg}".encode(), "text/plain; charset=utf-8")
            finally:
                store.close()
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(resp.body)))
        for k, v in {**SECURITY_HEADERS, **resp.headers}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head_only:
            self.wfile.write(resp.body)

    def do_GET(self) -> None:
        self._answer(head_only=False)

    def do_HEAD(self) -> None:
        self._answer(head_only=True)

    def _refuse(self) -> None:
        body = b"servelab ui is read-only: only GET and HEAD are answered\n"
        self.send_response(405)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _refuse


class UIServer(ThreadingHTTPServer):
    daemon_threads = True


class _UIServer6(UIServer):
    address_family = socket.AF_INET6


def make_server(host: str = "127.0.0.1", port: int = 0, store_path: Path | str | None = None) -> UIServer:
    """A bound, not yet serving, server (port 0: a free port; `server.server_address` says which)."""
    handler = type("Handler", (_Handler,), {"store_path": store_path})
    cls = _UIServer6 if ":" in host else UIServer
    try:
        return cls((host, port), handler)
    except OSError as exc:
        raise UserError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="choose another --port (0 picks a free one) or --host",
        ) from exc


def serve_in_thread(server: UIServer) -> threading.Thread:
    t = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="servelab-ui", daemon=True
    )
    t.start()
    return t


def url_of(server: UIServer) -> str:
    host, port = server.server_address[:2]
    # A bound TCP server's address holds the host as text; the socket types also allow bytes, which
    # must print as the name, never as "b'127.0.0.1'".
    name = host if isinstance(host, str) else bytes(host).decode()
    shown = f"[{name}]" if ":" in name else name
    return f"http://{shown}:{port}/"

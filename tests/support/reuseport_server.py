"""A minimal OpenAI-ish HTTP server that binds its port with SO_REUSEPORT, as vLLM and llama.cpp do.

Stdlib only, run as a script::

    python tests/support/reuseport_server.py --port P [--model NAME] [--host 127.0.0.1]

It answers GET /health (200) and GET /v1/models (one model), prints ``LISTENING <port>`` once it
listens, and exits on SIGTERM; with ``--silent`` it only listens and never answers; with
``--api-key KEY`` /v1/models answers 401 without that bearer token. Tests use it as "another server already on the port": a second
SO_REUSEPORT server binds the same port without error and the kernel splits connections between
the two, which is what the lifecycle's port guard must catch.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _ReusePortServer(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


def _handler(model: str, api_key: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, body: dict[str, Any] | None) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, None)
            elif self.path == "/v1/models":
                if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                    self._send(401, {"error": "invalid api key"})
                    return
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            else:
                self._send(404, {"error": "not found"})

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


def _silent(host: str, port: int) -> int:
    """A listener whose connections complete in the kernel's backlog and are never answered."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(128)
    print(f"LISTENING {sock.getsockname()[1]}", flush=True)
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    signal.sigwait(stop)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="reuseport-model")
    ap.add_argument("--silent", action="store_true", help="listen, but never accept a connection")
    ap.add_argument("--api-key", default=None, help="/v1/models then requires this bearer token")
    args = ap.parse_args(argv)
    if args.silent:
        return _silent(args.host, args.port)
    server = _ReusePortServer((args.host, args.port), _handler(args.model, args.api_key))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"LISTENING {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

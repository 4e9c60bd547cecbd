"""The readiness rule carried out against a server: one round of checks at a time (`Probe.step`), and the
log watched for a fatal signature meanwhile (`LogWatcher`). Both launched servers and a bare URL
(`ready.Endpoint`) are probed through the small `Probed` protocol.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import orjson

from servelab.engines.base import Diagnosis, LaunchSpec, Readiness
from servelab.engines.startup import StartupReader
from servelab.errors import LaunchFailed
from servelab.jsontypes import JsonObject

LOG_SCAN_OVERLAP = 8192  # bytes of already-scanned log kept for signatures that span a read boundary
WARMUP_PROMPT = "hello"


class Probed(Protocol):
    """What a probe needs of a server: a launched one (`handle.ServerHandle`) or a bare URL."""

    @property
    def spec(self) -> LaunchSpec: ...
    @property
    def started_mono(self) -> float: ...
    @property
    def url(self) -> str: ...
    @property
    def log_path(self) -> Path | str:
        """Quoted in hints ("Full log: ..."); may name a command (`journalctl -u X`)."""
        ...

    @property
    def forwarded(self) -> bool: ...
    async def port_open(self, timeout_s: float) -> bool: ...


def tail_lines(text: str, n: int = 20) -> tuple[str, ...]:
    return tuple(ln for ln in text.splitlines() if ln.strip())[-n:]


def diagnose_log(text: str, engine: str | None) -> Diagnosis:
    """The knowledge base's diagnosis of a log; before that module exists, the log's tail."""
    try:
        from servelab.engines.signatures import diagnose
    except ImportError:
        return Diagnosis(klass="unknown", evidence="", advice="Read the log", tail=tail_lines(text))
    return diagnose(text, engine=engine)


def _fatal_in(text: str, engine: str | None) -> Diagnosis | None:
    try:
        from servelab.engines.signatures import fatal_in
    except ImportError:
        return None
    return fatal_in(text, engine=engine)


class LogWatcher:
    """Reads the log as it grows and scans only the new part (plus an overlap) for fatal signatures; each
    new line also goes to the start-up reader (`startup`) with the seconds since `started_mono` it was
    seen at."""

    def __init__(self, path: Path, engine: str | None, started_mono: float | None = None) -> None:
        self.path, self.engine = path, engine
        self.offset = 0
        self.carry = ""
        self.started_mono = started_mono
        self.startup = StartupReader(engine)

    def fatal(self) -> Diagnosis | None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                new = f.read()
        except OSError:
            return None
        if not new:
            return None
        # Scan complete lines only: a signature must not be judged on a half-written line.
        cut = new.rfind(b"\n") + 1
        if cut == 0:
            return None
        self.offset += cut
        fresh = new[:cut].decode("utf-8", "replace")
        seen = None if self.started_mono is None else round(time.monotonic() - self.started_mono, 3)
        self.startup.feed(fresh, seen)
        text = self.carry + fresh
        self.carry = text[-LOG_SCAN_OVERLAP:]
        return _fatal_in(text, self.engine)


def failed(server: Probed, what: str, diag: Diagnosis) -> LaunchFailed:
    evidence = f": {diag.evidence}" if diag.evidence else ""
    tail = ""
    if diag.klass == "unknown" and diag.tail:
        tail = "\nlast log lines:\n  " + "\n  ".join(diag.tail[-10:])
    exc = LaunchFailed(
        f"{what} ({diag.klass}{evidence}){tail}",
        hint=f"{diag.advice.rstrip('.')}. Full log: {server.log_path}",
    )
    exc.diagnosis = diag
    return exc


class Probe:
    """The readiness rule as a small state machine; each `step` is one round of checks."""

    def __init__(
        self,
        server: Probed,
        readiness: Readiness,
        api_key: str | None,
        request_timeout_s: float,
        engine: str | None,
    ) -> None:
        from servelab.bench.client import Client

        self.server, self.r, self.engine = server, readiness, engine
        self.client = Client(
            server.url, api_key=api_key, timeout_s=request_timeout_s, connect_timeout_s=request_timeout_s
        )
        self.request_timeout_s = request_timeout_s
        self.phases: dict[str, float] = {}
        self.models: list[str] = []
        self.last = "not polled yet"
        self.polls = 0

    def _passed(self, phase: str) -> None:
        self.phases.setdefault(phase, time.monotonic() - self.server.started_mono)

    async def _port_open(self) -> bool:
        if not await self.server.port_open(self.request_timeout_s):
            self.last = "port not open yet"
            return False
        return True

    async def _health(self) -> bool:
        path = self.r.health_path
        assert path is not None
        res = await self.client.get(path, timeout_s=self.request_timeout_s)
        if res.error_kind == "connect_error":
            self.last = "port not open yet" if self.r.port_opens_when_ready else "connection refused"
            return False
        self._passed("port")
        if res.error_kind == "timeout" or (res.status == 0 and res.error_kind):
            self.last = f"{path} accepted the connection but did not answer ({res.error_kind})"
            return False
        if res.status in self.r.ready_status:
            return True
        if res.status in self.r.loading_status:
            self.last = f"loading ({path} answers HTTP {res.status})"
        else:
            self.last = f"{path} answers HTTP {res.status}"
        return False

    async def _warmup(self, remaining: float) -> bool:
        model = self.server.spec.served_model
        if self.r.warmup_api == "chat":
            path = "/v1/chat/completions"
            body: JsonObject = {"model": model, "messages": [{"role": "user", "content": WARMUP_PROMPT}]}
        else:
            path, body = "/v1/completions", {"model": model, "prompt": WARMUP_PROMPT}
        body.update(max_tokens=1, stream=False)
        timeout = max(1.0, min(remaining, max(60.0, self.request_timeout_s)))
        res = await self.client.send(self.client.build_request(path, body), mode="json", timeout_s=timeout)
        if res.ok:
            return True
        self._auth_check(res.status, path)
        self.last = f"warm-up {path} failed ({res.error_kind}: {(res.error_message or '')[:200]})"
        return False

    def _auth_check(self, status: int, path: str) -> None:
        if status in (401, 403):
            diag = Diagnosis(
                klass="auth_required",
                evidence=f"{path} answered HTTP {status}",
                advice="The server requires an API key: pass the one it was started with (--api-key)",
                fatal=True,
            )
            raise failed(self.server, "the server rejects our requests", diag)

    async def _models(self) -> bool:
        res = await self.client.get("/v1/models", timeout_s=self.request_timeout_s)
        self._auth_check(res.status, "/v1/models")
        if res.status != 200:
            self.last = f"/v1/models answers {res.status or res.error_kind}"
            return False
        try:
            data = orjson.loads(res.body).get("data") or []
            self.models = [str(m.get("id")) for m in data if isinstance(m, dict)]
        except (orjson.JSONDecodeError, AttributeError):
            self.last = f"/v1/models answered undecodable JSON: {res.body[:120]!r}"
            return False
        want = self.server.spec.served_model
        if want in self.models:
            return True
        if not self.models:
            self.last = "/v1/models lists no model yet"
            return False
        diag = Diagnosis(
            klass="wrong_model",
            evidence=f"/v1/models lists {', '.join(self.models)}, not {want!r}",
            advice="Another server may answer on this port, or the served model name differs: check "
            "--served-model-name and the port",
            fatal=True,
        )
        raise failed(self.server, "the server serves another model", diag)

    async def step(self, remaining: float) -> bool:
        """One round; True once every phase of the rule has passed."""
        self.polls += 1
        if "health" not in self.phases:
            if self.server.forwarded and "port" not in self.phases:
                if not await self._port_open():  # before HTTP: through a forward, "refused" reads otherwise
                    return False
                self._passed("port")
            if self.r.health_path is None:
                if not await self._port_open():
                    return False
                self._passed("port")
            elif not await self._health():
                return False
            self._passed("health")
        if self.r.warmup_request and "warmup" not in self.phases:
            if not await self._warmup(remaining):
                return False
            self._passed("warmup")
        if self.r.check_models and "models" not in self.phases:
            if not await self._models():
                return False
            self._passed("models")
        return True

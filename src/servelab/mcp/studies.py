"""Studies run in the background as child `servelab tune` processes: the child takes the study's lease
as any driver does, so a study an agent started is one `servelab status`, `servelab runs` and a plain
`servelab tune --resume` see like any other, and a stop is its own clean teardown (SIGINT)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import orjson

from servelab.errors import ConfigError, NotFoundError, ServelabError, UserError
from servelab.jsontypes import JsonObject
from servelab.paths import data_home

_STUDY_LINE = re.compile(r"^(?:resuming )?study (s-[0-9a-f]+)", re.MULTILINE)
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


def servelab_argv() -> list[str]:
    """This interpreter running servelab: the child sees the same installation and store."""
    return [sys.executable, "-m", "servelab"]


def error_of(stdout: bytes, stderr: bytes, rc: int) -> ServelabError:
    """The error a `servelab … --json` child reported (its message and hint, as the CLI prints them)."""
    with contextlib.suppress(orjson.JSONDecodeError):
        doc = orjson.loads(stdout)
        if isinstance(doc, dict) and "message" in doc and "error" in doc:
            err = ServelabError(str(doc["message"]), str(doc.get("hint") or ""))
            err.exit_code = rc
            return err
    tail = stderr.decode(errors="replace").strip().splitlines()[-5:]
    return ServelabError(
        f"servelab exited {rc}: " + (" / ".join(tail) or "no output"),
        hint="run the same command in a terminal with --debug for the traceback",
    )


@dataclass
class Child:
    """One `servelab tune` this server started."""

    proc: subprocess.Popen[bytes]
    source: str
    log: Path
    study: str = ""
    name: str = ""
    _out: IO[bytes] | None = field(default=None, repr=False)

    def exit_code(self) -> int | None:
        return self.proc.poll()


class Studies:
    """The studies this server drives, by uid; every one stopped (SIGINT, then waited for) when the
    server ends, so a client that disconnects leaves no process behind."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or data_home() / "mcp"
        self.children: dict[str, Child] = {}

    def _spawn(self, argv: list[str], source: str) -> Child:
        self.root.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        log = self.root / f"tune-{stamp}-{os.getpid()}-{len(self.children)}.log"
        out = open(log.with_suffix(".json"), "wb")  # noqa: SIM115 - closed when the child is reaped
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [*servelab_argv(), "tune", *argv, "--json"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env={**os.environ, "COLUMNS": "160"},
                start_new_session=True,  # the client's Ctrl-C is not the study's: tune_stop is
            )
        return Child(proc, source, log, _out=out)

    def _await_uid(self, child: Child) -> Child:
        """Wait for the child's first line (`study s-…: N candidates`) or its exit: the uid comes back at
        once, and a bad study file is the child's own error (message and hint)."""
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            m = _STUDY_LINE.search(child.log.read_text(errors="replace"))
            if m:
                child.study = m.group(1)
                return child
            rc = child.proc.poll()
            if rc is not None:
                self._close(child)
                raise error_of(child.log.with_suffix(".json").read_bytes(), child.log.read_bytes(), rc)
            time.sleep(0.05)
        self._signal(child)
        raise ServelabError(
            f"servelab tune did not start the study within {START_TIMEOUT_S:.0f} s",
            hint=f"its progress lines are in {child.log}",
        )

    def start(self, study_file: str) -> Child:
        path = Path(study_file).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(
                f"study_file: no file {study_file}", hint="pass the path of a study TOML (examples/ has some)"
            )
        from servelab.config.loading import load_study

        name = load_study(str(path)).study.name  # a bad file fails here with the field's path
        child = self._await_uid(self._spawn([str(path)], str(path)))
        child.name = name
        self.children[child.study] = child
        return child

    def resume(self, uid: str, source: str, name: str, retry_failed: bool) -> Child:
        mine = self.children.get(uid)
        if mine is not None and mine.exit_code() is None:
            raise UserError(
                f"study {uid} is running (pid {mine.proc.pid}, started by this server)",
                hint="poll tune_progress, or tune_stop it first",
            )
        if not Path(source).is_file():
            raise NotFoundError(
                f"study {uid} was run from {source}, which is gone",
                hint="pass study_file: the study file it was run from",
            )
        argv = [source, "--resume", *(["--retry-failed"] if retry_failed else [])]
        child = self._await_uid(self._spawn(argv, source))
        if child.study != uid:  # --resume continues the latest unfinished run of that study file
            self._signal(child)
            self.wait(child, STOP_TIMEOUT_S)
            raise UserError(
                f"{source} resumed {child.study}, not {uid}",
                hint="a study file resumes its latest unfinished run; stop that one first",
            )
        child.name = name
        self.children[uid] = child
        return child

    def _signal(self, child: Child, sig: int = signal.SIGINT) -> None:
        if child.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(sig)

    def _close(self, child: Child) -> None:
        if child._out is not None:
            child._out.close()
            child._out = None

    def wait(self, child: Child, timeout: float) -> int | None:
        try:
            rc = child.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._close(child)
        return rc

    def stop(self, uid: str, timeout: float = STOP_TIMEOUT_S) -> Child:
        child = self.children.get(uid)
        if child is None:
            raise NotFoundError(
                f"study {uid} is not driven by this server",
                hint="tune_progress shows its driver's pid; stop it where it was started (Ctrl-C or "
                "`kill -INT PID`)",
            )
        self._signal(child)
        self.wait(child, timeout)
        return child

    def close(self, grace: float = 1.5) -> list[int]:
        """Stop every study still running: SIGINT, the driver's own clean teardown. Waits up to `grace`
        (a stdio client kills the server's group 2 s after closing its stdin), then leaves a driver that is
        still tearing down to finish on its own (its own session; it holds the study's lease until its
        servers are gone, then `tune_resume` continues the study). Returns the pids still stopping."""
        live = [c for c in self.children.values() if c.proc.poll() is None]
        for c in live:
            self._signal(c)
        end = time.monotonic() + grace
        left = [c.proc.pid for c in live if self.wait(c, max(0.05, end - time.monotonic())) is None]
        for c in self.children.values():
            self._close(c)
        return left

    def result(self, uid: str) -> JsonObject | None:
        """The outcome document a child printed when it ended (its `--json`)."""
        child = self.children.get(uid)
        if child is None or child.exit_code() is None:
            return None
        with contextlib.suppress(OSError, orjson.JSONDecodeError):
            doc = orjson.loads(child.log.with_suffix(".json").read_bytes())
            return doc if isinstance(doc, dict) else None
        return None

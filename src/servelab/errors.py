"""The servelab error hierarchy.

Errors are raised deep inside the tool and mapped once, at the CLI boundary (servelab.cli.main), into a
message plus a hint. Every error carries a hint that tells the user what to do next, and its exit code:

- 1 (FAILED): what the command checked or measured failed, or something outside the input (a server, an
  engine, the host, the store) could not be used: the same command can succeed once the world changes;
- 2 (USAGE): the user must change the input (options, a study file, a name that does not exist, a file
  that cannot be read): the same command can never succeed; click's own usage errors exit 2 as well;
- 3 (INTERNAL_ERROR): not a ServelabError at all: a bug;
- 130 (INTERRUPTED): SIGINT/SIGTERM; what finished is stored.

docs/cli/exit-codes.md is the user's copy of this rule.
"""

from __future__ import annotations

from typing import Any

from servelab.jsontypes import JsonObject

OK = 0
FAILED = 1
USAGE = 2
INTERNAL_ERROR = 3
INTERRUPTED = 130


class ServelabError(Exception):
    """Root of every error servelab raises on purpose."""

    exit_code: int = FAILED
    default_hint: str = ""
    # What `--json` prints instead of the error object, when the command has a result to show anyway
    # (an interrupted bench prints its stored run, `status: interrupted`).
    document: JsonObject | None = None

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def to_dict(self) -> JsonObject:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint}


class UserError(ServelabError):
    """Bad input from the user: wrong flag, bad file, unknown name. Exit code 2."""

    exit_code = USAGE


class ConfigError(UserError):
    """A configuration (flags, study file, dataset) is invalid."""

    default_hint = "Check the value named in the message; `servelab COMMAND --help` lists the options."


class NotFoundError(UserError):
    """A named thing (run, study, model, GPU) does not exist."""


class StoreError(ServelabError):
    """The SQLite store could not be opened, migrated or written."""

    default_hint = "Check that $SERVELAB_HOME is writable, or point it elsewhere."


class StudyBusy(StoreError):
    """Another live servelab process drives the study (holds its lease): running it again succeeds once
    that one is done, so exit code 1."""

    default_hint = (
        "wait for it to finish, or stop it (Ctrl-C or `kill PID`), then `servelab tune STUDY.toml --resume`."
    )


class EngineError(ServelabError):
    """An inference engine misbehaved: failed to launch, never became ready, did not apply a setting."""

    # A servelab.engines.base.Diagnosis (failure class, evidence, advice) when the failure was classified.
    diagnosis: Any = None

    def to_dict(self) -> JsonObject:
        d = super().to_dict()
        if self.diagnosis is not None:
            d["diagnosis"] = self.diagnosis.to_dict()
        return d


class LaunchFailed(EngineError):
    pass


class NotReady(EngineError):
    pass


class ConfigNotApplied(EngineError):
    pass


class ServerError(ServelabError):
    """The server under test cannot be used at all (unreachable, wrong model)."""

    default_hint = (
        "Check that the server is running and that --url and --model are right (`curl URL/v1/models`)."
    )


class HostError(ServelabError):
    """The host (GPUs, drivers, /dev/shm, systemd; an SSH target, its agent) is not in a usable state."""


class HostUnusable(HostError):
    """The host target cannot work as given (unknown host, refused key, changed host key, no servelab
    there): the user must fix it, so exit code 2."""

    exit_code = USAGE


class HostLost(HostError):
    """The connection to a host dropped while servelab worked on it: what finished is stored, and the
    same command (`tune --resume`) succeeds once the host is back. Exit code 1."""


class Interrupted(ServelabError):
    """The user (SIGINT) or a supervisor (SIGTERM) stopped the command; what finished is stored."""

    exit_code = INTERRUPTED

    def __init__(self, message: str, hint: str | None = None, run_uid: str | None = None) -> None:
        super().__init__(message, hint)
        self.run_uid = run_uid  # the stored bench run the interruption left behind, if any

"""Redaction of secrets (API keys, tokens, passwords) before anything is logged, stored, printed or launched.

What is a secret is data (`servelab/data/secrets.toml`): engine flags whose value is one (`--api-key K`,
`--api-key=K`, `--hf-token`, ...), environment names that hold one (`HF_TOKEN`, `MY_CREDENTIALS`), and the
password inside a URL (`postgres://u:PASS@h/db`). `redact` masks them in whatever a writer persists (a list of
strings is read as an argv, so a flag's value in the next element is masked too); `externalize` moves them
out of a launched server's argv into its environment, the way each engine reads them.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import Field, dataclass, replace
from functools import cache
from importlib import resources
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from servelab.errors import ConfigError

MASK = "***"

# A URL's password: scheme://user:PASSWORD@host (the user name is kept, it says whose account it is).
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@'\"]*:)([^\s@/'\"]+)(@)")
_VALUE_PATTERNS = [
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{4,}"),
    re.compile(r"\b(sk-[A-Za-z0-9_-]{4})[A-Za-z0-9_-]+"),
    re.compile(r"\b(hf_[A-Za-z0-9]{2})[A-Za-z0-9]+"),
    re.compile(r"(?i)((?:api[_-]?key|token|secret|password)\s*[=:]\s*['\"]?)[^\s'\",}]+"),
]
_ASSIGNMENT = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)=(['\"]?)([^\s'\"]+)")
_FLAG_IN_TEXT = re.compile(r"(?<!\S)(-{1,2}[A-Za-z0-9][A-Za-z0-9_-]*)([= ])(['\"]?)([^\s'\"]+)")
_WORDS = re.compile(r"[_\-\s]+")


@dataclass(frozen=True)
class Knowledge:
    """secrets.toml, parsed: which flags and names hold secrets, and each engine's environment route."""

    flags: frozenset[str]
    flag_last_words: frozenset[str]
    client_key_flags: frozenset[str]
    env_anywhere: frozenset[str]
    env_last: frozenset[str]
    env_last_after_another: frozenset[str]
    launch: Mapping[str, Mapping[str, str]]  # engine -> {secret flag: environment variable}


@cache
def knowledge() -> Knowledge:
    data = tomllib.loads(resources.files("servelab.data").joinpath("secrets.toml").read_text())

    def words(table: str, key: str) -> frozenset[str]:
        return frozenset(str(w).lower() for w in data[table][key])

    return Knowledge(
        flags=words("flags", "names"),
        flag_last_words=words("flags", "last_words"),
        client_key_flags=words("flags", "client_key"),
        env_anywhere=words("env", "anywhere"),
        env_last=words("env", "last"),
        env_last_after_another=words("env", "last_after_another"),
        launch={eng: {str(f): str(v) for f, v in routes.items()} for eng, routes in data["launch"].items()},
    )


def is_secret_flag(name: str) -> bool:
    """`--api-key`, `--hf-token`, `--hub-token`: a flag whose value is a secret."""
    k = knowledge()
    name = name.lower()
    if not name.startswith("-") or name.startswith("---"):
        return False
    if name in k.flags:
        return True
    parts = [w for w in _WORDS.split(name.lstrip("-")) if w]
    if parts and parts[-1] in k.flag_last_words:
        return True
    return name.endswith(("-api-key", "_api_key"))


def is_secret_name(name: str) -> bool:
    """An environment variable (or JSON key) whose value is a secret: HF_TOKEN, VLLM_API_KEY, api_key."""
    k = knowledge()
    parts = [w for w in _WORDS.split(name.lower()) if w]
    if not parts:
        return False
    if any(p in k.env_anywhere for p in parts) or parts[-1] in k.env_last:
        return True
    if len(parts) >= 2 and parts[-2:] == ["api", "key"]:
        return True
    return len(parts) >= 2 and parts[-1] in k.env_last_after_another


def _mask_url(text: str) -> str:
    return _URL_CREDENTIALS.sub(lambda m: m.group(1) + MASK + m.group(3), text)


def has_url_credentials(text: str) -> bool:
    return _URL_CREDENTIALS.search(text) is not None


def redact_text(text: str) -> str:
    """Mask anything that looks like a secret in free text (log lines, a joined command, error messages):
    values of secret flags and of `SECRET_NAME=value`, URL passwords, bearer/sk-/hf_ tokens."""
    text = _mask_url(text)
    text = _FLAG_IN_TEXT.sub(
        lambda m: m.group(1) + m.group(2) + m.group(3) + MASK if is_secret_flag(m.group(1)) else m.group(0),
        text,
    )
    text = _ASSIGNMENT.sub(
        lambda m: f"{m.group(1)}={m.group(2)}{MASK}" if is_secret_name(m.group(1)) else m.group(0), text
    )
    for pat in _VALUE_PATTERNS:
        text = pat.sub(lambda m: m.group(1) + MASK, text)
    return text


def secret_args(argv: Sequence[str]) -> Iterator[tuple[int, str, str, bool]]:
    """(index, flag, value, inline) of each secret flag in `argv`: `--flag V` (value at index + 1) or
    `--flag=V` (inline)."""
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if is_secret_flag(name):
            if eq:
                yield i, name, value, True
            elif i + 1 < len(argv):
                yield i, name, argv[i + 1], False
                i += 1
        i += 1


def redact_argv(argv: Sequence[str]) -> list[str]:
    """An argv with the value of every secret flag masked (both spellings) and URL passwords masked."""
    out = list(argv)
    for i, name, _value, inline in secret_args(argv):
        if inline:
            out[i] = f"{name}={MASK}"
        else:
            out[i + 1] = MASK
    return [redact_text(a) for a in out]


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment with secret-named values masked whole, and URL passwords masked in the others."""
    return {k: (MASK if is_secret_name(k) and v else redact_text(v)) for k, v in env.items()}


def redact(obj: Any) -> Any:
    """Recursively mask secrets in dicts/lists/strings: values under secret-looking keys whole, a list of
    strings as an argv (`["--api-key", "K"]`), and free text as `redact_text` does."""
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v:
                out[k] = MASK
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, list | tuple):
        if obj and all(isinstance(v, str) for v in obj):
            return type(obj)(redact_argv(obj))
        return type(obj)(redact(v) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


class Launch(Protocol):
    """What `externalize` reads of a launch (engines.base.LaunchSpec, a frozen dataclass, is one): named
    here so that the contract does not import the engines above it. A dataclass: `replace` rebuilds it."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def argv(self) -> list[str]: ...
    @property
    def env(self) -> dict[str, str]: ...


L = TypeVar("L", bound=Launch)


@dataclass(frozen=True)
class Externalized(Generic[L]):
    """A launch whose secrets left the command line: `spec` (argv without them, env with them) and the key
    the server demands from clients (None: it demands none), for servelab's own requests."""

    spec: L
    api_key: str | None


def env_route(engine: str, flag: str) -> str | None:
    """The environment variable `engine` reads `flag`'s value from (None: only its command line)."""
    return knowledge().launch.get(engine, {}).get(flag)


def externalize(spec: L, engine: str) -> Externalized[L]:
    """Move each secret flag of `spec.argv` into the environment variable the engine reads it from, so no
    `ps` shows it. Refuses (ConfigError) a secret the engine only takes on its command line, and a URL
    password in argv."""
    argv = list(spec.argv)
    env = dict(spec.env)
    drop: set[int] = set()
    api_key: str | None = None
    k = knowledge()
    for i, name, value, inline in secret_args(argv):
        route = env_route(engine, name)
        if route is None:
            raise ConfigError(
                f"{engine} takes `{name}` only on its command line, where every user of this host reads it "
                "(ps, /proc/PID/cmdline)",
                hint=f"leave `{name}` out of the candidate's args (servelab launches {engine} without it), "
                "or serve it behind a proxy that checks the key",
            )
        env[route] = value
        drop.update((i,) if inline else (i, i + 1))
        if name in k.client_key_flags:
            api_key = value
    for i, arg in enumerate(argv):
        if i not in drop and has_url_credentials(arg):
            raise ConfigError(
                f"argument {i} of the {engine} command line holds a URL with a password ({redact_text(arg)})",
                hint="pass the URL through the candidate's env instead (a secret never goes on a command line)",
            )
    for flag in k.client_key_flags:  # a key given directly in the environment the engine reads it from
        route = env_route(engine, flag)
        if api_key is None and route and env.get(route):
            api_key = env[route]
    kept = [a for i, a in enumerate(argv) if i not in drop]
    return Externalized(replace(spec, argv=kept, env=env), api_key)

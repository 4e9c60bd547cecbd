"""The entry points: a study from a dict (`parse_study`) or a TOML file (`load_study`), every problem listed
with its field path."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from servelab.config.problems import StudyProblems, field_path, message
from servelab.config.study import Study
from servelab.errors import ConfigError


def parse_study(data: Mapping[str, object], source: str = "study") -> Study:
    """Validate a study given as a dict; every problem is listed with its field path."""
    try:
        return Study.model_validate(data)
    except StudyProblems as exc:
        lines = [f"  {field_path(path)}: {msg}" for path, msg in exc.problems]
    except ValidationError as exc:
        lines = [f"  {field_path(tuple(err['loc']))}: {message(err)}" for err in exc.errors()]
    raise ConfigError(
        f"{source} is not a valid study:\n" + "\n".join(lines),
        hint="docs/study.md describes every field; examples/ has complete studies.",
    )


def load_study(path: str | Path) -> Study:
    """Read and validate a study TOML file."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"study file {p} does not exist", hint="give the path of a .toml study; see examples/"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the study file {p}: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p} is not valid TOML: {exc}", hint="fix the line named above") from None
    return parse_study(data, str(p))

"""A study's problems, each with its field path (`candidates[2].tp`), as one message a person can act on."""

from __future__ import annotations

from typing import Any

from servelab.errors import ConfigError


class StudyProblems(ConfigError):
    """Problems found across the whole study, each with its own field path (a model-level check would
    otherwise report them all at the top level). Not a ValueError, so pydantic lets it through whole."""

    def __init__(self, problems: list[tuple[tuple[Any, ...], str]]) -> None:
        super().__init__("the study is not valid: " + "; ".join(f"{field_path(p)}: {m}" for p, m in problems))
        self.problems = problems


def message(err: Any) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling; docs/study.md lists the fields)"
    return msg


def path_parts(path: str) -> tuple[Any, ...]:
    """`constraints[0].when.pp` → ("constraints", 0, "when", "pp")."""
    out: list[Any] = []
    for part in path.split("."):
        name, *idx = part.replace("]", "").split("[")
        if name:
            out.append(name)
        out += [int(i) for i in idx]
    return tuple(out)


def field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"

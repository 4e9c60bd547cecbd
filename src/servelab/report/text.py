"""Making strings from logs safe to show: ANSI/control sequences stripped, then escaped for the target.

Engine logs end up in reports (evidence lines, diagnoses, error messages); a log line is data, never markup.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence

# CSI (ESC [ ... final), OSC (ESC ] ... BEL/ST), other two-byte ESC sequences, then the C0/C1 controls left.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]"
)
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(value: object) -> str:
    """`value` as text without terminal escape sequences or control characters (newlines and tabs kept)."""
    text = "" if value is None else str(value)
    return _CTRL.sub("", _ANSI.sub("", text))


def h(value: object) -> str:
    """Cleaned and HTML-escaped (quotes included): safe in element text and attribute values."""
    return html.escape(clean(value), quote=True)


_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#~])")


def md(value: object) -> str:
    """Cleaned, one line, with HTML and Markdown syntax neutralised: safe inline and in table cells.

    `<` and `&` become entities (no tag, no entity can start); `>` stays itself in prose ("159.3 > 150"
    reads as written in the raw file too) and is backslash-escaped only where it would open a blockquote."""
    text = " ".join(clean(value).split())
    text = _MD_SPECIAL.sub(r"\\\1", text).replace("&", "&amp;").replace("<", "&lt;")
    return "\\" + text if text.startswith(">") else text


def md_code(value: object) -> str:
    """A fenced code block whose fence is longer than any backtick run inside (content shown verbatim)."""
    text = clean(value).rstrip("\n")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def md_inline_code(value: object) -> str:
    """Inline code that survives backticks and pipes inside table cells."""
    text = " ".join(clean(value).split()).replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    tick = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{tick}{pad}{text}{pad}{tick}" if text else ""


def level_digits(value: object) -> int:
    """Digits to show a load level with: a concurrency (a whole number) none, a rate or a time scale two."""
    try:
        return 0 if float(value).is_integer() else 2  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0


def fmt_level(value: object) -> str:
    """A load level: `16`, a rate `2.5` (never rounded to a concurrency), `-` when missing."""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:g}"
    return fmt(value, 0)


def fmt(value: object, digits: int = 1) -> str:
    """A number for a table (thousands separated), `-` when missing."""
    if value is None or isinstance(value, bool):
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:,.{digits}f}"
    return clean(value)


def as_map(value: object) -> Mapping[str, object]:
    """A member of open JSON (a stored digest, a diagnosis, doctor's findings) read as an object: absent or
    not one, empty, so a renderer shows `-` rather than failing on another writer's shape."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[object]:
    """A member of open JSON read as a list: absent or not one, empty."""
    return list(value) if isinstance(value, list | tuple) else []


def clock_sentence(clock_speeds: Sequence[float]) -> str:
    """The host section's clock row for a simulated study, one wording for HTML and Markdown."""
    speeds = ", ".join(f"{s:g}×" for s in clock_speeds)
    return "simulated: servelab's simulator standing in for these GPUs" + (
        f" (its clock ran {speeds} faster; every figure is in the simulated GPUs' time)" if speeds else ""
    )

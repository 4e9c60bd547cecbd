"""Per-request export (`bench --export-requests FILE`, `runs show RUN --export-requests FILE`): one row
per stored request, as JSON Lines (`.jsonl`) or CSV (`.csv`), the format chosen by the extension.

The path is checked before anything is measured (a bad extension or an unwritable place is exit 2
before the first request, not after an hour of load), and the file is written to a temporary file beside
it and renamed into place, so a reader never sees half of it. Values are the stored ones, on the
client's clock (`RequestRecord`): seconds, `*_s`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from servelab.bench.metrics import tpot_s
from servelab.errors import ConfigError, UserError
from servelab.jsontypes import JsonObject
from servelab.results import Run
from servelab.store.bench import BenchRepo

FORMATS = {".jsonl": "jsonl", ".csv": "csv"}
# The columns, in order (docs/cli/bench.md): stable names, only ever added to.
COLUMNS: tuple[str, ...] = (
    "level",
    "label",
    "idx",
    "prompt_idx",
    "scheduled_s",
    "start_s",
    "ok",
    "error_kind",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "itl_count",
    "input_tokens",
    "output_tokens",
    "requested_output_tokens",
    "token_source",
    "error_message",  # the server's own words for a failure (its JSON error's message)
)


def check_path(path: str, option: str = "--export-requests") -> tuple[Path, str]:
    """The file and its format, or a ConfigError (exit 2) naming the option: an unknown extension, a
    directory, or a place this process cannot create a file in."""
    out = Path(path)
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise ConfigError(
            f"{option} {path}: unknown format {out.suffix or '(no extension)'!r}",
            hint="the extension chooses the format: FILE.jsonl (JSON Lines) or FILE.csv",
        )
    if out.is_dir():
        raise ConfigError(f"{option} {path} is a directory", hint="give a file name, e.g. requests.jsonl")
    folder = out.parent
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".servelab-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"{option} {path}: cannot write in {folder}: {exc.strerror or exc}",
            hint="give a file in an existing directory you can write to",
        ) from None
    return out, fmt


def rows(run: Run, repo: BenchRepo) -> Iterator[JsonObject]:
    """Every stored request of `run`, level by level, in `COLUMNS`' order."""
    ids = repo.level_ids(run.id)
    for lv in run.levels:
        if lv.index not in ids:
            continue
        label = lv.summary.label or f"{lv.value:g}"
        for r in repo.requests(ids[lv.index]):
            yield {
                "level": lv.index,
                "label": label,
                "idx": r.idx,
                "prompt_idx": r.prompt_idx,
                "scheduled_s": r.scheduled_s,
                "start_s": r.start_s,
                "ok": r.ok,
                "error_kind": r.error_kind,
                "ttft_s": r.ttft_s,
                "tpot_s": tpot_s(r),
                "e2e_s": r.e2e_s,
                "itl_count": len(r.itl_s),
                "input_tokens": r.input_tokens,
                "output_tokens": r.output_tokens,
                "requested_output_tokens": r.requested_output_tokens,
                "token_source": r.token_source,
                "error_message": r.error_message,
            }


def _csv_cell(v: Any) -> Any:
    """CSV has no null or boolean: None is an empty cell, booleans are `true`/`false` (as in JSON)."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else v  # repr: the float round-trips exactly


def render(items: Iterator[JsonObject], fmt: str) -> bytes:
    if fmt == "jsonl":
        return b"".join(orjson.dumps(row) + b"\n" for row in items)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for row in items:
        w.writerow([_csv_cell(row[c]) for c in COLUMNS])
    return buf.getvalue().encode()


def write(path: Path, fmt: str, run: Run, repo: BenchRepo) -> int:
    """Write every request of `run` to `path` atomically; the number of rows written."""
    items = list(rows(run, repo))
    data = render(iter(items), fmt)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return len(items)

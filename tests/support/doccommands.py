"""Every `servelab …` command the documentation shows, found where the docs show it.

The convention (docs/cli/exit-codes.md, "Commands in the docs are tested", is the reader's copy):

- A fenced block tagged `bash`, `sh`, `shell`, `console` or untagged is made of *commands*: every line
  that starts with `servelab ` (a trailing `\\` joins the next line) is run as written. A trailing
  `# exit N` comment is the exit code the docs promise; without one the promise is 0.
- A block tagged `synopsis` is usage grammar: every line starting with `servelab ` must contain grammar
  (`[`, `|`, `(`, `...`, or a placeholder the test cannot fill, such as ID or TEXT), so a real command
  cannot hide there; it is not run, but its command and every `--option` it names must exist.
- `<!-- doc-commands: not-run REASON -->` on the line before a fence marks a block that is not run
  (REASON is reported); its commands must still name existing commands and options.
- A `servelab ` line in a block of another language (json, python, text, …) cannot be classified: an
  error. So is a command line in a command block that carries grammar (`[`, `|`, `...`).
- Inline spans (`` `servelab …` `` in prose) are references, not commands: their command and options
  must exist.

Placeholders are whole words in capitals (PLACEHOLDERS: URL, MODEL, RUN, STUDY, STUDY.toml, S, PORT, DB:
the test's SQLite store, PG_URL: a fresh database of the session's PostgreSQL): the
test substitutes each with something it made; any other word in capitals in a command is an error.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

COMMAND_LANGS = {"", "bash", "sh", "shell", "console"}
SYNOPSIS = "synopsis"
_FENCE = re.compile(r"^(\s*)(```|~~~)\s*([^\s`]*)(.*)$")
_NOT_RUN = re.compile(r"<!--\s*doc-commands:\s*not-run\s+(.+?)\s*-->")
_INLINE = re.compile(r"`(servelab [^`]*)`")
_EXIT = re.compile(r"#\s*exit\s+(\d+)\b")
PLACEHOLDER = re.compile(r"^[A-Z]+(?:_[A-Z]+)*(?:\.toml)?$")
GRAMMAR = ("[", "|", "(", "...", "…")
# The placeholders the test fills in; any other word in capitals (ID, TEXT, FILE, N) only a reader can.
PLACEHOLDERS = {"URL", "MODEL", "RUN", "STUDY", "STUDY.toml", "S", "PORT", "DB", "PG_URL"}


@dataclass
class DocCommand:
    path: str  # relative to the repository root
    line: int  # 1-based, the command's first line
    text: str  # the command as written (continuations joined, comment removed)
    kind: str  # "run", "not-run", "synopsis", "inline"
    expect: int = 0
    reason: str = ""
    comment: str = ""

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)


@dataclass
class Extraction:
    commands: list[DocCommand] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def doc_files(root: Path) -> list[Path]:
    return [
        root / "README.md",
        *sorted((root / "docs").glob("*.md")),
        *sorted((root / "docs/cli").glob("*.md")),
    ]


def _logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Join `\\` continuations; each result keeps its first line's number."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in lines:
        if not buf:
            start = n
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        out.append((start, buf + raw))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def _split_comment(text: str) -> tuple[str, str]:
    """The command and its trailing comment (a `#` outside quotes, after whitespace)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip(), text[i + 1 :].strip()
    return text.rstrip(), ""


def _has_grammar(text: str) -> bool:
    return any(g in text for g in GRAMMAR)


def extract(root: Path) -> Extraction:
    ex = Extraction()
    for f in doc_files(root):
        rel = str(f.relative_to(root))
        lines = f.read_text().splitlines()
        in_block, lang, not_run, block = False, "", "", []  # type: ignore[var-annotated]
        prev = ""
        for n, line in enumerate(lines, 1):
            m = _FENCE.match(line)
            if m and not in_block:
                in_block, lang, block = True, m.group(3).lower(), []
                nr = _NOT_RUN.search(prev)
                not_run = nr.group(1) if nr else ""
                continue
            if m and in_block and not m.group(3):
                in_block = False
                _block(ex, rel, lang, not_run, block)
                prev = line
                continue
            if in_block:
                block.append((n, line))
            else:
                for span in _INLINE.finditer(line):
                    ex.commands.append(DocCommand(rel, n, span.group(1), "inline"))
                if line.strip():
                    prev = line
        if in_block:
            ex.errors.append(f"{rel}: a code block is never closed")
    return ex


def _block(ex: Extraction, rel: str, lang: str, not_run: str, block: list[tuple[int, str]]) -> None:
    if lang == SYNOPSIS:
        for n, text in block:
            s = text.strip()
            if not s.startswith("servelab "):
                if text[:1].isspace() and s:
                    continue  # a continuation of the synopsis above
                if s:
                    ex.errors.append(f"{rel}:{n}: not a servelab synopsis line in a synopsis block: {s!r}")
                continue
            cmd, _ = _split_comment(s)
            words = cmd.split()
            if not _has_grammar(cmd) and not any(
                PLACEHOLDER.match(w) and w not in PLACEHOLDERS for w in words
            ):
                ex.errors.append(
                    f"{rel}:{n}: {cmd!r} has no usage grammar ([ | ( ... or a placeholder only a reader can"
                    " fill): a real command belongs in a bash block"
                )
            ex.commands.append(DocCommand(rel, n, cmd, "synopsis"))
        return
    for n, text in _logical_lines(block):
        s = text.strip().removeprefix("$ ")
        if not s.startswith("servelab "):
            continue
        if lang not in COMMAND_LANGS:
            ex.errors.append(f"{rel}:{n}: a servelab command in a {lang!r} block cannot be classified: {s!r}")
            continue
        cmd, comment = _split_comment(s)
        if _has_grammar(cmd):
            ex.errors.append(
                f"{rel}:{n}: {cmd!r} carries usage grammar: tag its block `synopsis`, or write a real command"
            )
            continue
        e = _EXIT.match("#" + comment) if comment else None
        expect = int(e.group(1)) if e else 0
        kind = "not-run" if not_run else "run"
        ex.commands.append(DocCommand(rel, n, cmd, kind, expect, not_run, comment))


def check_names(cli: object, cmd: DocCommand) -> list[str]:
    """The command path and every `--option` that `cmd` names exist in the real click group `cli`."""
    import click

    words = cmd.text.replace("\\", " ").split()
    node: click.Command = cli  # type: ignore[assignment]
    i = 1
    top = {o: p for p in node.params for o in p.opts if o.startswith("--")}  # `servelab --db URL COMMAND`
    while i < len(words) and words[i] in top:
        i += 1 if getattr(top[words[i]], "is_flag", False) else 2
    first = i
    while isinstance(node, click.Group) and i < len(words):
        sub_cmd = node.get_command(click.Context(node), words[i])  # the top group loads its commands lazily
        if sub_cmd is None:
            break
        node = sub_cmd
        i += 1
    if i == first:
        word = words[i] if len(words) > i else ""
        return [f"{cmd.id}: {cmd.text!r}: {word!r} is not a servelab command"]
    if node.context_settings.get("ignore_unknown_options"):
        return []  # e.g. `sim`: the engine's own flags pass through
    known = {"--help"}
    sub = node.commands if isinstance(node, click.Group) else {}
    for c in [node, *sub.values()]:
        for p in c.params:
            known.update(o for o in [*p.opts, *p.secondary_opts] if o.startswith("--"))
    errors = []
    for w in words[i:]:
        for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", w):
            if opt not in known:
                errors.append(f"{cmd.id}: {cmd.text!r}: `{' '.join(words[:i])}` has no option {opt}")
    return errors

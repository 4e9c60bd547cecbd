"""systemd's documented reading of a unit line, re-implemented for the tests: split on whitespace outside
double quotes, C escapes, `%%` specifiers, `$$` in command lines only (Environment= does not expand `$`)."""

from __future__ import annotations

import shutil

import pytest


def _unescape(s: str, i: int) -> tuple[str, int]:
    c = s[i]
    table = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", ";": ";", " ": " "}
    if c in table:
        return table[c], i + 1
    raise AssertionError(f"escape \\{c} we never write")


def unquote_words(line: str, dollar: bool) -> list[str]:
    """systemd's reading of a command line into words."""
    words, i, n = [], 0, len(line)
    while i < n:
        while i < n and line[i] == " ":
            i += 1
        if i >= n:
            break
        word, quoted = "", False
        while i < n and (quoted or line[i] != " "):
            c = line[i]
            if c == '"':
                quoted = not quoted
                i += 1
            elif c == "\\":
                ch, i = _unescape(line, i + 1)
                word += ch
            elif c == "%":
                assert line[i + 1] == "%", f"bare specifier in {line!r}"
                word += "%"
                i += 2
            elif c == "$" and dollar:
                assert line[i + 1] == "$", f"bare $ (a variable expansion) in {line!r}"
                word += "$"
                i += 2
            else:
                word += c
                i += 1
        assert not quoted, f"unbalanced quote in {line!r}"
        words.append(word)
    return words


def systemd_analyze() -> str:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail(
            "systemd-analyze is missing: install Debian's systemd package (scripts/test.sh does as root)"
        )
    return exe

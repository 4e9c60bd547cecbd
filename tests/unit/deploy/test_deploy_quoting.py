"""systemd quoting: what we write, systemd must read back as exactly the value (hostile values included).

`unquote_words` / `unquote_env` re-implement systemd's documented reading of a line (split on whitespace
outside double quotes, C escapes inside them, `%%` specifier, `$$` in command lines only), so the round
trip checks our writer against the rules, and `systemd-analyze verify` checks the real parser accepts it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.deploy.systemd_reader import systemd_analyze, unquote_words

from servelab.deploy.systemd import environment_line, quote_arg, quote_command
from servelab.errors import ConfigError

HOSTILE = [
    "a b",
    'say "hi"',
    "it's",
    "100%",
    "%n%i",
    "$HOME",
    "${PATH}",
    "$$",
    "back\\slash",
    "\\n",
    "trailing\\",
    ";",
    "",
    " lead",
    "'single quoted'",
    "a=b=c",
    "-dash",
    "@at",
    "unicodé ✓",
    "tab\\t",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_exec_word_round_trips(value: str) -> None:
    assert unquote_words(quote_arg(value), dollar=True) == [value]


@pytest.mark.parametrize("value", HOSTILE)
def test_environment_value_round_trips(value: str) -> None:
    line = environment_line("X_1", value)
    assert line.startswith('Environment="') and line.endswith('"')
    assert unquote_words(line.removeprefix("Environment="), dollar=False) == [f"X_1={value}"]


def test_dollar_is_literal_in_environment_but_escaped_in_commands() -> None:
    assert environment_line("A", "$HOME") == 'Environment="A=$HOME"'
    assert quote_arg("$HOME") == '"$$HOME"'
    assert environment_line("A", "50%") == 'Environment="A=50%%"'


@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_characters="\x7f")))
def test_any_printable_value_round_trips(value: str) -> None:
    assert unquote_words(quote_arg(value), dollar=True) == [value]
    assert unquote_words(environment_line("V", value).removeprefix("Environment="), dollar=False) == [
        f"V={value}"
    ]


@pytest.mark.parametrize("value", ["two\nlines", "nul\x00", "cr\r", "tab\there", "esc\x1b"])
def test_control_characters_are_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="control character"):
        quote_arg(value)
    with pytest.raises(ConfigError, match="control character"):
        environment_line("A", value)


@pytest.mark.parametrize("name", ["1A", "A-B", "A B", "", "A=B"])
def test_bad_environment_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid environment variable name"):
        environment_line(name, "x")


def test_relative_executable_is_refused() -> None:
    with pytest.raises(ConfigError, match="absolute"):
        quote_command(["python", "-m", "x"])


def test_systemd_parses_hostile_values_without_complaint(tmp_path: Path) -> None:
    exe = shutil.which("true") or "/bin/true"
    lines = [
        "[Service]",
        "Type=exec",
        *(environment_line(f"V{i}", v) for i, v in enumerate(HOSTILE)),
        "ExecStart=" + quote_command([exe, *HOSTILE]),
    ]
    unit = tmp_path / "hostile.service"
    unit.write_text("\n".join(lines) + "\n")
    res = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "hostile" not in res.stdout + res.stderr  # no warning about our file at all
    assert unquote_words(lines[-1].removeprefix("ExecStart="), dollar=True) == [exe, *HOSTILE]


def test_systemd_analyze_catches_a_broken_line(tmp_path: Path) -> None:
    """The check above can fail: an unbalanced quote is reported."""
    unit = tmp_path / "broken.service"
    unit.write_text('[Service]\nExecStart=/bin/true "a\n')
    res = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False
    )
    assert res.returncode != 0 and "quot" in (res.stdout + res.stderr).lower()

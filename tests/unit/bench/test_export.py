"""`--export-requests`: the path is checked before measuring, and CSV cells read back to the same values."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from servelab.bench.export import COLUMNS, check_path, render
from servelab.errors import ConfigError


def test_the_extension_chooses_the_format(tmp_path: Path) -> None:
    assert check_path(str(tmp_path / "r.jsonl")) == (tmp_path / "r.jsonl", "jsonl")
    assert check_path(str(tmp_path / "R.CSV")) == (tmp_path / "R.CSV", "csv")
    assert not list(tmp_path.iterdir())  # the probe leaves nothing behind


@pytest.mark.parametrize(
    ("name", "why"),
    [("r.json", "unknown format '.json'"), ("r", "(no extension)"), ("missing/r.csv", "cannot write in")],
)
def test_a_bad_path_is_a_config_error(tmp_path: Path, name: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_path(str(tmp_path / name))
    assert why in err.value.message and err.value.message.startswith("--export-requests ")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        check_path(str(tmp_path / "d.csv"))


def test_csv_cells_round_trip() -> None:
    row = dict.fromkeys(COLUMNS) | {"level": 0, "ok": False, "ttft_s": 0.1 + 0.2, "error_kind": "a,b\n"}
    text = render(iter([row]), "csv").decode()
    (got,) = list(csv.DictReader(io.StringIO(text)))
    assert got["ok"] == "false" and float(got["ttft_s"]) == 0.1 + 0.2 and got["error_kind"] == "a,b\n"
    assert got["e2e_s"] == "" and list(got) == list(COLUMNS)

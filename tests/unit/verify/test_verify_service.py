"""The orchestrator's pure parts: reference specs, and garbage the reference vouches for."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.errors import ConfigError
from servelab.verify.calls import Completion
from servelab.verify.result import Check, VerifyResult
from servelab.verify.service import _garbage_check, parse_reference


def test_parse_reference(tmp_path: Path) -> None:
    assert str(parse_reference(None)) == "auto" and str(parse_reference("auto")) == "auto"
    assert str(parse_reference("none")) == "none" and str(parse_reference("sim")) == "sim"
    (tmp_path / "config.json").write_text("{}")
    ref = parse_reference(f"hf:{tmp_path}")
    assert ref.kind == "hf" and ref.path == tmp_path.resolve() and str(ref) == f"hf:{tmp_path.resolve()}"
    with pytest.raises(ConfigError, match="unknown reference"):
        parse_reference("hf:")


LOOP = Completion("p", text=" x x x x x x x x", token_ids=[7] * 8, finish_reason="length")


def test_garbage_is_an_error_without_a_reference() -> None:
    check = _garbage_check([("alone", LOOP)], None, [LOOP])
    assert check.failed and "1 of 1 answers look like garbage" in check.detail


def test_garbage_the_reference_also_produces_is_a_warning() -> None:
    ok_ref = Check("reference", True)
    check = _garbage_check([("alone", LOOP), ("concurrent", LOOP)], ok_ref, [LOOP])
    assert not check.failed and check.severity == "warning"
    assert all(f["note"] == "the reference gives the same answer" for f in check.evidence["findings"])
    other = Completion("p", text=" !!!!!!!!!!!!!!!!", finish_reason="length")
    assert _garbage_check([("alone", LOOP), ("concurrent", other)], ok_ref, [LOOP]).failed
    assert _garbage_check([("alone", LOOP)], Check("reference", False, "error"), [LOOP]).failed


def test_result_verdict_and_json() -> None:
    r = VerifyResult(
        "http://h:1",
        "m",
        "completions",
        [Check("a", True), Check("b", False, "warning"), Check("c", False, "error", "bad", {"x": 1})],
    )
    assert not r.ok and [c.name for c in r.failures] == ["c"]
    d = r.to_dict()
    assert d["failed"] == ["c"] and d["warnings"] == ["b"] and d["checks"][2]["evidence"] == {"x": 1}
    r.checks.pop()
    assert r.ok

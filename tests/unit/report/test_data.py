"""The report model against the store: the performance model's view, the HTML's stored numbers, the CLI."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from click.testing import CliRunner
from tests.unit.report.study_builder import build_study

from servelab.cli.main import cli
from servelab.report import data, html
from servelab.report.model import CandidateScore, CandidateSettings, Explained, NoExplain
from servelab.store.db import Store, open_store


def test_explain_sets_the_winner_beside_the_model(golden_store: Store) -> None:
    m = data.load(golden_store, "golden-study")
    ex = m.explain
    assert isinstance(ex, Explained) and ex.label == "tp8"
    tp8 = m.candidate("tp8")
    assert tp8 is not None
    assert [lv.measured["tpot_ms"] for lv in ex.levels] == [lv["tpot_ms_p50"] for lv in tp8.levels]
    assert all((lv.predicted["tpot_ms"] or 0) > 0 for lv in ex.levels)
    dec = ex.decode
    assert dec.concurrency == 64 and dec.measured_tpot_ms == tp8.levels[-1]["tpot_ms_p50"]
    step = dec.predicted_step_ms or 0.0
    assert abs(sum(dec.predicted_breakdown_ms.values()) - step) < 0.01 * step


def test_candidate_settings_name_every_candidate_field() -> None:
    """The report's settings hold every field a layout or value sets (space.FIELDS), then args and env; the
    JSON lists only what a candidate chose (tp always)."""
    from servelab.space import FIELDS

    assert tuple(CandidateSettings.model_fields) == (*FIELDS, "args", "env")
    dumped = CandidateSettings(tp=None, pp=2, mem_fraction=0.9).model_dump(mode="json")
    assert dumped == {"tp": None, "pp": 2, "mem_fraction": 0.9}


def test_a_stored_score_keeps_its_keys() -> None:
    """A score stored by an older servelab (no `levels_meeting_slo`) or a later one (a field this model does
    not know) is published with the keys it was stored with, in their order."""
    old = {"label": "tp8", "status": "measured", "value": 503, "half_width": None, "level": 64.0, "why": ""}
    assert CandidateScore.model_validate(old).model_dump(mode="json") == old
    assert list(CandidateScore.model_validate(old).model_dump(mode="json")) == list(old)
    later = old | {"levels_meeting_slo": [1.0, 64.0], "novel": {"x": 1}}
    assert CandidateScore.model_validate(later).model_dump(mode="json") == later


def test_unknown_model_leaves_a_note_not_an_error(golden_store: Store) -> None:
    golden_store.conn.execute(
        "UPDATE studies SET spec_json = json_set(spec_json, '$.model.path', 'no-such-model')"
    )
    ex = data.load(golden_store, "golden-study").explain
    assert isinstance(ex, NoExplain) and "cannot describe" in ex.note


class _Cells(HTMLParser):
    """(candidate, key) -> data-value of every number cell in the per-level tables."""

    def __init__(self) -> None:
        super().__init__()
        self.cand: str | None = None
        self.values: dict[tuple[str, str], list[float]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self.cand = a.get("data-candidate")
        if tag == "td" and self.cand and a.get("data-key") and a.get("data-value"):
            self.values.setdefault((self.cand, a["data-key"] or ""), []).append(float(a["data-value"] or 0))


def test_html_tables_hold_the_stored_numbers(golden_store: Store) -> None:
    m = data.load(golden_store, "golden-study", model=False)
    p = _Cells()
    p.feed(html.render(m))
    for c in m.candidates:
        for key in ("output_throughput", "tpot_ms_p50", "ttft_ms_p99", "goodput", "e2e_ms_p50"):
            assert p.values.get((c.label, key), []) == [lv[key] for lv in c.levels]


def test_cli_writes_html_and_markdown_and_json(tmp_path: Path, servelab_home: Path) -> None:
    with open_store() as store:
        build_study(store, tmp_path)
    res = CliRunner().invoke(
        cli,
        [
            "report",
            "golden-study",
            "--no-host-checks",
            "--html",
            str(tmp_path / "r.html"),
            "--md",
            str(tmp_path / "md" / "r.md"),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["winner"]["label"] == "tp8" and out["format"] == "servelab-report/1"
    assert (
        str(tmp_path / "r.html") in out["written"] and (tmp_path / "md" / "r_files" / "latency.svg").exists()
    )
    assert "<svg" in (tmp_path / "r.html").read_text()
    plain = CliRunner().invoke(cli, ["report", "last", "--no-host-checks"])
    assert plain.exit_code == 0 and plain.output.startswith("# Findings: golden-study")
    missing = CliRunner().invoke(cli, ["report", "nope", "--no-host-checks"])
    assert missing.exit_code == 2 and "no study 'nope'" in missing.output


def test_doctor_findings_of_this_machine_go_into_the_host_section(golden_store: Store) -> None:
    from servelab.report import markdown
    from servelab.report.host import gather

    here = gather()
    assert here is not None and here["checks"], here  # the host checks exist in this servelab
    assert {c["status"] for c in here["checks"]} <= {"ok", "warn", "fail", "skip"}
    text = markdown.render(data.load(golden_store, "golden-study", host=here, model=False))
    assert "### This machine (where the report was written, not the study's host)" in text
    assert all(markdown.md(c["name"]) in text for c in here["checks"])

"""The Markdown report of a fixed study against tests/fixtures/golden/report.md.

Regenerate after an intended change: SERVELAB_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/report -q
(then read the diff: it is the review)."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from servelab.report import data, markdown
from servelab.report.model import Explained, StudyReport
from servelab.store.db import Store

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden"

# The decode-step view is the performance model's; a fixed one keeps the golden file independent of refits.
EXPLAIN: dict[str, Any] = {
    "available": True,
    "label": "tp8",
    "same_model": False,
    "caveat": None,
    "largest_gap": "at concurrency 64: ttft_ms off by -2%",
    "levels": [
        {
            "mode": "concurrency",
            "level": float(c),
            "concurrency": c,
            "measured": {"tpot_ms": t, "ttft_ms": f, "output_throughput": o},
            "predicted": {"tpot_ms": t * 0.99, "ttft_ms": f * 0.98, "output_throughput": o * 1.01},
            "error_pct": {},
            "attribution": {},
            "gap": "ttft_ms off by -2%",
        }
        for c, t, f, o in ((1, 19.7, 283.0, 46.0), (16, 45.9, 992.5, 301.0), (64, 105.3, 2795.0, 503.0))
    ],
    "decode": {
        "mode": "concurrency",
        "level": 64,
        "unit": "concurrent requests",
        "concurrency": 64,
        "predicted_step_ms": 80.0,
        "predicted_tpot_ms": 104.0,
        "predicted_breakdown_ms": {
            "weights": 20.0,
            "kv_cache": 4.0,
            "compute": 10.0,
            "allreduce": 30.0,
            "other": 16.0,
        },
        "measured_tpot_ms": 105.3,
        "bottleneck": "allreduce",
        "allreduce_share": 0.375,
    },
}


def fixed_model(store: Store) -> StudyReport:
    model = data.load(store, "golden-study", host=None, model=False)
    return model.model_copy(update={"explain": Explained.model_validate(EXPLAIN)})


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SERVELAB_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with SERVELAB_UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), (
        f"{name} differs from the golden file (SERVELAB_UPDATE_GOLDEN=1 regenerates it)"
    )


def test_markdown_matches_golden(golden_store: Store) -> None:
    check_golden("report.md", markdown.render(fixed_model(golden_store), "report_files"))


def test_write_puts_valid_svgs_beside_the_markdown(golden_store: Store, tmp_path: Path) -> None:
    out = tmp_path / "out" / "findings.md"
    written = markdown.write(fixed_model(golden_store), out)
    text = out.read_text()
    svgs = [p for p in written if p.suffix == ".svg"]
    assert {p.name for p in svgs} == {"throughput.svg", "latency.svg", "pareto.svg", "ttft.svg", "decode.svg"}
    for p in svgs:
        assert f"](findings_files/{p.name})" in text
        root = ET.fromstring(p.read_text())  # well-formed XML, drawable
        assert root.tag.endswith("svg") and root.get("viewBox")
        assert (
            len(list(root.iter("{http://www.w3.org/2000/svg}circle")))
            + len(list(root.iter("{http://www.w3.org/2000/svg}rect")))
            > 2
        )


def test_report_model_holds_the_stored_numbers(golden_store: Store) -> None:
    m = fixed_model(golden_store)
    c = {x.label: x for x in m.candidates}
    assert [x.label for x in m.candidates][:1] == ["tp8"]
    assert c["tp8"].winner and m.winner.runner_up == "tp4-pp2"
    lv64 = c["tp8"].levels[-1]
    assert lv64["output_throughput"] == (500.0 + 506.0) / 2 and lv64["ci"]["output_throughput"] is not None
    assert m.winner.significant is True  # 503 ± 19 vs 461 ± 6: the margin exceeds the noise
    assert c["tp8-trtllm"].status == "not_applied" and c["tp8-trtllm"].levels == []
    assert c["arfusion"].status == "anomalous"
    assert {a.kind for a in c["arfusion"].anomalies} >= {"throughput_collapse", "power_drop"}
    assert (c["broken"].diagnosis or {})["class"] == "cuda_init"
    assert m.plan_state == {
        "done": ["tp8", "tp4-pp2", "arfusion"],
        "not_applied": ["tp8-trtllm"],
        "failed": ["broken"],
        "not_yet_done": ["later"],
    }
    assert [p.label for p in m.pareto.front] and all(p.meets_slo for p in m.pareto.front)
    assert (c["tp8"].command or "").startswith("NCCL_P2P_LEVEL=SYS python -m servelab sim")

"""Requests the server will refuse, named before they are sent (issue 32): the first 40 rows of a
Mooncake-format trace replayed against the simulator serving Qwen3-8B with a 1,900-token context. Five
rows ask for more (prompt + output); `bench` counts them before the level, `--over-context skip|clip`
leaves them out or cuts them, and a row sent anyway fails with the server's own words, which the run,
the report and `--export-requests` keep. The simulator's default context is the model's own (vLLM's
derivation: Qwen3-8B's max_position_embeddings, 40,960)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support import simruns, trace_samples

from servelab.bench import traces as T

pytestmark = pytest.mark.integration

MODEL = "Qwen3-8B"
CONTEXT = 1900
TRACE = trace_samples.DIR / "mooncake.jsonl"
ROWS = T.read_trace(TRACE).sliced(limit=40).requests
OVER = [i for i, r in enumerate(ROWS) if r.input_len + r.output_len > CONTEXT]
REPLAY = ["--trace", str(TRACE), "--trace-limit", "40", "--time-scale", "5"]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[simruns.SimProcess]:
    proc = simruns.start_sim(
        tmp_path_factory.mktemp("sim"),
        "--model", MODEL, "--gpu", "h100-sxm", "--num-gpus", "1", "--personality", "vllm",
        "--max-model-len", str(CONTEXT),
        speed=200,
    )  # fmt: skip
    try:
        yield proc
    finally:
        proc.stop()


def test_the_sample_has_rows_over_the_context() -> None:
    assert len(OVER) == 5, OVER  # as in the issue: 5 of the first 40 rows


def test_rows_sent_anyway_are_named_before_and_fail_in_the_servers_words(
    sim: simruns.SimProcess, tmp_path: Path
) -> None:
    export = tmp_path / "requests.jsonl"
    out = simruns.bench(tmp_path, sim.url, MODEL, *REPLAY, "--export-requests", str(export))
    fit = out["config"]["context_fit"]
    assert fit["max_model_len"] == CONTEXT and fit["what"] == "trace rows" and fit["action"] == "send"
    assert (fit["checked"], fit["over"]) == (40, 5)
    assert fit["longest"] == max(r.input_len + r.output_len for r in ROWS)
    assert out["capabilities"]["max_model_len"] == CONTEXT
    said = [w for w in out["warnings"] if "ask for more than the server's context" in w]
    assert len(said) == 1 and said[0].startswith("5 of 40 trace rows") and "--over-context skip" in said[0]
    (level,) = out["levels"]
    s = level["summary"]
    assert (s["completed"], s["failed"], s["errors"]) == (35, 5, {"http_400": 5})
    # vLLM's own text (serving_engine.py), not the JSON body around it: every row over has a prompt
    # alone over the context
    assert all(ROWS[i].input_len >= CONTEXT for i in OVER)
    texts = {
        f"This model's maximum context length is {CONTEXT} tokens. However, your request has "
        f"{ROWS[i].input_len} input tokens. Please reduce the length of the input messages."
        for i in OVER
    }
    assert s["error_examples"]["http_400"] in texts
    # the export names each refused request with the server's words; the refused ones are the rows over
    rows = [json.loads(line) for line in export.read_text().splitlines()]
    refused = sorted(r["idx"] for r in rows if not r["ok"])
    assert refused == OVER
    for r in rows:
        if r["ok"]:
            assert r["error_message"] is None
        else:
            assert r["error_kind"] == "http_400"
            assert r["error_message"] == (
                f"This model's maximum context length is {CONTEXT} tokens. However, your request has "
                f"{ROWS[r['idx']].input_len} input tokens. Please reduce the length of the input messages."
            )
    # the run's report shows each failure kind in the server's words
    rep = simruns.servelab(tmp_path, "report", out["run"])
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "## Failures" in rep.stdout and "maximum context length is 1900 tokens" in rep.stdout


def test_the_warning_comes_before_the_level_in_the_human_output(
    sim: simruns.SimProcess, tmp_path: Path
) -> None:
    res = simruns.servelab(tmp_path, "bench", "--url", sim.url, "--model", MODEL, *REPLAY)
    assert res.returncode == 0, res.stderr[-3000:]
    err = " ".join(res.stderr.split())
    assert "5 of 40 trace rows ask for more than the server's context" in err, res.stderr[-3000:]


def test_skip_leaves_the_rows_out(sim: simruns.SimProcess, tmp_path: Path) -> None:
    out = simruns.bench(tmp_path, sim.url, MODEL, *REPLAY, "--over-context", "skip")
    fit = out["config"]["context_fit"]
    assert (fit["over"], fit["action"]) == (5, "skip") and out["config"]["over_context"] == "skip"
    assert out["config"]["trace_info"]["requests"] == 35
    assert any("--over-context skip: they are not sent" in w for w in out["warnings"])
    records = sorted(simruns.level_records(tmp_path, out["run"]), key=lambda r: r.idx)
    assert len(records) == 35 and all(r.ok for r in records)
    kept = [r for i, r in enumerate(ROWS) if i not in OVER]
    assert [r.input_tokens for r in records] == [q.input_len for q in kept]


def test_clip_cuts_the_prompts_to_fit(sim: simruns.SimProcess, tmp_path: Path) -> None:
    out = simruns.bench(tmp_path, sim.url, MODEL, *REPLAY, "--over-context", "clip")
    assert out["config"]["context_fit"]["action"] == "clip"
    records = sorted(simruns.level_records(tmp_path, out["run"]), key=lambda r: r.idx)
    assert len(records) == 40 and all(r.ok for r in records), [r.error_message for r in records if not r.ok]
    for i, (rec, row) in enumerate(zip(records, ROWS, strict=True)):
        assert rec.output_tokens == row.output_len  # the output asked for is kept
        if i in OVER:
            assert rec.input_tokens is not None and rec.input_tokens + row.output_len < CONTEXT
            assert rec.input_tokens < row.input_len
        else:
            assert rec.input_tokens == row.input_len


def test_the_default_context_is_the_models_own(tmp_path: Path) -> None:
    sim = simruns.start_sim(
        tmp_path / "sim", "--model", MODEL, "--gpu", "h100-sxm", "--num-gpus", "1", "--personality", "sglang"
    )
    try:
        with urllib.request.urlopen(sim.url + "/v1/models", timeout=5) as r:
            models = json.loads(r.read())
    finally:
        sim.stop()
    assert models["data"][0]["max_model_len"] == 40960  # Qwen3-8B's max_position_embeddings, not 32768

"""A failure whose log names the setting to change teaches the search a region of that setting, and the
plan keeps it as evidence. The simulator (vLLM personality) with its `kv_cache_too_small:20000` fault
refuses to start when max_model_len is over the 20,000 tokens its KV cache holds, in vLLM's words with
vLLM's figures; the diagnosis reads `max_model_len`, 19968 to try (20,000 rounded down to 256). The search
over max_model_len then runs no other length above 19968: each is pruned with the region the one failure
taught, the lengths that fit are measured, and the failed candidate's plan item is blocked with the
diagnosis and its setting. Real processes, the real simulator, the real store (read through the CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.integration.test_tune_search import _point, _rows
from tests.integration.test_tune_sim import markers_alive, servelab

pytestmark = pytest.mark.integration

FITS = 20000  # the KV cache's tokens the fault gives
TRY = 19968  # what the diagnosis says to try: FITS rounded down to a multiple of 256
LENGTHS = [4096, 8192, 16384, 24576, 32768, 40960]  # Qwen3-8B's context is 40960

STUDY = f"""
objective = "output_throughput"
repeats = 1

[study]
name = "kv-setting-prune"

[model]
path = "Qwen3-8B"

[host]
gpu = "h100-sxm"
num_gpus = 1

[engine]
name = "sim"
startup_timeout_s = 60
[engine.options]
personality = "vllm"
speed = 100
fast_start = true
faults = ["kv_cache_too_small:{FITS}"]

[search]
strategy = "optuna"
budget_trials = {len(LENGTHS)}
seed = 3
contenders = 1
[search.space]
max_model_len = {LENGTHS}

[workload]
input_len = 256
output_len = 16
requests_per_stream = 1

[load]
concurrency = [4]
"""


def test_a_failure_naming_its_setting_prunes_that_region_and_the_plan_keeps_it(tmp_path: Path) -> None:
    study = tmp_path / "kv.toml"
    study.write_text(STUDY)
    home = tmp_path / "home"
    out = json.loads(servelab("tune", str(study), "--json", home=home, timeout=600).stdout)
    cands = {c["label"]: c for c in out["candidates"]}
    length = {r["label"]: int(_point(r)["max_model_len"]) for r in _rows(home)}  # each one's point
    assert set(length) == set(cands)
    assert sorted(length.values()) == LENGTHS  # every point was proposed: run or pruned

    # one length above what fits ran and failed, naming the setting with the log's figures
    [failed] = [label for label, c in cands.items() if c["status"] == "failed"]
    assert length[failed] > FITS
    diag = cands[failed]["diagnosis"]
    assert diag["class"] == "kv_cache_too_small"
    assert diag["setting"] == {
        "name": "max_model_len",
        "value": TRY,
        "reason": f"max_model_len is {length[failed]}; the log says {FITS} fit in the KV cache",
        "tried": length[failed],
    }
    # the other lengths above it were never launched: pruned by the region that failure taught
    pruned = [label for label, c in cands.items() if c["status"] == "pruned"]
    assert sorted(length[x] for x in pruned) == sorted(n for n in LENGTHS if n > FITS and n != length[failed])
    regions = {r["where"]: r for r in out["search"]["regions"]}
    assert set(regions) == {f"max_model_len > {TRY}"}
    assert regions[f"max_model_len > {TRY}"]["kind"] == "failed"
    assert regions[f"max_model_len > {TRY}"]["source"] == failed
    assert regions[f"max_model_len > {TRY}"]["pruned"] == len(pruned)
    # the lengths that fit ran and were measured (a loaded machine may flag one anomalous: still measured)
    ran = {length[x]: c["status"] for x, c in cands.items() if c["status"] not in ("failed", "pruned")}
    assert set(ran) == {n for n in LENGTHS if n <= FITS}
    assert set(ran.values()) <= {"measured", "anomalous"}
    assert out["search"]["used"]["trials"] == len(LENGTHS) - len(pruned)

    # the plan: the failed candidate's item is blocked, the diagnosis and its setting its evidence
    plan = json.loads(servelab("plan", "--plan", out["study"], "--json", home=home).stdout)
    items = {i["binding"]["candidate"]: i for i in plan["items"]}
    item = items[failed]
    assert item["status"] == "blocked"
    ev = item["evidence"][-1]
    assert ev["status"] == "failed" and ev["diagnosis"]["setting"]["value"] == TRY
    hist = json.loads(
        servelab("plan", "history", item["id"], "--plan", out["study"], "--json", home=home).stdout
    )["events"]
    assert hist[-1]["to_status"] == "blocked"
    assert f"try max_model_len = {TRY}" in hist[-1]["reason"]
    assert not markers_alive(f"servelab-study:{out['study']}:")

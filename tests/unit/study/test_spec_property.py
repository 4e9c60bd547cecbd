"""Property (issue 15): the dry run accepts exactly what the real run can launch.

Hypothesis writes study files (names with odd characters, env tables, args, matrices, simulator options,
layouts against the box) and reads them as `servelab tune` does. A study the dry run refuses is refused
with a ConfigError (exit 2, no traceback). For a study it accepts, every candidate goes through what the
real run derives before launching (settings, a port, the engine's command line, the run marker, the log
file, the environment `exec` gets) and each must succeed; a candidate without extra engine flags is also
handed to the simulator's own start-up checks (`servelab sim`'s argument parsing and `build_config`, all
of it short of serving), which must accept it too. Tokens of distinct labels never collide.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servelab import naming
from servelab.cli.sim import build_config
from servelab.cli.sim import sim as sim_command
from servelab.config.loading import load_study
from servelab.engines import registry
from servelab.errors import ConfigError
from servelab.lifecycle.handle import check_marker
from servelab.naming import STUDY_MARKER_PREFIX as MARKER_PREFIX
from servelab.sim.faults import FAULTS
from servelab.trial.prepare import settings_for
from servelab.tune import preflight

ODD = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r"),  # TOML folds \r\n
    max_size=12,
)
NAMEISH = st.one_of(ODD, st.sampled_from(["a/b", "a_b", "a?b", "x=1", "tp8-NCCL_P2P_DISABLE=1", "", "."]))


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        # JSON's escapes are TOML's; TOML wants DEL escaped too, and no surrogate pairs (so no ensure_ascii)
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_value(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def mostly(valid: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Valid values nine times in ten: enough studies pass to exercise what runs after the dry run."""
    return st.integers(0, 9).flatmap(lambda i: bad if i == 7 else valid)


ENV_NAME = mostly(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), st.sampled_from(["", "x=1", "a\0"]))
options = st.fixed_dictionaries(
    {},
    optional={
        "cpus": mostly(st.lists(st.integers(0, 1), min_size=1, max_size=2), st.sampled_from(["0", [-1], []])),
        "faults": mostly(
            st.lists(st.sampled_from([*sorted(FAULTS), "die_after_ready:3"]), max_size=1),
            st.sampled_from(["hang", ["nope"], ["hang:x"], ["oom_init", "cuda_init"]]),
        ),
        "speed": mostly(st.floats(0.5, 100), st.sampled_from([-1.0, 0.0, math.nan, math.inf])),
        "personality": mostly(st.sampled_from(["vllm", "sglang"]), st.just("trt")),
        "seed": mostly(st.integers(0, 9), st.just("1")),
        "fast_start": mostly(st.booleans(), st.just("yes")),
        "num_gpus": mostly(st.sampled_from([1, 2, 8]), st.just(0)),
    },
)
candidate = st.fixed_dictionaries(
    {},
    optional={
        "name": NAMEISH,
        "tp": mostly(st.sampled_from([1, 2, 4, 8]), st.sampled_from([3, 16])),
        "pp": st.sampled_from([1, 2]),
        "max_concurrency": st.integers(1, 256),
        "mem_fraction": st.sampled_from([0.5, 0.9]),
        "max_model_len": st.sampled_from([2048, 4096]),
        "env": st.dictionaries(ENV_NAME, ODD, max_size=2),
        "args": st.lists(ODD, max_size=1),
        "options": options,
    },
)
matrix = st.fixed_dictionaries(
    {},
    optional={
        "tp": st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3),
        "max_concurrency": st.lists(st.integers(1, 64), min_size=1, max_size=3),
        "env": st.lists(st.dictionaries(ENV_NAME, ODD, max_size=1), min_size=1, max_size=2),
        "variants": st.lists(
            st.fixed_dictionaries({"tp": st.sampled_from([1, 2])}, optional={"name": NAMEISH}),
            min_size=1,
            max_size=2,
        ),
    },
)


def study_file(cands: list[dict[str, Any]], mat: dict[str, Any], opts: dict[str, Any], box: int) -> str:
    lines = [
        '[study]\nname = "p"\n[model]\npath = "Qwen3-30B-A3B"',
        f'[host]\ngpu = "h100-sxm"\nnum_gpus = {box}',
        '[engine]\nname = "sim"\n[engine.options]',
        *(f"{k} = {toml_value(v)}" for k, v in opts.items()),
    ]
    for c in cands:
        lines.append("[[candidates]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in c.items()]
    if mat:
        lines.append("[matrix]")
        lines += [f"{k} = {toml_value(v)}" for k, v in mat.items()]
    lines.append("[workload]\nnum_requests = 8\n[load]\nconcurrency = [1]")
    return "\n".join(lines) + "\n"


def launchable(argv: list[str], env: dict[str, str]) -> None:
    """What `subprocess.Popen` / `exec` refuse: NUL in argv, `=` or NUL in an environment name."""
    assert argv and all("\0" not in a for a in argv)
    for k, v in env.items():
        assert k and "=" not in k and "\0" not in k and "\0" not in v, (k, v)


def simulator_accepts(argv: list[str]) -> None:
    """The simulator's own start-up checks on this argv, short of serving."""
    assert argv[1:4] == ["-m", "servelab", "sim"]
    ctx = sim_command.make_context("sim", argv[4:])
    build_config(dict(ctx.params), list(ctx.args))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cands=st.lists(candidate, min_size=1, max_size=4),
    mat=matrix,
    opts=options,
    box=st.sampled_from([8, 2, 1]),
)
def test_the_dry_run_accepts_exactly_what_the_real_run_can_launch(
    cands: list[dict[str, Any]], mat: dict[str, Any], opts: dict[str, Any], box: int
) -> None:
    engine = registry.get("sim")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "study.toml"
        path.write_text(study_file(cands, mat, opts, box))
        try:  # the dry run: the file read as `tune` reads it, then the shared preflight
            study = load_study(path)
            preflight(study, engine)
        except ConfigError as exc:
            assert exc.exit_code == 2 and exc.message  # refused cleanly: nothing to launch
            event("refused")
            return
        event(f"accepted {min(len(study.candidates), 3)}+ candidates")
        tokens: dict[str, str] = {}
        for cand in study.candidates:  # what `Tuner._trial` derives before it launches
            label = cand.label()
            s = settings_for(study, cand, port=40000)
            launch = engine.command(s)
            check_marker(naming.run_marker(MARKER_PREFIX, "st-x", label, 0))
            log = Path(tmp) / "logs" / naming.log_name(label, 0, 1)
            assert log.parent == Path(tmp) / "logs"
            log.parent.mkdir(exist_ok=True)
            os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))  # new: never shared
            launchable(launch.argv, {**launch.env, "SERVELAB_RUN": "x"})
            cpus = s.options.get("cpus")
            assert cpus is None or all(isinstance(c, int) and c >= 0 for c in cpus)
            if not s.extra_args:
                simulator_accepts(launch.argv)
            tok = naming.token(label)
            assert tokens.setdefault(tok, label) == label

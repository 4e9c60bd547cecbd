"""RUN → the stored launch record; redacted secrets must be supplied before anything is deployed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from servelab.deploy import source
from servelab.errors import ConfigError, NotFoundError
from servelab.redact import redact_text
from servelab.store.db import Store

MakeStudy = Callable[..., dict[str, Any]]


def test_study_means_its_winner(store: Store, make_study: MakeStudy) -> None:
    ids = make_study("vllm")
    rec = source.resolve(store, ids["uid"])
    assert (rec.candidate, rec.trial_id, rec.engine) == ("tp2", ids["trials"]["tp2"], "vllm")
    assert rec.port == 8123 and rec.served_model == "qwen3" and rec.main_level == 4.0
    assert rec.main_digest()["output_throughput"] == 1000.0
    assert source.resolve(store, "last").trial_id == rec.trial_id
    assert source.resolve(store, "demo study").trial_id == rec.trial_id


def test_candidate_and_trial_refs(store: Store, make_study: MakeStudy) -> None:
    ids = make_study("sglang")
    assert source.resolve(store, f"{ids['uid']}:tp1").trial_id == ids["trials"]["tp1"]
    assert source.resolve(store, f"trial:{ids['trials']['tp1']}").candidate == "tp1"
    with pytest.raises(NotFoundError, match="no candidate 'tp9'"):
        source.resolve(store, f"{ids['uid']}:tp9")
    with pytest.raises(NotFoundError, match="no trial 999"):
        source.resolve(store, "trial:999")
    with pytest.raises(ConfigError, match="numeric"):
        source.resolve(store, "trial:abc")


def test_no_winner_and_unmeasured(store: Store, make_study: MakeStudy) -> None:
    ids = make_study("sim", winner=None)
    with pytest.raises(NotFoundError, match="has no winner") as exc:
        source.resolve(store, ids["uid"])
    assert "tp2" in exc.value.hint
    store.conn.execute("UPDATE study_trials SET status = 'failed' WHERE id = ?", (ids["trials"]["tp1"],))
    with pytest.raises(NotFoundError, match="no measured trial"):
        source.resolve(store, f"{ids['uid']}:tp1")
    with pytest.raises(ConfigError, match="was not measured"):
        source.resolve(store, f"trial:{ids['trials']['tp1']}")


def test_secret_env_is_left_to_the_environment_file(store: Store, make_study: MakeStudy) -> None:
    ids = make_study("vllm", env={"HF_TOKEN": "hf_secretsecret", "NCCL_DEBUG": "WARN"})
    rec = source.resolve(store, ids["uid"])
    assert rec.env["HF_TOKEN"] == "***"  # the store never held the secret
    with pytest.raises(ConfigError, match="secrets \\(HF_TOKEN\\)") as exc:
        source.apply_overrides(rec)
    assert "HF_TOKEN=VALUE" in exc.value.hint and "--env-file" in exc.value.hint
    with pytest.raises(ConfigError, match="`--env HF_TOKEN` would write a secret"):
        source.apply_overrides(rec, env={"HF_TOKEN": "hf_real"}, env_file=True)
    from_file = source.apply_overrides(rec, env_file=True)
    assert "HF_TOKEN" not in from_file.env and from_file.env["NCCL_DEBUG"] == "WARN"
    assert from_file.secret_env == ("HF_TOKEN",)


def test_secret_argument_leaves_the_command_line(store: Store, make_study: MakeStudy) -> None:
    ids = make_study("vllm", args=["--api-key", "sk-abcdefghijkl", "--hf-token=hf_abcdefgh"])
    rec = source.resolve(store, ids["uid"])
    with pytest.raises(ConfigError, match="VLLM_API_KEY") as exc:
        source.apply_overrides(rec)
    assert "VLLM_API_KEY=VALUE" in exc.value.hint and "--env-file" in exc.value.hint
    with pytest.raises(ConfigError, match="`--arg --api-key` would write a secret") as inline:
        source.apply_overrides(rec, args={"--api-key": "sk-real"}, env_file=True)
    assert redact_text(inline.value.message) == inline.value.message  # printed whole, nothing masked
    fixed = source.apply_overrides(rec, port=9000, env_file=True)
    assert source.flag_value(fixed.argv, "--api-key") is None and fixed.port == 9000
    assert not any("hf-token" in a or "***" in a for a in fixed.argv)
    assert fixed.secret_env == ("HF_TOKEN", "VLLM_API_KEY")


def test_secret_flag_without_an_environment_route_is_refused(store: Store, make_study: MakeStudy) -> None:
    ids = make_study("sglang", args=["--api-key", "sk-abcdefghijkl"])
    with pytest.raises(ConfigError, match="sglang takes `--api-key` only on its command line") as exc:
        source.apply_overrides(source.resolve(store, ids["uid"]), env_file=True)
    assert (
        redact_text(exc.value.message) == exc.value.message and redact_text(exc.value.hint) == exc.value.hint
    )


def test_set_flag_forms() -> None:
    assert source.set_flag(["x", "--port", "1", "--port=2"], "--port", "3") == [
        "x",
        "--port",
        "3",
        "--port=3",
    ]
    with pytest.raises(ConfigError, match="no --host"):
        source.set_flag(["x"], "--host", "0.0.0.0")

"""The trial pipeline's typed seams keep the stored shapes: a diagnosis, a level, a candidate's outcome."""

from __future__ import annotations

from servelab.applied import Mismatch
from servelab.engines.base import Diagnosis, EffectiveConfig
from servelab.trial.outcome import AppliedCheck, Finding, LevelResult, TrialOutcome


def test_a_finding_stores_the_keys_a_diagnosis_always_had_in_their_order() -> None:
    d = Diagnosis("oom_init", "CUDA out of memory", "lower mem_fraction", tail=("a", "b"), fatal=True)
    assert list(Finding.of(d, "exited").to_dict().items()) == [
        ("class", "oom_init"),
        ("evidence", "CUDA out of memory"),
        ("advice", "lower mem_fraction"),
        ("fatal", True),
        ("tail", ["a", "b"]),
        ("message", "exited"),
    ]
    assert Finding.of(Diagnosis("x", "e", "a")).to_dict() == Diagnosis("x", "e", "a").to_dict()
    # server_unresponsive: no fatal, but its (possibly empty) tail
    assert Finding("server_unresponsive", "e", "a", tail=(), message="m").to_dict() == {
        "class": "server_unresponsive",
        "evidence": "e",
        "advice": "a",
        "tail": [],
        "message": "m",
    }


def level(died: bool = False) -> LevelResult:
    return LevelResult(4.0, {"level": 4.0, "failed": 0}, {"gpu_power_w": 300.0}, "b-1", 7, died)


def test_a_stored_level_is_the_digest_with_telemetry_and_its_bench_run() -> None:
    assert level().stored() == {"level": 4.0, "failed": 0, "gpu_power_w": 300.0, "bench_run": "b-1"}
    assert level(died=True).stored()["died"] is True


def test_the_candidate_outcome_a_study_stores() -> None:
    found = Finding("cuda_init", "e", "a", fatal=True, message="m")
    assert TrialOutcome("measured", "done").record() == {}
    assert TrialOutcome("failed", "start", found).record() == {"diagnosis": found.to_dict()}
    assert TrialOutcome("failed", "bench", found, levels=[level(True)], died=True).record() == {
        "diagnosis": found.to_dict(),
        "died_during_benchmark": True,
    }
    flat = Finding("invalid_candidate", "bad tp", "use 1")
    assert TrialOutcome("failed", "command", flat).record() == {
        "class": "invalid_candidate",
        "evidence": "bad tp",
        "advice": "use 1",
    }
    m = Mismatch("moe_runner_backend", "flashinfer_trtllm", "flashinfer_cutlass", "log line")
    check = AppliedCheck({"moe_runner_backend": "flashinfer_trtllm"}, EffectiveConfig(), [m], ["tp_size"])
    assert TrialOutcome("not_applied", "applied", applied=check).record() == {
        "not_applied": [m.to_dict()],
        "unconfirmed": ["tp_size"],
    }

"""Requested vs effective: the flashinfer_trtllm experiment that never ran must be caught."""

from servelab.applied import compare, same


def test_backend_replacement_is_a_mismatch_with_evidence() -> None:
    line = "Use flashinfer_cutlass as MoE runner backend on SM120, since flashinfer_trtllm is not supported"
    mism, unconfirmed = compare(
        {"moe_runner_backend": "flashinfer_trtllm", "tp_size": 8, "pp_size": 1},
        {"moe_runner_backend": "flashinfer_cutlass", "tp_size": 8},
        {"moe_runner_backend": line},
    )
    assert [m.key for m in mism] == ["moe_runner_backend"]
    assert mism[0].evidence == line
    assert "flashinfer_trtllm" in mism[0].sentence()
    assert unconfirmed == ["pp_size"]


def test_auto_and_spellings_match() -> None:
    assert compare({"attention_backend": "auto"}, {"attention_backend": "fa3"}, {}) == ([], [])
    assert same(8, "8") and same("True", True) and same("flashinfer-cutlass", "flashinfer_cutlass")
    assert not same(0.9, 0.85)

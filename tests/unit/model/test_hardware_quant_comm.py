from __future__ import annotations

import pytest

from servelab.errors import ConfigError, NotFoundError
from servelab.model.comm import Fabric, allreduce_s
from servelab.model.hardware import get_gpu, make_host
from servelab.model.quant import BYTES_PER_PARAM, normalize_format


def test_catalog_has_required_gpus() -> None:
    for name in ("rtx-pro-6000", "rtx-5090", "l40s", "a100-sxm", "h100-sxm", "h100-pcie", "h200-sxm", "b200"):
        assert get_gpu(name).memory_gb > 0
    pro = get_gpu("rtx-pro-6000")
    assert (pro.memory_gb, pro.memory_bw_gbs, pro.sm) == (96, 1792, 120)
    h200 = get_gpu("H200_SXM")
    assert (h200.memory_gb, h200.memory_bw_gbs) == (141, 4800)


def test_unknown_gpu_lists_known() -> None:
    with pytest.raises(NotFoundError) as exc:
        get_gpu("tpu-v5")
    assert "rtx-pro-6000" in exc.value.hint and "h200-sxm" in exc.value.hint


def test_fp4_falls_back_on_gpus_without_it() -> None:
    assert get_gpu("h100-sxm").tflops("fp4") == get_gpu("h100-sxm").tflops_fp8
    assert get_gpu("a100-sxm").tflops("fp8") == 312


def test_pcie_allreduce_is_latency_bound_and_slower_than_nvlink() -> None:
    pcie = make_host("rtx-pro-6000", 8).interconnect
    nvl = make_host("h200-sxm", 8).interconnect
    fp = Fabric(pcie.bus_gbs, pcie.base_us, pcie.hop_us)
    fn = Fabric(nvl.bus_gbs, nvl.base_us, nvl.hop_us)
    small = 6144 * 2  # one decode token's hidden state
    assert 20e-6 < allreduce_s(fp, 8, small) < 150e-6  # tens of µs
    assert allreduce_s(fp, 8, small) > 3 * allreduce_s(fn, 8, small)
    # latency dominates small messages, bandwidth dominates large ones
    assert allreduce_s(fp, 8, small) < 1.1 * fp.latency_us(8) * 1e-6
    big = 64e6
    assert allreduce_s(fp, 8, big) > 10 * fp.latency_us(8) * 1e-6
    assert fp.latency_us(8) > fp.latency_us(4) > fp.latency_us(2)


def test_measured_latency_overrides_catalog() -> None:
    f = Fabric(40, 10, 4, measured_us=((8, 90.0),))
    assert f.latency_us(8) == 90.0
    assert f.latency_us(4) < 90.0


def test_quant_formats() -> None:
    assert normalize_format("FP4") == "nvfp4"
    assert normalize_format("Q4_K_M") == "q4_k_m"
    assert BYTES_PER_PARAM["nvfp4"] < BYTES_PER_PARAM["fp8"] < BYTES_PER_PARAM["bf16"]
    with pytest.raises(ConfigError):
        normalize_format("fp3")

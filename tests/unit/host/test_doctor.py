"""Doctor checks as data: each one on facts built from real outputs."""

from __future__ import annotations

from pathlib import Path

from servelab.host import doctor, gpus, topology

FIX = Path(__file__).parents[2] / "fixtures" / "nvidia_smi"
NO_GPU = gpus.GpuReport("none", False, note="no GPUs: nvidia-smi is not installed")


def facts(**kw: object) -> doctor.Facts:
    base: dict[str, object] = {
        "gpus": NO_GPU,
        "uvm_disable_hmm": None,
        "shm_bytes": 32 * 2**30,
        "nofile_soft": 1 << 20,
        "nofile_hard": 1 << 20,
    }
    base.update(kw)
    return doctor.Facts(**base)  # type: ignore[arg-type]


def by_name(f: doctor.Facts) -> dict[str, doctor.Check]:
    return {c.name: c for c in doctor.run_checks(f)}


def test_cpu_host_skips_gpu_checks_and_says_why() -> None:
    checks = by_name(facts())
    for name in ("GPU P2P", "PCIe link", "power limit", "ECC", "persistence mode"):
        assert checks[name].status == "skip" and "no GPUs" in checks[name].evidence
    assert checks["nvidia_uvm HMM"].status == "skip"
    assert doctor.report(facts()).worst == "ok"


def test_host_limits() -> None:
    c = by_name(facts(uvm_disable_hmm="N", shm_bytes=64 * 2**20, nofile_soft=1024, nofile_hard=4096))
    assert c["nvidia_uvm HMM"].status == "warn" and "uvm_disable_hmm=1" in c["nvidia_uvm HMM"].fix
    assert c["/dev/shm size"].status == "fail" and "--shm-size" in c["/dev/shm size"].fix
    assert c["open-file limit"].status == "warn" and "1024" in c["open-file limit"].evidence
    assert doctor.report(facts(shm_bytes=64 * 2**20)).worst == "fail"
    assert by_name(facts(uvm_disable_hmm="Y"))["nvidia_uvm HMM"].status == "ok"


def test_h200_from_q_is_healthy() -> None:
    rep = gpus.parse_q((FIX / "q_h200.txt").read_text())
    c = by_name(facts(gpus=rep))
    assert c["PCIe link"].status == "ok" and c["power limit"].status == "ok"
    assert c["ECC"].status == "ok" and c["persistence mode"].status == "ok"


def test_degraded_gpus() -> None:
    rep = gpus.GpuReport(
        "fixture",
        True,
        gpus=[
            gpus.Gpu(
                0,
                pcie_gen=4,
                pcie_gen_max=5,
                pcie_width=8,
                pcie_width_max=16,
                power_limit_w=500,
                default_power_limit_w=700,
                persistence=False,
                ecc=True,
                ecc_uncorrected=3,
            ),
            gpus.Gpu(
                1,
                pcie_gen=1,
                pcie_gen_max=5,
                pcie_width=16,
                pcie_width_max=16,
                utilization_pct=0,
                power_limit_w=700,
                default_power_limit_w=700,
                persistence=True,
                ecc=True,
                ecc_uncorrected=0,
            ),
        ],
    )
    c = by_name(facts(gpus=rep))
    assert c["PCIe link"].status == "warn" and "GPU0: x8 of x16" in c["PCIe link"].evidence
    assert "GPU1" not in c["PCIe link"].evidence  # gen 1 at idle is power saving, not a fault
    assert c["power limit"].status == "warn" and "500 W < default 700 W" in c["power limit"].evidence
    assert c["ECC"].status == "fail" and "3 uncorrected" in c["ECC"].evidence
    assert c["persistence mode"].status == "warn" and c["persistence mode"].fix.startswith(
        "sudo nvidia-smi -pm 1"
    )


def test_p2p_from_topology() -> None:
    rep = gpus.GpuReport("fixture", True, gpus=[gpus.Gpu(0), gpus.Gpu(1)])
    t = topology.parse_topo((FIX / "topo_2x5090_phb.txt").read_text())
    t.p2p = topology.parse_p2p((FIX / "p2p_2x5090_gns.txt").read_text())
    c = by_name(facts(gpus=rep, topology={"summary": topology.analyze(t, False)}))
    assert c["GPU P2P"].status == "warn" and "GPU not supported" in c["GPU P2P"].evidence
    t.p2p = {}
    c = by_name(facts(gpus=rep, topology={"summary": topology.analyze(t, True)}))
    assert c["GPU P2P"].status == "warn" and "virtual machine" in c["GPU P2P"].evidence


def test_gather_reads_this_host() -> None:
    f = doctor.gather(NO_GPU, {})
    assert f.nofile_soft is not None and f.shm_bytes is not None

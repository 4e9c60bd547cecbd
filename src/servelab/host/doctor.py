"""`servelab doctor`: host checks that decide whether an inference server can run well here, each with a fix.

Each check is a pure function of `Facts` (gathered once, or built by tests) returning a `Check`: a status
(ok / warn / fail / skip), the evidence it read and the command that fixes it. Thresholds are data
(`LIMITS`), so changing one is not a code change.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from servelab.host.gpus import Gpu, GpuReport
from servelab.host.topology import TopologySummary
from servelab.jsontypes import JsonObject

LIMITS: dict[str, float] = {
    "shm_min_gib": 8.0,  # NCCL and vLLM/SGLang shared-memory transports; Docker's default 64 MiB fails them
    "nofile_min": 65536,  # every request is a socket; engines and tokenizers open many files
    "power_limit_ratio": 0.95,  # a limit below 95 % of the default is a deliberate cap (or a mistake)
}
UVM_HMM_PARAM = Path("/sys/module/nvidia_uvm/parameters/uvm_disable_hmm")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    evidence: str
    fix: str = ""

    def to_dict(self) -> JsonObject:
        return asdict(self)


@dataclass
class Facts:
    """What the checks read; `gather()` fills it from this host."""

    gpus: GpuReport
    topology: JsonObject = field(default_factory=dict)  # topology.read's, as the agent sends it
    uvm_disable_hmm: str | None = None  # the module parameter ("Y"/"N"); None: nvidia_uvm not loaded
    shm_bytes: int | None = None
    nofile_soft: int | None = None
    nofile_hard: int | None = None

    def to_dict(self) -> JsonObject:
        """JSON-able: what the agent of a remote host sends back (`from_dict` reads it)."""
        return {
            "gpus": self.gpus.to_dict(),
            "topology": self.topology,
            "uvm_disable_hmm": self.uvm_disable_hmm,
            "shm_bytes": self.shm_bytes,
            "nofile_soft": self.nofile_soft,
            "nofile_hard": self.nofile_hard,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Facts:
        gpus, topology = d["gpus"], d.get("topology") or {}
        assert isinstance(gpus, dict) and isinstance(topology, dict)
        uvm = d.get("uvm_disable_hmm")
        return cls(
            gpus=GpuReport.from_dict(gpus),
            topology=dict(topology),
            uvm_disable_hmm=uvm if isinstance(uvm, str) else None,
            shm_bytes=_int(d.get("shm_bytes")),
            nofile_soft=_int(d.get("nofile_soft")),
            nofile_hard=_int(d.get("nofile_hard")),
        )


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def gather(gpus: GpuReport, topology: JsonObject) -> Facts:
    shm: int | None
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_blocks * st.f_frsize
    except OSError:
        shm = None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return Facts(
        gpus=gpus,
        topology=topology,
        uvm_disable_hmm=_read(UVM_HMM_PARAM),
        shm_bytes=shm,
        nofile_soft=soft,
        nofile_hard=hard,
    )


def _no_gpus(name: str, f: Facts) -> Check | None:
    return None if f.gpus.available else Check(name, "skip", f.gpus.note or "no GPUs")


def check_uvm_hmm(f: Facts) -> Check:
    """HMM lets nvidia_uvm mirror all process memory; with some driver/kernel pairs it makes CUDA start-up and
    pinned allocations crawl or hang, and the usual advice for inference hosts is to turn it off."""
    if f.uvm_disable_hmm is None:
        return Check("nvidia_uvm HMM", "skip", "nvidia_uvm is not loaded")
    if f.uvm_disable_hmm.upper() in ("Y", "1"):
        return Check("nvidia_uvm HMM", "ok", f"uvm_disable_hmm={f.uvm_disable_hmm}")
    return Check(
        "nvidia_uvm HMM",
        "warn",
        f"uvm_disable_hmm={f.uvm_disable_hmm} (HMM enabled)",
        "echo 'options nvidia_uvm uvm_disable_hmm=1' | sudo tee /etc/modprobe.d/nvidia-uvm-hmm.conf"
        " && sudo modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm  (or reboot)",
    )


def check_shm(f: Facts) -> Check:
    if f.shm_bytes is None:
        return Check(
            "/dev/shm size",
            "fail",
            "/dev/shm is not mounted",
            "sudo mount -t tmpfs -o size=16g tmpfs /dev/shm",
        )
    gib = f.shm_bytes / 2**30
    need = LIMITS["shm_min_gib"]
    if gib >= need:
        return Check("/dev/shm size", "ok", f"{gib:.1f} GiB")
    return Check(
        "/dev/shm size",
        "fail" if gib < 1 else "warn",
        f"{gib:.2f} GiB (< {need:g} GiB)",
        "sudo mount -o remount,size=16g /dev/shm  (in Docker: --shm-size=16g or --ipc=host)",
    )


def check_nofile(f: Facts) -> Check:
    need = int(LIMITS["nofile_min"])
    if f.nofile_soft is None:
        return Check("open-file limit", "skip", "unknown")
    soft = f.nofile_soft if f.nofile_soft != resource.RLIM_INFINITY else 1 << 62
    if soft >= need:
        return Check("open-file limit", "ok", f"soft {f.nofile_soft}, hard {f.nofile_hard}")
    return Check(
        "open-file limit",
        "warn",
        f"soft {f.nofile_soft} (< {need}), hard {f.nofile_hard}",
        f"ulimit -n {need}  (systemd: LimitNOFILE={need}; /etc/security/limits.conf: * soft nofile {need})",
    )


def check_p2p(f: Facts) -> Check:
    raw = f.topology.get("summary")
    if not f.gpus.available or not raw:
        return Check("GPU P2P", "skip", f.gpus.note or "no GPU topology")
    summary = TopologySummary.model_validate(raw)
    if summary.gpus < 2:
        return Check("GPU P2P", "skip", "one GPU")
    bad = summary.p2p_unavailable
    if bad:
        first = bad[0]
        return Check(
            "GPU P2P",
            "warn",
            f"{len(bad)} GPU pair(s) without P2P, e.g. {first.pair[0]}-{first.pair[1]}: {first.meaning}",
            "NCCL will copy through host memory; on bare metal enable ACS/IOMMU passthrough "
            "(iommu=pt) in BIOS/kernel; in a VM ask for a P2P-capable (NVLink or clique-enabled) instance",
        )
    if summary.vm_all_phb:
        return Check(
            "GPU P2P",
            "warn",
            "every GPU pair shows PHB: a virtual machine hiding the PCIe tree",
            "run `nvidia-smi topo -p2p r` to see whether P2P works; expect slower all-reduce than bare metal",
        )
    if not summary.p2p_checked:
        return Check("GPU P2P", "ok", f"links: {summary.link_counts} (P2P matrix not read)")
    return Check("GPU P2P", "ok", f"P2P OK between all pairs; links: {summary.link_counts}")


def _per_gpu(
    name: str,
    f: Facts,
    bad: Callable[[Gpu], str | None],
    fix: str,
    ok: str,
    status: str = "warn",
    needs: Callable[[Gpu], object] | None = None,
) -> Check:
    skip = _no_gpus(name, f)
    if skip is not None:
        return skip
    if needs is not None and not any(needs(g) is not None for g in f.gpus.gpus):
        return Check(name, "skip", f"not reported by {f.gpus.source}")
    found = [f"GPU{g.index}: {why}" for g in f.gpus.gpus if (why := bad(g))]
    if found:
        return Check(name, status, "; ".join(found), fix)
    return Check(name, "ok", ok)


def _pcie_low(g: Gpu) -> str | None:
    # An idle GPU drops its link to save power (gen 1); only a link narrower than its maximum is a fault at rest.
    if g.pcie_width is not None and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
        return f"x{g.pcie_width} of x{g.pcie_width_max}"
    if (
        g.pcie_gen is not None
        and g.pcie_gen_max
        and g.pcie_gen < g.pcie_gen_max
        and (g.utilization_pct or 0) > 0
    ):
        return f"gen {g.pcie_gen} of {g.pcie_gen_max} while busy"
    return None


def check_pcie(f: Facts) -> Check:
    return _per_gpu(
        "PCIe link",
        f,
        _pcie_low,
        "reseat the card or move it to a full x16 slot; check BIOS PCIe settings and risers",
        "every link at its maximum width",
        needs=lambda g: g.pcie_width_max,
    )


def _power_low(g: Gpu) -> str | None:
    if (
        g.power_limit_w
        and g.default_power_limit_w
        and g.power_limit_w < LIMITS["power_limit_ratio"] * g.default_power_limit_w
    ):
        return f"limit {g.power_limit_w:.0f} W < default {g.default_power_limit_w:.0f} W"
    return None


def check_power(f: Facts) -> Check:
    return _per_gpu(
        "power limit",
        f,
        _power_low,
        "sudo nvidia-smi -i IDX -pl DEFAULT_WATTS",
        "every GPU at its default power limit",
        needs=lambda g: g.default_power_limit_w,
    )


def _ecc_bad(g: Gpu) -> str | None:
    if g.ecc_uncorrected:
        return f"{g.ecc_uncorrected} uncorrected ECC errors (volatile)"
    return None


def check_ecc(f: Facts) -> Check:
    skip = _no_gpus("ECC", f)
    if skip is not None:
        return skip
    bad = _per_gpu(
        "ECC",
        f,
        _ecc_bad,
        "drain the GPU and reset it (sudo nvidia-smi -r -i IDX); replace it if errors recur",
        "",
        status="fail",
    )
    if bad.status != "ok":
        return bad
    modes = {g.ecc for g in f.gpus.gpus}
    if modes == {None}:
        return Check("ECC", "skip", "ECC not reported (consumer GPU or simulator)")
    off = [f"GPU{g.index}" for g in f.gpus.gpus if g.ecc is False]
    if off:
        return Check("ECC", "ok", f"ECC off on {', '.join(off)} (more memory, no error correction; a choice)")
    return Check("ECC", "ok", "ECC on, no uncorrected errors")


def check_persistence(f: Facts) -> Check:
    skip = _no_gpus("persistence mode", f)
    if skip is not None:
        return skip
    if all(g.persistence is None for g in f.gpus.gpus):
        return Check("persistence mode", "skip", "not reported")
    return _per_gpu(
        "persistence mode",
        f,
        lambda g: "off" if g.persistence is False else None,
        "sudo nvidia-smi -pm 1  (better: enable nvidia-persistenced)",
        "on for every GPU",
    )


CHECKS: tuple[Callable[[Facts], Check], ...] = (
    check_uvm_hmm,
    check_shm,
    check_nofile,
    check_p2p,
    check_pcie,
    check_power,
    check_ecc,
    check_persistence,
)


def run_checks(facts: Facts) -> list[Check]:
    return [c(facts) for c in CHECKS]


@dataclass(frozen=True)
class GpusSeen:
    """Which GPU source the checks read, and how many GPUs it showed."""

    source: str
    available: bool
    note: str
    count: int


@dataclass(frozen=True)
class DoctorReport:
    """The checks' verdict: `worst` is ok | warn | fail (a skip alone counts as ok)."""

    gpus: GpusSeen
    checks: list[Check]
    worst: str

    def to_dict(self) -> JsonObject:
        """As `servelab doctor --json` shows it."""
        return {"gpus": asdict(self.gpus), "checks": [c.to_dict() for c in self.checks], "worst": self.worst}


def report(facts: Facts) -> DoctorReport:
    checks = run_checks(facts)
    order = ("ok", "skip", "warn", "fail")
    worst = max((c.status for c in checks), key=order.index, default="ok")
    g = facts.gpus
    return DoctorReport(
        gpus=GpusSeen(source=g.source, available=g.available, note=g.note, count=len(g.gpus)),
        checks=checks,
        worst="ok" if worst == "skip" else worst,
    )

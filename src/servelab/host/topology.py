"""GPU interconnect: the `nvidia-smi topo -m` matrix, the P2P matrix (`topo -p2p r`), NUMA placement and VMs.

Why it matters: tensor parallelism all-reduces every layer. Over NVLink (`NV#`) that is cheap; over PCIe it
costs most when the path crosses the host bridge (`PHB`), the bridges of a socket (`NODE`) or the
socket interconnect (`SYS`). A virtual machine usually hides the real PCIe tree and reports `PHB` between
every pair of GPUs, and P2P there is often unavailable, so NCCL falls back to copies through host memory.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from servelab.host.gpus import Runner, run_nvidia_smi
from servelab.jsontypes import JsonObject

# Link kinds from best to worst (the legend of `nvidia-smi topo -m`).
LINK_ORDER: tuple[str, ...] = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
P2P_OK = "OK"
P2P_LEGEND: dict[str, str] = {
    "OK": "supported",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by regkey",
    "U": "unknown",
}


@dataclass
class Topology:
    """The parsed matrix: `links[a][b]` for GPUs (and NICs), plus each GPU's CPU and NUMA affinity."""

    gpus: list[str] = field(default_factory=list)
    nics: list[str] = field(default_factory=list)
    links: dict[str, dict[str, str]] = field(default_factory=dict)
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str] = field(default_factory=dict)
    p2p: dict[str, dict[str, str]] = field(default_factory=dict)  # from `topo -p2p r`, when read

    def gpu_pairs(self) -> list[tuple[str, str, str]]:
        out = []
        for i, a in enumerate(self.gpus):
            for b in self.gpus[i + 1 :]:
                link = self.links.get(a, {}).get(b)
                if link:
                    out.append((a, b, link))
        return out

    def to_dict(self) -> JsonObject:
        return asdict(self)


def kind(link: str) -> str:
    """'NV18' -> 'NV'; the other codes are their own kind."""
    return "NV" if link.startswith("NV") else link


def parse_topo(text: str) -> Topology:
    """`nvidia-smi topo -m` (tab- or space-separated; the legend after the matrix is ignored)."""
    topo = Topology()
    lines = [ln.rstrip() for ln in text.splitlines()]
    # The header names the devices; every matrix row has an "X" on its diagonal.
    header_i = next(
        (i for i, ln in enumerate(lines) if re.search(r"\bGPU0\b", ln) and "X" not in ln.split()), None
    )
    if header_i is None:
        return topo
    header = lines[header_i][lines[header_i].index("GPU0") :]  # a pasted prompt may precede it
    # Columns are separated by tabs in real output, by runs of spaces when pasted; "CPU Affinity" has a space.
    header_norm = (
        header.replace("CPU Affinity", "CPU_Affinity")
        .replace("NUMA Affinity", "NUMA_Affinity")
        .replace("GPU NUMA ID", "GPU_NUMA_ID")
    )
    cols = ["NUMA_Affinity" if c == "NUMA" else c for c in header_norm.split()]  # some pastes shorten it
    devices = [c for c in cols if c not in ("CPU_Affinity", "NUMA_Affinity", "GPU_NUMA_ID")]
    for ln in lines[header_i + 1 :]:
        if not ln.strip():
            break
        cells = ln.split()
        if not cells or cells[0] not in devices:
            break
        name, rest = cells[0], cells[1:]
        row = dict(zip(devices, rest[: len(devices)], strict=False))
        topo.links[name] = {k: v for k, v in row.items() if k != name and v != "X"}
        extra = rest[len(devices) :]
        if name.startswith("GPU"):
            topo.gpus.append(name)
            if "CPU_Affinity" in cols and extra:
                topo.cpu_affinity[name] = extra[0]
            if "NUMA_Affinity" in cols and len(extra) > 1:
                topo.numa_affinity[name] = extra[1]
        else:
            topo.nics.append(name)
    return topo


def parse_p2p(text: str) -> dict[str, dict[str, str]]:
    """`nvidia-smi topo -p2p r` (or w, rw, n, a): pair -> status code (OK, GNS, CNS, TNS, NS, DR, U)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header_i = next(
        (i for i, ln in enumerate(lines) if ln.split()[:1] == ["GPU0"] and "X" not in ln.split()), None
    )
    if header_i is None:
        return {}
    devices = lines[header_i].split()
    out: dict[str, dict[str, str]] = {}
    for ln in lines[header_i + 1 :]:
        cells = ln.split()
        if not cells or cells[0] not in devices:
            break
        out[cells[0]] = {d: v for d, v in zip(devices, cells[1:], strict=False) if d != cells[0] and v != "X"}
    return out


class P2pPair(BaseModel):
    """A GPU pair without working P2P, as `nvidia-smi topo -p2p r` marks it."""

    model_config = ConfigDict(frozen=True)

    pair: list[str]
    status: str
    meaning: str


class TopologySummary(BaseModel):
    """What the matrix means for serving (`analyze`); doctor's P2P check reads it, status and the report
    show it as JSON (its keys in this order)."""

    model_config = ConfigDict(frozen=True)

    gpus: int
    link_counts: dict[str, int]
    nvlink: bool
    worst_link: str | None
    all_phb: bool
    virtual_machine: bool | None
    # All-PHB alone is also what some bare-metal boards show; a VM is called out when the CPU says so.
    vm_all_phb: bool
    p2p_checked: bool
    p2p_unavailable: list[P2pPair]
    numa_nodes: list[str]
    crosses_numa: bool


def summarize(topo: Topology, virtual_machine: bool | None = None) -> TopologySummary:
    """What the matrix means for serving: link counts, NVLink, a VM's all-PHB picture, P2P, NUMA spread."""
    pairs = topo.gpu_pairs()
    counts = Counter(kind(link) for _, _, link in pairs)
    worst = max((kind(link) for _, _, link in pairs), key=LINK_ORDER.index, default=None)
    all_phb = len(topo.gpus) >= 2 and bool(pairs) and set(counts) == {"PHB"}
    p2p_pairs = [(a, b, v) for a, row in topo.p2p.items() for b, v in row.items() if a < b]
    p2p_bad = [(a, b, v) for a, b, v in p2p_pairs if v != P2P_OK]
    numa = sorted(set(topo.numa_affinity.values()) - {"N/A"})
    return TopologySummary(
        gpus=len(topo.gpus),
        link_counts=dict(counts),
        nvlink=counts.get("NV", 0) == len(pairs) and bool(pairs),
        worst_link=worst,
        all_phb=all_phb,
        virtual_machine=virtual_machine,
        vm_all_phb=bool(all_phb and virtual_machine),
        p2p_checked=bool(p2p_pairs),
        p2p_unavailable=[P2pPair(pair=[a, b], status=v, meaning=P2P_LEGEND.get(v, v)) for a, b, v in p2p_bad],
        numa_nodes=numa,
        crosses_numa=len(numa) > 1,
    )


def analyze(topo: Topology, virtual_machine: bool | None = None) -> JsonObject:
    """`summarize` as JSON (what `read` puts under "summary")."""
    return summarize(topo, virtual_machine).model_dump(mode="json")


def is_virtual_machine(
    cpuinfo: Path = Path("/proc/cpuinfo"), dmi: Path = Path("/sys/class/dmi/id")
) -> bool | None:
    """The CPU's `hypervisor` flag (set inside KVM, Xen, VMware, Hyper-V guests); None when unreadable."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return " hypervisor" in line
    except OSError:
        pass
    try:
        vendor = (dmi / "sys_vendor").read_text().strip().lower()
    except OSError:
        return None
    return any(v in vendor for v in ("qemu", "kvm", "vmware", "microsoft", "xen", "amazon ec2", "google"))


def numa_nodes(root: Path = Path("/sys/devices/system/node")) -> dict[str, str]:
    """NUMA node -> its CPU list, from sysfs ({} where sysfs has no node directory)."""
    out: dict[str, str] = {}
    try:
        names = sorted(n for n in os.listdir(root) if re.fullmatch(r"node\d+", n))
    except OSError:
        return out
    for n in names:
        try:
            out[n[4:]] = (root / n / "cpulist").read_text().strip()
        except OSError:
            out[n[4:]] = ""
    return out


def read(run: Runner = run_nvidia_smi) -> JsonObject:
    """This host's topology: the matrix and P2P when nvidia-smi works, NUMA and VM detection always."""
    vm = is_virtual_machine()
    out: JsonObject = {"available": False, "numa": dict(numa_nodes()), "virtual_machine": vm}
    text = run(["topo", "-m"])
    if text is None:
        out["note"] = "no GPU topology: nvidia-smi is not available"
        return out
    topo = parse_topo(text)
    p2p = run(["topo", "-p2p", "r"])
    if p2p:
        topo.p2p = parse_p2p(p2p)
    out.update({"available": bool(topo.gpus), "matrix": topo.to_dict(), "summary": analyze(topo, vm)})
    return out

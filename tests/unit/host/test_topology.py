"""`nvidia-smi topo -m` / `topo -p2p` parsing and what the matrix means, on published outputs."""

from __future__ import annotations

from pathlib import Path

from servelab.host import topology

FIX = Path(__file__).parents[2] / "fixtures" / "nvidia_smi"


def parse(name: str) -> topology.Topology:
    return topology.parse_topo((FIX / name).read_text())


def test_pcie_box_two_sockets_with_nics() -> None:
    t = parse("topo_8x4090_sys.txt")
    assert t.gpus == [f"GPU{i}" for i in range(8)] and t.nics == ["NIC0", "NIC1"]
    assert t.links["GPU0"]["GPU7"] == "SYS" and t.links["GPU6"]["NIC0"] == "PHB"
    assert t.cpu_affinity["GPU4"] == "56-111,168-223" and t.numa_affinity["GPU4"] == "1"
    s = topology.analyze(t, virtual_machine=False)
    assert s["link_counts"] == {"SYS": 28} and s["worst_link"] == "SYS" and not s["nvlink"]
    assert s["numa_nodes"] == ["0", "1"] and s["crosses_numa"] and not s["vm_all_phb"]


def test_nvlink_box_space_separated_with_short_numa_header() -> None:
    t = parse("topo_dgx_h100_nv18.txt")
    assert len(t.gpus) == 8 and t.links["GPU3"]["GPU4"] == "NV18"
    assert t.cpu_affinity["GPU7"] == "52-103" and t.numa_affinity["GPU7"] == "1"
    s = topology.analyze(t)
    assert s["nvlink"] and s["worst_link"] == "NV" and s["link_counts"] == {"NV": 28}


def test_all_phb_is_called_a_vm_only_when_the_cpu_says_so() -> None:
    t = parse("topo_5gpu_phb_collect_env.txt")  # indented header, as vLLM's collect_env prints it
    assert len(t.gpus) == 5 and t.links["GPU0"]["GPU4"] == "PHB"
    assert topology.analyze(t, virtual_machine=True)["vm_all_phb"]
    s = topology.analyze(t, virtual_machine=False)
    assert s["all_phb"] and not s["vm_all_phb"]


def test_p2p_matrix_ok_and_unavailable() -> None:
    t = parse("topo_4x5060ti_phb.txt")
    t.p2p = topology.parse_p2p((FIX / "p2p_4x5060ti_ok.txt").read_text())
    assert t.p2p["GPU0"] == {"GPU1": "OK", "GPU2": "OK", "GPU3": "OK"}
    s = topology.analyze(t, virtual_machine=False)
    assert s["p2p_checked"] and s["p2p_unavailable"] == []

    t2 = parse("topo_2x5090_phb.txt")
    t2.p2p = topology.parse_p2p((FIX / "p2p_2x5090_gns.txt").read_text())
    s2 = topology.analyze(t2, virtual_machine=False)
    assert s2["p2p_unavailable"] == [
        {"pair": ["GPU0", "GPU1"], "status": "GNS", "meaning": "GPU not supported"}
    ]


def test_garbage_gives_an_empty_topology() -> None:
    assert topology.parse_topo("NVIDIA-SMI has failed").gpus == []
    assert topology.parse_p2p("") == {}


def test_read_without_nvidia_smi_reports_numa_and_vm(tmp_path: Path) -> None:
    out = topology.read(run=lambda args: None)
    assert out["available"] is False and "nvidia-smi" in out["note"] and isinstance(out["numa"], dict)
    node = tmp_path / "node3"
    node.mkdir()
    (node / "cpulist").write_text("0-7\n")
    assert topology.numa_nodes(tmp_path) == {"3": "0-7"}
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags\t\t: fpu vme hypervisor lahf_lm\n")
    assert topology.is_virtual_machine(cpuinfo, tmp_path) is True
    cpuinfo.write_text("flags\t\t: fpu vme lahf_lm\n")
    assert topology.is_virtual_machine(cpuinfo, tmp_path) is False


def test_read_with_a_runner() -> None:
    texts = {
        "-m": (FIX / "topo_2x5090_phb.txt").read_text(),
        "-p2p": (FIX / "p2p_2x5090_gns.txt").read_text(),
    }
    out = topology.read(run=lambda args: texts[args[1]])
    assert out["available"] and out["summary"]["p2p_unavailable"][0]["status"] == "GNS"

"""The GPU parsers on real nvidia-smi outputs (tests/fixtures/nvidia_smi/README.md names the sources)."""

from __future__ import annotations

import os
from pathlib import Path

from servelab.host import gpus

FIX = Path(__file__).parents[2] / "fixtures" / "nvidia_smi"


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_q_h200_new_layout() -> None:
    rep = gpus.parse_q(read("q_h200.txt"))
    assert rep.available and rep.driver_version == "550.90.12" and rep.cuda_version == "12.4"
    (g,) = rep.gpus
    assert g.name == "NVIDIA H200" and g.uuid == "GPU-cb3dfa52-e2f3-9ca4-a399-7d16041c3732"
    assert (g.memory_used_mib, g.memory_total_mib) == (1, 143771)
    assert (g.power_w, g.power_limit_w, g.default_power_limit_w) == (
        74.58,
        700.0,
        700.0,
    )  # not the memory rail's 41.76
    assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max) == (5, 5, 16, 16)
    assert (g.clock_sm_mhz, g.clock_mem_mhz, g.clock_sm_max_mhz) == (345, 3199, 1980)
    assert g.persistence is True and g.ecc is True and g.ecc_uncorrected == 0
    assert g.temperature_c == 28 and g.utilization_pct == 0
    assert g.processes == [] and g.idle and not g.orphaned_memory


def test_q_old_layout_processes_and_double_bit_ecc() -> None:
    # Older drivers: "Power Readings / Power Limit", "Double Bit / Device Memory / Total", listed processes.
    text = """Driver Version                            : 418.87.01
GPU 00000000:3B:00.0
    Product Name                          : Tesla V100-PCIE-32GB
    GPU UUID                              : GPU-1
    Persistence Mode                      : Disabled
    PCI
        GPU Link Info
            PCIe Generation
                Max                       : 3
                Current                   : 3
            Link Width
                Max                       : 16x
                Current                   : 8x
    Ecc Mode
        Current                           : Enabled
    ECC Errors
        Volatile
            Double Bit
                Device Memory             : 2
                Total                     : 2
    Power Readings
        Power Draw                        : 25.33 W
        Power Limit                       : 250.00 W
        Default Power Limit               : 250.00 W
        Enforced Power Limit              : 200.00 W
    Processes
        Process ID                        : 1628
            Type                          : C
            Name                          : python
            Used GPU Memory               : 1200 MiB
"""
    (g,) = gpus.parse_q(text).gpus
    assert g.persistence is False and g.pcie_width == 8 and g.pcie_width_max == 16
    assert g.power_limit_w == 200.0 and g.default_power_limit_w == 250.0
    assert g.ecc_uncorrected == 2
    assert [(p.pid, p.name, p.used_mib) for p in g.processes] == [(1628, "python", 1200)]


def test_query_gpu_with_header_and_units() -> None:
    gs = gpus.parse_query_gpu(read("query_gpu_8xh200.csv"))
    assert [g.index for g in gs] == list(range(8))
    assert (
        gs[0].memory_used_mib == 130013 and gs[0].utilization_pct == 100 and gs[0].memory_total_mib == 143771
    )
    assert gs[4].uuid == "GPU-cb449822-5571-be90-8303-e7558da3ea66"


def test_compute_apps_attach_and_memory_held_by_nothing() -> None:
    gs = gpus.parse_query_gpu(read("query_gpu_8xh200.csv"))
    procs = gpus.parse_compute_apps(read("compute_apps_8xh200.csv"))
    assert [p.pid for p in procs] == [1328667, 1328668, 1328669, 1758887]
    assert procs[3].name == "[Not Found]" and procs[3].used_mib == 58060
    gpus.attach_processes(gs, procs)
    assert [p.pid for p in gs[0].processes] == [1328667]
    assert gs[2].idle and gs[5].idle  # 0 and 4 MiB, nothing listed
    # GPU4/GPU6 keep 244/292 MiB after their processes were killed: memory held by nothing alive.
    assert gs[4].orphaned_memory and gs[6].orphaned_memory and not gs[4].idle
    assert not gs[0].orphaned_memory
    gs[7].processes[0].alive = False  # the [Not Found] pid, once we know it is gone
    assert gs[7].orphaned_memory


def test_query_gpu_pcie_fields() -> None:
    gs = gpus.parse_query_gpu(read("query_gpu_4x5060ti.csv"))
    assert len(gs) == 4 and gs[0].name == "NVIDIA GeForce RTX 5060 Ti"
    assert (gs[0].pcie_gen, gs[0].pcie_gen_max, gs[0].pcie_width, gs[0].pcie_width_max) == (1, 3, 8, 8)


def test_noheader_nounits_uses_the_asked_fields() -> None:
    row = "0, NVIDIA H100 80GB HBM3, GPU-x, 00000000:18:00.0, 3, 81559, 69.50, 700.00, 700.00, 0, 31, 345, 2619, 1980, 5, 5, 16, 16, Enabled, Enabled, 0, 550.54.15\n"
    (g,) = gpus.parse_query_gpu(row, gpus.QUERY_FIELDS)
    assert g.memory_total_mib == 81559 and g.power_limit_w == 700.0 and g.persistence and g.ecc
    assert g.clock_sm_max_mhz == 1980 and g.bus_id == "00000000:18:00.0"


def test_missing_values_are_none() -> None:
    (g,) = gpus.parse_query_gpu("index, power.draw [W], ecc.mode.current\n0, [N/A], [N/A]\n")
    assert g.power_w is None and g.ecc is None
    assert gpus.parse_compute_apps("") == []


def test_read_nvidia_smi_with_a_fake_runner() -> None:
    calls: list[list[str]] = []

    def run(args: list[str]) -> str | None:
        calls.append(args)
        if args[0].startswith("--query-gpu"):
            return "0, NVIDIA H100, GPU-a, 0000:01:00.0, 500, 81559, 100.0, 700, 700, 5, 40, 1980, 2619, 1980, 5, 5, 16, 16, Enabled, Enabled, 0, 550.54.15\n"
        return "GPU-a, 4242, python, 480\n"

    rep = gpus.read_nvidia_smi(run)
    assert rep is not None and rep.available and rep.driver_version == "550.54.15"
    assert rep.gpus[0].processes[0].pid == 4242
    assert any(a[0].startswith("--query-compute-apps") for a in calls)
    assert gpus.read_nvidia_smi(lambda args: None) is None


def test_from_sim_and_enrich_with_a_live_process() -> None:
    payload = {
        "simulated": True,
        "driver_version": "580.95.05",
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA H100",
                "uuid": "GPU-sim-00",
                "memory_used_mib": 70000,
                "memory_total_mib": 81559,
                "power_w": 300.0,
                "power_limit_w": 700,
                "utilization_pct": 40,
                "temperature_c": 50,
                "processes": [{"pid": os.getpid(), "name": "VLLM::EngineCore", "used_memory_mib": 70000}],
            },
            {
                "index": 1,
                "name": "NVIDIA H100",
                "uuid": "GPU-sim-01",
                "memory_used_mib": 0,
                "memory_total_mib": 81559,
                "power_w": 70.0,
                "power_limit_w": 700,
                "utilization_pct": 0,
                "temperature_c": 35,
                "processes": [],
            },
        ],
    }
    rep = gpus.from_sim(payload, "http://127.0.0.1:1")
    assert rep.source == "sim:http://127.0.0.1:1" and rep.available and rep.note == "simulated GPUs"
    gpus.enrich(rep)
    p = rep.gpus[0].processes[0]
    assert p.alive is True and p.since is not None and p.owner and "python" in (p.command or "")
    assert rep.gpus[1].idle and not rep.gpus[0].idle


def test_read_local_without_gpus_says_so(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(gpus, "read_nvml", lambda: None)
    monkeypatch.setattr(gpus, "read_nvidia_smi", lambda run=None: None)
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    rep = gpus.read_local()
    assert not rep.available and rep.source == "none" and "no GPUs" in rep.note


def test_nvml_mapping_with_a_stand_in_binding() -> None:
    """NVML cannot run here (no driver); a stand-in with NVML's function names checks the unit conversions
    (mW -> W, bytes -> MiB) and that an unsupported query leaves its field empty instead of failing."""
    from types import SimpleNamespace

    class NotSupported(Exception):
        pass

    def unsupported(*a: object) -> None:
        raise NotSupported

    nv = SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlSystemGetCudaDriverVersion=lambda: 12040,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: "GPU-1",
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=b"00000000:18:00.0"),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=3 * 2**20, total=81559 * 2**20),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=7),
        nvmlDeviceGetPowerUsage=lambda h: 69500,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700000,
        nvmlDeviceGetPowerManagementDefaultLimit=lambda h: 700000,
        nvmlDeviceGetEccMode=lambda h: (1, 1),
        nvmlDeviceGetTemperature=lambda h, s: 31,
        nvmlDeviceGetClockInfo=lambda h, c: 345 if c == 1 else 2619,
        nvmlDeviceGetMaxClockInfo=lambda h, c: 1980,
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMaxPcieLinkWidth=unsupported,
        nvmlDeviceGetPersistenceMode=lambda h: 1,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=77, usedGpuMemory=512 * 2**20)],
    )
    rep = gpus._nvml_report(nv)
    assert rep.available and rep.driver_version == "550.54.15" and rep.cuda_version == "12.4"
    (g,) = rep.gpus
    assert (g.memory_used_mib, g.memory_total_mib, g.power_w, g.power_limit_w) == (3, 81559, 69.5, 700.0)
    assert g.bus_id == "00000000:18:00.0" and g.persistence is True and g.ecc is True
    assert g.pcie_width == 16 and g.pcie_width_max is None
    assert [(p.pid, p.used_mib) for p in g.processes] == [(77, 512)]


def test_nvml_memory_in_use_leaves_out_what_the_driver_reserves() -> None:
    """An idle H200 (driver 580, the GPU check of docs/gpu.md): NVML's version-1 memory query said 615 MiB
    used with no process, and `status` reported memory a dead process left behind. The version-2 query
    (nvidia-smi's: 0 MiB) is read first; a driver without it falls back to version 1."""
    from types import SimpleNamespace

    class NotSupported(Exception):
        pass

    MIB = 2**20

    def memory_info(h: object, version: int | None = None) -> SimpleNamespace:
        if version is None:  # version 1: the reserved memory counted as used
            return SimpleNamespace(used=615 * MIB, total=143771 * MIB)
        if version != 0x02000028:
            raise NotSupported
        return SimpleNamespace(used=0, reserved=615 * MIB, total=143771 * MIB)

    def nv(with_v2: bool) -> SimpleNamespace:
        ns = SimpleNamespace(
            nvmlDeviceGetCount=lambda: 1,
            nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
            nvmlDeviceGetName=lambda h: "NVIDIA H200",
            nvmlDeviceGetMemoryInfo=memory_info,
            nvmlDeviceGetComputeRunningProcesses=lambda h: [],
        )
        if with_v2:
            ns.nvmlMemory_v2 = 0x02000028
        return ns

    (g,) = gpus._nvml_report(nv(with_v2=True)).gpus
    assert (g.memory_used_mib, g.memory_total_mib) == (0, 143771)
    assert g.idle and not g.orphaned_memory
    (old,) = gpus._nvml_report(nv(with_v2=False)).gpus  # a binding without version 2
    assert old.memory_used_mib == 615 and old.orphaned_memory


def test_unreadable_index_falls_back_to_the_row_position() -> None:
    gs = gpus.parse_query_gpu("index, name, uuid\n[N/A], NVIDIA H100, GPU-a\n3, NVIDIA H100, GPU-b\n")
    assert [g.index for g in gs] == [0, 3]


def test_a_process_without_a_gpu_uuid_is_attached_nowhere() -> None:
    gs = gpus.parse_query_gpu("index, name, uuid\n0, NVIDIA H100, GPU-a\n")
    gpus.attach_processes(gs, [gpus.GpuProcess(pid=7, name="python", used_mib=1, gpu_uuid=None)])
    assert gs[0].processes == []

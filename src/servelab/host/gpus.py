"""GPUs as they are now: memory, power, utilization, clocks, PCIe link, persistence, ECC and who holds them.

Sources, in order: NVML through `nvidia-ml-py` (optional extra `servelab[gpu]`, imported lazily), then
`nvidia-smi` (`--query-gpu` / `--query-compute-apps` CSV, which every driver since 2012 prints), and the
simulator's `/servelab/gpus` route, which serves the same fields so the whole `servelab status` path can be
tested without a GPU. `parse_q` reads `nvidia-smi -q`, the output people paste into bug reports.

Why the parsers are separate pure functions: `nvidia-smi` output is "not guaranteed to be backwards
compatible" (its man page), so each is tested on real outputs kept in tests/fixtures/nvidia_smi/.
"""

from __future__ import annotations

import contextlib
import csv
import io
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from servelab.jsontypes import JsonObject

IDLE_MIB = (
    16  # a GPU nobody uses shows 0-5 MiB (the driver's own context); above this, something holds memory
)

# --query-gpu fields, in the order asked (names from `nvidia-smi --help-query-gpu`).
QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.used",
    "memory.total",
    "power.draw",
    "power.limit",
    "power.default_limit",
    "utilization.gpu",
    "temperature.gpu",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "persistence_mode",
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "driver_version",
)
APPS_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "process_name", "used_memory")

Runner = Callable[[list[str]], str | None]


@dataclass
class GpuProcess:
    """A compute process on a GPU; `owner`, `since`, `marker`, `alive` are filled from /proc when it is local."""

    pid: int
    name: str
    used_mib: int | None = None
    gpu_uuid: str | None = None
    owner: str | None = None
    since: float | None = None  # process start, epoch seconds
    command: str | None = None
    marker: str | None = None  # its SERVELAB_RUN
    alive: bool | None = None  # None: not checked (another host, or unreadable)


@dataclass
class Gpu:
    index: int
    name: str = ""
    uuid: str | None = None
    bus_id: str | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    default_power_limit_w: float | None = None
    utilization_pct: float | None = None
    temperature_c: float | None = None
    clock_sm_mhz: int | None = None
    clock_mem_mhz: int | None = None
    clock_sm_max_mhz: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    persistence: bool | None = None
    ecc: bool | None = None
    ecc_uncorrected: int | None = None
    processes: list[GpuProcess] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        """Nothing on it: no compute process and (almost) no memory in use."""
        return not self.processes and (self.memory_used_mib or 0) <= IDLE_MIB

    @property
    def orphaned_memory(self) -> bool:
        """Memory in use while no live process holds it (a process gone, its memory not yet freed, or a
        process in another container that the driver does not show us)."""
        live = [p for p in self.processes if p.alive is not False]
        return not live and (self.memory_used_mib or 0) > IDLE_MIB

    def to_dict(self) -> JsonObject:
        d = asdict(self)
        d["idle"] = self.idle
        d["orphaned_memory"] = self.orphaned_memory
        return d


@dataclass
class GpuReport:
    """What one source said: `available` False means "no GPUs here" (with `note` saying why)."""

    source: str  # "nvml", "nvidia-smi", "sim:URL", "fixture", "none"
    available: bool
    gpus: list[Gpu] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None
    note: str = ""

    def to_dict(self) -> JsonObject:
        return {
            "source": self.source,
            "available": self.available,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "note": self.note,
            "gpus": [g.to_dict() for g in self.gpus],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> GpuReport:
        """The report `to_dict` wrote (another host's, over the agent): derived keys are dropped."""
        gpu_keys = {f.name for f in fields(Gpu)} - {"processes"}
        proc_keys = {f.name for f in fields(GpuProcess)}
        listed = d.get("gpus") or []
        assert isinstance(listed, list)
        gpus = [
            Gpu(
                **{k: v for k, v in g.items() if k in gpu_keys},
                processes=[
                    GpuProcess(**{k: v for k, v in p.items() if k in proc_keys})
                    for p in g.get("processes") or []
                ],
            )
            for g in listed
        ]
        return cls(
            source=str(d["source"]),
            available=bool(d["available"]),
            gpus=gpus,
            driver_version=_opt_str(d.get("driver_version")),
            cuda_version=_opt_str(d.get("cuda_version")),
            note=str(d.get("note") or ""),
        )


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


# -- value parsing ---------------------------------------------------------------------------------
_NUM = re.compile(r"[-+]?\d+(?:\.\d+)?")
_MISSING = (
    "",
    "n/a",
    "[n/a]",
    "[not supported]",
    "not supported",
    "unknown",
    "[unknown error]",
    "[insufficient permissions]",
)


def number(text: str | None) -> float | None:
    """The first number in `text` ("81559 MiB", "250.00 W", "[N/A]" -> None)."""
    if text is None or text.strip().lower() in _MISSING:
        return None
    m = _NUM.search(text)
    return float(m.group()) if m else None


def _int(text: str | None) -> int | None:
    v = number(text)
    return None if v is None else int(v)


def _flag(text: str | None) -> bool | None:
    t = (text or "").strip().lower()
    if t in ("enabled", "on", "yes", "1"):
        return True
    if t in ("disabled", "off", "no", "0"):
        return False
    return None


# -- nvidia-smi --query-gpu / --query-compute-apps ---------------------------------------------------
def _csv_rows(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in row]
        for row in csv.reader(io.StringIO(text))
        if row and any(c.strip() for c in row)
    ]


def _header_key(h: str) -> str:
    """'memory.used [MiB]' -> 'memory.used'; nvidia-smi prints some names differently than asked
    ('power.limit' as 'enforced.power.limit' on old drivers is not remapped: ask what you parse)."""
    return h.split(" [")[0].strip()


def parse_query_gpu(text: str, fields: tuple[str, ...] | None = None) -> list[Gpu]:
    """Rows of `--query-gpu=... --format=csv` (with header) or `csv,noheader[,nounits]` (pass `fields`)."""
    rows = _csv_rows(text)
    if not rows:
        return []
    if fields is None:
        fields = tuple(_header_key(h) for h in rows[0])
        rows = rows[1:]
    out: list[Gpu] = []
    for pos, row in enumerate(rows):
        v = dict(zip(fields, row, strict=False))
        index = _int(v.get("index"))  # None when missing or unreadable ("[N/A]"): the row's position
        out.append(
            Gpu(
                index=pos if index is None else index,
                name=v.get("name", v.get("gpu_name", "")),
                uuid=v.get("uuid", v.get("gpu_uuid")),
                bus_id=v.get("pci.bus_id"),
                memory_used_mib=_int(v.get("memory.used")),
                memory_total_mib=_int(v.get("memory.total")),
                power_w=number(v.get("power.draw")),
                power_limit_w=number(v.get("power.limit", v.get("enforced.power.limit"))),
                default_power_limit_w=number(v.get("power.default_limit")),
                utilization_pct=number(v.get("utilization.gpu")),
                temperature_c=number(v.get("temperature.gpu")),
                clock_sm_mhz=_int(v.get("clocks.sm", v.get("clocks.current.sm"))),
                clock_mem_mhz=_int(v.get("clocks.mem", v.get("clocks.current.memory"))),
                clock_sm_max_mhz=_int(v.get("clocks.max.sm", v.get("clocks.max.sm_clock"))),
                pcie_gen=_int(v.get("pcie.link.gen.current")),
                pcie_gen_max=_int(v.get("pcie.link.gen.max")),
                pcie_width=_int(v.get("pcie.link.width.current")),
                pcie_width_max=_int(v.get("pcie.link.width.max")),
                persistence=_flag(v.get("persistence_mode")),
                ecc=_flag(v.get("ecc.mode.current")),
                ecc_uncorrected=_int(v.get("ecc.errors.uncorrected.volatile.total")),
            )
        )
    return out


def parse_compute_apps(text: str, fields: tuple[str, ...] | None = None) -> list[GpuProcess]:
    """Rows of `--query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv`."""
    rows = _csv_rows(text)
    if not rows:
        return []
    if fields is None:
        if rows[0][0].lower().startswith("no running"):
            return []
        fields = tuple(_header_key(h) for h in rows[0])
        rows = rows[1:]
    out: list[GpuProcess] = []
    for row in rows:
        v = dict(zip(fields, row, strict=False))
        pid = _int(v.get("pid"))
        if pid is None:
            continue
        out.append(
            GpuProcess(
                pid=pid,
                name=v.get("process_name", v.get("name", "")),
                used_mib=_int(v.get("used_memory", v.get("used_gpu_memory"))),
                gpu_uuid=v.get("gpu_uuid"),
            )
        )
    return out


def attach_processes(gpus: list[Gpu], procs: list[GpuProcess]) -> None:
    """Put each process under the GPU whose UUID it names."""
    by_uuid = {g.uuid: g for g in gpus if g.uuid}
    for p in procs:
        g = by_uuid.get(p.gpu_uuid) if p.gpu_uuid else None
        if g is not None:
            g.processes.append(p)


# -- nvidia-smi -q ---------------------------------------------------------------------------------
# "Key<spaces>: value" (the colon always follows a space); a line without one is a section header,
# including "GPU 00000000:03:00.0" whose own colons belong to the bus id.
_Q_LINE = re.compile(r"^(\s*)(\S.*?)(?:\s+:\s*(.*))?$")


def _q_tree(text: str) -> list[tuple[list[str], str | None]]:
    """Each `key : value` line of `nvidia-smi -q` with the path of section headers above it."""
    out: list[tuple[list[str], str | None]] = []
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith("="):
            continue
        m = _Q_LINE.match(line)
        if not m:
            continue
        indent, key, value = len(m.group(1).expandtabs()), m.group(2).strip(), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [k for _, k in stack] + [key]
        out.append((path, value.strip() if value is not None else None))
        if value is None or value == "":
            stack.append((indent, key))
    return out


def _uncorrected(sub: list[str]) -> bool:
    """Volatile uncorrectable counters: "Double Bit / Total" (drivers before ~525) or "* Uncorrectable*"."""
    return ("Double Bit" in sub and sub[-1] == "Total") or "Uncorrectable" in sub[-1]


def parse_q(text: str) -> GpuReport:
    """`nvidia-smi -q`: driver/CUDA versions and one Gpu per `GPU 00000000:xx:00.0` section."""
    rep = GpuReport(source="nvidia-smi -q", available=False)
    gpu: Gpu | None = None
    proc: GpuProcess | None = None
    for path, value in _q_tree(text):
        top = path[0]
        if len(path) == 1 and value is not None and value != "":
            if top == "Driver Version":
                rep.driver_version = value
            elif top == "CUDA Version":
                rep.cuda_version = value
            continue
        if len(path) == 1 and top.startswith("GPU ") and (value is None or value == ""):
            gpu = Gpu(index=len(rep.gpus), bus_id=top[4:].strip())
            rep.gpus.append(gpu)
            proc = None
            continue
        if gpu is None or value is None:
            continue
        sub = path[1:]
        key = " / ".join(sub)
        simple = {
            "Product Name": "name",
            "GPU UUID": "uuid",
        }
        if key in simple:
            setattr(gpu, simple[key], value)
        elif key == "Persistence Mode":
            gpu.persistence = _flag(value)
        elif key in ("FB Memory Usage / Used",):
            gpu.memory_used_mib = _int(value)
        elif key == "FB Memory Usage / Total":
            gpu.memory_total_mib = _int(value)
        elif key in ("Utilization / Gpu", "Utilization / GPU"):
            gpu.utilization_pct = number(value)
        elif key == "Temperature / GPU Current Temp":
            gpu.temperature_c = number(value)
        elif sub[0] in ("Power Readings", "GPU Power Readings"):
            name = sub[-1]
            if (
                name in ("Power Draw", "Average Power Draw", "Instantaneous Power Draw")
                and gpu.power_w is None
            ):
                gpu.power_w = number(value)
            elif name in ("Enforced Power Limit", "Current Power Limit") or (
                name == "Power Limit" and gpu.power_limit_w is None
            ):
                gpu.power_limit_w = number(value)
            elif name == "Default Power Limit":
                gpu.default_power_limit_w = number(value)
        elif key == "Clocks / SM":
            gpu.clock_sm_mhz = _int(value)
        elif key == "Clocks / Memory":
            gpu.clock_mem_mhz = _int(value)
        elif key == "Max Clocks / SM":
            gpu.clock_sm_max_mhz = _int(value)
        elif "GPU Link Info" in sub:  # under "PCI" in most drivers, directly under the GPU in some
            link = " / ".join(sub[sub.index("GPU Link Info") + 1 :])
            if link == "PCIe Generation / Max":
                gpu.pcie_gen_max = _int(value)
            elif link == "PCIe Generation / Current":
                gpu.pcie_gen = _int(value)
            elif link == "Link Width / Max":
                gpu.pcie_width_max = _int(value)
            elif link == "Link Width / Current":
                gpu.pcie_width = _int(value)
        elif key.lower() == "ecc mode / current":
            gpu.ecc = _flag(value)
        elif sub[0] == "ECC Errors" and sub[1:2] == ["Volatile"] and _uncorrected(sub):
            n = _int(value)
            if n is not None:
                gpu.ecc_uncorrected = (gpu.ecc_uncorrected or 0) + n
        elif sub[0] == "Processes":
            if sub[-1] == "Process ID":
                pid = _int(value)
                if pid is not None:
                    proc = GpuProcess(pid=pid, name="", gpu_uuid=gpu.uuid)
                    gpu.processes.append(proc)
            elif proc is not None and sub[-1] == "Name":
                proc.name = value
            elif proc is not None and sub[-1] == "Used GPU Memory":
                proc.used_mib = _int(value)
    rep.available = bool(rep.gpus)
    return rep


# -- the simulator's telemetry ---------------------------------------------------------------------
def from_sim(payload: Mapping[str, object], url: str) -> GpuReport:
    """The JSON of the simulator's GET /servelab/gpus."""
    gpus: list[Gpu] = []
    listed = payload.get("gpus", [])
    assert isinstance(listed, list)
    for i, g in enumerate(listed):
        gpu = Gpu(
            index=int(g.get("index", i)),
            name=str(g.get("name", "")),
            uuid=g.get("uuid"),
            memory_used_mib=g.get("memory_used_mib"),
            memory_total_mib=g.get("memory_total_mib"),
            power_w=g.get("power_w"),
            power_limit_w=g.get("power_limit_w"),
            default_power_limit_w=g.get("default_power_limit_w"),
            utilization_pct=g.get("utilization_pct"),
            temperature_c=g.get("temperature_c"),
        )
        for p in g.get("processes", []):
            gpu.processes.append(
                GpuProcess(
                    pid=int(p["pid"]),
                    name=str(p.get("name", "")),
                    used_mib=p.get("used_memory_mib"),
                    gpu_uuid=gpu.uuid,
                )
            )
        gpus.append(gpu)
    return GpuReport(
        source=f"sim:{url}",
        available=bool(gpus),
        gpus=gpus,
        driver_version=_opt_str(payload.get("driver_version")),
        cuda_version=_opt_str(payload.get("cuda_version")),
        note="simulated GPUs" if payload.get("simulated") else "",
    )


# -- live sources ----------------------------------------------------------------------------------
def run_nvidia_smi(args: list[str], timeout: float = 30) -> str | None:
    """stdout of `nvidia-smi ARGS` (None: not installed, failed, or no device). The one place that runs
    nvidia-smi: `gpu_memory` and `deploy.preflight` ask through it too."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def read_nvidia_smi(run: Runner = run_nvidia_smi) -> GpuReport | None:
    """GPUs and their compute processes from nvidia-smi's CSV queries (None: nvidia-smi is unusable)."""
    text = run([f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"])
    if text is None:
        return None
    gpus = parse_query_gpu(text, QUERY_FIELDS)
    first = dict(zip(QUERY_FIELDS, (_csv_rows(text) or [[]])[0], strict=False))
    driver = first.get("driver_version")
    apps = run([f"--query-compute-apps={','.join(APPS_FIELDS)}", "--format=csv,noheader,nounits"])
    if apps:
        attach_processes(gpus, parse_compute_apps(apps, APPS_FIELDS))
    return GpuReport(
        source="nvidia-smi",
        available=bool(gpus),
        gpus=gpus,
        driver_version=driver,
        note="" if gpus else "nvidia-smi found no GPU",
    )


def read_nvml() -> GpuReport | None:
    """GPUs through NVML (None: nvidia-ml-py is not installed or NVML does not initialise)."""
    try:
        import pynvml  # the optional extra servelab[gpu] (untyped: see [tool.mypy] in pyproject.toml)
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver, no device
        return None
    try:
        return _nvml_report(pynvml)
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _nvml_report(nv: Any) -> GpuReport:
    def get(fn: str, *args: Any) -> Any:
        try:
            return getattr(nv, fn)(*args)
        except Exception:  # NotSupported, NoPermission: a field this GPU does not report
            return None

    def text(v: Any) -> str | None:
        return v.decode() if isinstance(v, bytes) else v

    rep = GpuReport(source="nvml", available=False, driver_version=text(get("nvmlSystemGetDriverVersion")))
    cuda = get("nvmlSystemGetCudaDriverVersion")
    rep.cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
    for i in range(get("nvmlDeviceGetCount") or 0):
        h = get("nvmlDeviceGetHandleByIndex", i)
        if h is None:
            continue
        mem = _nvml_memory(nv, h, get)
        util = get("nvmlDeviceGetUtilizationRates", h)
        power = get("nvmlDeviceGetPowerUsage", h)
        limit = get("nvmlDeviceGetEnforcedPowerLimit", h)
        default = get("nvmlDeviceGetPowerManagementDefaultLimit", h)
        ecc = get("nvmlDeviceGetEccMode", h)
        pci = get("nvmlDeviceGetPciInfo", h)
        g = Gpu(
            index=i,
            name=text(get("nvmlDeviceGetName", h)) or "",
            uuid=text(get("nvmlDeviceGetUUID", h)),
            bus_id=text(pci.busId) if pci is not None else None,
            memory_used_mib=mem.used // 2**20 if mem else None,
            memory_total_mib=mem.total // 2**20 if mem else None,
            power_w=power / 1000 if power is not None else None,
            power_limit_w=limit / 1000 if limit else None,
            default_power_limit_w=default / 1000 if default else None,
            utilization_pct=util.gpu if util else None,
            temperature_c=get("nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0)),
            clock_sm_mhz=get("nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1)),
            clock_mem_mhz=get("nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_MEM", 2)),
            clock_sm_max_mhz=get("nvmlDeviceGetMaxClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1)),
            pcie_gen=get("nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_gen_max=get("nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_width=get("nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_width_max=get("nvmlDeviceGetMaxPcieLinkWidth", h),
            persistence=_nvml_bool(get("nvmlDeviceGetPersistenceMode", h)),
            ecc=bool(ecc[0]) if ecc else None,
        )
        for p in get("nvmlDeviceGetComputeRunningProcesses", h) or []:
            used = getattr(p, "usedGpuMemory", None)
            g.processes.append(
                GpuProcess(pid=int(p.pid), name="", used_mib=used // 2**20 if used else None, gpu_uuid=g.uuid)
            )
        rep.gpus.append(g)
    rep.available = bool(rep.gpus)
    return rep


def _nvml_memory(nv: Any, h: Any, get: Callable[..., Any]) -> Any:
    """The GPU's memory, `used` without what the driver reserves for itself: NVML's version-2 query
    (as nvidia-smi shows it). The version-1 query counts the reserved part as used: an idle H200 on
    driver 580 read 615 MiB "used" with no process, which `status` took for memory a dead process had
    left behind (docs/gpu.md). Drivers or bindings without version 2: version 1."""
    version = getattr(nv, "nvmlMemory_v2", None)
    mem = get("nvmlDeviceGetMemoryInfo", h, version) if version is not None else None
    return mem if mem is not None else get("nvmlDeviceGetMemoryInfo", h)


def _nvml_bool(v: Any) -> bool | None:
    return None if v is None else bool(v)


def read_local() -> GpuReport:
    """This host's GPUs: NVML, else nvidia-smi, else a report that says plainly there are none."""
    rep = read_nvml() or read_nvidia_smi()
    if rep is not None and rep.available:
        return rep
    if shutil.which("nvidia-smi") is None:
        note = "no GPUs: nvidia-smi is not installed and NVML is not available"
    else:
        note = "no GPUs: nvidia-smi found no usable device"
    return GpuReport(source="none", available=False, note=note)


def enrich(rep: GpuReport, local: bool = True) -> None:
    """Fill owner, start time, command and servelab marker of each process from /proc (local GPUs only)."""
    if not local:
        return
    import psutil

    from servelab.host.processes import marker_of

    for g in rep.gpus:
        for p in g.processes:
            try:
                proc = psutil.Process(p.pid)
                with proc.oneshot():
                    p.alive = proc.status() != psutil.STATUS_ZOMBIE
                    p.since = proc.create_time()
                    with contextlib.suppress(psutil.AccessDenied):
                        p.owner = proc.username()
                    with contextlib.suppress(psutil.AccessDenied):
                        p.command = " ".join(proc.cmdline()) or proc.name()
                p.marker = marker_of(p.pid)
            except psutil.NoSuchProcess:
                p.alive = False
            except psutil.AccessDenied:
                p.alive = True

"""Hardware discovery from sysfs: NUMA nodes, sockets, cores, GPUs, NICs, memory per NUMA node.

Interface (used by ``fluxnetes agent``; stable)::

    discover(root: Path = Path("/sys"), *, kubelet_config: Path | None = KUBELET_CONFIG)
        -> NodeHardware
    read_kubelet_config(path: Path) -> KubeletSettings   # missing file -> defaults

``NodeHardware`` is plain typed data (``to_dict()`` for JSON). ``hw.flat`` is True when the
topology could not be read or makes no sense (no ``devices/system/node``, CPUs outside every
NUMA node, a GPU whose NUMA node is unknown on a multi-NUMA machine, unreadable files):
then ``hw.warnings`` holds exactly one message naming the cause, it is logged once, and the
node stays flat in the scheduler's graph (no NodeResourceTopology is published). Discovery
never raises for odd sysfs content.

What is read (``root`` replaces ``/sys``; tests point it at recorded trees):

* ``devices/system/cpu/online`` and ``cpuN/topology/{physical_package_id,core_id,
  thread_siblings_list}``: sockets, cores and their SMT siblings (a core = one sibling set);
* ``devices/system/node/nodeN/{cpulist,meminfo,distance}``: NUMA nodes with CPUs (memory-only
  nodes, e.g. CXL or HBM, are skipped), their memory (``MemTotal``) and SLIT distances;
* ``bus/pci/devices/*/{class,vendor,device,numa_node,local_cpulist}``: GPUs (class 0x0300xx
  or 0x0302xx from NVIDIA 0x10de or AMD 0x1002) and NICs (0x0200xx Ethernet, 0x0207xx
  InfiniBand). ``numa_node`` -1 is resolved through ``local_cpulist``; on a one-NUMA machine
  everything belongs to node 0.
* the kubelet's configuration file (YAML, ``KubeletConfiguration``) when readable:
  ``reservedSystemCPUs`` and the CPU / topology / memory manager policies.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

KUBELET_CONFIG = Path("/var/lib/kubelet/config.yaml")

GPU_VENDORS = {"0x10de": "nvidia", "0x1002": "amd"}
GPU_CLASSES = ("0x0300", "0x0302")
NIC_CLASSES = ("0x0200", "0x0207")


class SysfsError(Exception):
    """Odd or unreadable sysfs content (caught inside :func:`discover`)."""


def parse_cpulist(text: str) -> list[int]:
    """Kernel cpulist format ``0-3,8,10-11`` (also used by ``reservedSystemCPUs``) -> ids.

    An empty string is the empty list; anything else malformed raises :class:`ValueError`."""
    out: set[int] = set()
    s = text.strip()
    if not s:
        return []
    for part in s.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?(?::(\d+)/(\d+))?", part)
        if not m:
            raise ValueError(f"not a CPU list: {text.strip()!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"not a CPU list: {text.strip()!r} ({part}: end before start)")
        if m.group(3) is not None:  # "0-15:2/4": used 2 of every 4
            used, grp = int(m.group(3)), int(m.group(4))
            if grp <= 0 or used <= 0:
                raise ValueError(f"not a CPU list: {text.strip()!r}")
            out.update(c for c in range(lo, hi + 1) if (c - lo) % grp < used)
        else:
            out.update(range(lo, hi + 1))
    return sorted(out)


def format_cpulist(cpus: list[int] | tuple[int, ...]) -> str:
    """Inverse of :func:`parse_cpulist`: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: list[str] = []
    ids = sorted(set(cpus))
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        runs.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(runs)


@dataclass(frozen=True)
class Core:
    """A physical core: its logical CPUs (SMT siblings), socket and NUMA node."""

    socket: int  # physical_package_id
    core_id: int  # topology/core_id (unique within a socket only)
    numa: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class PciDevice:
    address: str  # "0000:17:00.0"
    kind: str  # "gpu" | "nic"
    vendor: str  # "0x10de"
    device: str  # "0x2330"
    pci_class: str  # "0x030200"
    numa: int | None  # None: unknown (numa_node -1 and not resolvable)

    @property
    def resource(self) -> str:
        """The Kubernetes extended resource its device plugin advertises (GPUs)."""
        return f"{GPU_VENDORS.get(self.vendor, 'nvidia')}.com/gpu"


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]
    memory_bytes: int  # MemTotal of the node
    distances: tuple[int, ...] = ()  # SLIT distance to node k (index = position in node list)
    sockets: tuple[int, ...] = ()  # physical packages of its CPUs (usually one)


@dataclass(frozen=True)
class KubeletSettings:
    """The kubelet's settings that matter for topology (``KubeletConfiguration`` keys)."""

    found: bool = False  # the file was read
    reserved_cpus: tuple[int, ...] = ()  # reservedSystemCPUs
    cpu_manager_policy: str = "none"
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    memory_manager_policy: str = "None"
    # reservedMemory: NUMA node -> bytes of memory reserved on it
    reserved_memory: dict[int, int] = field(default_factory=dict)


@dataclass
class NodeHardware:
    numa_nodes: list[NumaNode] = field(default_factory=list)
    cores: list[Core] = field(default_factory=list)
    gpus: list[PciDevice] = field(default_factory=list)
    nics: list[PciDevice] = field(default_factory=list)
    kubelet: KubeletSettings = field(default_factory=KubeletSettings)
    flat: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def cpus(self) -> list[int]:
        return sorted(c for core in self.cores for c in core.cpus)

    @property
    def sockets(self) -> list[int]:
        return sorted({c.socket for c in self.cores})

    @property
    def memory_bytes(self) -> int:
        return sum(n.memory_bytes for n in self.numa_nodes)

    def cpus_of(self, numa: int) -> list[int]:
        return sorted(c for core in self.cores if core.numa == numa for c in core.cpus)

    def gpus_of(self, numa: int) -> list[PciDevice]:
        return [g for g in self.gpus if g.numa == numa]

    def summary(self) -> str:
        if self.flat:
            return f"flat node ({len(self.cpus)} CPUs): {'; '.join(self.warnings)}"
        parts = []
        for n in self.numa_nodes:
            parts.append(f"numa{n.id}: {len(n.cpus)} CPUs, {n.memory_bytes // 2**20} MiB, "
                         f"{len(self.gpus_of(n.id))} GPUs")
        return (f"{len(self.sockets)} socket(s), {len(self.cores)} cores, {len(self.cpus)} CPUs; "
                + "; ".join(parts))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kubelet"]["reserved_memory"] = {str(k): v for k, v in self.kubelet.reserved_memory.items()}
        return d


# ----------------------------------------------------------------------------- reading


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SysfsError(f"cannot read {p}: {getattr(exc, 'strerror', None) or exc}") from None


def _read_int(p: Path) -> int:
    text = _read(p).strip()
    try:
        return int(text, 0)
    except ValueError:
        raise SysfsError(f"{p}: not an integer: {text!r}") from None


def _read_cpulist(p: Path) -> list[int]:
    text = _read(p)
    try:
        return parse_cpulist(text)
    except ValueError as exc:
        raise SysfsError(f"{p}: {exc}") from None


def _numbered(d: Path, prefix: str) -> list[tuple[int, Path]]:
    out = []
    try:
        entries = list(d.iterdir())
    except OSError:
        return []
    for e in entries:
        m = re.fullmatch(re.escape(prefix) + r"(\d+)", e.name)
        if m:
            out.append((int(m.group(1)), e))
    return sorted(out)


def _meminfo_total(p: Path) -> int:
    for line in _read(p).splitlines():
        m = re.match(r"Node\s+\d+\s+MemTotal:\s+(\d+)\s*kB", line)
        if m:
            return int(m.group(1)) * 1024
    raise SysfsError(f"{p}: no 'MemTotal' line")


def _read_cores(root: Path) -> list[tuple[int, int, tuple[int, ...]]]:
    """(socket, core_id, sibling cpus) per core, from the online CPUs."""
    cpu_dir = root / "devices/system/cpu"
    online_p = cpu_dir / "online"
    if online_p.exists():
        online = _read_cpulist(online_p)
    else:
        online = [n for n, _ in _numbered(cpu_dir, "cpu")]
    if not online:
        raise SysfsError(f"{cpu_dir}: no online CPUs found")
    seen: dict[tuple[int, ...], tuple[int, int]] = {}
    onl = set(online)
    for cpu in online:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        socket = _read_int(topo / "physical_package_id")
        core_id = _read_int(topo / "core_id")
        sib_p = topo / "thread_siblings_list"
        if not sib_p.exists():
            sib_p = topo / "core_cpus_list"
        sibs = tuple(c for c in _read_cpulist(sib_p) if c in onl)
        if cpu not in sibs:
            raise SysfsError(f"{sib_p}: does not list cpu{cpu} itself")
        if sibs in seen:
            continue
        seen[sibs] = (max(socket, 0), core_id)  # -1 (unknown package): one socket
    return [(s, c, sibs) for sibs, (s, c) in seen.items()]


def _read_numa(root: Path, online: set[int]) -> list[tuple[int, list[int], int, list[int]]]:
    node_dir = root / "devices/system/node"
    if not node_dir.is_dir():
        raise SysfsError(f"{node_dir} does not exist (kernel without NUMA, or a VM or container "
                         "that hides it)")
    out = []
    for nid, nd in _numbered(node_dir, "node"):
        cpus = [c for c in _read_cpulist(nd / "cpulist") if c in online]
        if not cpus:
            continue  # memory-only node (CXL, HBM): not a placement domain
        mem = _meminfo_total(nd / "meminfo")
        dist: list[int] = []
        if (nd / "distance").exists():
            try:
                dist = [int(x) for x in _read(nd / "distance").split()]
            except ValueError:
                raise SysfsError(f"{nd / 'distance'}: not a list of integers") from None
        out.append((nid, cpus, mem, dist))
    if not out:
        raise SysfsError(f"{node_dir}: no NUMA node with online CPUs")
    return out


def _read_pci(root: Path, cpu_numa: dict[int, int], numa_ids: list[int]) -> tuple[list[PciDevice], list[PciDevice]]:
    pci_dir = root / "bus/pci/devices"
    gpus: list[PciDevice] = []
    nics: list[PciDevice] = []
    try:
        devs = sorted(pci_dir.iterdir())
    except OSError:
        return gpus, nics  # no PCI bus visible (some containers): nothing to place
    for d in devs:
        try:
            pci_class = _read(d / "class").strip().lower()
            vendor = _read(d / "vendor").strip().lower()
        except SysfsError:
            continue  # a half-visible device is not ours to judge
        if pci_class.startswith(GPU_CLASSES) and vendor in GPU_VENDORS:
            kind = "gpu"
        elif pci_class.startswith(NIC_CLASSES):
            kind = "nic"
        else:
            continue
        device = _read(d / "device").strip().lower() if (d / "device").exists() else ""
        numa: int | None = None
        if (d / "numa_node").exists():
            numa = _read_int(d / "numa_node")
        if numa is not None and numa < 0:
            numa = None
        if numa is None and (d / "local_cpulist").exists():
            nodes = {cpu_numa[c] for c in _read_cpulist(d / "local_cpulist") if c in cpu_numa}
            if len(nodes) == 1:
                numa = nodes.pop()
        if numa is None and len(numa_ids) == 1:
            numa = numa_ids[0]
        if numa is not None and numa not in numa_ids:
            raise SysfsError(f"{d / 'numa_node'}: NUMA node {numa} has no CPUs")
        dev = PciDevice(d.name, kind, vendor, device, pci_class, numa)
        if kind == "gpu" and numa is None:
            raise SysfsError(f"{d}: GPU with unknown NUMA node (numa_node -1) on a "
                             f"{len(numa_ids)}-NUMA machine")
        (gpus if kind == "gpu" else nics).append(dev)
    return gpus, nics


def read_kubelet_config(path: Path) -> KubeletSettings:
    """The topology-relevant keys of a KubeletConfiguration file; a missing or unreadable
    file gives the kubelet's defaults (``found=False``); malformed values raise ValueError
    naming the key."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return KubeletSettings()
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a KubeletConfiguration must be a mapping")

    def s(key: str, default: str) -> str:
        v = doc.get(key, default)
        if v is None:
            return default
        if not isinstance(v, str):
            raise ValueError(f"{path}: {key}: must be a string")
        return v

    reserved: list[int] = []
    if doc.get("reservedSystemCPUs"):
        try:
            reserved = parse_cpulist(str(doc["reservedSystemCPUs"]))
        except ValueError as exc:
            raise ValueError(f"{path}: reservedSystemCPUs: {exc}") from None
    rmem: dict[int, int] = {}
    for i, ent in enumerate(doc.get("reservedMemory") or []):
        if not isinstance(ent, dict) or not isinstance(ent.get("numaNode"), int):
            raise ValueError(f"{path}: reservedMemory[{i}].numaNode: must be an integer")
        limits = ent.get("limits") or {}
        if "memory" in limits:
            from fluxnetes.graph.builders import parse_quantity
            from fluxnetes.graph.model import GraphError

            try:
                rmem[ent["numaNode"]] = rmem.get(ent["numaNode"], 0) + int(
                    parse_quantity(limits["memory"], f"reservedMemory[{i}].limits.memory"))
            except GraphError as exc:
                raise ValueError(f"{path}: {exc}") from None
    return KubeletSettings(
        found=True,
        reserved_cpus=tuple(reserved),
        cpu_manager_policy=s("cpuManagerPolicy", "none"),
        topology_manager_policy=s("topologyManagerPolicy", "none"),
        topology_manager_scope=s("topologyManagerScope", "container"),
        memory_manager_policy=s("memoryManagerPolicy", "None"),
        reserved_memory=rmem,
    )


_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    """The agent rediscovers periodically: the same problem is logged as a warning once."""
    if msg in _warned:
        log.debug("%s", msg)
        return
    _warned.add(msg)
    log.warning("%s", msg)


def discover(root: Path = Path("/sys"), *, kubelet_config: Path | None = KUBELET_CONFIG) -> NodeHardware:
    """Read the node's hardware under ``root`` (``/sys``). Never raises for odd sysfs: the
    result is then flat with one warning (see the module docstring)."""
    kubelet = KubeletSettings()
    extra_warnings: list[str] = []
    if kubelet_config is not None:
        try:
            kubelet = read_kubelet_config(kubelet_config)
        except ValueError as exc:
            extra_warnings.append(f"kubelet configuration ignored: {exc}")
    try:
        hw = _discover(root, kubelet)
    except SysfsError as exc:
        msg = f"hardware topology unavailable, the node stays flat: {exc}"
        _warn_once(msg)
        cores: list[Core] = []
        with contextlib.suppress(SysfsError):  # the CPU count is still useful to show
            cores = [Core(s, c, 0, sibs) for s, c, sibs in _read_cores(root)]
        return NodeHardware(cores=cores, kubelet=kubelet, flat=True, warnings=[msg, *extra_warnings])
    for w in extra_warnings:
        _warn_once(w)
    hw.warnings.extend(extra_warnings)
    return hw


def _discover(root: Path, kubelet: KubeletSettings) -> NodeHardware:
    if not root.is_dir():
        raise SysfsError(f"{root} is not a readable directory")
    raw_cores = _read_cores(root)
    online = {c for _, _, sibs in raw_cores for c in sibs}
    numa = _read_numa(root, online)
    cpu_numa: dict[int, int] = {}
    for nid, cpus, _, _ in numa:
        for c in cpus:
            if c in cpu_numa:
                raise SysfsError(f"cpu{c} is listed by NUMA nodes {cpu_numa[c]} and {nid}")
            cpu_numa[c] = nid
    missing = sorted(online - set(cpu_numa))
    if missing:
        raise SysfsError(f"CPUs {format_cpulist(missing)} belong to no NUMA node")
    cores: list[Core] = []
    for socket, core_id, sibs in raw_cores:
        nodes = {cpu_numa[c] for c in sibs}
        if len(nodes) != 1:
            raise SysfsError(f"the SMT siblings {format_cpulist(sibs)} span NUMA nodes {sorted(nodes)}")
        cores.append(Core(socket, core_id, nodes.pop(), tuple(sorted(sibs))))
    cores.sort(key=lambda c: c.cpus[0])
    numa_ids = [nid for nid, _, _, _ in numa]
    gpus, nics = _read_pci(root, cpu_numa, numa_ids)
    nodes_out = []
    for nid, cpus, mem, dist in numa:
        sockets = tuple(sorted({c.socket for c in cores if c.numa == nid}))
        nodes_out.append(NumaNode(nid, tuple(cpus), mem, tuple(dist), sockets))
    warnings: list[str] = []
    bad = sorted(set(kubelet.reserved_cpus) - online)
    if bad:
        warnings.append(f"kubelet reservedSystemCPUs {format_cpulist(bad)} are not online CPUs")
    return NodeHardware(nodes_out, cores, gpus, nics, kubelet, False, warnings)

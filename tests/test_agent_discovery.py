"""Hardware discovery from recorded and generated sysfs trees, and the NodeResourceTopology
object built from it (fluxnetes.agent.discovery, fluxnetes.agent.nrt)."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fluxnetes.agent import nrt
from fluxnetes.agent.discovery import (
    NodeHardware,
    discover,
    format_cpulist,
    parse_cpulist,
    read_kubelet_config,
)
from fluxnetes.graph.topology import topology_from_nrt
from fluxnetes.k8s.kube import ApiError

FIXTURES = Path(__file__).parent / "fixtures" / "sysfs"
THIS_MACHINE = FIXTURES / "this-machine"


def _gen() -> Any:
    spec = importlib.util.spec_from_file_location("gen_sysfs", FIXTURES / "gen_sysfs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _gen()


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("sysfs")
    return {name: GEN.write_tree(layout, base / name) for name, layout in GEN.LAYOUTS.items()}


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "sys"
    shutil.copytree(src, dst)
    return dst


# ----------------------------------------------------------------------------- layouts


def test_this_machine_recorded() -> None:
    hw = discover(THIS_MACHINE, kubelet_config=None)
    assert not hw.flat and hw.warnings == []
    assert [n.id for n in hw.numa_nodes] == [0]
    assert hw.cpus == [0, 1] and hw.sockets == [0]
    assert [c.cpus for c in hw.cores] == [(0,), (1,)]  # no SMT on this VM
    assert hw.numa_nodes[0].memory_bytes == 7301332 * 1024
    assert hw.gpus == []
    # the virtio NIC says numa_node -1; one NUMA node: it is there
    assert [(d.address, d.vendor, d.numa) for d in hw.nics] == [("0000:00:03.0", "0x1af4", 0)]


def test_two_socket_interleaved_numbering(trees: dict[str, Path]) -> None:
    hw = discover(trees["two-socket"], kubelet_config=None)
    assert not hw.flat and hw.warnings == []
    assert [n.id for n in hw.numa_nodes] == [0, 1]
    assert hw.numa_nodes[0].cpus == tuple(range(0, 80, 2))
    assert hw.numa_nodes[1].cpus == tuple(range(1, 80, 2))
    assert [n.sockets for n in hw.numa_nodes] == [(0,), (1,)]
    assert [n.distances for n in hw.numa_nodes] == [(10, 21), (21, 10)]
    assert hw.numa_nodes[0].memory_bytes == 192 * 2**30
    assert len(hw.cores) == 40
    core0 = hw.cores[0]
    assert core0.cpus == (0, 40) and core0.socket == 0 and core0.numa == 0
    assert all(c.numa == c.socket for c in hw.cores)
    assert all(len(c.cpus) == 2 for c in hw.cores)
    # the Matrox BMC VGA (class 0x0300, vendor 0x102b) is not a GPU
    assert hw.gpus == []
    # numa_node -1 resolved through local_cpulist (the odd CPUs = NUMA node 1)
    assert {d.address: d.numa for d in hw.nics} == {"0000:3b:00.0": 0, "0000:86:00.0": 1}


def test_dgx_h100_gpus_per_numa(trees: dict[str, Path]) -> None:
    hw = discover(trees["dgx-h100"], kubelet_config=None)
    assert not hw.flat
    assert [len(n.cpus) for n in hw.numa_nodes] == [112, 112]
    assert hw.cpus_of(0) == [*range(0, 56), *range(112, 168)]
    assert len(hw.cores) == 112 and hw.sockets == [0, 1]
    assert [len(hw.gpus_of(n)) for n in (0, 1)] == [4, 4]
    assert {g.resource for g in hw.gpus} == {"nvidia.com/gpu"}
    assert all(g.pci_class.startswith("0x0302") for g in hw.gpus)
    assert [d.numa for d in hw.nics] == [0, 0, 0, 0, 1, 1, 1, 1]  # InfiniBand 0x0207
    assert hw.memory_bytes == 2 * 2**40
    d = hw.to_dict()
    assert d["numa_nodes"][1]["id"] == 1 and len(d["gpus"]) == 8


# ----------------------------------------------------------------------------- kubelet


def test_kubelet_reserved_cpus_and_policies(tmp_path: Path, trees: dict[str, Path]) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "cpuManagerPolicy: static\nreservedSystemCPUs: \"0,40\"\n"
        "topologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n"
        "memoryManagerPolicy: Static\nreservedMemory:\n- numaNode: 0\n  limits: {memory: 1Gi}\n")
    hw = discover(trees["two-socket"], kubelet_config=cfg)
    k = hw.kubelet
    assert k.found and k.reserved_cpus == (0, 40) and k.cpu_manager_policy == "static"
    assert (k.topology_manager_policy, k.topology_manager_scope) == ("single-numa-node", "pod")
    assert k.memory_manager_policy == "Static" and k.reserved_memory == {0: 2**30}
    obj = nrt.build_nrt("n1", hw)
    zones = {z["name"]: {r["name"]: r for r in z["resources"]} for z in obj["zones"]}
    # cpu 0 and its sibling 40 are both on NUMA node 0 (even CPUs)
    assert zones["node-0"]["cpu"]["capacity"] == 40 and zones["node-0"]["cpu"]["allocatable"] == 38
    assert zones["node-1"]["cpu"]["allocatable"] == 40
    assert zones["node-0"]["memory"]["allocatable"] == 191 * 2**30
    attrs = {a["name"]: a["value"] for a in obj["attributes"]}
    assert attrs["topologyManagerPolicy"] == "single-numa-node" and attrs["topologyManagerScope"] == "pod"
    assert obj["topologyPolicies"] == ["SingleNUMANodePodLevel"]


def test_kubelet_config_missing_is_defaults_and_bad_is_one_warning(tmp_path: Path) -> None:
    k = read_kubelet_config(tmp_path / "absent.yaml")
    assert not k.found and k.topology_manager_policy == "none" and k.reserved_cpus == ()
    bad = tmp_path / "bad.yaml"
    bad.write_text("reservedSystemCPUs: \"0-x\"\n")
    with pytest.raises(ValueError, match="reservedSystemCPUs"):
        read_kubelet_config(bad)
    hw = discover(THIS_MACHINE, kubelet_config=bad)
    assert not hw.flat  # the hardware is still known
    assert len(hw.warnings) == 1 and "reservedSystemCPUs" in hw.warnings[0]


# ----------------------------------------------------------------------------- odd sysfs


def _one_flat_warning(hw: NodeHardware, caplog: pytest.LogCaptureFixture, what: str) -> None:
    assert hw.flat and hw.numa_nodes == []
    assert len(hw.warnings) == 1 and what in hw.warnings[0], hw.warnings
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("fluxnetes.agent")]
    assert len(warned) == 1


def test_missing_root_is_flat(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hw = discover(tmp_path / "nothing", kubelet_config=None)
    _one_flat_warning(hw, caplog, "not a readable directory")
    assert hw.cores == []


def test_vm_without_numa_is_flat(tmp_path: Path, trees: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    root = _copy(trees["two-socket"], tmp_path)
    shutil.rmtree(root / "devices/system/node")
    hw = discover(root, kubelet_config=None)
    _one_flat_warning(hw, caplog, "devices/system/node does not exist")
    assert len(hw.cpus) == 80  # still counted, for the summary
    assert "flat node (80 CPUs)" in hw.summary()
    # the agent rediscovers every few minutes: the same problem is not logged again
    again = discover(root, kubelet_config=None)
    assert again.flat and again.warnings == hw.warnings
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1


def test_gpu_with_unknown_numa_on_two_numa_nodes_is_flat(tmp_path: Path, trees: dict[str, Path],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    root = _copy(trees["dgx-h100"], tmp_path)
    dev = root / "bus/pci/devices/0000:9d:00.0"
    (dev / "numa_node").write_text("-1\n")
    (dev / "local_cpulist").unlink()
    hw = discover(root, kubelet_config=None)
    _one_flat_warning(hw, caplog, "GPU with unknown NUMA node")


def test_gpu_numa_minus_one_resolved_by_local_cpulist(tmp_path: Path, trees: dict[str, Path]) -> None:
    root = _copy(trees["dgx-h100"], tmp_path)
    (root / "bus/pci/devices/0000:9d:00.0/numa_node").write_text("-1\n")
    hw = discover(root, kubelet_config=None)
    assert not hw.flat and [len(hw.gpus_of(n)) for n in (0, 1)] == [4, 4]


@pytest.mark.parametrize("mutation, what", [
    ("garbage-cpulist", "not a CPU list"),
    ("unreadable-meminfo", "cannot read"),
    ("cpus-outside-numa", "belong to no NUMA node"),
    ("bad-package-id", "not an integer"),
])
def test_odd_sysfs_is_flat_never_a_crash(tmp_path: Path, caplog: pytest.LogCaptureFixture, mutation: str,
                                         what: str) -> None:
    root = _copy(THIS_MACHINE, tmp_path)
    node0 = root / "devices/system/node/node0"
    if mutation == "garbage-cpulist":
        (node0 / "cpulist").write_text("zero-one\n")
    elif mutation == "unreadable-meminfo":  # a directory where a file should be: EISDIR
        (node0 / "meminfo").unlink()
        (node0 / "meminfo").mkdir()
    elif mutation == "cpus-outside-numa":
        (node0 / "cpulist").write_text("0\n")
    elif mutation == "bad-package-id":
        (root / "devices/system/cpu/cpu1/topology/physical_package_id").write_text("?\n")
    hw = discover(root, kubelet_config=None)
    _one_flat_warning(hw, caplog, what)


def test_memory_only_numa_node_is_skipped(tmp_path: Path) -> None:
    root = _copy(THIS_MACHINE, tmp_path)
    n1 = root / "devices/system/node/node1"
    n1.mkdir()
    (n1 / "cpulist").write_text("\n")
    (n1 / "meminfo").write_text("Node 1 MemTotal:       1048576 kB\n")
    hw = discover(root, kubelet_config=None)
    assert not hw.flat and [n.id for n in hw.numa_nodes] == [0]


# ----------------------------------------------------------------------------- cpulists


@given(st.sets(st.integers(min_value=0, max_value=300), max_size=60))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(sorted(cpus))) == sorted(cpus)


def test_cpulist_forms() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("0-7:2/4") == [0, 1, 4, 5]
    assert parse_cpulist(" \n") == []
    for bad in ("3-1", "a", "1,,2", "-1"):
        with pytest.raises(ValueError, match="not a CPU list"):
            parse_cpulist(bad)


# ----------------------------------------------------------------------------- NRT object


def test_nrt_object_for_dgx(trees: dict[str, Path]) -> None:
    hw = discover(trees["dgx-h100"], kubelet_config=None)
    node = {"metadata": {"name": "dgx1", "uid": "u-1"},
            "status": {"allocatable": {"cpu": "220", "memory": "2000Gi", "nvidia.com/gpu": "8"}}}
    obj = nrt.build_nrt("dgx1", hw, node=node)
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha2" and obj["kind"] == "NodeResourceTopology"
    assert obj["metadata"]["name"] == "dgx1"
    assert obj["metadata"]["labels"] == {nrt.MANAGED_BY: nrt.AGENT}
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert [z["name"] for z in obj["zones"]] == ["node-0", "node-1"]
    assert all(z["type"] == "Node" for z in obj["zones"])
    assert obj["zones"][0]["costs"] == [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}]
    res = [{r["name"]: r for r in z["resources"]} for z in obj["zones"]]
    assert [r["nvidia.com/gpu"]["allocatable"] for r in res] == [4, 4]
    assert [r["cpu"]["capacity"] for r in res] == [112, 112]
    # the Node has 220 allocatable cpus: the zones are scaled down to it
    assert sum(r["cpu"]["allocatable"] for r in res) == 220
    assert sum(r["memory"]["allocatable"] for r in res) == 2000 * 2**30
    assert all(r["cpu"]["available"] == r["cpu"]["allocatable"] for r in res)
    attrs = {a["name"]: a["value"] for a in obj["attributes"]}
    assert attrs["topologyManagerPolicy"] == "none" and obj["topologyPolicies"] == ["None"]
    # the operator side reads it back
    topo = topology_from_nrt(obj)
    assert [(z.numa, z.cores, z.gpus) for z in topo.zones] == [(0, 110, 4), (1, 110, 4)]


def test_nrt_gpus_without_device_plugin_are_not_allocatable(trees: dict[str, Path]) -> None:
    hw = discover(trees["dgx-h100"], kubelet_config=None)
    node = {"metadata": {"name": "dgx1"}, "status": {"allocatable": {"cpu": "224", "memory": "2Ti"}}}
    res = [{r["name"]: r for r in z["resources"]} for z in nrt.build_nrt("dgx1", hw, node=node)["zones"]]
    assert [(r["nvidia.com/gpu"]["capacity"], r["nvidia.com/gpu"]["allocatable"]) for r in res] == [(4, 0), (4, 0)]


def test_flat_hardware_has_no_nrt(tmp_path: Path) -> None:
    hw = discover(tmp_path / "none", kubelet_config=None)
    with pytest.raises(ValueError, match="flat"):
        nrt.build_nrt("n", hw)


def test_crd_manifest_is_the_community_crd() -> None:
    crd = nrt.crd_manifest()
    assert crd["metadata"]["name"] == "noderesourcetopologies.topology.node.k8s.io"
    assert crd["spec"]["scope"] == "Cluster"
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert versions["v1alpha2"]["storage"] and versions["v1alpha1"]["served"]
    zone = versions["v1alpha2"]["schema"]["openAPIV3Schema"]["properties"]["zones"]["items"]
    assert set(zone["properties"]) == {"name", "type", "parent", "costs", "attributes", "resources"}


# ----------------------------------------------------------------------------- publish (fake API)


class FakeKube:
    """The few Kube calls publish() makes, over dicts (unit test only)."""

    def __init__(self, objects: dict[str, dict[str, Any]] | None = None, crd: bool = False) -> None:
        self.objects = objects or {}
        self.crd: dict[str, Any] | None = None
        if crd:
            self.crd = {"status": {"conditions": [{"type": "Established", "status": "True"}]}}
        self.writes: list[str] = []

    async def get_or_none(self, res: Any, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        if res.plural == "customresourcedefinitions":
            return self.crd
        if res.plural == "nodes":
            return {"metadata": {"name": name, "uid": "uid-" + name}, "status": {"allocatable": {}}}
        return self.objects.get(name)

    async def get(self, res: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        obj = await self.get_or_none(res, name)
        if obj is None:
            raise ApiError(404, {"message": "not found"}, "GET", name)
        return obj

    async def create(self, res: Any, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        self.writes.append(f"create {res.plural}")
        if res.plural == "customresourcedefinitions":
            self.crd = {**body, "status": {"conditions": [{"type": "Established", "status": "True"}]}}
            return self.crd
        if self.crd is None:
            raise ApiError(404, {"message": "the server could not find the requested resource"}, "POST", "")
        obj = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
        self.objects[body["metadata"]["name"]] = obj
        return obj

    async def replace(self, res: Any, name: str, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        self.writes.append(f"replace {name}")
        obj = {**body, "metadata": {**body["metadata"], "resourceVersion": "2"}}
        self.objects[name] = obj
        return obj

    async def delete(self, res: Any, name: str, namespace: str | None = None) -> None:
        self.writes.append(f"delete {name}")
        self.objects.pop(name, None)


def test_publish_installs_crd_creates_then_updates(trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nrt, "_crd_ready", False)
    kube = FakeKube()
    hw = discover(trees["two-socket"], kubelet_config=None)
    out = asyncio.run(nrt.publish(kube, "n1", hw))  # type: ignore[arg-type]
    assert out is not None and kube.writes == ["create customresourcedefinitions", "create noderesourcetopologies"]
    assert kube.crd is not None and kube.crd["metadata"]["name"] == nrt.CRD_NAME
    # unchanged hardware: no write
    asyncio.run(nrt.publish(kube, "n1", hw))  # type: ignore[arg-type]
    assert len(kube.writes) == 2
    # changed (a kubelet reservation appeared): an update with the resourceVersion
    from dataclasses import replace

    hw2 = replace(hw, kubelet=replace(hw.kubelet, reserved_cpus=(0,)))
    asyncio.run(nrt.publish(kube, "n1", hw2))  # type: ignore[arg-type]
    assert kube.writes[-1] == "replace n1"
    # flat: our object is removed
    asyncio.run(nrt.publish(kube, "n1", NodeHardware(flat=True, warnings=["x"])))  # type: ignore[arg-type]
    assert kube.writes[-1] == "delete n1" and "n1" not in kube.objects


def test_publish_reinstalls_a_removed_crd(trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nrt, "_crd_ready", False)
    kube = FakeKube()
    hw = discover(trees["two-socket"], kubelet_config=None)
    asyncio.run(nrt.publish(kube, "n1", hw))  # type: ignore[arg-type]
    kube.crd, kube.objects = None, {}  # someone deleted the CRD (and so every object)
    assert asyncio.run(nrt.publish(kube, "n1", hw)) is not None  # type: ignore[arg-type]
    assert kube.writes[-2:] == ["create customresourcedefinitions", "create noderesourcetopologies"]
    assert kube.crd is not None and "n1" in kube.objects


def test_publish_leaves_nfd_objects_alone(trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nrt, "_crd_ready", False)
    theirs = {"metadata": {"name": "n1", "resourceVersion": "7", "labels": {}}, "zones": []}
    kube = FakeKube({"n1": theirs}, crd=True)
    hw = discover(trees["two-socket"], kubelet_config=None)
    assert asyncio.run(nrt.publish(kube, "n1", hw)) is None  # type: ignore[arg-type]
    assert kube.writes == [] and kube.objects["n1"] is theirs
    asyncio.run(nrt.publish(kube, "n1", NodeHardware(flat=True)))  # type: ignore[arg-type]
    assert kube.writes == []  # not ours to delete either
    asyncio.run(nrt.publish(kube, "n1", hw, force=True))  # type: ignore[arg-type]
    assert kube.writes == ["replace n1"]


# ----------------------------------------------------------------------------- real API server


def test_publish_on_the_api_server(k8s_cluster: Any, trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                   tmp_path: Path) -> None:
    """CRD installed (the API server accepts its schema), object created and updated, read back
    by the operator side; the kwok node's allocatable (16 cpu, 64Gi, 4 GPUs) caps the zones."""
    from fluxnetes.k8s.cluster.topology import NRT
    from fluxnetes.k8s.kube import CRDS, NODES, Kube

    monkeypatch.setattr(nrt, "_crd_ready", False)
    # a kubelet that aligns pods to one NUMA node: the operator builds sockets only for those
    cfg = tmp_path / "config.yaml"
    cfg.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                   "topologyManagerPolicy: single-numa-node\n")
    hw = discover(trees["dgx-h100"], kubelet_config=cfg)

    async def main() -> None:
        kube = await Kube.from_config(str(k8s_cluster.kubeconfig))
        try:
            if await kube.get_or_none(CRDS, nrt.CRD_NAME) is not None:
                await kube.delete(NRT, "kwok-node-0")  # left by an earlier test
            out = await nrt.publish(kube, "kwok-node-0", hw)
            assert out is not None
            got = await kube.get(NRT, "kwok-node-0")
            node = await kube.get(NODES, "kwok-node-0")
            assert got["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
            topo = topology_from_nrt(got)
            assert [(z.numa, z.cores, z.gpus, z.memory) for z in topo.zones] == [
                (0, 8, 2, 32 * 1024), (1, 8, 2, 32 * 1024)]
            # the operator side lists it (before its first graph) the same way
            from fluxnetes.k8s.cluster.topology import Topologies, TopologySource

            seen = Topologies()
            assert await TopologySource(kube, asyncio.Queue()).load(seen) >= 1
            assert seen.get("kwok-node-0") == topo
            # a second agent start: unchanged, no write (same resourceVersion)
            again = await nrt.publish(kube, "kwok-node-0", hw)
            assert again is not None
            assert again["metadata"]["resourceVersion"] == got["metadata"]["resourceVersion"]
            await kube.delete(NRT, "kwok-node-0")
        finally:
            await kube.close()

    asyncio.run(main())

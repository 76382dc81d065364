"""The node's hardware as a NodeResourceTopology object (``topology.node.k8s.io/v1alpha2``).

Interface (used by ``fluxnetes agent``; stable)::

    await publish(kube: Kube, node_name: str, hw: NodeHardware, *, force: bool = False)
        -> dict | None      # the object written, or None when nothing was written
    await ensure_crd(kube: Kube) -> bool   # True when this call installed the CRD
    build_nrt(node_name, hw, *, node=None) -> dict   # pure: the object publish() writes

``publish`` installs the CRD when it is absent (the YAML ships in the package:
``fluxnetes/agent/crds/``), then creates or updates the object named after the node. It
does not overwrite an object some other writer owns (NFD's nfd-topology-updater, RTE):
those are used as they are unless ``force``. A flat ``hw`` (topology unknown) publishes
nothing and removes an object the agent wrote earlier, so the graph falls back to flat.

The object (one per node, cluster-scoped, named after the node):

* ``zones``: one per NUMA node, ``name: node-<N>``, ``type: Node``; ``costs`` = the SLIT
  distances (``node-<M>``: value); ``resources``: ``cpu`` (logical CPUs; allocatable without
  the kubelet's ``reservedSystemCPUs``), ``memory`` (bytes; allocatable without the kubelet's
  ``reservedMemory`` for that NUMA node), ``nvidia.com/gpu`` / ``amd.com/gpu``; ``available``
  = ``allocatable`` (fluxnetes keeps what pods use in its own graph); when the Node's
  allocatable is smaller than the zones' sum, the zones are scaled down to it (the smaller
  wins, as on the operator side). Zone ``attributes``: ``cpus`` (the CPU list) and
  ``sockets`` (physical package ids).
* ``attributes``: ``topologyManagerPolicy``, ``topologyManagerScope`` (from the kubelet's
  configuration when readable, else its defaults ``none`` / ``container``),
  ``cpuManagerPolicy``, ``memoryManagerPolicy``; ``topologyPolicies`` (deprecated list form)
  for older readers.
* label ``app.kubernetes.io/managed-by: fluxnetes-agent``; owner reference to the Node (the
  object goes when the node does).
"""

from __future__ import annotations

import asyncio
import logging
from importlib.resources import files
from typing import Any

from fluxnetes.agent.discovery import NodeHardware, format_cpulist
from fluxnetes.k8s.kube import CRDS, NODES, ApiError, Kube, Resource, crd_established

log = logging.getLogger(__name__)

GROUP = "topology.node.k8s.io"
VERSION = "v1alpha2"
KIND = "NodeResourceTopology"
CRD_NAME = f"noderesourcetopologies.{GROUP}"
CRD_FILE = f"{CRD_NAME}.yaml"
NRT = Resource(f"{GROUP}/{VERSION}", "noderesourcetopologies", namespaced=False)
MANAGED_BY = "app.kubernetes.io/managed-by"
AGENT = "fluxnetes-agent"

_POLICIES = {  # topologyManagerPolicy -> deprecated topologyPolicies word
    "single-numa-node": "SingleNUMANode",
    "restricted": "Restricted",
    "best-effort": "BestEffort",
}


def crd_manifest() -> dict[str, Any]:
    import yaml

    doc: dict[str, Any] = yaml.safe_load((files("fluxnetes.agent") / "crds" / CRD_FILE).read_text())
    return doc


def topology_policies(policy: str, scope: str) -> list[str]:
    """The deprecated ``topologyPolicies`` value: e.g. ``SingleNUMANodeContainerLevel``."""
    word = _POLICIES.get(policy)
    if word is None:
        return ["None"]
    return [word + ("PodLevel" if scope == "pod" else "ContainerLevel")]


def build_nrt(node_name: str, hw: NodeHardware, *, node: dict[str, Any] | None = None) -> dict[str, Any]:
    """The NodeResourceTopology object for ``hw`` (see the module docstring). ``node``: the
    Node object, for the owner reference and to cap allocatable at the Node's."""
    from fluxnetes.graph.builders import parse_quantity
    from fluxnetes.graph.topology import scale_to_fit

    if hw.flat:
        raise ValueError(f"node {node_name}: the hardware topology is unknown (flat); nothing to publish")
    k = hw.kubelet
    reserved = set(k.reserved_cpus)
    zones = hw.numa_nodes
    cpu_cap = [len(z.cpus) for z in zones]
    cpu_alloc = [len([c for c in z.cpus if c not in reserved]) for z in zones]
    mem_cap = [z.memory_bytes for z in zones]
    mem_alloc = [max(0, z.memory_bytes - k.reserved_memory.get(z.id, 0)) for z in zones]
    gpu_res = sorted({g.resource for g in hw.gpus})
    gpus = {r: [len([g for g in hw.gpus_of(z.id) if g.resource == r]) for z in zones] for r in gpu_res}
    gpu_alloc = dict(gpus)
    if node is not None:
        alloc = (node.get("status") or {}).get("allocatable") or {}
        try:
            if "cpu" in alloc:
                cpu_alloc = scale_to_fit(cpu_alloc, int(parse_quantity(alloc["cpu"])))
            if "memory" in alloc:
                mem_alloc = scale_to_fit(mem_alloc, int(parse_quantity(alloc["memory"])))
            for r in gpu_res:
                gpu_alloc[r] = scale_to_fit(gpus[r], int(parse_quantity(alloc.get(r, 0))))
        except ValueError as exc:  # GraphError is a ValueError: a malformed Node quantity
            log.warning("node %s: allocatable not used to cap the zones: %s", node_name, exc)
    out_zones = []
    ids = [z.id for z in zones]
    for i, z in enumerate(zones):
        res = [
            {"name": "cpu", "capacity": cpu_cap[i], "allocatable": cpu_alloc[i], "available": cpu_alloc[i]},
            {"name": "memory", "capacity": mem_cap[i], "allocatable": mem_alloc[i], "available": mem_alloc[i]},
        ]
        for r in gpu_res:
            res.append({"name": r, "capacity": gpus[r][i], "allocatable": gpu_alloc[r][i],
                        "available": gpu_alloc[r][i]})
        zone: dict[str, Any] = {"name": f"node-{z.id}", "type": "Node", "resources": res,
                                "attributes": [{"name": "cpus", "value": format_cpulist(z.cpus)},
                                               {"name": "sockets", "value": ",".join(map(str, z.sockets))}]}
        if len(z.distances) == len(ids):
            zone["costs"] = [{"name": f"node-{m}", "value": d} for m, d in zip(ids, z.distances, strict=True)]
        out_zones.append(zone)
    meta: dict[str, Any] = {"name": node_name, "labels": {MANAGED_BY: AGENT}}
    if node is not None and (node.get("metadata") or {}).get("uid"):
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name,
                                    "uid": node["metadata"]["uid"]}]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": meta,
        "topologyPolicies": topology_policies(k.topology_manager_policy, k.topology_manager_scope),
        "attributes": [
            {"name": "topologyManagerPolicy", "value": k.topology_manager_policy},
            {"name": "topologyManagerScope", "value": k.topology_manager_scope},
            {"name": "cpuManagerPolicy", "value": k.cpu_manager_policy},
            {"name": "memoryManagerPolicy", "value": k.memory_manager_policy},
        ],
        "zones": out_zones,
    }


_crd_ready = False  # per process: the CRD was seen established once


async def ensure_crd(kube: Kube, timeout: float = 30) -> bool:
    """Install the NodeResourceTopology CRD when it is absent and wait until it is
    established. Returns True when this call created it."""
    global _crd_ready
    if _crd_ready:
        return False
    created = False
    crd = await kube.get_or_none(CRDS, CRD_NAME)
    if crd is None:
        try:
            await kube.create(CRDS, crd_manifest())
            created = True
            log.info("installed the %s CRD", CRD_NAME)
        except ApiError as exc:
            if exc.status != 409:  # 409: another agent was first
                raise
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if crd_established(await kube.get_or_none(CRDS, CRD_NAME)):
            _crd_ready = True
            return created
        if loop.time() > deadline:
            raise TimeoutError(f"the {CRD_NAME} CRD was not established within {timeout:.0f} s")
        await asyncio.sleep(0.2)


def _ours(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY) == AGENT


async def publish(kube: Kube, node_name: str, hw: NodeHardware, *, force: bool = False) -> dict[str, Any] | None:
    """Create or update the node's NodeResourceTopology (see the module docstring)."""
    existing = None
    if hw.flat:
        try:
            existing = await kube.get_or_none(NRT, node_name)
        except ApiError as exc:
            if exc.status != 404:  # 404 here: the CRD itself is absent, nothing to remove
                raise
        if existing is not None and _ours(existing):
            await kube.delete(NRT, node_name)
            log.info("node %s: topology unknown; removed the NodeResourceTopology written earlier", node_name)
        return None
    await ensure_crd(kube)
    node = None
    try:
        node = await kube.get_or_none(NODES, node_name)
    except ApiError as exc:  # without read access to Nodes: no owner reference, no cap
        log.info("node %s: Node not readable (%s); publishing without owner reference", node_name, exc)
    body = build_nrt(node_name, hw, node=node)
    existing = await kube.get_or_none(NRT, node_name)
    if existing is None:
        try:
            out: dict[str, Any] = await kube.create(NRT, body)
            return out
        except ApiError as exc:
            if exc.status == 404:  # the CRD was removed since it was installed: again
                global _crd_ready
                _crd_ready = False
                await ensure_crd(kube)
                out = await kube.create(NRT, body)
                return out
            if exc.status != 409:
                raise
            existing = await kube.get(NRT, node_name)
    if not _ours(existing) and not force:
        log.info("node %s: its NodeResourceTopology is written by another agent (NFD?); left as it is",
                 node_name)
        return None
    if _ours(existing) and all(existing.get(k) == body.get(k) for k in ("zones", "attributes", "topologyPolicies")):
        return existing  # unchanged: no write (agents republish periodically)
    body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
    out = await kube.replace(NRT, node_name, body)
    return out

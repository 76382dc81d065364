"""The simulated machine (a resource graph) and the jobspec each SWF job becomes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fluxnetes.sim.engine import SimJob
from fluxnetes.sim.swf import SwfHeader


class MachineError(ValueError):
    """The machine cannot be built from what was given."""


@dataclass
class Machine:
    """The simulated machine. ``graph`` is the resource graph the queue engine matches on;
    for a machine given by size (``--nodes/--cores`` or the SWF header) it is built on first
    use, since the count oracle only needs the node names and sizes (the very names
    the graph gives its nodes: ``node0``, ``node1``, ...)."""

    nodes: int
    cores_per_node: int  # the most common node size (whole-node requests use it)
    total_cores: int
    origin: str
    whole_nodes: bool = False
    _graph: Any = field(default=None, repr=False)  # fluxnetes.graph.ResourceGraph
    _build: Callable[[], Any] | None = field(default=None, repr=False)
    # jobspecs by processor count, then estimate (two int keys: no tuple made and hashed
    # per job, as a (procs, estimate) key would be)
    _specs: dict[int, dict[int, Any]] = field(default_factory=dict, repr=False)
    _shapes: dict[int, Any] = field(default_factory=dict, repr=False)  # procs -> first jobspec
    _node_cores: dict[str, int] | None = field(default=None, repr=False)
    # rack packing (``set_pack``, whole-node jobs): the level, and the nodes of the largest
    # rack; a job needing more nodes than that is not packed
    pack: str | None = None
    rack_capacity: int = 0

    @property
    def graph(self) -> Any:
        if self._graph is None:
            assert self._build is not None
            self._graph = self._build()
        return self._graph

    def describe(self) -> str:
        return f"{self.nodes} nodes x {self.cores_per_node} cores ({self.total_cores} cores, {self.origin})"

    def node_cores(self) -> dict[str, int]:
        """Cores of each node, by node name (what match results name), in graph order."""
        if self._node_cores is None:
            self._node_cores = {
                node.name: sum(1 for v in self.graph.walk(node) if v.type == "core")
                for node in self.graph.by_type.get("node", [])}
        return dict(self._node_cores)

    def nodes_for(self, procs: int) -> int:
        return -(-procs // self.cores_per_node)

    def min_cores(self, job: SimJob) -> int:
        """Fewest cores the job's request takes (whole-node requests take whole nodes)."""
        if self.whole_nodes:
            return self.nodes_for(job.procs) * self.cores_per_node
        return job.procs

    def jobspec(self, job: SimJob) -> Any:
        """The job's jobspec (``fluxnetes.jobspec.batch``): ``procs`` one-core slots, or whole
        (exclusive) nodes; with ``pack`` set (``set_pack``), the nodes under ``rack[1]`` when
        one rack holds that many."""
        by_estimate = self._specs.get(job.procs)
        if by_estimate is None:
            by_estimate = self._specs[job.procs] = {}
        spec = by_estimate.get(job.estimate)
        if spec is None:
            from fluxnetes.jobspec.batch import batch_jobspec, with_duration

            # one parse per processor count; other estimates share its resource tree
            # (a trace has a few hundred sizes but thousands of (size, estimate) pairs)
            shape = self._shapes.get(job.procs)
            if shape is None:
                nodes = self.nodes_for(job.procs)
                packed = self.pack is not None and nodes <= self.rack_capacity
                shape = self._shapes[job.procs] = batch_jobspec(
                    job.procs, job.estimate, exclusive_nodes=self.whole_nodes, nodes=nodes,
                    pack=self.pack if packed else None)
            spec = by_estimate[job.estimate] = (shape if shape.duration == job.estimate
                                                else with_duration(shape, job.estimate))
        return spec

    def set_pack(self, level: str | None, flag: str = "--pack") -> None:
        """Pack jobs into one ``level`` (``rack``) when one can hold them; None: never.
        MachineError naming ``flag`` when the graph has no such level."""
        if level is None:
            self.pack, self.rack_capacity = None, 0
            self._specs.clear()
            self._shapes.clear()
            return
        if level != "rack":
            raise MachineError(f"{flag}: must be racks or none (got {level!r})")
        if not self.whole_nodes:
            # rack[1] -> slot -> core matches nothing under Fluxion's slot rule (a selection
            # below a shared rack is never reached by the update pass): jobspec/batch.py
            raise MachineError(f"{flag} racks needs --whole-nodes: a rack-packed job asks for "
                               "rack[1] -> node[N] (exclusive); cores anywhere within one rack "
                               "(rack[1] -> slot -> core) is no shape Fluxion matches")
        capacity = max((sum(1 for v in self.graph.walk(rack) if v.type == "node")
                        for rack in self.graph.by_type.get("rack", [])), default=0)
        if capacity == 0:
            raise MachineError(f"{flag} racks: the machine has no racks with nodes; give "
                               "--racks N (or a --graph / --from-cluster with a rack level)")
        self.pack, self.rack_capacity = level, capacity
        self._specs.clear()
        self._shapes.clear()


def _from_graph(graph: Any, origin: str, whole_nodes: bool) -> Machine:
    nodes = graph.by_type.get("node", [])
    total = int(graph.summary().get("core", 0))
    if not nodes or total <= 0:
        raise MachineError(f"{origin}: the graph has no node with cores")
    sizes: Counter[int] = Counter()
    for node in nodes:
        sizes[sum(1 for v in graph.walk(node) if v.type == "core")] += 1
    per_node = sizes.most_common(1)[0][0]
    if per_node <= 0:
        raise MachineError(f"{origin}: nodes have no cores")
    machine = Machine(len(nodes), per_node, total, origin, whole_nodes, _graph=graph)
    machine.node_cores()  # computed once, from the graph
    return machine


def rack_sizes(nodes: int, racks: int) -> list[int]:
    """``nodes`` nodes over ``racks`` racks, as evenly as possible (the first racks take
    one more when they do not divide)."""
    base, extra = divmod(nodes, racks)
    return [base + (1 if r < extra else 0) for r in range(racks)]


def machine_from_size(nodes: int, cores: int, *, whole_nodes: bool = False, origin: str = "",
                      racks: int = 0) -> Machine:
    """``nodes`` nodes of ``cores`` cores each, under one cluster; with ``racks`` > 0 the
    nodes are spread over that many racks (``rack_sizes``; nodes keep their numbering
    across the cluster: rack0 holds node0.., the next rack the next ones)."""
    if nodes < 1:
        raise MachineError(f"--nodes: must be >= 1 (got {nodes})")
    if cores < 1:
        raise MachineError(f"--cores: must be >= 1 (got {cores})")
    if racks < 0 or racks > nodes:
        raise MachineError(f"--racks: must be between 1 and the number of nodes ({nodes}), "
                           f"got {racks}")
    origin = origin or f"--nodes {nodes} --cores {cores}"
    if racks:
        origin += f", {racks} racks"

    def build() -> Any:
        from fluxnetes.graph import from_description

        desc: dict[str, Any] = {"cluster": "swf", "node": {"sockets": 0, "cores": cores}}
        if racks:
            desc["racks"] = [{"name": f"rack{r}", "nodes": size}
                             for r, size in enumerate(rack_sizes(nodes, racks))]
        else:
            desc["nodes"] = nodes
        return from_description(desc)

    return Machine(nodes, cores, nodes * cores, origin, whole_nodes, _build=build,
                   _node_cores={f"node{i}": cores for i in range(nodes)})


def machine_from_header(header: SwfHeader, *, whole_nodes: bool = False,
                        racks: int = 0) -> Machine:
    """MaxNodes x (MaxProcs / MaxNodes) from the SWF header (MaxProcs alone: 1-core nodes);
    ``racks``: spread the nodes over that many racks."""
    max_nodes, max_procs = header.max_nodes, header.max_procs
    if max_nodes and max_procs and max_procs % max_nodes == 0:
        return machine_from_size(max_nodes, max_procs // max_nodes, whole_nodes=whole_nodes,
                                 origin="SWF header MaxNodes/MaxProcs", racks=racks)
    if max_procs:
        return machine_from_size(max_procs, 1, whole_nodes=whole_nodes,
                                 origin="SWF header MaxProcs (one core per node)", racks=racks)
    if max_nodes:
        return machine_from_size(max_nodes, 1, whole_nodes=whole_nodes,
                                 origin="SWF header MaxNodes (one core per node)", racks=racks)
    raise MachineError(
        "the SWF header has no MaxNodes/MaxProcs: give the machine with --nodes N --cores C "
        "or --graph FILE"
    )


def machine_from_graph(graph: Any, origin: str, *, whole_nodes: bool = False) -> Machine:
    """A machine from a graph already built (e.g. from a live cluster's Nodes)."""
    return _from_graph(graph, origin, whole_nodes)


def machine_from_graph_file(path: str | Path, *, whole_nodes: bool = False) -> Machine:
    from fluxnetes.graph import GraphError, load_graph

    try:
        graph = load_graph(path)
    except GraphError as exc:
        raise MachineError(str(exc)) from None
    return _from_graph(graph, str(path), whole_nodes)

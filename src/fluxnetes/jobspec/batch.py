"""Jobspecs of batch jobs that ask for a number of processors (an SWF trace's jobs).

A job of ``procs`` processors asks for one of three shapes:

* per core (default): ``slot[procs] -> core[1]``: the cores anywhere;
* whole nodes (``exclusive_nodes``): ``node[nodes] (exclusive) -> slot[1] -> core[1]``: the
  nodes to itself, whatever they hold beyond the job's processors;
* rack-packed (``pack="rack"``, whole nodes only): ``rack[1] -> node[nodes] (exclusive) ->
  slot[1] -> core[1]``, every node the job gets in one rack. The caller decides which jobs
  to pack (the simulator packs a job that one rack can hold and leaves a larger one as it
  is: ``sim/machine.py``).

Why not ``rack[1] -> slot[procs] -> core[1]`` (cores anywhere within one rack): under
Fluxion's rules (fluxion-spec §5.3) a slot is placed at the first vertex whose direct
children hold its types (a node, for cores), and a selection made below a vertex that is
neither the root nor exclusive is marked only on the chosen edges, so the update pass from
the root never reaches the cores: Fluxion matches nothing (the conformance data shows the
same for ``node[2] -> slot -> core[2]`` without ``exclusive``), and the matcher, faithful to
it, answers BUSY. The shape is refused here instead, with the rule.

Pure: no Kubernetes, no clock.
"""

from __future__ import annotations

from dataclasses import replace

from fluxnetes.jobspec.model import Jobspec, JobspecError, parse_jobspec
from fluxnetes.jobspec.pods import slots_entry

#: the graph levels a batch job can be packed into
PACK_LEVELS = ("rack",)


def batch_jobspec(procs: int, duration: int, *, exclusive_nodes: bool = False, nodes: int = 0,
                  pack: str | None = None, command: str = "swf-job") -> Jobspec:
    """The jobspec of a job of ``procs`` processors expected to run ``duration`` seconds
    (0 = unknown). ``nodes``: how many whole nodes it takes with ``exclusive_nodes``."""
    if isinstance(procs, bool) or not isinstance(procs, int) or procs < 1:
        raise JobspecError("procs", f"must be an integer >= 1, got {procs!r}")
    if pack is not None and pack not in PACK_LEVELS:
        raise JobspecError("pack", f"must be one of {', '.join(PACK_LEVELS)} (or none), got {pack!r}")
    if pack is not None and not exclusive_nodes:
        raise JobspecError("pack", f"{pack}-packing needs whole (exclusive) nodes: "
                                   f"{pack}[1] -> slot -> core places no slot below a shared {pack} "
                                   "(Fluxion's slot rule)")
    if exclusive_nodes and (isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1):
        raise JobspecError("nodes", f"must be an integer >= 1 with whole nodes, got {nodes!r}")
    # the pods' mapping (jobspec/pods.py), with one core per slot
    top = slots_entry(nodes if exclusive_nodes else procs, "task", [{"type": "core", "count": 1}],
                      exclusive_nodes=exclusive_nodes)
    version = 1
    if pack is not None:
        top = {"type": pack, "count": 1, "with": [top]}
        version = 9999  # V1 allows only node or slot at the top; a rack above them is V9999
    return parse_jobspec({
        "version": version,
        "resources": [top],
        "tasks": [{"command": [command], "slot": "task", "count": {"per_slot": 1}}],
        "attributes": {"system": {"duration": duration}},
    })


def with_duration(js: Jobspec, duration: int) -> Jobspec:
    """``js`` asking the same resources for ``duration`` seconds (0 = unknown): what parsing
    ``js`` with that duration gives, without parsing again. The resource tree, the tasks
    and the totals are shared with ``js`` (a parsed jobspec is treated as immutable by the
    matcher and the queue), so requests that differ only by duration cost no parse and key
    alike where the key is the resource tree (``queue.walk._shape_key``)."""
    if isinstance(duration, bool) or not isinstance(duration, int) or duration < 0:
        raise JobspecError("attributes.system.duration",
                           f"must be a whole number of seconds >= 0, got {duration!r}")
    system = dict(js.attributes.get("system") or {})
    system["duration"] = duration
    return replace(js, attributes={**js.attributes, "system": system}, duration=duration)

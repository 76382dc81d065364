"""Pod sets: a multi-role workload (launcher + workers, driver + workers...) as ONE jobspec.

A group is one or more pod sets, each with a name, a pod count and the per-pod request of its
template (the same mapping as :func:`fluxnetes.jobspec.pods.jobspec_from_pods`: whole cores,
MiB, GPUs, extended resources, optional socket locality). :func:`jobspec_from_podsets` builds
one jobspec with one slot shape per set, labelled by the set's name, so the matcher allocates
the whole gang or nothing:

* one set: exactly the jobspec ``jobspec_from_pods`` gives today (slot label = group name);
* several sets: sibling entries ``slot[n_S] (label S)``, one per set. Fluxion's traverser
  refuses sibling slots; the matcher places them together (``fluxnetes.match.gang``);
* ``exclusive`` (``fluxnetes.io/exclusive: node``): each entry becomes
  ``node[n_S] exclusive -> slot[1] (label S)`` - one pod per node, whole nodes;
* socket locality: ``socket[n_S] -> slot[1] (label S)`` - each pod within one socket, the
  socket shared (``fluxnetes.jobspec.pods.slots_entry``);
* ``pack`` (``fluxnetes.io/pack: node|rack|zone``): the entries go under ``<level>[1]``, so
  every pod lands within one node / rack / zone.

Per-set node rules (``PodSet.constraint``, an RFC 31 mapping such as the hostlist
``k8s/nodefit`` computes) are kept under ``attributes.system.podsets.<name>.constraints`` and
ANDed with the jobspec's own constraint for that set's slots (several sets only; a single
set's rules are the group's, as today).

:func:`nodes_of_sets` maps an allocation back to pods: per set, one node per slot (pod index),
stable against a previous mapping. Pure: no Kubernetes, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.jobspec.constraints import parse_constraint
from fluxnetes.jobspec.model import Jobspec, JobspecError, parse_jobspec
from fluxnetes.jobspec.packing import LEVELS, Packing, PackingError
from fluxnetes.jobspec.pods import (
    PodRequest,
    cores_for,
    extended_type,
    jobspec_from_pods,
    mib_for,
    slots_entry,
)

PODSETS_KEY = "podsets"  # attributes.system.podsets.<name>.constraints


@dataclass(frozen=True)
class PodSet:
    """One role of a workload: ``count`` pods asking ``request`` each."""

    name: str
    count: int
    request: PodRequest = field(default_factory=PodRequest)
    locality: str | None = None  # "socket": each pod within one NUMA domain
    constraint: Mapping[str, Any] | None = None  # RFC 31: the nodes this set's pods may use

    def demand(self) -> dict[str, int]:
        """What one pod takes, in the graph's units (core, memory MiB, gpu, extended types)."""
        r = self.request
        out = {"core": cores_for(r.cpu_millis)}
        mem = mib_for(r.memory_bytes)
        if mem > 0:
            out["memory"] = mem
        if r.gpus > 0:
            out["gpu"] = r.gpus
        for k, n in r.extended.items():
            if n > 0:
                out[extended_type(k)] = n
        return out


def _check_sets(sets: Sequence[PodSet]) -> list[PodSet]:
    if not sets:
        raise JobspecError("podsets", "must hold at least one pod set")
    seen: set[str] = set()
    live: list[PodSet] = []
    for i, s in enumerate(sets):
        if not isinstance(s.name, str) or not s.name or len(s.name) > 63:
            raise JobspecError(f"podsets[{i}].name", "must be a non-empty string of at most 63 characters")
        if s.name in seen:
            raise JobspecError(f"podsets[{i}].name", f"duplicate pod set name {s.name!r}")
        seen.add(s.name)
        if isinstance(s.count, bool) or not isinstance(s.count, int) or s.count < 0:
            raise JobspecError(f"podsets[{i}].count", f"pod set {s.name!r}: must be an integer >= 0")
        if s.count > 0:
            live.append(s)  # a role with no pods (e.g. 0 workers) takes no slot
    if not live:
        raise JobspecError("podsets", "every pod set has 0 pods: nothing to schedule")
    return live


def _slot_inner(s: PodSet, i: int) -> list[dict[str, Any]]:
    """The slot contents of one pod of ``s``, exactly as jobspec_from_pods writes them."""
    try:
        one = jobspec_from_pods(1, s.request, name=s.name)  # locality: slots_entry, above the slot
    except JobspecError as exc:
        raise JobspecError(f"podsets[{i}].{exc.path}", f"pod set {s.name!r}: {exc.rule}") from None
    inner: list[dict[str, Any]] = one.to_dict()["resources"][0]["with"]
    return inner


def jobspec_from_podsets(sets: Sequence[PodSet], *, duration: int = 0, packing: Packing | None = None,
                         name: str = "group") -> Jobspec:
    """One jobspec for the whole gang (see the module docstring). ``name`` is the group's
    name: the slot label of a single-set group, as today."""
    pk = packing or Packing()
    live = _check_sets(sets)
    if pk.pack is not None and pk.pack not in LEVELS:
        raise JobspecError("packing.pack", f"must be one of {', '.join(LEVELS)}, got {pk.pack!r}")
    total = sum(s.count for s in live)
    try:
        pk.check(total)
    except PackingError as exc:
        raise JobspecError(f"metadata.annotations.{exc.annotation}", exc.rule) from None
    pack = pk.pack
    if pack == "node" and pk.exclusive:
        pack = None  # one pod on one whole node is already within one node
    inners = [_slot_inner(s, i) for i, s in enumerate(live)]  # errors name the pod set
    if len(live) == 1 and pack is None:
        s = live[0]
        # today's single-template group, byte for byte
        return jobspec_from_pods(s.count, s.request, duration=duration, exclusive_nodes=pk.exclusive,
                                 name=name, locality=s.locality)
    if duration < 0:
        raise JobspecError("duration", "must be >= 0")
    single = len(live) == 1
    entries: list[dict[str, Any]] = []
    tasks: list[dict[str, Any]] = []
    podsets_attr: dict[str, Any] = {}
    for i, s in enumerate(live):
        label = (name or "group") if single else s.name
        inner = inners[i]
        entries.append(slots_entry(s.count, label, inner, exclusive_nodes=pk.exclusive, locality=s.locality))
        tasks.append({"command": [label], "slot": label, "count": {"per_slot": 1}})
        if s.constraint is not None and not single:
            parse_constraint(s.constraint, f"podsets[{i}].constraint")
            podsets_attr[label] = {"constraints": dict(s.constraint)}
    resources = entries if pack is None else [{"type": pack, "count": 1, "with": entries}]
    system: dict[str, Any] = {"duration": duration}
    if podsets_attr:
        system[PODSETS_KEY] = podsets_attr
    return parse_jobspec({"version": 9999, "resources": resources, "tasks": tasks,
                          "attributes": {"system": system}})


# ----------------------------------------------------------------------------- back to pods


def _node_name(s: Any) -> str:
    return str(getattr(s, "node", None) or getattr(s, "name", ""))


def _amounts(s: Any) -> dict[str, int]:
    out = {"core": int(s.cores or 0), "gpu": int(s.gpus or 0), "memory": int(s.memory or 0)}
    for k, v in (getattr(s, "extra", None) or {}).items():
        out[str(k)] = out.get(str(k), 0) + int(v)
    return out


def decompose(sets: Sequence[PodSet], shares: Iterable[Any], *, exclusive: bool = False) -> dict[str, list[str]]:
    """Per set, the node of each of its slots, read from per-node amounts alone (a single-set
    allocation, or one recorded before a restart). Greedy, most demanding set first; nodes in
    name order. A set that cannot be carved out of the amounts (a user-written jobspec) gets
    its pods spread over the nodes, biggest shares first."""
    live = [s for s in sets if s.count > 0]
    free = {_node_name(s): _amounts(s) for s in shares}
    names = sorted(free)
    order = sorted(range(len(live)), key=lambda i: (-sum(live[i].demand().values()), i))
    out: dict[str, list[str]] = {s.name: [] for s in live}
    for i in order:
        s = live[i]
        need = s.demand()
        got = out[s.name]
        for n in names:
            if len(got) >= s.count:
                break
            have = free[n]
            if exclusive:
                if have.get("_taken"):
                    continue
                if all(have.get(t, 0) >= a for t, a in need.items()):
                    got.append(n)
                    have["_taken"] = 1
                continue
            while len(got) < s.count and all(have.get(t, 0) >= a for t, a in need.items()):
                for t, a in need.items():
                    have[t] -= a
                got.append(n)
        if len(got) < s.count:
            biggest = sorted(names, key=lambda n: (-free[n].get("core", 0), n))
            while biggest and len(got) < s.count:
                got.append(biggest[len(got) % len(biggest)])
    return {k: sorted(v) for k, v in out.items()}


def keep_stable(fresh: Mapping[str, Sequence[str]],
                previous: Mapping[str, Sequence[str | None]] | None) -> dict[str, list[str]]:
    """``fresh`` reordered so that slot i of a set keeps its previous node wherever that node
    still holds a slot of the set (a re-created pod with the same index lands where its
    predecessor was); the other slots take the remaining nodes in order."""
    out: dict[str, list[str]] = {}
    for name, nodes in fresh.items():
        prev = list((previous or {}).get(name) or [])
        pool: dict[str, int] = {}
        for n in nodes:
            pool[n] = pool.get(n, 0) + 1
        slots: list[str | None] = [None] * len(nodes)
        for i, was in enumerate(prev[:len(nodes)]):
            if was is not None and pool.get(was, 0) > 0:
                slots[i] = was
                pool[was] -= 1
        rest = iter(sorted(n for n, k in pool.items() for _ in range(k)))
        out[name] = [s if s is not None else next(rest) for s in slots]
    return out


def nodes_of_sets(sets: Sequence[PodSet], result: Any, *, exclusive: bool = False,
                  previous: Mapping[str, Sequence[str | None]] | None = None) -> dict[str, list[str]]:
    """Per pod set, the node of each slot (index i = pod i of that set) of an allocation.

    ``result``: a ``MatchResult`` (its ``podsets`` answer from the matcher when the jobspec
    had several sets; otherwise its ``nodes``), or per-node shares (``NodeShare`` /
    ``k8s.shares.Share``). A single-set result whose slot is labelled by the group name maps
    to that set. ``previous``: the mapping before (stability, see :func:`keep_stable`)."""
    live = [s for s in sets if s.count > 0]
    by_label = getattr(result, "podsets", None)
    fresh: dict[str, list[str]]
    if by_label and all(s.name in by_label for s in live):
        fresh = {s.name: sorted(by_label[s.name]) for s in live}
    elif by_label and len(live) == 1 and len(by_label) == 1:
        fresh = {live[0].name: sorted(next(iter(by_label.values())))}
    else:
        shares = getattr(result, "nodes", result)
        fresh = decompose(live, shares, exclusive=exclusive)
    return keep_stable(fresh, previous)


# ----------------------------------------------------------------------------- reading back


def podsets_of_jobspec(js: Jobspec) -> list[tuple[str, int]]:
    """(label, pods) of each pod set of a multi-set jobspec, in the order its slots are
    numbered (the jobspec's order, as :func:`jobspec_from_podsets` wrote them); [] for a
    one-set request. What ``kubectl fluxnetes explain`` shows of a FluxJob's pod sets."""
    if len(js.sets) < 2:
        return []
    out: list[tuple[str, int]] = []

    def walk(r: Any, mult: int) -> None:
        n = mult * int(r.count.min)
        if r.type == "slot":
            out.append((str(r.label or ""), n))
            return
        for c in r.with_:
            walk(c, n)

    for top in js.resources:
        # a packing level (<level>[1]) holds the sets; it counts once
        walk(top, 1)
    return out

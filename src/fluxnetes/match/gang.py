"""Requests of several pod sets (one slot shape per set, ``fluxnetes.jobspec.podsets``).

Fluxion's traverser refuses sibling slots, so such a request is matched here as one
transaction over the same engine state: at a time ``at``, each set's entry (``slot[n]`` or
``node[n] exclusive -> slot[1]``) is selected by the ordinary DFU walk and committed under a
temporary job id, the next set seeing what the previous ones took; if any set fails, all are
rolled back (all or nothing). On success the holdings of every set are recorded as ONE job
(``jobid``), so cancel, partial cancel and update_allocate work as for any job. The answer
carries ``podsets``: per set label, the node of each of its slots.

Order: sets with node rules of their own first, then the most demanding sets
(node-exclusive entries, then by GPUs, cores, memory of one slot), which is what
first-fit-decreasing packing would do; within a set the match policy decides as usual. The
order is greedy: a gang that fits only in an arrangement this order does not find waits.

Packing (``<level>[1] -> [sets...]``): each vertex of that level (graph order) whose
pruning filter has the gang's totals free is a candidate domain; the sets are matched with
a constraint limiting them to the domain's nodes; the first domain where all fit wins.

Reservations (allocate_orelse_reserve): the root filter's candidate times for the gang's
totals, tried in order, each one as above. Satisfiability: every set alone must be
satisfiable (the reason names the set), the gang's totals must exist (in some domain when
packed). That is a necessary condition: a gang whose sets fit alone but never together in
subtler ways (bin packing) is answered BUSY, not UNSATISFIABLE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fluxnetes.graph.model import UP, ResourceGraph, Vertex
from fluxnetes.jobspec.constraints import Constraint, parse_constraint
from fluxnetes.jobspec.model import Jobspec, JobspecError, Resource, exclusive_types, split_sets
from fluxnetes.jobspec.packing import Packing
from fluxnetes.jobspec.podsets import PodSet
from fluxnetes.match.engine import Engine
from fluxnetes.match.jobmeta import AT_ALLOC, AT_RESERVE, AT_SAT, FAR, GRAPH_END, Meta
from fluxnetes.match.records import JobRecords
from fluxnetes.match.results import JobRecord, MatchResult, MatchStatus, NodeShare
from fluxnetes.match.vstate import VState

if TYPE_CHECKING:
    from fluxnetes.queue.satisfy import Capacity


class GangHost(Protocol):
    """What a gang's match uses of the matcher (``match.matcher.Matcher``, which calls
    ``match_gang`` with itself): its graph and engine, its job records and counters, and the
    steps of one ordinary match. A Protocol, so that this module needs no import of the
    matcher's (the matcher imports this one)."""

    graph: ResourceGraph
    engine: Engine
    stats: dict[str, int]
    _records: JobRecords
    _gang_domains: object  # this module's packing domains (_Domains), kept per matcher

    def cancel(self, jobid: int) -> None: ...
    def _fail(self, status: MatchStatus, jid: int, js: Jobspec, reason: str) -> MatchResult: ...
    def _feasible(self, js: Jobspec, need_nodes: int, now: int, duration: int, *,
                  satisfiability: bool) -> bool: ...
    def _commit(self, js: Jobspec, jid: int, at: int, duration: int, alloc_type: int, now: int,
                x_types: set[str]) -> MatchResult | None: ...
    def _sat_walk(self, js: Jobspec, duration: int, x_types: set[str], walk: Callable[[], bool]) -> bool: ...
    def _type_capacity(self, t: str, *, up_only: bool) -> int: ...
    def _unsat_reason(self, js: Jobspec) -> str: ...
    def _busy_reason(self, js: Jobspec, now: int) -> str: ...

_TMP_BASE = 1 << 60  # temporary job ids of the sets while a gang is matched
_SKIP = ("node", "slot", "socket", "numanode")


@dataclass
class _Part:
    label: str
    entry: Resource
    per_slot: dict[str, int]  # what one slot takes (graph units), for slot -> node
    count: int
    exclusive: bool  # node[n] exclusive -> slot[1]: one slot per node
    constraint: Constraint | None  # the set's own rules AND the request's


def _holds_slot(r: Resource) -> bool:
    return r.type == "slot" or any(_holds_slot(c) for c in r.with_)


def _find_slot(r: Resource) -> Resource:
    if r.type == "slot":
        return r
    for c in r.with_:
        if c.type == "slot" or c.with_:
            try:
                return _find_slot(c)
            except LookupError:
                continue
    raise LookupError(r.type)


def _sub(js: Jobspec, entry: Resource, constraint: Constraint | None) -> Jobspec:
    totals = {entry.type: entry.count.min}
    for t, n in entry.agg.items():
        totals[t] = totals.get(t, 0) + entry.count.min * n
    types: set[str] = set()
    stack = [entry]
    while stack:
        r = stack.pop()
        types.add(r.type)
        stack.extend(r.with_)
    return Jobspec(version=js.version, resources=[entry], tasks=[], attributes=js.attributes,
                   duration=js.duration, constraint=constraint, queue=js.queue, totals=totals,
                   types=frozenset(types))


def _and(*cs: Constraint | None) -> Constraint | None:
    live = tuple(c for c in cs if c is not None)
    if not live:
        return None
    return live[0] if len(live) == 1 else Constraint("and", live)


def parts_of(js: Jobspec) -> tuple[list[Resource], list[_Part]]:
    """(wrappers, sets) of a multi-set request, most demanding set first."""
    split = split_sets(js.resources)
    if split is None:
        raise JobspecError("resources", "is not a request of several pod sets")
    wrappers, entries = split
    system = js.attributes.get("system") or {}
    own = system.get("podsets") if isinstance(system, Mapping) else None
    parts: list[_Part] = []
    ruled: list[bool] = []
    for e in entries:
        slot = _find_slot(e)
        rules = None
        if isinstance(own, Mapping) and isinstance(own.get(slot.label), Mapping) \
                and "constraints" in own[slot.label]:
            rules = parse_constraint(own[slot.label]["constraints"],
                                     f"attributes.system.podsets.{slot.label}.constraints")
        per = {t: n for t, n in slot.agg.items() if t not in _SKIP and n > 0}
        count = 1
        r: Resource | None = e
        while r is not None:  # counts multiply from the entry down to the slot
            count *= r.count.min
            r = None if r.type == "slot" else next((c for c in r.with_ if _holds_slot(c)), None)
        excl = e.type == "node" and slot.count.min == 1  # node[n] -> slot[1]: one pod per node
        parts.append(_Part(slot.label, e, per, count, excl, _and(js.constraint, rules)))
        ruled.append(rules is not None)

    def key(i: int) -> tuple[int, ...]:
        # sets with node rules of their own first (fewest choices), then the biggest slots
        p = parts[i]
        return (0 if ruled[i] else 1, 0 if p.exclusive else 1, -p.per_slot.get("gpu", 0),
                -p.per_slot.get("core", 0), -p.per_slot.get("memory", 0), i)

    return wrappers, [parts[i] for i in sorted(range(len(parts)), key=key)]


def slots_on_nodes(nodes: list[NodeShare], per_slot: Mapping[str, int], count: int, exclusive: bool) -> list[str]:
    """The node of each slot of ONE set's allocation (sorted by node name)."""
    out: list[str] = []
    for ns in sorted(nodes, key=lambda n: n.name):
        if exclusive:
            out.append(ns.name)
            continue
        have = {"core": ns.cores, "gpu": ns.gpus, "memory": ns.memory, **ns.extra}
        fit = min((have.get(t, 0) // n for t, n in per_slot.items()), default=0)
        out.extend([ns.name] * fit)
    if len(out) != count:  # pools taken whole (JGF graphs): spread over the nodes
        names = sorted({ns.name for ns in nodes})
        out = sorted(names[i % len(names)] for i in range(count)) if names else []
    return out[:count]


class _Domains:
    """Candidate vertices of the packing level and their nodes (per graph version)."""

    def __init__(self) -> None:
        self.key: tuple[int, str] | None = None
        self.items: list[tuple[Vertex, Constraint]] = []

    def of(self, m: GangHost, level: str) -> list[tuple[Vertex, Constraint]]:
        key = (m.graph.version, level)
        if self.key != key:
            items = []
            for d in m.graph.by_type.get(level, []):
                names = frozenset(v.name for v in m.graph.walk(d) if v.type == "node")
                if names:
                    items.append((d, Constraint("hostlist", (names,))))
            self.key, self.items = key, items
        return self.items


def match_gang(m: GangHost, js: Jobspec, op: str, now: int, jid: int, duration: int) -> MatchResult:
    """One match operation for a multi-set request (see the module docstring)."""
    try:
        wrappers, parts = parts_of(js)
    except JobspecError as exc:
        return m._fail(MatchStatus.UNSATISFIABLE, jid, js, str(exc))
    domains: list[tuple[Vertex | None, Constraint | None]] = [(None, None)]
    wrapper_agg: dict[str, int] = {}
    if wrappers:
        top = wrappers[0]
        if len(wrappers) != 1 or top.count.min != 1:
            return m._fail(MatchStatus.UNSATISFIABLE, jid, js,
                           "pod sets may be packed under one level of count 1 only (node, rack or zone)")
        doms = m._gang_domains
        if not isinstance(doms, _Domains):
            doms = m._gang_domains = _Domains()
        domains = list(doms.of(m, top.type))
        if not domains:
            return m._fail(MatchStatus.UNSATISFIABLE, jid, js, f"no {top.type} of this graph holds nodes")
        wrapper_agg = top.agg
    eng = m.engine
    sat_only = op == "satisfiability"

    def attempt(at: int, alloc_type: int) -> MatchResult | None:
        d = duration if at + duration <= GRAPH_END else GRAPH_END - at
        for dom, dcon in domains:
            if dom is not None:
                f = eng.vs[dom.idx].f
                if dom.status != UP and alloc_type != AT_SAT:
                    continue
                if f is not None and not f.fits(wrapper_agg, at, at + d):
                    continue
            res = _attempt_in(m, js, parts, dcon, at, d, duration, alloc_type, now, jid)
            if res is not None:
                return res
        return None

    if not sat_only:
        res = attempt(now, AT_ALLOC)
        if res is not None:
            return res
        if op == "allocate_orelse_reserve":
            for when in eng.candidate_times(now + 1, duration, js.totals):
                if when >= GRAPH_END:
                    break
                res = attempt(when, AT_RESERVE)
                if res is not None:
                    return res
        if op == "allocate":
            return m._fail(MatchStatus.BUSY, jid, js, m._busy_reason(js, now))
    why = _never(m, js, parts, domains, wrapper_agg, now, duration)
    if sat_only:
        if why is None:
            return MatchResult(MatchStatus.ALLOCATED, -1, now, duration, "")
        return MatchResult(MatchStatus.UNSATISFIABLE, -1, now, 0, why)
    if why is None:
        return m._fail(MatchStatus.BUSY, jid, js, m._busy_reason(js, now))
    return m._fail(MatchStatus.UNSATISFIABLE, jid, js, why)


def _attempt_in(m: GangHost, js: Jobspec, parts: list[_Part], dcon: Constraint | None, at: int, d: int,
                duration: int, alloc_type: int, now: int, jid: int) -> MatchResult | None:
    """Every set at ``at`` (within the domain ``dcon``), all or nothing."""
    eng = m.engine
    done: list[tuple[_Part, int, MatchResult]] = []
    ok = True
    for i, p in enumerate(parts):
        sub = _sub(js, p.entry, _and(p.constraint, dcon))
        tmp = _TMP_BASE + i
        while tmp in m._records.jobs:
            tmp += len(parts)
        x_types = exclusive_types(sub.resources)
        need_nodes = sub.totals.get("node", 0)
        if alloc_type == AT_ALLOC and not m._feasible(sub, need_nodes, now, duration, satisfiability=False):
            ok = False
            break
        if not eng.select(sub.resources, Meta(tmp, at, now, d, alloc_type, sub.constraint), x_types):
            ok = False
            break
        res = m._commit(sub, tmp, at, duration, alloc_type, now, x_types)
        if res is None:
            ok = False
            break
        done.append((p, tmp, res))
    holdings: dict[VState, int] = {}
    podsets: dict[str, list[str]] = {}
    for p, tmp, res in done:
        if ok:
            for u, a in JobRecords.holdings(m._records.jobs[tmp]).items():
                holdings[u] = holdings.get(u, 0) + a
            podsets[p.label] = slots_on_nodes(res.nodes, p.per_slot, p.count, p.exclusive)
        m.cancel(tmp)
        m.stats["succeeded"] -= 1
    if not ok:
        return None
    reserved = alloc_type == AT_RESERVE
    rec = JobRecord(jid, at, d, reserved, [], [], queue=js.queue)
    m._records.put(rec, holdings)
    m.stats["succeeded"] += 1
    status = MatchStatus.RESERVED if reserved else MatchStatus.ALLOCATED
    return MatchResult(status, jid, at, d, "", rec.nodes, rec.vertices, js.queue, podsets=podsets)


def _never(m: GangHost, js: Jobspec, parts: list[_Part], domains: list[tuple[Vertex | None, Constraint | None]],
           wrapper_agg: Mapping[str, int], now: int, duration: int) -> str | None:
    """Why the gang can never run (naming the pod set when one alone cannot), or None."""
    eng = m.engine
    at = FAR - duration - 1

    def alone(p: _Part, dcon: Constraint | None) -> bool:
        sub = _sub(js, p.entry, _and(p.constraint, dcon))
        need = sub.totals.get("node", 0)
        x_types = exclusive_types(sub.resources)
        # (the matcher remembers or counts the walk's answer: Matcher._sat_walk)
        return m._feasible(sub, need, now, duration, satisfiability=True) and m._sat_walk(
            sub, duration, x_types,
            lambda: eng.select(sub.resources, Meta(-1, at, now, duration, AT_SAT, sub.constraint), x_types))

    for p in parts:
        if not alone(p, None):
            sub = _sub(js, p.entry, p.constraint)
            return f"pod set '{p.label}': {m._unsat_reason(sub)}"
    for t, n in sorted(js.totals.items()):
        if t in ("slot",) or (domains[0][0] is not None and t == domains[0][0].type):
            continue
        cap = m._type_capacity(t, up_only=False)
        if n > cap:
            return f"the pod sets together need {n} {t}; only {cap} exist in this graph"
    if domains[0][0] is None:
        return None
    for dom, dcon in domains:
        assert dom is not None
        vs = eng.vs[dom.idx]
        if any(vs.ftot[vs.fidx[t]] < n for t, n in wrapper_agg.items() if t in vs.fidx):
            continue
        if all(alone(p, dcon) for p in parts):
            return None
    level = domains[0][0].type if domains else "?"
    return f"no single {level} can hold every pod set together"


# ----------------------------------------------------------------------------- explanations

K8S_NAMES = {"core": "cpu", "memory": "MiB memory", "gpu": "nvidia.com/gpu", "slot": "pod"}


def podset_shortfall(sets: Sequence[PodSet], graph: ResourceGraph, *, packing: Packing | None = None,
                     capacity: Capacity | None = None, names: Mapping[str, str] | None = None) -> str | None:
    """Which pod set, and which resource, can never fit ``graph`` (the count questions of
    ``fluxnetes.queue.satisfy``, no match walk): e.g. "pod set 'worker': needs 8 pods of
    4 cpu each; the nodes hold at most 3 of them". Then the sets together ("the pod sets
    together need 33 cpu in all; the cluster has 32"). None: the count questions find no
    reason (the matcher's satisfiability may still). ``capacity``: ``Capacity.of(graph)``,
    reused across calls while the graph does not change."""
    from fluxnetes.jobspec.podsets import jobspec_from_podsets
    from fluxnetes.queue.satisfy import Capacity as Cap

    cap = capacity if capacity is not None else Cap.of(graph)
    nm = dict(K8S_NAMES if names is None else names)
    pk = packing or Packing()
    live = [s for s in sets if s.count > 0]
    for s in live:
        one = jobspec_from_podsets([PodSet(s.name, s.count, s.request, s.locality)],
                                   packing=Packing(None, pk.exclusive), name=s.name)
        short = cap.check(one)
        if short is not None:
            return f"pod set '{s.name}': {short.text(nm)}"
    if len(live) > 1:
        whole = jobspec_from_podsets(live, packing=Packing(None, pk.exclusive))
        for t, n in sorted(whole.totals.items()):
            if t == "slot" or n <= 0:
                continue
            have = cap.totals.get(t, 0)
            if n > have:
                unit = nm.get(t, t)
                what = f"{n} {unit}s" if t in ("node", "slot") else f"{n} {unit}"
                return f"the pod sets together need {what} in all; the cluster has {have}"
    return None

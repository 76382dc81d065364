"""``first`` on per-node counters: the simulator's requests without a walk (issue 32).

The simulator asks two request shapes on graphs of identical nodes, flat or in racks
(``cluster -> [rack ->] node -> core``), every span holding now:

* ``slot[P] -> core[1]`` (a job of P processors), and
* ``node[N] (exclusive) -> slot[1] -> core[1]`` (``--whole-nodes``).

For these, the ``first`` walk's answer is a function of a few counters: which cores are
free, and ``first``'s dynamic child order (each vertex's children sorted by ``(-weight,
-uniq_id)``, a child's weight set to what is free in it right after a commit that touched
it, never changed by a release: ``Engine._upd_by_outedges``). :class:`FirstFit` keeps
exactly that and answers from it:

* the walk goes over the children that have a free core in that order (racks, then their
  nodes); a node gives its free cores in core order, at most P (``Engine._unit_slots``);
  a rack stops once it holds P slots, the root once all racks visited hold P; then the
  best P by slot score are taken (``Dfu.choose_best_k``: descending score, stable). For
  ``node[N]``, a node counts when all its cores are free, one candidate each, best N by
  node score;
* a commit holds the cores (a whole node holds all of its cores), and sets the weight of
  every node and rack it touched;
* a release gives the cores back (weights stay).

On one-core nodes under the root (every SWF machine of one-processor nodes) this is
simpler still: every free node is free whole, so the free nodes in the policy's order are
all that is kept (``freenodes.py``), and the static policies are answered there too.

Nothing is written in the engine's per-vertex state while the counters are in use: a
commit and a release are a loop over the job's nodes. The live jobs are the counters'
own answers (:class:`CountedResult`, one object per job: what it took, its window); while
the counters answer every live job is theirs, so "has every live job started by now and
not ended?" is answered here too (:meth:`FirstFit.active`), and the matcher's job windows
(``spans.py``) are written only when the counters hand over. Any other operation
(``Matcher`` decides which) first writes the live jobs into the engine
(:meth:`FirstFit.flush`, the ordinary update pass per job, then the weights) and the
matcher carries on with its walk for good. ``tests/test_match_firstfit.py`` runs the walk
beside it on random sessions and compares every answer and release.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

from fluxnetes.graph.model import UP
from fluxnetes.jobspec.model import Jobspec, Resource
from fluxnetes.match.counted import CORE0 as _CORE0
from fluxnetes.match.counted import CountedResult
from fluxnetes.match.engine import Engine
from fluxnetes.match.freenodes import FreeNodes
from fluxnetes.match.freenodes import U as _U
from fluxnetes.match.jobmeta import Entry
from fluxnetes.match.vstate import MAXW, VState

SLOTS = 0  # slot[P] -> core[1]
NODES = 1  # node[N] exclusive -> slot[1] -> core[1]

# (_U: uniq ids below this, checked: an order key is one int)


def _fixed(r: Resource) -> int:
    """The count of ``r`` if it is a fixed count (min == max, '+1'), else 0."""
    c = r.count
    if c.min != c.max or c.operator != "+" or c.operand != 1 or c.min < 1:
        return 0
    return c.min


def request_shape(js: Jobspec) -> tuple[int, int] | None:
    """``(SLOTS, P)`` or ``(NODES, N)`` for the two shapes, None for anything else."""
    if js.sets or js.constraint is not None or len(js.resources) != 1:
        return None
    top = js.resources[0]
    if top.type == "slot":
        if top.exclusive is False or len(top.with_) != 1:
            return None
        core = top.with_[0]
        if core.type != "core" or core.with_ or core.exclusive or _fixed(core) != 1:
            return None
        p = _fixed(top)
        return (SLOTS, p) if p else None
    if top.type == "node" and top.exclusive is True and len(top.with_) == 1:
        slot = top.with_[0]
        if slot.type != "slot" or slot.exclusive is False or _fixed(slot) != 1 \
                or len(slot.with_) != 1:
            return None
        core = slot.with_[0]
        if core.type != "core" or core.with_ or core.exclusive or _fixed(core) != 1:
            return None
        n = _fixed(top)
        return (NODES, n) if n else None
    return None


class _Room:
    """Children of one vertex that have a free core, in ``first``'s order (keys ascending;
    a key is ``(MAXW - weight) * _U + (_U - 1 - uniq_id)``, the engine's ``(-weight,
    -uniq_id)`` as one int)."""

    __slots__ = ("items", "keys")

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.items: list[int] = []

    def add(self, key: int, item: int) -> None:
        j = bisect_left(self.keys, key)
        self.keys.insert(j, key)
        self.items.insert(j, item)

    def drop(self, key: int) -> None:
        j = bisect_left(self.keys, key)
        del self.keys[j]
        del self.items[j]


def _key(weight: int, uniq: int) -> int:
    return (MAXW - weight) * _U + (_U - 1 - uniq)


class FirstFit:
    """Counters for ``first`` on ``cluster -> [rack ->] node -> core`` (module docstring).
    Build with :meth:`build` (None when the engine's graph or state does not qualify)."""

    def __init__(self, engine: Engine, racks: list[VState], nodes: list[VState], flat: bool) -> None:
        self.engine = engine
        self.flat = flat
        self.racks = racks  # [] when flat
        self.nodes = nodes
        n = len(nodes)
        self.cores_per = len(nodes[0].children)
        # per node: its core VStates in `first`'s core order, free flags, free count, weight
        # (not kept on one-core nodes under the root: `free_list` holds all there is)
        self.core_order: list[list[VState]] = []
        self.core_free: list[list[bool]] = []
        self.free = [self.cores_per] * n
        self.weight = [MAXW] * n
        self.rack_of = [0] * n
        self.node_score: list[int] = []
        self.core_score: list[list[int]] = []
        for nv in nodes:
            cs = sorted(nv.children, key=lambda c: -c.v.uniq_id)  # (all weights MAXW)
            self.core_order.append(cs)
            self.core_free.append([True] * len(cs))
            v = nv.v
            factor = (v.id + 2) * 10000 + abs(v.uniq_id % 10000 - 1)
            self.core_score.append([3 + factor + c.v.id for c in cs])
            self.node_score.append(2 + v.id)
        self.excl = [False] * n  # held whole (NODES)
        # each node's current order key (_key of its weight), kept to avoid recomputing it
        self.nkey = [_key(MAXW, nv.v.uniq_id) for nv in nodes]
        self.names = [nv.v.name for nv in nodes]
        # (node name, 1) per node, built once: a one-core node's share in every answer
        self.unit_shares = [(name, 1) for name in self.names]
        # node indexes follow uniq ids (tree order): shares come out in pick order
        self.by_index = all(nodes[i].v.uniq_id < nodes[i + 1].v.uniq_id for i in range(n - 1))
        # one-core nodes under the root, indexes in uniq id order (KTH-SP2's machine, any
        # SWF machine of one-processor nodes): the free nodes in the policy's order are
        # all that is kept (freenodes.py). The static policies (low, high, lonode, hinode)
        # have counters on this machine only (build())
        self.unit = self.cores_per == 1 and flat and self.by_index
        self.static = not engine.first
        self.free_list: FreeNodes | None = None
        if self.unit:
            self.free_list = FreeNodes(
                n, [self._static_key(i) for i in range(n)] if self.static else None)
        # racks (flat: one pseudo-rack, the root)
        self.rweight = [MAXW] * max(1, len(racks))
        self.rfree = [0] * max(1, len(racks))
        self.rnodes = [0] * max(1, len(racks))
        self.rxnodes = [0] * max(1, len(racks))  # nodes held whole
        self.rooms = [_Room() for _ in range(max(1, len(racks)))]
        if racks:
            index = {id(r): k for k, r in enumerate(racks)}
            for i, nv in enumerate(nodes):
                assert nv.parent is not None
                self.rack_of[i] = index[id(nv.parent)]
        for i, nv in enumerate(nodes):
            k = self.rack_of[i]
            self.rfree[k] += self.cores_per
            self.rnodes[k] += 1
            self.rooms[k].add(_key(MAXW, nv.v.uniq_id), i)
        self.root_room = _Room()
        for k, rv in enumerate(racks):
            self.root_room.add(_key(MAXW, rv.v.uniq_id), k)
        # live jobs (their answers hold what they took and their windows)
        self.jobs: dict[int, CountedResult] = {}
        # "has every live job started by now and not ended?" (``active``): a bound on the
        # latest start (raised by every allocation, made exact again only when it is above
        # `now`: the simulator's time never goes back) and a heap of (end, job id) whose
        # entries of released jobs are dropped when they reach the top
        self.latest = -1
        self.ends: list[tuple[int, int]] = []

    def _static_key(self, i: int) -> int:
        """Node ``i``'s one slot's rank under a static policy, as one int (the slot score
        is 1 + the core's score, ``slotpack.py``; the core's score 1 + the node factor
        (node-centric policies) + its id + 1, ``candidates.vertex_score``)."""
        eng = self.engine
        nv = self.nodes[i]
        v = nv.v
        ml = (v.id + 2) * 10000 + abs(v.uniq_id % 10000 - 1) if eng.node_centric else 0
        score = 1 + (1 + ml + nv.children[0].v.id + 1)
        return (-score if eng.high else score) * _U + i

    @classmethod
    def build(cls, engine: Engine) -> FirstFit | None:
        """Counters for this engine, or None: not ``first`` (or a static policy: low,
        high, lonode, hinode, on one-core nodes under the root) with stable ties and whole
        pools, the graph is not ``cluster -> [rack ->] node -> core`` with every node
        holding the same number of one-unit cores, something is down, or a span is
        recorded."""
        if engine.node_exclusive or engine.exact or engine.split_pools or engine.perf \
                or engine.locality or engine.leaf_types:
            return None
        if engine.first and (not engine.high or not engine.node_centric):
            return None
        root = engine.root
        if root.v.type != "cluster" or not root.children:
            return None
        kids = root.children
        if all(c.v.type == "node" for c in kids):
            racks: list[VState] = []
            nodes = list(kids)
        elif all(c.v.type == "rack" and c.children for c in kids):
            racks = list(kids)
            nodes = [n for r in racks for n in r.children]
            if any(n.v.type != "node" for n in nodes):
                return None
        else:
            return None
        size = len(nodes[0].children)
        if size < 1:
            return None
        for x in [root, *racks]:
            if x.v.status != UP or x.ps or x.xs or (x.f is not None and len(x.f)):
                return None
            if x.v.uniq_id >= _U:
                return None
        for nv in nodes:
            v = nv.v
            if v.status != UP or len(nv.children) != size or nv.ps or nv.xs \
                    or (nv.f is not None and len(nv.f)) or v.uniq_id >= _U:
                return None
            for c in nv.children:
                cv = c.v
                if cv.type != "core" or c.children or cv.size != 1 or cv.status != UP or c.ps \
                        or c.xs or cv.uniq_id >= _U:
                    return None
        ff = cls(engine, racks, nodes, not racks)
        return ff if ff.unit or not ff.static else None

    # ---------------------------------------------------------------- questions
    def free_cores(self) -> int:
        return sum(self.rfree)

    def free_nodes(self) -> int:
        """Nodes not held whole (the root filter's ``node`` count)."""
        return len(self.nodes) - sum(self.rxnodes)

    def fits_machine(self, kind: int, count: int) -> bool:
        """The satisfiability walk's answer (far future: every node up and free)."""
        return count <= (len(self.nodes) * self.cores_per if kind == SLOTS else len(self.nodes))

    def busy_reason(self, js: Jobspec) -> str:
        """``Matcher._busy_reason`` from the counters (the root filter's core and node
        counts)."""
        for t, n in js.totals.items():
            if t == "slot":
                continue
            free = self.free_cores() if t == "core" else self.free_nodes()
            if n > free:
                return f"needs {n} {t}, {free} free now"
        return "resources are free in total but not in the requested shape/place now"

    def active(self, now: int) -> bool:
        """Has every live job started by ``now`` and not ended at ``now``?"""
        if self.latest > now:
            self.latest = max([r.at for r in self.jobs.values()], default=-1)
            if self.latest > now:
                return False
        ends = self.ends
        jobs = self.jobs
        while ends:
            top = ends[0]
            if top[1] in jobs:
                return now < top[0]
            heappop(ends)
        return True

    def earliest_end(self) -> int | None:
        """The earliest end of a live job's window (None: no live job)."""
        ends = self.ends
        jobs = self.jobs
        while ends:
            top = ends[0]
            if top[1] in jobs:
                return top[0]
            heappop(ends)
        return None

    def select(self, kind: int, count: int) -> list[tuple[int, list[int]]] | None:
        """The walk's choice: [(node, core positions)] in tree order, or None (BUSY).
        Takes nothing (:meth:`allocate` does)."""
        free_list = self.free_list
        if free_list is not None:
            took = free_list.peek(count)
            return None if took is None else [(i, _CORE0) for i in took]
        return self._select(kind, count)

    def _select(self, kind: int, count: int) -> list[tuple[int, list[int]]] | None:
        if kind == SLOTS:
            if count > self.free_cores():
                return None
            return self._slots(count)
        if count > self.free_nodes():
            return None
        return self._nodes(count)

    def _rack_order(self) -> list[int]:
        return [0] if self.flat else self.root_room.items

    def _slots(self, p: int) -> list[tuple[int, list[int]]] | None:
        if self.cores_per == 1 and self.flat:
            # one core per node: every node in the room gives its core, the first p are taken
            # (no surplus: each gives exactly one)
            items = self.rooms[0].items
            if len(items) < p:
                return None
            return [(i, _CORE0) for i in sorted(items[:p])]
        cands: list[tuple[int, int, int]] = []  # (node, core position, score)
        core_free = self.core_free
        free = self.free
        scores = self.core_score
        total = 0
        for k in self._rack_order():
            in_rack = 0
            for i in self.rooms[k].items:
                take = free[i] if free[i] < p else p
                flags = core_free[i]
                sc = scores[i]
                j = 0
                got = 0
                while got < take:
                    if flags[j]:
                        cands.append((i, j, sc[j]))
                        got += 1
                    j += 1
                in_rack += take
                if in_rack >= p:
                    break
            total += in_rack
            if total >= p:
                break
        if total < p:
            return None
        if total > p:
            # best p by score, descending, discovery order among equals (a stable sort)
            cands = sorted(cands, key=lambda c: -c[2])[:p]
        return self._group(cands)

    def _nodes(self, n: int) -> list[tuple[int, list[int]]] | None:
        cands: list[tuple[int, int, int]] = []
        free = self.free
        whole = self.cores_per
        total = 0
        for k in self._rack_order():
            in_rack = 0
            for i in self.rooms[k].items:
                if free[i] == whole:
                    cands.append((i, -1, self.node_score[i]))
                    in_rack += 1
                    if in_rack >= n:
                        break
            total += in_rack
            if total >= n:
                break
        if total < n:
            return None
        if total > n:
            cands = sorted(cands, key=lambda c: -c[2])[:n]
        every = list(range(whole))
        return sorted((i, every) for i, _j, _s in cands)

    @staticmethod
    def _group(cands: list[tuple[int, int, int]]) -> list[tuple[int, list[int]]]:
        by: dict[int, list[int]] = {}
        for i, j, _s in cands:
            lst = by.get(i)
            if lst is None:
                by[i] = [j]
            else:
                lst.append(j)
        return sorted(by.items())

    # ---------------------------------------------------------------- changes
    def allocate(self, jobid: int, kind: int, count: int, at: int, end: int,
                 queue: str) -> CountedResult | None:
        """Take what the walk would choose for ``count`` slots (or whole nodes) for
        ``jobid`` over [at, end), reorder as the update pass does; the answer, or None
        (BUSY: nothing taken)."""
        free_list = self.free_list
        if free_list is not None:
            took = free_list.take(count)
            if took is None:
                return None
            p = len(took)
            self.rfree[0] -= p
            if kind == NODES:
                self.rxnodes[0] += p
            res = CountedResult(jobid, at, end, queue, self, kind, took, None,
                                tuple([self.unit_shares[i] for i in took]), p)
        else:
            picks = self._select(kind, count)
            if picks is None:
                return None
            self._commit(kind, picks)
            res = CountedResult(jobid, at, end, queue, self, kind, None, picks, self.shares(picks),
                                sum([len(ps) for _i, ps in picks]))
        self.jobs[jobid] = res
        if at > self.latest:
            self.latest = at
        heappush(self.ends, (end, jobid))
        return res

    def _commit(self, kind: int, picks: list[tuple[int, list[int]]]) -> None:
        """Hold ``picks`` (an answer of :meth:`_select`) and reorder as the update pass
        does (nodes and racks of more than one core or in racks)."""
        free = self.free
        weight = self.weight
        rooms = self.rooms
        rack_of = self.rack_of
        before: dict[int, int] = {}  # touched rack -> its free cores before
        rfree = self.rfree
        nkey = self.nkey
        core_free = self.core_free
        for i, positions in picks:
            flags = core_free[i]
            for j in positions:
                flags[j] = False
            k = rack_of[i]
            if k not in before:
                before[k] = rfree[k]
            had = free[i]
            took = len(positions)
            left = had - took
            free[i] = left
            rfree[k] -= took
            if kind == NODES:
                self.excl[i] = True
                self.rxnodes[k] += 1
            room = rooms[k]
            keys = room.keys
            old = nkey[i]
            if had > 0:  # (in the room list: drop it, _Room.drop inline)
                j = bisect_left(keys, old)
                del keys[j]
                del room.items[j]
            weight[i] = left
            key = nkey[i] = (MAXW - left) * _U + old % _U  # (old % _U: the uniq id part)
            if left > 0:
                j = bisect_left(keys, key)
                keys.insert(j, key)
                room.items.insert(j, i)
        if not self.flat:
            for k, had in before.items():
                u = self.racks[k].v.uniq_id
                if had > 0:
                    self.root_room.drop(_key(self.rweight[k], u))
                self.rweight[k] = self.rnodes[k] - self.rxnodes[k]
                if rfree[k] > 0:
                    self.root_room.add(_key(self.rweight[k], u), k)

    def release(self, jobid: int) -> bool:
        """Give back what ``jobid`` holds (weights stay, as in the engine); False when it
        is not a live job of the counters."""
        res = self.jobs.pop(jobid, None)
        if res is None:
            return False
        if len(self.ends) > 2 * len(self.jobs) + 64:  # mostly released jobs' ends: rebuild
            self.ends = sorted([(r.end, j) for j, r in self.jobs.items()])
        kind = res.kind
        free_list = self.free_list
        took = res.took
        if free_list is not None and took is not None:
            free_list.give(took)
            self.rfree[0] += len(took)
            if kind == NODES:
                self.rxnodes[0] -= len(took)
            return True
        free = self.free
        nkey = self.nkey
        rack_of = self.rack_of
        rooms = self.rooms
        core_free = self.core_free
        rfree = self.rfree
        flat = self.flat
        for i, positions in res.picks():
            flags = core_free[i]
            for j in positions:
                flags[j] = True
            k = rack_of[i]
            if free[i] == 0:  # back in the room list, where its (unchanged) weight puts it
                room = rooms[k]
                key = nkey[i]
                j = bisect_left(room.keys, key)
                room.keys.insert(j, key)
                room.items.insert(j, i)
            free[i] += len(positions)
            if kind == NODES:
                self.excl[i] = False
                self.rxnodes[k] -= 1
            if not flat and rfree[k] == 0:
                self.root_room.add(_key(self.rweight[k], self.racks[k].v.uniq_id), k)
            rfree[k] += len(positions)
        return True

    # ---------------------------------------------------------------- output
    def entries(self, kind: int, picks: list[tuple[int, list[int]]]) -> list[Entry]:
        """What the update pass emits for ``picks`` (post-order: cores, node, rack, root)."""
        out: list[Entry] = []
        nodes = self.nodes
        rack_prev = -1
        for i, positions in picks:
            k = self.rack_of[i]
            if not self.flat and k != rack_prev and rack_prev >= 0:
                out.append(Entry(self.racks[rack_prev], self.racks[rack_prev].v.size, False, None))
            rack_prev = k
            nv = nodes[i]
            order = self.core_order[i]
            if kind == NODES:
                for c in nv.children:
                    out.append(Entry(c, c.v.size, True, None))
                out.append(Entry(nv, nv.v.size, True, None))
            else:
                chosen = sorted((order[j] for j in positions), key=lambda c: c.pos)
                for c in chosen:
                    out.append(Entry(c, 1, True, None))
                out.append(Entry(nv, nv.v.size, False, None))
        if not self.flat and rack_prev >= 0:
            out.append(Entry(self.racks[rack_prev], self.racks[rack_prev].v.size, False, None))
        out.append(Entry(self.engine.root, 1, False, None))
        return out

    def shares(self, picks: list[tuple[int, list[int]]]) -> tuple[tuple[str, int], ...]:
        """(node name, cores) per node, by node uniq id (``MatchResult.core_shares``)."""
        if self.by_index:
            names = self.names
            return tuple([(names[i], len(p)) for i, p in picks])
        nodes = self.nodes
        rows = sorted((nodes[i].v.uniq_id, nodes[i].v.name, len(p)) for i, p in picks)
        return tuple((name, n) for _u, name, n in rows)

    # ---------------------------------------------------------------- leaving
    def flush(self, commit: Callable[[CountedResult, list[tuple[VState, int, bool]]], None]) -> None:
        """Write every live job into the engine (``commit(answer, marks)`` runs the update
        pass and records the job) and the weights into the child orders."""
        for jobid in sorted(self.jobs):
            res = self.jobs[jobid]
            marks: list[tuple[VState, int, bool]] = []
            for i, positions in res.picks():
                if res.kind == NODES:
                    nv = self.nodes[i]
                    marks.append((nv, nv.v.size, True))
                else:
                    order = self.core_order[i]
                    marks.extend((order[j], 1, True) for j in positions)
            commit(res, marks)
        if not self.static:  # (only `first`'s update pass weighs children)
            free_list = self.free_list
            for i, nv in enumerate(self.nodes):
                nv.weight = free_list.weight(i) if free_list is not None else self.weight[i]
            for k, rv in enumerate(self.racks):
                rv.weight = self.rweight[k]
        self.jobs.clear()
        self.ends.clear()
        self.engine.prime()  # child orders and room lists from the weights

    def describe(self) -> dict[str, Any]:
        return {"nodes": len(self.nodes), "racks": len(self.racks), "jobs": len(self.jobs)}

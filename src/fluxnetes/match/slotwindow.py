"""The slot index's choice for a future window (a reservation at a candidate time): hosts
packed from the leaves free over [at, at + duration) exactly as the walk packs them, lazily,
in the order of a lower bound on each host's best slot key (from the static candidate
order), until no unpacked host can beat the N slots found; a host's pruning filter rules it
out first when it cannot hold one slot over the window. Static policies with stable ties and
fixed counts only (``ReserveSearch._index``, match/reservesearch.py)."""

from __future__ import annotations

import heapq
from typing import Any, Protocol

from fluxnetes.graph.model import UP
from fluxnetes.jobspec.model import Resource
from fluxnetes.match.candidates import Allow
from fluxnetes.match.engine import Engine
from fluxnetes.match.slotpack import Slot, SlotHost, UnitRuns, free_candidates, pack_slots
from fluxnetes.match.vstate import VState


class Hosts(Protocol):
    """What the window reads of its slot index (``slotindex.SlotIndex``)."""

    eng: Engine
    fixed: bool
    hosts: list[SlotHost]
    elems: list[Resource]

    def static_order(self, h: SlotHost) -> list[list[tuple[int, VState]]]: ...

    def passes(self, h: SlotHost, allow: Allow) -> bool: ...


class SlotWindow:
    """``SlotIndex.select_at``'s state: the hosts' static bounds, made on first use."""

    def __init__(self, index: Hosts) -> None:
        self.index = index
        self.eng = index.eng
        self._bounds_cache: list[tuple[Any, int, SlotHost]] | None = None  # host order
        self._bounds_unknown = False
        self.fcheck: dict[int, list[tuple[int, int]]] = {}  # host dfs -> (filter index, need)

    def _bounds(self) -> list[tuple[Any, int, SlotHost]] | None:
        """Per host a lower bound on its best slot's key (from the static candidate order,
        whatever is free), sorted; None when a bound cannot be given (non-leaf candidates,
        or element counts that are ranges)."""
        got = self._bounds_cache
        if got is not None or self._bounds_unknown:
            return got
        if not self.index.fixed:
            self._bounds_unknown = True
            return None
        high = self.eng.high
        split = self.eng.split_pools
        out: list[tuple[Any, int, SlotHost]] = []
        fcheck = self.fcheck
        for h in self.index.hosts:
            score = 1
            ok = True
            checks: list[tuple[int, int]] = []
            for elem, order in zip(self.index.elems, self.index.static_order(h), strict=True):
                cnt = elem.count.min
                if any(c.children for _s, c in order):
                    self._bounds_unknown = True
                    return None
                unit = all(c.v.size == 1 and not (split and c.v.size > 1) for _s, c in order)
                fi = h.vs.fidx.get(elem.type)
                if fi is not None and not any(split and c.v.size > 1 for _s, c in order):
                    # the host's filter bounds these leaves (see match/reserve.py)
                    checks.append((fi, cnt))
                # unit leaves: exactly cnt members, at best the first cnt in policy order;
                # else members hold >= 1 unit each: at most cnt of them (high), one at least (low)
                k = cnt if unit else (min(cnt, len(order)) if high else 1)
                if len(order) < (cnt if unit else 1) or k < 1:
                    ok = False
                    break
                score += sum(sc for sc, _c in order[:k])
            if ok:
                out.append((-score if high else score, h.dfs, h))
                fcheck[h.dfs] = checks
        out.sort(key=lambda x: (x[0], x[1]))
        self._bounds_cache = out
        return out

    def _free_at(self, c: VState, at: int, end: int) -> int:
        """What the walk at [at, end) (a reservation) sees free of candidate leaf ``c``."""
        cv = c.v
        if cv.status != UP:
            return 0
        if self.eng.split_pools and cv.size > 1:
            return c.avail(at, end) if c.ps else cv.size
        if (c.xs or c.ps) and c.x_busy(at, end):
            return 0
        return c.avail(at, end) if c.ps else cv.size

    def _host_open_at(self, h: SlotHost, at: int, end: int) -> bool:
        """The walk's host-level checks at [at, end): up (and its ancestors), own planner of
        the host and its ancestors not full over the window; and (no slot otherwise) the
        host's filter has one slot's count of each leaf type it bounds free over it."""
        if h.down:
            return False
        f = h.vs.f
        if f is not None:
            for fi, need in self.fcheck.get(h.dfs, ()):
                if f.free(fi, at, end) < need:
                    return False  # fewer leaves free over the window than one slot takes
        x: VState | None = h.vs
        while x is not None:
            if x.ps and x.avail(at, end) == 0:
                return False
            x = x.parent
        return True

    def _pack_at(self, h: SlotHost, at: int, end: int) -> list[Slot] | UnitRuns:
        """_pack with the leaves free over [at, end) instead of the leaves free now."""
        high = self.eng.high
        split = self.eng.split_pools
        got = free_candidates(
            self.index.elems, self.index.static_order(h), lambda c: self._free_at(c, at, end)
        )
        if got is None:
            return []
        per, unit = got
        if unit and len(per) == 1:
            cnt, cands = per[0]
            if len(cands) < cnt:
                return []
            return UnitRuns([(x[0], x[2]) for x in cands], cnt, high)
        return pack_slots(per, high, split)

    def select_at(self, slot: Resource, allow: Allow, at: int, end: int) -> list[tuple[VState, int]] | None:
        """The walk's choice of ``slot`` (a fixed count) for a reservation over [at, end):
        members of the N best slots, or None if fewer than N exist. Hosts are packed lazily
        in the order of a lower bound on their best slot, until no unpacked host can beat the
        slots found. Raises LookupError when not applicable (the caller walks)."""
        if slot.count.min != slot.count.max:
            raise LookupError("slot count is a range")
        bounds = self._bounds()
        if bounds is None:
            raise LookupError("no static bound for these hosts")
        need = slot.count.min
        chosen: list[tuple[VState, int]] = []
        heap: list[tuple[Any, int, int, int]] = []
        packed: list[list[Slot] | UnitRuns] = []
        it = iter(bounds)
        nxt = next(it, None)
        taken = 0
        while taken < need:
            while nxt is not None and (not heap or (nxt[0], nxt[1], 0) <= heap[0][:3]):
                h = nxt[2]
                nxt = next(it, None)
                if allow is not None and not self.index.passes(h, allow):
                    continue
                if not self._host_open_at(h, at, end):
                    continue
                slots = self._pack_at(h, at, end)
                if len(slots):
                    packed.append(slots)
                    heapq.heappush(heap, (slots[0][0], h.dfs, 0, len(packed) - 1))
            if not heap:
                return None
            _key, dfs, si, pi = heapq.heappop(heap)
            slots = packed[pi]
            chosen.extend(slots[si][2])
            taken += 1
            if si + 1 < len(slots):
                heapq.heappush(heap, (slots[si + 1][0], dfs, si + 1, pi))
        return chosen

"""A slot host (``SlotHost``) and its free leaves packed into slots exactly as the walk packs them (the walk's
``dom_slot``): a slot is (key, position, members), the key the slot's score as the root
sorts it; ``UnitRuns`` holds the common case, runs of unit leaves, without building every
slot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fluxnetes.graph.model import UP
from fluxnetes.jobspec.model import Resource
from fluxnetes.match.counts import calc_count
from fluxnetes.match.vstate import VState

Slot = tuple[Any, int, list[tuple[VState, int]]]  # (key, position, members)


class UnitRuns:
    """A host's slots when they are runs of ``cnt`` unit leaves of one type, in policy
    order: built on demand instead of materialised (hosts x slots can be 10^5+)."""

    __slots__ = ("cands", "cnt", "high", "memo")

    def __init__(self, cands: list[tuple[int, VState]], cnt: int, high: bool) -> None:
        self.cands = cands
        self.cnt = cnt
        self.high = high
        # slots built since the last remove (select() reads the first ones several times);
        # callers only read them (select copies the members out)
        self.memo: dict[int, Slot] = {}

    def __len__(self) -> int:
        return len(self.cands) // self.cnt

    def __getitem__(self, i: int) -> Slot:
        hit = self.memo.get(i)
        if hit is not None:
            return hit
        cnt = self.cnt
        score = 1
        members: list[tuple[VState, int]] = []
        for sc, c in self.cands[i * cnt:(i + 1) * cnt]:
            score += sc
            members.append((c, 1))
        slot = (-score if self.high else score, i, members)
        self.memo[i] = slot
        return slot

    def score(self, i: int) -> int:
        """Slot ``i``'s score without building it."""
        cnt = self.cnt
        return 1 + sum(sc for sc, _c in self.cands[i * cnt:(i + 1) * cnt])

    def scores(self) -> list[int]:
        """Every slot's score (1 + its members' scores), in position order."""
        cnt = self.cnt
        cands = self.cands
        return [1 + sum(sc for sc, _c in cands[i:i + cnt]) for i in range(0, len(self) * cnt, cnt)]

    def remove(self, gone: set[int]) -> None:
        cnt = self.cnt
        for i in sorted(gone, reverse=True):
            del self.cands[i * cnt:(i + 1) * cnt]
        self.memo.clear()  # positions shifted


class SlotHost:
    """A slot host (the first vertex, top-down, whose direct children hold every slot type)
    and its slots as the index keeps them."""

    __slots__ = ("dfs", "down", "key", "ml", "scores", "slots", "total", "unit", "vs")

    def __init__(self, vs: VState, dfs: int, ml: int) -> None:
        self.vs = vs
        self.dfs = dfs
        self.ml = ml
        self.down = False
        self.unit = False  # slots are aligned runs of unit leaves (see consume())
        self.slots: list[Slot] | UnitRuns = []
        self.total = 0
        self.key: Any = None  # its first slot's key (Slot[0]: an int or a tuple, by policy); None: no slot
        self.scores: dict[int, int] = {}  # `locality`: slot score -> how many slots have it


Per = list[tuple[int, list[tuple[int, int, VState]]]]  # per element: (count, candidates)


def free_now(c: VState, split: bool) -> int:
    """What the walk sees free of candidate leaf ``c`` when every recorded job is active at
    its time (the indexes' precondition): nothing when it is down or holds a job, unless it
    is a split pool (``split``), which gives what is left of it."""
    cv = c.v
    if cv.status != UP:
        return 0
    if c.xs or c.alloc_n or c.ps:
        if not (split and cv.size > 1 and not c.children):
            return 0
        return cv.size - c.pused
    return cv.size


def free_candidates(
    elems: list[Resource], orders: list[list[tuple[int, VState]]], free: Callable[[VState], int]
) -> tuple[Per, bool] | None:
    """Per slot element, (its count per slot, its candidates with something ``free``: (score,
    amount, vertex) in packing order), and whether every candidate so far is a unit leaf;
    None when an element's count allows no slot."""
    per: Per = []
    unit = True
    for elem, order in zip(elems, orders, strict=True):
        cands: list[tuple[int, int, VState]] = []
        for sc, c in order:
            avail = free(c)
            if avail <= 0:
                continue
            if avail != 1:
                unit = False
            cands.append((sc, avail, c))
        qc = len(cands) if unit else sum(a for _s, a, _c in cands)
        cnt = calc_count(elem.count, qc)
        if cnt == 0:
            return None
        per.append((cnt, cands))
    return per, unit


def count_slots(per: Per, split: bool) -> int:
    """cnt_slot: how many slots the candidates give, the fewest over the elements (whole
    candidates, remainders not carried; a split pool carries its remainder). Every count in
    ``per`` is at least 1."""
    nslots = None
    for cnt, cands in per:
        fit = 0
        acc = 0
        for _s, a, c in cands:
            if split and c.v.size > 1 and not c.children:
                acc += a
                fit += acc // cnt
                acc %= cnt
                continue
            acc += a
            if acc >= cnt:
                fit += 1
                acc = 0
        nslots = fit if nslots is None else min(nslots, fit)
    return nslots or 0


def build_slots(per: Per, nslots: int, split: bool) -> list[tuple[int, list[tuple[VState, int]]]]:
    """The first ``nslots`` slots, in packing order: (score, members (vertex, amount)). Each
    element's candidates are taken in turn; a split pool gives a slot what it still needs and
    the next slot the rest. Fewer slots when the candidates run out."""
    out: list[tuple[int, list[tuple[VState, int]]]] = []
    pos = [0] * len(per)
    left = [0] * len(per)  # split pools: amount left in the current candidate
    for _ in range(nslots):
        score = 1
        members: list[tuple[VState, int]] = []
        for ei, (cnt, cands) in enumerate(per):
            j = 0
            while j < cnt:
                gi = pos[ei]
                if gi >= len(cands):
                    return out
                s, a, c = cands[gi]
                if split and c.v.size > 1 and not c.children:
                    if left[ei] == 0:
                        left[ei] = a
                    take = min(left[ei], cnt - j)
                    left[ei] -= take
                    if left[ei] == 0:
                        pos[ei] = gi + 1
                    members.append((c, take))
                    score += s
                    j += take
                    continue
                pos[ei] = gi + 1
                members.append((c, a))
                score += s
                j += a
        out.append((score, members))
    return out


def pack_slots(per: Per, high: bool, split: bool) -> list[Slot]:
    """A host's slots sorted by key (the root's order: descending score when ``high``).
    ``per``: per slot element, (count per slot, candidates (score, amount, vertex) in
    packing order)."""
    nslots = count_slots(per, split)
    if not nslots:
        return []
    slots: list[Slot] = [
        (-score if high else score, i, members)
        for i, (score, members) in enumerate(build_slots(per, nslots, split))
    ]
    slots.sort(key=slot_key)
    return slots


def slot_key(s: tuple[Any, int, Any]) -> tuple[Any, int]:
    return (s[0], s[1])

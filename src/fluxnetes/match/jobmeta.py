"""One matching attempt and what a committed job holds: :class:`Meta` (Fluxion jobmeta_t)
with its allocation types and time bounds, :class:`Entry` (one vertex of a committed job,
also named ``Emitted``/``JobEntry`` by its users) and :class:`Share`.
"""

from __future__ import annotations

from typing import Any

from fluxnetes.match.vstate import VState

GRAPH_END = 3153600000  # 100 years: Fluxion's default graph horizon
FAR = 1 << 62  # "far future" for satisfiability walks

AT_ALLOC = 0
AT_RESERVE = 1
AT_SAT = 2


class Share:
    __slots__ = ("acc", "per", "prev", "shares")

    def __init__(self, per: int) -> None:
        self.per = per
        self.acc = 0
        self.shares = 0
        self.prev = 0


class Meta:
    """One matching attempt (Fluxion jobmeta_t)."""

    __slots__ = ("alloc_type", "at", "constraint", "duration", "end", "jobid", "now", "room")

    def __init__(self, jobid: int, at: int, now: int, duration: int, alloc_type: int, constraint: Any) -> None:
        # room: every recorded span holds at ``at`` (the caller knows: Matcher._all_active),
        # so a child whose cores are all held by spans cannot give one now (Engine.explore)
        self.room = False
        self.jobid = jobid
        self.at = at
        self.now = now
        self.duration = duration
        self.end = at + duration
        self.alloc_type = alloc_type
        self.constraint = constraint


class Entry:
    """One vertex of a committed job: what was emitted (needs, exclusive) and what the job
    holds there (own planner amount = needs when exclusive; counts added to its filter)."""

    __slots__ = ("excl", "fcounts", "needs", "vs")

    def __init__(self, vs: VState, needs: int, excl: bool, fcounts: tuple[int, ...] | None) -> None:
        self.vs = vs
        self.needs = needs
        self.excl = excl
        self.fcounts = fcounts

    @property
    def plan(self) -> int:
        return self.needs if self.excl else 0


Emitted = Entry
JobEntry = Entry

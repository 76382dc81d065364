"""What a scheduling walk may answer without the matcher (pinned reservations: parking).

``_Hints`` carries, through one walk, the jobs the previous cycle found unable to start, the
nodes freed since, the request shapes already BUSY in this walk and whether anything in the
matcher ends by itself; the helpers below key a job's request by what a match depends on.
``Scheduler`` (``cycle.py``) fills it; ``walk.py`` asks it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.queue.job import QueuedJob
from fluxnetes.queue.protocol import shares_of
from fluxnetes.queue.walk import CycleResult


def _slot_cores(resources: Any) -> list[int]:
    """Cores each slot of ``resources`` holds at least (count.min products below it)."""
    out: list[int] = []
    for r in resources or ():
        if getattr(r, "type", "") == "slot":
            out.append(_cores_under(getattr(r, "with_", ())))
        else:
            out.extend(_slot_cores(getattr(r, "with_", ())))
    return out


def _resources_key(resources: Any) -> Hashable:
    """The request tree as the matcher reads it (slot labels, which only name the slot,
    left out: two groups asking the same shape share the key)."""
    return tuple(
        (
            getattr(r, "type", ""),
            repr(getattr(r, "count", None)),
            getattr(r, "unit", ""),
            getattr(r, "exclusive", None),
            getattr(r, "id", ""),
            _resources_key(getattr(r, "with_", ())),
        )
        for r in resources or ()
    )


def _cores_under(resources: Any) -> int:
    total = 0
    for r in resources or ():
        count = int(getattr(getattr(r, "count", None), "min", 1))
        if getattr(r, "type", "") == "core":
            total += count
        else:
            total += count * _cores_under(getattr(r, "with_", ()))
    return total


# a planned duration reaching this far means "until released": the matcher plans a job
# of unknown duration up to its graph horizon (100 years); the tests' fakes say 0
UNTIL_RELEASED = 3_000_000_000


def _until_released(result: Any) -> bool:
    duration = int(getattr(result, "duration", 0) or 0)
    return duration <= 0 or int(getattr(result, "at", 0) or 0) + duration >= UNTIL_RELEASED


def _signature(result: Any) -> tuple[int, tuple[Any, ...]]:
    """What a reservation holds: its start and its vertices (or node shares)."""
    vertices = getattr(result, "vertices", None)
    if vertices:
        held: tuple[Any, ...] = tuple((v.uniq_id, v.size) for v in vertices)
    else:
        held = tuple(shares_of(result))
    return int(result.at), held


@dataclass
class _Hints:
    """What one walk may answer without the matcher (pinned reservations only).

    * ``parked``: jobs the previous cycle found unable to start now (BUSY or reserved); a
      plain ``allocate`` for one of them is answered BUSY unless ``woken``.
    * ``freed``: nodes where something was freed since the previous cycle, or where a
      reservation of that cycle, ahead in this walk, is not held again identically
      (None: anywhere / unknown: every parked job is woken).
    * ``woken(job, freed)``: could a freed node hold one slot of this job now?
    * ``old``: the previous cycle's reservations (their signature and nodes).
    * ``busy``: request shapes that could not start now earlier in this walk (the walk
      only adds allocations and reservations, so a later plain ``allocate`` of the same
      shape is BUSY too).

    * ``forever``: every span in the matcher holds until released (no reservation, no
      running job with a planned end; the job asked has no duration either). Then the
      free resources never grow by themselves, so a job that cannot start now finds no
      later start either: a reservation question for a job known BUSY now is BUSY too.

    Otherwise questions for a reservation (``allocate_orelse_reserve``) are always asked:
    the matcher's search for a start time is not monotone (a reservation added elsewhere
    can create the candidate time at which a job that found none before fits), so no
    answer of it is carried over.
    """

    parked: dict[str, Hashable]  # job id -> its request shape then
    freed: set[str] | None
    woken: Any  # Callable[[QueuedJob, set[str]], bool]
    shape: Any  # Callable[[QueuedJob], Hashable]
    old: dict[str, tuple[tuple[int, tuple[Any, ...]], list[str]]] = field(default_factory=dict)
    busy: set[Hashable] = field(default_factory=set)
    forever_now: Any = None  # Callable[[], bool]: is the matcher "forever" now? (asked once)
    forever_known: bool | None = None
    sat: set[Hashable] = field(default_factory=set)  # shapes known satisfiable (the scheduler's)

    @property
    def forever(self) -> bool:
        if self.forever_known is None:
            self.forever_known = bool(self.forever_now()) if self.forever_now is not None else False
        return self.forever_known

    def known_busy(self, job: QueuedJob, result: CycleResult, *, reserve: bool = False) -> bool:
        """Is the answer to a plain ``allocate`` of ``job`` (``reserve``: to
        ``allocate_orelse_reserve``) surely BUSY?"""
        if reserve and not (job.duration == 0 and self.shape(job) in self.sat and self.forever):
            return False  # (an unknown shape may be unsatisfiable: the matcher says so)
        if self.shape(job) in self.busy:
            result.memo += 1
            return True
        if self.parked.get(job.id) != self.shape(job) or self.freed is None \
                or self.woken(job, self.freed):
            return False  # (a job whose request changed is not the job that was parked)
        result.parked += 1
        return True

    def answered(self, job: QueuedJob, status: str, answer: Any, *, reserve: bool) -> None:
        if status == "RESERVED" or (status == "ALLOCATED" and not _until_released(answer)):
            self.forever_known = False
        if status == "ALLOCATED" or (status in ("RESERVED", "BUSY") and reserve):
            self.sat.add(self.shape(job))
        if status != "ALLOCATED":
            self.busy.add(self.shape(job))
        old = self.old.pop(job.id, None)
        if old is None or self.freed is None:
            return
        if status == "RESERVED" and _signature(answer) == old[0]:
            return  # held again exactly as before: nothing behind it gains room
        self.freed.update(old[1])


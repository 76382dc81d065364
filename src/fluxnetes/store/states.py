"""Job states and the full table of allowed transitions.

A job is one pod group. Its life:

    provisional --(group complete)--> pending --(cycle)--> running --> completed | failed | cancelled
                                         |  ^                  |
                                         v  |                  +--(requeue, e.g. node lost)--> pending
                                       reserved --(cycle)--> running
                                         |
    pending / reserved --(can never fit)--> unsatisfiable

``reserved`` is a pending job that holds a reservation (an expected start time) from the last
cycle; reservations are recomputed every cycle, so ``reserved -> pending`` is allowed (the
reservation was dropped). Every non-terminal state may go to ``cancelled`` (the owner was
deleted) or ``failed`` (an error outside the scheduler). Terminal states never change again.
"""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    PROVISIONAL = "provisional"  # pods of the group are still arriving
    PENDING = "pending"  # complete group, waiting in the queue
    RESERVED = "reserved"  # waiting, with an expected start time from the last cycle
    RUNNING = "running"  # resources allocated and recorded
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNSATISFIABLE = "unsatisfiable"  # asks more than the cluster could ever give


S = JobState

# The full table: state -> states it may move to. Anything else raises IllegalTransition.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.PROVISIONAL: frozenset({S.PENDING, S.CANCELLED, S.FAILED}),
    S.PENDING: frozenset({S.RESERVED, S.RUNNING, S.UNSATISFIABLE, S.CANCELLED, S.FAILED}),
    S.RESERVED: frozenset({S.PENDING, S.RUNNING, S.UNSATISFIABLE, S.CANCELLED, S.FAILED}),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.PENDING}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.UNSATISFIABLE: frozenset(),
}

TERMINAL: frozenset[JobState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
QUEUED: frozenset[JobState] = frozenset({S.PENDING, S.RESERVED})  # what a cycle considers


class IllegalTransition(ValueError):
    """A state change the table does not allow; names both states."""

    def __init__(self, job: str, current: JobState | str, target: JobState | str) -> None:
        self.job = job
        self.current = JobState(current)
        self.target = JobState(target)
        allowed = ", ".join(sorted(TRANSITIONS[self.current])) or "none (terminal state)"
        super().__init__(
            f"job {job}: illegal transition {self.current.value} -> {self.target.value} "
            f"(allowed from {self.current.value}: {allowed})"
        )


def check_transition(job: str, current: JobState | str, target: JobState | str) -> None:
    """Raise IllegalTransition unless ``current -> target`` is in the table."""
    cur, tgt = JobState(current), JobState(target)
    if tgt not in TRANSITIONS[cur]:
        raise IllegalTransition(job, cur, tgt)

"""The queue: policies (fcfs, easy, conservative, hybrid), priorities, the scheduling cycle.

Pure core: no clock, no I/O. See README.md in this folder for the interface.
"""

from fluxnetes.queue.cycle import (
    CountedReservation,
    CycleResult,
    Scheduler,
    job_duration,
    schedule_cycle,
)
from fluxnetes.queue.job import QueuedJob, queue_order
from fluxnetes.queue.policy import (
    DEFAULT_QUEUE_DEPTH,
    DEFAULT_RESERVATION_DEPTH,
    POLICY_NAMES,
    PolicyError,
    QueuePolicy,
)

__all__ = [
    "DEFAULT_QUEUE_DEPTH",
    "DEFAULT_RESERVATION_DEPTH",
    "POLICY_NAMES",
    "CountedReservation",
    "CycleResult",
    "PolicyError",
    "QueuePolicy",
    "QueuedJob",
    "Scheduler",
    "job_duration",
    "queue_order",
    "schedule_cycle",
]

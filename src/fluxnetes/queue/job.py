"""A job as the queue sees it, and the order the queue walks jobs in."""

from __future__ import annotations

from typing import Any, Final


def _id_key(job_id: str) -> tuple[int, int, str]:
    # numeric ids compare as numbers ("9" before "10"), others as text after them
    if job_id.isdigit():
        return (0, int(job_id), "")
    return (1, 0, job_id)


class QueuedJob:
    """A pending job.

    * ``id``: unique within the queue (the store's / operator's job id).
    * ``jobspec``: what the matcher is asked for (a ``fluxnetes.jobspec.Jobspec``).
    * ``submit_time``: seconds, same clock as ``now``.
    * ``priority``: higher runs first.
    * ``queue``: queue name (informational for now: one queue per Scheduler).
    * ``min_cores``: optional hint, the fewest cores the job can run on (0 = unknown); lets
      the scheduler skip matcher calls that cannot succeed. Never changes a decision.
    * ``account``: the account (a leaf of the fair-share tree: user, namespace or account)
      the job charges; "" = none named (the tree's default, if any). Read by
      ``queue.priority.FairShare``; the plain queue order ignores it.

    A value (the queue keys its answers by these fields): its fields are ``Final``, so mypy
    refuses an assignment and the native build raises AttributeError (pure Python lets one
    through at run time; ``replace`` makes a changed copy). Equal when every field but the
    jobspec is equal, as the frozen dataclass it replaces was. A plain class with slots, not
    a dataclass: the simulator builds one per job, and a dataclass's generated ``__init__``
    runs as interpreted Python even in the native build.

    Read from the jobspec once, here (a cycle asks them of every waiting job): ``cores``,
    the fewest cores the job needs (``min_cores``, else the jobspec's core total), and
    ``duration`` (the jobspec's, whole seconds; 0 = unknown: holds until released).
    """

    __slots__ = ("account", "cores", "duration", "id", "jobspec", "min_cores", "priority",
                 "queue", "submit_time")

    def __init__(self, id: str, jobspec: Any, submit_time: int, priority: int = 0,
                 queue: str = "default", min_cores: int = 0, account: str = "") -> None:
        # Final rather than a __setattr__ guard, which would cost every construction
        self.id: Final = id
        self.jobspec: Final = jobspec
        self.submit_time: Final = submit_time
        self.priority: Final = priority
        self.queue: Final = queue
        self.min_cores: Final = min_cores
        self.account: Final = account
        if min_cores:
            cores = min_cores
        else:
            totals = getattr(jobspec, "totals", None)
            cores = int(totals.get("core", 0)) if isinstance(totals, dict) else 0
        self.cores: Final = cores
        self.duration: Final = int(getattr(jobspec, "duration", 0) or 0)

    def _fields(self) -> tuple[str, int, int, str, int, str]:
        return (self.id, self.submit_time, self.priority, self.queue, self.min_cores,
                self.account)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QueuedJob):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (f"QueuedJob(id={self.id!r}, jobspec={self.jobspec!r}, "
                f"submit_time={self.submit_time!r}, priority={self.priority!r}, "
                f"queue={self.queue!r}, min_cores={self.min_cores!r}, account={self.account!r})")

    def replace(self, **changes: Any) -> QueuedJob:
        """A copy with ``changes`` (field=value), what ``dataclasses.replace`` made of the
        frozen dataclass this class was. TypeError naming an unknown field."""
        fields: dict[str, Any] = {
            "id": self.id, "jobspec": self.jobspec, "submit_time": self.submit_time,
            "priority": self.priority, "queue": self.queue, "min_cores": self.min_cores,
            "account": self.account}
        unknown = sorted(changes.keys() - fields.keys())
        if unknown:
            raise TypeError(f"QueuedJob.replace: no field {', '.join(unknown)} (fields: "
                            f"{', '.join(fields)})")
        fields.update(changes)
        return QueuedJob(**fields)

    def sort_key(self) -> tuple[int, int, tuple[int, int, str]]:
        """Priority (higher first), then submit time, then id (numeric ids numerically)."""
        return (-self.priority, self.submit_time, _id_key(self.id))


def queue_order(jobs: list[QueuedJob]) -> list[QueuedJob]:
    """The jobs in the order a cycle walks them."""
    return sorted(jobs, key=QueuedJob.sort_key)

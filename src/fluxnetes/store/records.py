"""What the store takes in and gives back: a submission (with its rules), a job's row and an
event, as plain frozen values, and the errors that name a job or a field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fluxnetes.store.db import StoreError
from fluxnetes.store.models import Job
from fluxnetes.store.states import JobState


class JobNotFound(StoreError, LookupError):
    pass


class SubmissionError(StoreError, ValueError):
    """A submission breaks a rule (names the field)."""


@dataclass(frozen=True)
class Submission:
    """A complete group entering the queue (or a provisional one, see Store.observe_member)."""

    namespace: str
    name: str
    jobspec: str
    size: int = 1
    duration: int = 0  # seconds, 0 = unknown
    priority: int = 0
    queue: str = "default"
    kind: str = "Pod"
    uid: str = ""

    def validate(self) -> None:
        for fname, limit in (("namespace", 253), ("name", 253), ("kind", 64), ("queue", 64)):
            v = getattr(self, fname)
            if not isinstance(v, str) or not v:
                raise SubmissionError(f"submission.{fname}: must be a non-empty string")
            if len(v) > limit:
                raise SubmissionError(f"submission.{fname}: longer than {limit} characters")
        if len(self.uid) > 64:
            raise SubmissionError("submission.uid: longer than 64 characters")
        if not isinstance(self.size, int) or self.size < 1:
            raise SubmissionError(f"submission.size: must be an integer >= 1, got {self.size!r}")
        if not isinstance(self.duration, int) or self.duration < 0:
            raise SubmissionError(
                f"submission.duration: must be an integer >= 0 (0 = unknown), got {self.duration!r}"
            )
        if not isinstance(self.priority, int):
            raise SubmissionError(f"submission.priority: must be an integer, got {self.priority!r}")


@dataclass(frozen=True)
class JobRecord:
    id: int
    namespace: str
    name: str
    uid: str
    kind: str
    jobspec: str
    size: int
    duration: int
    priority: int
    queue: str
    state: JobState
    reason: str
    submit_time: int
    start_time: int | None
    end_time: int | None
    matcher_jobid: int | None
    expected_start: int | None
    updated_time: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" + (f" ({self.uid})" if self.uid else "")


@dataclass(frozen=True)
class EventRecord:
    id: int
    job_id: int
    time: int
    from_state: JobState | None
    to_state: JobState
    reason: str


JOB_COLUMNS = [c.name for c in Job.__table__.columns]


def job_record(row: Any) -> JobRecord:
    """A JobRecord from a ``Job`` object or a result row of the job columns (both answer a
    column's name: the object by attribute, the row through its mapping)."""
    if isinstance(row, Job):
        vals = {c: getattr(row, c) for c in JOB_COLUMNS}
    else:
        m = row._mapping if hasattr(row, "_mapping") else row
        vals = {c: m[c] for c in JOB_COLUMNS}
    vals["state"] = JobState(vals["state"])
    return JobRecord(**vals)


def event_row(
    job_id: int, now: int, from_state: str | None, to_state: str, reason: str
) -> dict[str, Any]:
    """One ``events`` row, for the bulk inserts."""
    return {
        "job_id": job_id,
        "time": now,
        "from_state": from_state,
        "to_state": to_state,
        "reason": reason,
    }

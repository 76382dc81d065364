"""store: persistence of jobs, groups, allocations and events (SQLite by default, PostgreSQL in
clusters), and the queue service that runs the scheduling cycle against it. See README.md."""

from fluxnetes.store.allocations import AllocationError, AllocationRecord, NodeAmount
from fluxnetes.store.db import StoreConfigError, StoreError, StoreUnavailable, check_url, redact
from fluxnetes.store.records import (
    EventRecord,
    JobNotFound,
    JobRecord,
    Submission,
    SubmissionError,
)
from fluxnetes.store.states import (
    QUEUED,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    JobState,
    check_transition,
)
from fluxnetes.store.store import Store

__all__ = [
    "QUEUED",
    "TERMINAL",
    "TRANSITIONS",
    "AllocationError",
    "AllocationRecord",
    "EventRecord",
    "IllegalTransition",
    "JobNotFound",
    "JobRecord",
    "JobState",
    "NodeAmount",
    "Store",
    "StoreConfigError",
    "StoreError",
    "StoreUnavailable",
    "Submission",
    "SubmissionError",
    "check_transition",
    "check_url",
    "redact",
]

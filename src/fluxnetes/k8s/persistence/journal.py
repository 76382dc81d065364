"""``--store URL``: the queue's memory in the fluxnetes store (SQLite file or PostgreSQL).

With a store, every group enters it (submission with its jobspec, size, duration, priority
and submit time) and every decision of the operator is a store transition with its event
(pending, reserved, running with the allocation's per-node amounts, partial releases: nodes
given back whole and, ``release_part``, what a group still holds of a node where some of its
pods ended, completed / failed / cancelled / unsatisfiable). After a restart the controller reads the live
jobs back (``live_jobs``, ``allocations``): the queue resumes in the store's order (priority,
then submit time), allocations the FluxJob status did not record yet are restored, and
everything is reconciled with the cluster (FluxJobs, bound pods; objects gone -> cancelled).

Writes run on one worker thread, in order, so the database never stalls the event loop; a
store outage is logged once, ``ok`` turns False (the operator's /readyz follows it) and the
writes are retried until the store answers again (nothing is dropped). Transitions the store
would refuse as illegal are bridged through the legal path (e.g. a job that completed while
its start was still being written is started, then completed) or skipped when the store is
already in a terminal state. A completion found after a restart with no allocation known (its
pods gone too) ends the row as cancelled, saying so: a live row would be queued again.
Partial releases queued one after the other go out in one transaction (a burst of ended pods).
The crash points ``store-<state>`` / ``store-release`` / ``store-release-part`` come right before such a write
(crashpoints.py): a restart test stops the operator there, the store behind the cluster.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.scheduling.shares import Share

log = logging.getLogger("fluxnetes.k8s.journal")  # its name from before the sub-packages

_STATE = {
    Phase.PROVISIONAL: "provisional", Phase.PENDING: "pending", Phase.RESERVED: "reserved",
    Phase.RUNNING: "running", Phase.COMPLETED: "completed", Phase.FAILED: "failed",
    Phase.CANCELLED: "cancelled", Phase.UNSATISFIABLE: "unsatisfiable",
    # a victim of preemption holds its resources until its pods are gone: still running for
    # the store (k8s/scheduling/preemption.py ends the row once they are)
    Phase.PREEMPTED: "running",
}
LIVE = ("provisional", "pending", "reserved", "running")
TERMINAL = ("completed", "failed", "cancelled", "unsatisfiable")


@dataclass(frozen=True)
class GroupRecord:
    """What the store needs to know about a group at one decision (a snapshot: the worker
    thread never reads the controller's mutable state)."""

    namespace: str
    name: str
    uid: str
    kind: str
    jobspec: str
    size: int
    duration: int
    priority: int
    submit: int
    phase: Phase
    reason: str
    start: int = 0
    shares: tuple[Share, ...] = ()  # what it holds now (running) or held when it ended
    store_id: int | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.name, self.uid)


@dataclass
class Journal:
    url: str
    store: Any = None
    ok: bool = True
    _ids: dict[tuple[str, str, str], int] = field(default_factory=dict)
    _q: queue.Queue[Callable[[], None] | None] = field(default_factory=queue.Queue)
    _thread: threading.Thread | None = None
    retry_seconds: float = 1.0
    # the leader's write fence (kube.Fence), read when each write is about to run: once it
    # has closed another replica may lead and write, so nothing queued before goes out
    fence: Callable[[], Any] | None = None
    dropped: int = 0
    # the partial releases queued last, not taken by the worker yet: a new one joins them
    # (one transaction for a burst of ended pods); any other write closes it (order kept)
    _shrinks: _Shrinks | None = None
    _tail: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        from fluxnetes.store import Store

        self.store = Store.open(self.url)  # migrations; StoreUnavailable names the database
        self._thread = threading.Thread(target=self._work, name="fluxnetes-store", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ worker
    def _work(self) -> None:
        from fluxnetes.store import StoreUnavailable

        while True:
            op = self._q.get()
            if op is None:
                return
            while True:
                if self._fenced(op):
                    break
                try:
                    op()
                    if not self.ok:
                        log.info("store writes work again")
                    self.ok = True
                    break
                except StoreUnavailable as exc:  # retried until it answers: nothing is dropped
                    if self.ok:
                        log.warning("store unavailable, retrying: %s", exc)
                    self.ok = False
                    time.sleep(self.retry_seconds)
                except Exception as exc:  # a refused write (a bug): logged, the next one goes on
                    log.warning("store write failed: %s", exc)
                    break

    def _put(self, op: Callable[[], None] | None) -> None:
        with self._tail:
            self._shrinks = None  # a later partial release must not be written before ``op``
            self._q.put(op)

    def _fenced(self, op: Callable[[], None]) -> bool:
        """The fence has closed: this write (and every later one) is dropped, never sent late.
        The next leader reads the store and the cluster back (exact recovery) as after a crash."""
        fence = self.fence() if self.fence is not None else None
        if fence is None or fence.remaining() > 0 or getattr(op, "unfenced", False):
            return False
        if not self.dropped:
            log.warning("store writes dropped: not the leader any more (the lease was lost or the operator stops)")
        self.dropped += 1
        return True

    def close(self) -> None:
        self._put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def drain(self, timeout: float = 30) -> bool:
        """Wait until every write queued so far is done (tests, clean shutdown)."""
        done = threading.Event()

        def mark() -> None:
            done.set()

        mark.unfenced = True  # type: ignore[attr-defined]  # a marker, not a write
        self._put(mark)
        return done.wait(timeout)

    # ------------------------------------------------------------------ reads (at start)
    def live_jobs(self) -> list[Any]:
        """Jobs not in a terminal state, in queue order (priority desc, submit time, id)."""
        jobs = self.store.jobs(LIVE)
        return sorted(jobs, key=lambda j: (-j.priority, j.submit_time, j.id))

    def allocations(self) -> dict[int, Any]:
        return {a.job_id: a for a in self.store.allocations()}

    def remember(self, key: tuple[str, str, str], store_id: int) -> None:
        self._ids[key] = store_id

    def forget(self, key: tuple[str, str, str]) -> None:
        """The group is done and dropped from the operator's memory: drop its id too (after
        every write queued so far, which may still need it)."""
        def op() -> None:
            self._ids.pop(key, None)

        self._put(op)

    def tracked(self) -> int:
        """How many groups the journal keeps an id for (memory stays bounded: tests)."""
        return len(self._ids)

    # ------------------------------------------------------------------ writes
    def record(self, rec: GroupRecord, now: int) -> None:
        """Bring the group's store row to ``rec.phase`` (submitting it the first time)."""
        self._crash_point(f"store-{_STATE[rec.phase]}", rec)
        self._put(lambda: self._record(rec, now))

    def _crash_point(self, point: str, rec: GroupRecord) -> None:
        """Right before the store is told (crashpoints.py: a restart test may stop here, the
        store then behind the cluster)."""
        from fluxnetes.k8s import crashpoints

        crashpoints.hit(point, f"{rec.namespace}/{rec.name}", flush=self.drain)

    def cancel(self, store_id: int, now: int, reason: str) -> None:
        def op() -> None:
            from fluxnetes.store import JobState

            cur = str(self.store.get(store_id).state)
            if cur not in TERMINAL:
                self.store.transition(store_id, JobState.CANCELLED, now, reason)

        self._put(op)

    def release_nodes(self, rec: GroupRecord, nodes: Sequence[str], now: int, reason: str) -> None:
        self._crash_point("store-release", rec)

        def op() -> None:
            jid = self._ids.get(rec.key) or rec.store_id
            if jid is not None and str(self.store.get(jid).state) == "running":
                self.store.release_nodes(jid, nodes, now, reason)

        self._put(op)

    def release_part(self, rec: GroupRecord, left: Share, now: int) -> None:
        """Part of the group's share of one node given back (one of its pods there ended while
        others of it run on there): the store records ``left``, what the group still holds on
        that node, so a restart lays the group out with it (not the node's amount at its
        start: a leak until the group ends). Releases queued one after the other (no other
        write between) go out together, in one transaction."""
        from fluxnetes.store import NodeAmount

        self._crash_point("store-release-part", rec)
        amount = NodeAmount(name=left.node, cores=left.cores, gpus=left.gpus, memory=left.memory,
                            extra=dict(left.extra))
        with self._tail:
            if self._shrinks is not None and self._shrinks.add(rec, amount, now):
                return  # joined the burst queued last: written with it
            self._shrinks = _Shrinks(self)
            self._shrinks.add(rec, amount, now)
            self._q.put(self._shrinks.write)

    def _id(self, rec: GroupRecord) -> int:
        from fluxnetes.store import JobState, Submission

        jid = self._ids.get(rec.key) or rec.store_id
        if jid is None:
            found = self.store.find(*rec.key)
            if found is not None:
                jid = found.id
            else:
                sub = Submission(namespace=rec.namespace, name=rec.name, jobspec=rec.jobspec or "{}",
                                 size=max(1, rec.size), duration=max(0, rec.duration), priority=rec.priority,
                                 kind=rec.kind or "Pod", uid=rec.uid)
                state = JobState.PROVISIONAL if rec.phase == Phase.PROVISIONAL else JobState.PENDING
                jid = self.store.submit_many([sub], rec.submit, state=state)[0]
            self._ids[rec.key] = jid
        return jid

    def _record(self, rec: GroupRecord, now: int) -> None:
        from fluxnetes.store import JobState, NodeAmount

        jid = self._id(rec)
        target = _STATE[rec.phase]
        cur = str(self.store.get(jid).state)
        if cur == target or cur in TERMINAL or rec.phase == Phase.PROVISIONAL:
            return  # nothing to do; terminal rows never change; pending -> provisional is no decision

        def step(state: str, reason: str) -> None:
            nonlocal cur
            self.store.transition(jid, JobState(state), now, reason)
            cur = state

        def start() -> None:
            nonlocal cur
            if cur == "provisional":
                step("pending", "queued")
            nodes = [NodeAmount(name=s.node, cores=s.cores, gpus=s.gpus, memory=s.memory, extra=dict(s.extra))
                     for s in rec.shares]
            self.store.start(jid, now, at=rec.start or now, duration=rec.duration, nodes=nodes,
                             reason=rec.reason if rec.phase == Phase.RUNNING else "allocated")
            cur = "running"

        if target == "running":
            if cur == "running":
                return
            start()
        elif target == "completed":
            if cur != "running":
                if not rec.shares:
                    # it ran while no operator recorded where (found finished after a restart, its
                    # pods gone): the row must still end, never stay live to be queued again
                    log.warning("store: %s/%s completed without a recorded allocation", rec.namespace, rec.name)
                    step("cancelled", f"{rec.reason} (where it ran is not known)")
                    return
                start()  # it started while its start was being written: record both
            step("completed", rec.reason)
        elif target in ("reserved", "unsatisfiable"):
            if cur == "provisional":
                step("pending", "queued")
            if cur != target:
                step(target, rec.reason)
        else:  # pending, failed, cancelled: legal from every live state
            step(target, rec.reason)


class _Shrinks:
    """Partial releases written in one transaction: per group, per node, the latest amount
    left (absolute amounts: the latest says it all, and a retried write changes nothing)."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._left: dict[tuple[str, str, str], tuple[GroupRecord, dict[str, Any]]] = {}
        self._taken = False
        self._now = 0

    def add(self, rec: GroupRecord, amount: Any, now: int) -> bool:
        """Join this batch (under the journal's tail lock); False once the worker took it."""
        if self._taken:
            return False
        self._left.setdefault(rec.key, (rec, {}))[1][amount.name] = amount
        self._now = max(self._now, now)
        return True

    def write(self) -> None:
        from fluxnetes.store import AllocationError

        j = self._journal
        with j._tail:
            self._taken = True
        store = j.store
        with store.batch():  # one transaction (retried whole while the store is away)
            for key, (rec, left) in self._left.items():
                jid = j._ids.get(key) or rec.store_id
                if jid is None:
                    continue  # never recorded (its writes failed): nothing to shrink
                try:
                    store.shrink_nodes(jid, list(left.values()), self._now)
                except AllocationError as exc:  # the store already says less (a bug otherwise)
                    log.warning("store: partial release of %s/%s not written: %s", rec.namespace, rec.name, exc)

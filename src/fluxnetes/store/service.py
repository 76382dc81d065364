"""The queue service: the adapter that runs the pure scheduling cycle against the store.

One cycle = one database transaction:
1. take the cycle lock (PostgreSQL advisory lock; SQLite's write lock);
2. make the in-memory matcher equal to the store's live allocations: on the first cycle, and
   after any failure, a fresh matcher from ``matcher_factory`` gets every recorded allocation
   replayed with ``update_allocate``; otherwise the recorded allocations are diffed against
   what the matcher holds (jobs that ended elsewhere are cancelled, new or partially
   released ones are (re)recorded) — the store is the truth, memory never is;
3. load the first queue-depth queued jobs, run ``fluxnetes.queue.schedule_cycle``;
4. write the decisions (starts with their allocations, reservations, rejections, events);
5. commit, then cancel this cycle's reservations in the matcher (they are recomputed
   every cycle), so the matcher holds exactly the recorded allocations again.

A crash anywhere before the commit leaves the store as it was (the next process replays the
same allocations and decides again); after the commit the decisions are durable and the
started jobs are no longer queued, so nothing is lost and nothing starts twice.

Time comes from the ``clock`` callable (integer seconds); the service never reads the clock
itself.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.store.allocations import AllocationRecord, NodeAmount, node_amount
from fluxnetes.store.db import StoreUnavailable, redact
from fluxnetes.store.records import JobRecord
from fluxnetes.store.store import Store

log = logging.getLogger("fluxnetes.store.service")

BACKOFF_START = 0.5
BACKOFF_MAX = 30.0
FULL_GC_EVERY = 1_000  # cycles between full garbage collections (see _refreeze)


class _Tagged:
    """A queued job's jobspec carrying the store job id (parsed jobspecs are shared between
    identical texts, so identity cannot tell jobs apart)."""

    __slots__ = ("job_id", "spec")

    def __init__(self, spec: Any, job_id: int) -> None:
        self.spec = spec
        self.job_id = job_id

    @property
    def duration(self) -> int:
        return int(getattr(self.spec, "duration", 0) or 0)


def _request_key(spec: Any) -> tuple[Any, tuple[int, ...]]:
    """(structure, counts) of a jobspec's request. Two requests with the same structure
    compare by their fixed counts; a count range makes the counts part of the structure."""
    counts: list[int] = []
    fixed = True

    def walk(resources: Any) -> tuple[Any, ...]:
        nonlocal fixed
        out = []
        for r in resources:
            c = getattr(r, "count", None)
            lo, hi = getattr(c, "min", None), getattr(c, "max", None)
            if isinstance(lo, int) and lo == hi:
                counts.append(lo)
            else:
                fixed = False
                counts.append(hash(repr(c)))
            out.append(
                (
                    getattr(r, "type", repr(r)),
                    getattr(r, "unit", ""),
                    getattr(r, "exclusive", None),
                    getattr(r, "label", ""),
                    getattr(r, "id", ""),
                    walk(getattr(r, "with_", ())),
                )
            )
        return tuple(out)

    structure: Any = (
        walk(getattr(spec, "resources", ())),
        repr(getattr(spec, "constraint", None)),
        getattr(spec, "queue", ""),
    )
    if not fixed:
        return (structure, tuple(counts)), ()
    return structure, tuple(counts)


class _IdMatcher:
    """The matcher as the cycle sees it, for one cycle.

    * Every allocation/reservation is made under the store's job id, so the matcher never
      invents ids that could collide after a replay.
    * Plain ``allocate`` answers BUSY without asking the matcher when a request that it
      dominates was already BUSY in this cycle: same structure (types, nesting, units,
      exclusivity, labels, constraint, queue), every count at least as large, and a duration at
      least as long. Within a cycle resources are only taken (no cancel happened), and a
      request needing more of everything for longer cannot fit where a smaller one did not,
      so the answer is the same — only cheaper: on a full 1,024-node cluster most of a cycle's
      calls are such BUSY answers (~20 ms each).
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        # structure -> BUSY (counts, duration, answer), minimal ones only
        self._busy: dict[Any, list[tuple[tuple[int, ...], int, Any]]] = {}
        self._keys: dict[int, tuple[Any, tuple[int, ...]]] = {}
        self.errors: dict[int, str] = {}  # job id -> matcher exception text

    def _key(self, spec: Any) -> tuple[Any, tuple[int, ...]]:
        key = self._keys.get(id(spec))
        if key is None:
            key = _request_key(spec)
            self._keys[id(spec)] = key
        return key

    def allocate(self, jobspec: _Tagged, *, now: int, jobid: Any = None) -> Any:
        duration = jobspec.duration or _FOREVER
        structure, counts = self._key(jobspec.spec)
        known = self._busy.get(structure, [])
        for c, d, answer in known:
            if d <= duration and all(x >= y for x, y in zip(counts, c, strict=True)):
                return _Busy(answer.status, jobspec.job_id, answer.reason)
        try:
            answer = self._inner.allocate(jobspec.spec, now=now, jobid=jobspec.job_id)
        except Exception as e:
            return self._error(jobspec, e)
        if _status(answer) == "BUSY":
            kept = [
                e
                for e in known
                if not (e[1] >= duration and all(y >= x for x, y in zip(counts, e[0], strict=True)))
            ]
            self._busy[structure] = [*kept, (counts, duration, answer)]
        return answer

    def allocate_orelse_reserve(self, jobspec: _Tagged, *, now: int, jobid: Any = None) -> Any:
        try:
            return self._inner.allocate_orelse_reserve(jobspec.spec, now=now, jobid=jobspec.job_id)
        except Exception as e:
            return self._error(jobspec, e)

    def _error(self, jobspec: _Tagged, exc: Exception) -> Any:
        """The matcher failed on this job (a bug or a request it cannot handle): the job fails
        with the reason instead of failing every cycle; the matcher is rebuilt afterwards."""
        log.error("store: the matcher failed on job %s: %r", jobspec.job_id, exc)
        reason = f"matcher error: {type(exc).__name__}: {exc}"
        self.errors[jobspec.job_id] = reason
        return _Busy("UNSATISFIABLE", jobspec.job_id, reason)

    def cancel(self, jobid: Any) -> Any:
        self._busy.clear()  # resources came back: earlier BUSY answers may be stale
        return self._inner.cancel(jobid)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name == "satisfiability":

            def satisfiability(js: Any, *a: Any, **kw: Any) -> Any:
                if not isinstance(js, _Tagged):
                    return attr(js, *a, **kw)
                try:
                    return attr(js.spec, *a, **kw)
                except Exception as e:
                    return self._error(js, e)

            return satisfiability
        return attr


_FOREVER = 2**62


@dataclasses.dataclass(frozen=True)
class _Busy:
    """A BUSY answer repeated for another job (the fields the cycle reads)."""

    status: Any
    jobid: Any
    reason: str = ""
    at: int = 0
    duration: int = 0
    nodes: tuple[Any, ...] = ()


def _status(result: Any) -> str:
    status = result.status
    return str(getattr(status, "name", status)).upper()


def _default_node_share() -> Callable[[NodeAmount], Any]:
    import importlib

    try:
        node_share = importlib.import_module("fluxnetes.match").NodeShare
    except (ImportError, AttributeError):  # no matcher yet: replay the store's own records
        return lambda n: n

    def make(n: NodeAmount) -> Any:
        return node_share(
            name=n.name,
            path=n.path,
            cores=n.cores,
            gpus=n.gpus,
            memory=n.memory,
            extra=dict(n.extra),
        )

    return make


def _default_cycle() -> Callable[..., Any]:
    from fluxnetes.queue.cycle import schedule_cycle

    return schedule_cycle


def _default_policy() -> Any:
    from fluxnetes.queue.policy import QueuePolicy

    return QueuePolicy(name="easy")


def _default_parse() -> Callable[[str], Any]:
    from fluxnetes.jobspec import parse_jobspec

    return parse_jobspec


@dataclass
class CycleReport:
    """What one service cycle did (ids are store job ids)."""

    now: int
    skipped: bool = False  # another process holds the cycle lock
    rebuilt: bool = False  # the matcher was rebuilt from the store
    considered: int = 0
    started: list[int] = field(default_factory=list)
    reserved: dict[int, int] = field(default_factory=dict)  # id -> expected start
    unsatisfiable: dict[int, str] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # bad jobspec text


class QueueService:
    """Loads queued jobs, runs the pure cycle, persists its decisions; recovers from the store.

    * ``matcher_factory()``: a fresh Matcher on the current graph (no allocations).
    * ``clock()``: now, integer seconds.
    * ``policy``: a ``fluxnetes.queue.QueuePolicy`` (its ``queue_depth`` bounds what a cycle
      loads; None = all queued jobs).
    * ``freeze_gc``: after building a matcher and after each cycle, move what survived out of
      the garbage collector's view (``gc.freeze``), so no full collection walks the graph and
      its allocations in the middle of a cycle (pauses of up to 1 s on 1,024 nodes otherwise);
      a full collection runs every ``FULL_GC_EVERY`` cycles, between cycles.
    """

    def __init__(
        self,
        store: Store,
        matcher_factory: Callable[[], Any],
        *,
        clock: Callable[[], int],
        policy: Any = None,
        cycle: Callable[..., Any] | None = None,
        parse: Callable[[str], Any] | None = None,
        node_share: Callable[[NodeAmount], Any] | None = None,
        freeze_gc: bool = True,
    ) -> None:
        self.store = store
        self.matcher_factory = matcher_factory
        self.clock = clock
        self.policy = policy if policy is not None else _default_policy()
        self._cycle = cycle or _default_cycle()
        self._parse = parse or _default_parse()
        self._node_share = node_share or _default_node_share()
        self.matcher: Any = None
        self._known: dict[int, int] = {}  # job id -> allocation revision the matcher holds
        self._specs: dict[int, Any] = {}  # parsed jobspecs of queued jobs (text is immutable)
        self.ready = False
        self.last_error = ""
        self.replay_errors: dict[int, str] = {}
        self.freeze_gc = freeze_gc
        self._cycles_since_full = 0

    # ------------------------------------------------------------------ matcher state

    def _replay(self, alloc: AllocationRecord) -> None:
        placement = [self._node_share(n) for n in alloc.nodes]
        try:
            self.matcher.update_allocate(
                alloc.job_id, placement, at=alloc.at, duration=alloc.duration
            )
            self.replay_errors.pop(alloc.job_id, None)
        except Exception as e:  # a recorded placement the graph cannot take (node gone...)
            self.replay_errors[alloc.job_id] = str(e)
            log.error("store: cannot replay the allocation of job %s: %s", alloc.job_id, e)
        self._known[alloc.job_id] = alloc.revision

    def _rebuild(self, s: Any) -> None:
        self.matcher = None
        if self.freeze_gc:
            gc.unfreeze()  # the previous graph (if any) becomes collectable again
        self.matcher = self.matcher_factory()
        self._known = {}
        self.replay_errors = {}
        allocs = Store.load_allocations(s)
        for alloc in allocs:
            self._replay(alloc)
        if self.freeze_gc:
            # The graph is millions of long-lived objects; without this every full collection
            # walks all of them (pauses of ~1 s in the middle of a cycle on a 1,024-node graph).
            gc.collect()
            gc.freeze()
        log.info("store: matcher rebuilt from %d recorded allocations", len(allocs))

    def _sync(self, s: Any) -> None:
        live = Store.live_revisions(s)
        for jid in [j for j in self._known if j not in live]:
            self._cancel(jid)
            del self._known[jid]
        stale = [j for j, rev in live.items() if self._known.get(j) != rev]
        if stale:
            for jid in stale:
                if jid in self._known:
                    self._cancel(jid)
            for alloc in Store.load_allocations(s, stale):
                self._replay(alloc)

    def _cancel(self, jid: int) -> None:
        if jid in self.replay_errors:
            self.replay_errors.pop(jid)
            return
        self.matcher.cancel(jid)

    def _refreeze(self) -> None:
        """Keep the collector's view small: what survived this cycle (new allocations in the
        matcher) joins the frozen graph, after a young-generation collection has cleared the
        cycle's own cyclic garbage. Every FULL_GC_EVERY cycles everything is unfrozen and
        collected once, so nothing that died later in a reference cycle is kept for long."""
        self._cycles_since_full += 1
        if self._cycles_since_full >= FULL_GC_EVERY:
            self._cycles_since_full = 0
            gc.unfreeze()
            gc.collect()
        else:
            gc.collect(1)
        gc.freeze()

    def recover(self) -> int:
        """Rebuild the matcher from the store now; returns the allocations replayed."""
        with self.store.session() as s:
            self._rebuild(s)
        return len(self._known)

    def invalidate(self) -> None:
        """The graph changed outside the queue: rebuild the matcher on the next cycle."""
        self.matcher = None

    # ------------------------------------------------------------------ the cycle

    def _spec(self, job: JobRecord) -> Any:
        spec = self._specs.get(job.id)
        if spec is None:
            spec = self._parse(job.jobspec)
            self._specs[job.id] = spec
        return spec

    def run_cycle(self) -> CycleReport:
        """One cycle at ``clock()``. Raises StoreUnavailable if the database is unreachable
        (nothing was decided then)."""
        from fluxnetes.queue.job import QueuedJob

        now = int(self.clock())
        report = CycleReport(now=now)
        depth = getattr(self.policy, "queue_depth", None)
        committed = False
        reservations: list[Any] = []
        try:
            with self.store.cycle_session() as s:
                if s is None:
                    report.skipped = True
                    return report
                if self.matcher is None:
                    self._rebuild(s)
                    report.rebuilt = True
                else:
                    self._sync(s)
                loaded = self.store.queued_for_cycle(s, depth if depth is not None else 10**9)
                queued = []
                for job in loaded:
                    try:
                        spec = self._spec(job)
                    except Exception as e:  # invalid text in the store: fail the job, say why
                        report.failed[job.id] = f"invalid jobspec: {e}"
                        continue
                    queued.append(
                        QueuedJob(
                            id=str(job.id),
                            jobspec=_Tagged(spec, job.id),
                            submit_time=job.submit_time,
                            priority=job.priority,
                            queue=job.queue,
                        )
                    )
                # from here the matcher changes before the commit: a failure means rebuild
                matcher, self.matcher = self.matcher, None
                wrapped = _IdMatcher(matcher)
                result = self._cycle(queued, wrapped, now, self.policy)
                report.considered = int(getattr(result, "considered", len(queued)))
                started = []
                for qj, res in result.started:
                    jid = int(qj.id)
                    rv1 = res.to_rv1() if hasattr(res, "to_rv1") else {}
                    started.append(
                        (
                            jid,
                            int(res.at),
                            int(res.duration),
                            rv1,
                            [node_amount(n) for n in res.nodes],
                        )
                    )
                    report.started.append(jid)
                for qj, res in result.reserved:
                    report.reserved[int(qj.id)] = int(res.at)
                    reservations.append(res)
                for qj, why in result.unsatisfiable:
                    if int(qj.id) in wrapped.errors:
                        report.failed[int(qj.id)] = wrapped.errors[int(qj.id)]
                    else:
                        report.unsatisfiable[int(qj.id)] = str(why)
                self.store.persist_decisions(
                    s,
                    now,
                    loaded=loaded,
                    started=started,
                    reserved=report.reserved,
                    unsatisfiable=report.unsatisfiable,
                    failed=report.failed,
                )
                for res in reservations:  # reservations are recomputed every cycle
                    matcher.cancel(res.jobid)
                reservations = []
            committed = True
            # after a matcher exception its state is suspect: rebuild it from the store
            self.matcher = None if wrapped.errors else matcher
            for jid in report.started:
                self._known[jid] = 0
            # keep parsed jobspecs of jobs still queued at the head only
            done = {*report.started, *report.unsatisfiable, *report.failed}
            self._specs = {
                j.id: self._specs[j.id] for j in loaded if j.id in self._specs and j.id not in done
            }
        finally:
            if not committed:
                self.matcher = None  # rebuilt from the store next time
        if self.freeze_gc:
            self._refreeze()
        self.ready = True
        self.last_error = ""
        return report

    # ------------------------------------------------------------------ resilience

    def step(self) -> CycleReport | None:
        """run_cycle, but a database outage is logged and reported (ready=False), not raised;
        any other error is logged with its traceback, also reported as not ready (the next
        cycle starts from the store again)."""
        try:
            return self.run_cycle()
        except StoreUnavailable as e:
            if self.ready or self.last_error != str(e):
                log.warning("%s; scheduling paused, will retry", e)
            self.ready = False
            self.last_error = str(e)
            return None
        except Exception as e:
            log.exception("store: scheduling cycle failed: %s", e)
            self.ready = False
            self.last_error = f"cycle failed: {type(e).__name__}: {e}"
            return None

    def run(
        self,
        stop: threading.Event,
        *,
        interval: float = 1.0,
        on_cycle: Callable[[CycleReport], None] | None = None,
    ) -> None:
        """Cycle every ``interval`` seconds until ``stop`` is set. While the database is down,
        retry with exponential backoff (0.5 s doubling to 30 s); never raise for an outage."""
        backoff = BACKOFF_START
        while not stop.is_set():
            report = self.step()
            if report is None:
                stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            backoff = BACKOFF_START
            if on_cycle is not None:
                on_cycle(report)
            stop.wait(interval)


def wait_for_store(
    url: str,
    *,
    stop: threading.Event | None = None,
    sleep: Callable[[float], Any] | None = None,
    attempts: int | None = None,
) -> Store | None:
    """Open (and migrate) the store, retrying with backoff while the database is down or not
    ready. Returns None if ``stop`` was set or ``attempts`` ran out."""
    stop = stop or threading.Event()
    wait = sleep or stop.wait
    backoff = BACKOFF_START
    n = 0
    while not stop.is_set():
        n += 1
        try:
            return Store.open(url)
        except StoreUnavailable as e:
            log.warning("store: %s not ready (%s); retrying in %.1fs", redact(url), e, backoff)
            if attempts is not None and n >= attempts:
                return None
            wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
    return None


__all__ = ["CycleReport", "QueueService", "wait_for_store"]

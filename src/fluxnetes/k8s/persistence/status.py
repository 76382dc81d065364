"""What a group says about itself: its phase (``set_phase``: log line, metrics, a store
transition, every phase kept as a FluxJob condition), Kubernetes Events (a token bucket caps
Normal ones at --event-rate), FluxJob create/status/spec writes (coalesced: a status is
written once it waited --status-interval, ``fluxjobs_due`` / ``flush_fluxjobs``), the store
record of a group, and the queue gauge. Owned state (private): the event bucket,
``_flushing``, ``_counts_dirty``; what it needs of the group book is ``StatusBook``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import OwnerRef
from fluxnetes.k8s.groups.group import Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.kube import EVENTS, FLUXJOBS, ApiError, short, transient
from fluxnetes.k8s.names import SCALE_SEP
from fluxnetes.k8s.objects import _dump_jobspec, _meta
from fluxnetes.k8s.persistence import fluxjob
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.resources import GPU
from fluxnetes.logging import log_context
from fluxnetes.metrics import METRICS

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")

# Normal Events per second, burst (Warnings are never dropped); --event-rate overrides the rate
EVENT_RATE, EVENT_BURST = 20.0, 200.0
# FluxJob writes per flush: a few round trips of the background connections (kube.py)
FLUSH_BATCH = 64


class StatusBook(Protocol):
    """What the status writer uses of the group book: the groups (and the count of those
    forgotten), and what it tells the book when a group ends or its last status is written."""

    @property
    def groups(self) -> GroupTable: ...
    @property
    def pruned(self) -> Mapping[str, int]: ...
    def spend_name(self, g: Group) -> None: ...
    def mark_finished(self, key: tuple[str, str]) -> None: ...
    def recheck_prune(self, g: Group) -> None: ...
    def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None: ...


class StatusWriter:
    """Phases, Events, FluxJob writes, store records: a component of its own (its state is
    private); the operator's other parts reach it as ``status``."""

    def __init__(self, ctx: Context, book: StatusBook) -> None:
        self._ctx, self._book = ctx, book
        self._counts_dirty = True
        self._flushing = False
        self._tokens, self._tokens_at, self._events_dropped = float(EVENT_BURST), time.monotonic(), 0

    # ---------------------------------------------------------------- told by the other parts
    @property
    def counts_dirty(self) -> bool:
        """Groups changed phase (or came or went) since the queue gauge was last set."""
        return self._counts_dirty

    @property
    def events_dropped(self) -> int:
        """Normal Events not sent (over --event-rate)."""
        return self._events_dropped

    def counts_changed(self) -> None:
        self._counts_dirty = True

    def start_flush(self) -> None:
        """Write the due FluxJobs in the background, unless such a flush is running."""
        if not self._flushing:
            self._flushing = True
            self._ctx.spawn(self._flush_once())

    def event(self, ref: Mapping[str, Any], etype: str, reason: str, message: str) -> None:
        # a token bucket (like client-go's event recorder) keeps a burst of thousands of jobs
        # from flooding the API server; every decision is also in the FluxJob's conditions
        now = time.monotonic()
        self._tokens = min(EVENT_BURST, self._tokens + (now - self._tokens_at) * self._ctx.config.event_rate)
        self._tokens_at = now
        if self._tokens < 1 and etype == "Normal":
            self._events_dropped += 1
            return
        self._tokens -= 1
        ns = ref.get("namespace") or "default"
        ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{ref.get('name')}.", "namespace": ns},
            "involvedObject": {k: ref[k] for k in ("apiVersion", "kind", "name", "namespace", "uid") if ref.get(k)},
            "type": etype, "reason": reason, "message": message[:1024],
            "source": {"component": "fluxnetes"}, "reportingComponent": "fluxnetes",
            "reportingInstance": self._ctx.config.identity,
            "firstTimestamp": ts, "lastTimestamp": ts, "eventTime": None, "count": 1,
        }
        del body["eventTime"]

        async def post() -> None:
            try:
                await self._ctx.kube.create(EVENTS, body, ns, background=True)
            except Exception as exc:
                log.debug("event not recorded: %r", exc)

        self._ctx.spawn(post())

    def pod_ref(self, pod: Mapping[str, Any]) -> dict[str, str]:
        m = _meta(pod)
        return {"apiVersion": "v1", "kind": "Pod", "name": m.get("name", ""), "namespace": m.get("namespace", ""),
                "uid": m.get("uid", "")}

    def group_ref(self, g: Group) -> dict[str, str] | None:
        """What an Event about group ``g`` names: its FluxJob when it has one (with its uid:
        ``kubectl describe fluxjob`` lists only the Events whose involvedObject has the
        object's uid) or is to have one; else its workload (``--fluxjobs waiting``, the
        default: a group placed at once gets no FluxJob, and an Event naming one would point
        at nothing); None for a group of bare pods without one (its pods are told)."""
        if g.fj_exists or g.fj_wanted or self._ctx.config.fluxjobs == "all" or not recovered_from_pods(g):
            ref = g.ref()
            if g.fj_exists and g.fj_uid:
                ref["uid"] = g.fj_uid
            return ref
        if g.spec.owner is not None:
            return {**g.spec.owner.as_dict(), "namespace": g.spec.namespace}
        return None

    def group_event(self, g: Group, etype: str, reason: str, message: str, pods: bool = True) -> None:
        ref = self.group_ref(g)
        if ref is not None:
            self.event(ref, etype, reason, message)
        elif not pods and g.members:
            # nothing but its pods to name: the first one by name says it for the group (one
            # Event, as one on its FluxJob would be, not one per pod of a large gang)
            ref = self.pod_ref(min(g.members.values(), key=lambda p: str(_meta(p).get("name", ""))))
            self.event(ref, etype, reason, message)
        if pods:
            for pod in list(g.members.values())[:50]:
                self.event(self.pod_ref(pod), etype, reason, message)

    def set_phase(self, g: Group, phase: Phase, reason: str) -> None:
        if g.phase != phase or g.reason != reason:
            changed = g.phase != phase
            before = g.phase
            if changed:
                self.keep_condition(g, before, g.reason)
                # the transition, at its time, even if no status write shows ``phase`` itself
                g.fj_status = {**g.fj_status, "history": fluxjob.with_history(
                    fluxjob.with_history(fluxjob.history_of(g.fj_status), before, g.reason, self._ctx.now()),
                    phase, reason, self._ctx.now())}
            g.phase, g.reason = phase, reason
            g.fj_dirty = True
            if phase.final:
                self._book.mark_finished(g.key)
                self._book.spend_name(g)
            self._ctx.wake()
            self._counts_dirty = True
            if changed and before == Phase.RUNNING:
                METRICS.release("full")  # the group gave everything back
            if changed:
                with log_context(job=g.qid, group=g.spec.name, namespace=g.spec.namespace):
                    log.info("%s: %s -> %s: %s", g.qid, before, phase, reason,
                             extra={"phase": str(phase), "previous": str(before), "reason": reason,
                                    "size": g.spec.size, "jobid": g.jobid})
            if changed and self._ctx.journal is not None:
                self._ctx.journal.record(self.group_record(g), self._ctx.now())

    def keep_condition(self, g: Group, phase: Phase, reason: str) -> None:
        """The group leaves ``phase``: if no status write showed it yet (status writes are
        coalesced, so a short job can go Pending -> Running -> Completed between two), its
        condition is added to the last written status, which the next write builds on
        (fluxjob.status keeps earlier conditions): every decision stays on the FluxJob."""
        if phase not in (Phase.PENDING, Phase.RESERVED, Phase.RUNNING, Phase.PREEMPTED):
            return
        conds = list(g.fj_status.get("conditions") or [])
        if g.fj_status.get("phase") == str(phase) or any(
                c.get("type") == str(phase) and c.get("message") == reason for c in conds):
            return
        at = g.start if phase == Phase.RUNNING and g.start else self._ctx.now()
        conds = [c for c in conds if c.get("type") != str(phase)]
        conds.append({"type": str(phase), "status": "False", "reason": str(phase), "message": reason,
                      "lastTransitionTime": fluxjob.rfc3339(at)})
        g.fj_status = {**g.fj_status, "conditions": conds}

    def end_run(self, g: Group, reason: str, now: int) -> None:
        """The group's run ends in the store (cancelled, ``reason``) while the group goes on,
        waiting to be allocated again (preempted and queued again, suspended by its user):
        under a new row (uid suffix ``~requeue-N``), which its next phase starts."""
        if self._ctx.journal is None:
            return
        rec = self.group_record(g)
        self._ctx.journal.record(replace(rec, phase=Phase.CANCELLED, reason=reason), now)
        self._ctx.journal.forget(rec.key)
        g.new_store_row(g.store_uid or rec.uid)

    def group_record(self, g: Group) -> Any:
        """A snapshot of the group for the store (see journal.GroupRecord)."""
        from fluxnetes.k8s.persistence.journal import GroupRecord

        if not g.store_uid:
            g.store_uid = g.spec.owner.uid if g.spec.owner else next(iter(g.members), "")
        return GroupRecord(
            namespace=g.spec.namespace, name=g.spec.name, uid=g.store_uid,
            kind=g.spec.owner.kind if g.spec.owner else "Pod", jobspec=self.jobspec_text(g),
            size=g.spec.size, duration=g.spec.duration, priority=g.spec.priority, submit=g.submit or self._ctx.now(),
            phase=g.phase, reason=g.reason, start=g.start or 0,
            shares=tuple(g.held.values()) if g.held else tuple(g.alloc), store_id=g.store_id)

    def jobspec_text(self, g: Group) -> str:
        # dumped once per group: YAML emitting costs milliseconds, and the text goes into the
        # FluxJob and into every store row of the group
        if g.jobspec_yaml is None:
            g.jobspec_yaml = _dump_jobspec(g.jobspec)
        return g.jobspec_yaml

    async def patch_fluxjob_spec(self, g: Group, spec: dict[str, Any]) -> None:
        try:
            await self._ctx.kube.patch(FLUXJOBS, g.spec.name, {"spec": spec, "metadata": fluxjob.write_meta()},
                                  g.spec.namespace, background=True)
        except ApiError as exc:
            log.info("FluxJob %s spec: %s", g.qid, exc)

    # ---------------------------------------------------------------- FluxJob writes
    def fluxjob_status(self, g: Group) -> dict[str, Any]:
        return fluxjob.status(
            g.phase, reason=g.reason, jobid=g.jobid if isinstance(g.jobid, int) else None,
            submit_time=g.submit, expected_start=g.expected_start if g.phase == Phase.RESERVED else None,
            start_time=g.start, end_time=g.end, nodes=g.slots, pods_seen=len(g.members), now=self._ctx.now(),
            previous=g.fj_status,
        ) | ({"shares": [s.as_dict() for s in g.held.values()], "released": sorted(g.released)}
             # a group that ended while some of its pods run on (node lost, cancelled) still
             # holds their shares: shown, so that views charge their nodes until they go
             if g.phase == Phase.RUNNING or g.held else {"shares": None, "released": None}) | self.pod_sets_status(g)

    @staticmethod
    def pod_sets_status(g: Group) -> dict[str, Any]:
        """A multi-role workload's pod sets (k8s/groups/podset_groups.py): name, pods, and once
        started the node of each of its slots. Nothing for a one-template group."""
        if not g.sets:
            return {}
        started = g.phase == Phase.RUNNING and len(g.slot_set) == len(g.slots)
        out = []
        for ps in g.sets:
            r = ps.request  # per pod, in the units of spec.request (kubectl fluxnetes charges each set its own)
            req = {"cpu": r.cpu_millis, "memory": r.memory_bytes, GPU: r.gpus, **r.extended}
            entry: dict[str, Any] = {"name": ps.name, "count": ps.count,
                                     "request": {k: v for k, v in req.items() if v}}
            if started:
                entry["nodes"] = [n for n, name in zip(g.slots, g.slot_set, strict=True) if name == ps.name]
            out.append(entry)
        return {"podSets": out}

    async def write_fluxjob(self, g: Group) -> None:
        """One API write: the FluxJob created with its status (the CRD has no status
        subresource), or its status merge-patched, with the uid as precondition so this group's
        status never lands on another group's FluxJob of the same name."""
        ns, name = g.spec.namespace, g.spec.name
        owner = g.spec.owner
        if g.phase.final and g.kind is not None and owner is not None and owner.uid \
                and self._book.owner_obj(owner, ns) is None:
            # its workload was deleted: its FluxJob goes too. Deleted here rather than left to
            # the garbage collector (owner reference), which after a mass delete takes minutes
            # while `kubectl get fluxjobs` shows the group Running; the collector then finds
            # it gone, so this is its write, not one more (a last status would be one more)
            if g.fj_exists and g.fj_uid:
                await self.delete_fluxjob(g)
            g.fj_exists = False
            return
        if self._ctx.crash_point("fluxjob-write", g.qid):
            return  # a restart test's hook drops it
        st = self.fluxjob_status(g)
        try:
            if not g.fj_exists:
                body = fluxjob.manifest(g.spec, jobspec=self.jobspec_text(g),
                                        match_policy=self._ctx.config.match_policy)
                body["status"] = fluxjob.sent_status(st)
                if g.spec.owner is None and g.spec.size == 1 and len(g.members) == 1:
                    # a lone pod owns its FluxJob: deleting the pod cleans it up
                    ref = self.pod_ref(next(iter(g.members.values())))
                    body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": ref["name"],
                                                            "uid": ref["uid"], "blockOwnerDeletion": False}]
                try:
                    created = await self._ctx.kube.create(FLUXJOBS, body, ns, background=True)
                    g.fj_uid = str(_meta(created).get("uid", ""))
                    written = True
                except ApiError as exc:
                    if exc.status != 409:
                        raise
                    taken = await self.take_over_fluxjob(g, body)
                    if taken is None:
                        g.fj_dirty = True  # an earlier group's FluxJob is still going away: later
                        return
                    written = taken
                g.fj_exists = True
                self._ctx.crash_point("fluxjob-created", g.qid)
                if written:
                    g.fj_status = st
                    self._ctx.crash_point("fluxjob-written", g.qid, phase=st.get("phase"))
                    return
            body_st = {"status": fluxjob.sent_status(st), "metadata": fluxjob.write_meta(g.fj_uid)}
            await self._ctx.kube.patch(FLUXJOBS, name, body_st, ns, background=True)
            g.fj_status = st
            self._ctx.crash_point("fluxjob-written", g.qid, phase=st.get("phase"))
        except ApiError as exc:
            if exc.namespace_terminating:
                # no write can land there, and the namespace's deletion takes the workload and
                # its group along: retrying every second (10,000 groups of a deleted namespace:
                # thousands of refused creates) only loads the API server. Written again if
                # the group changes and its namespace is still there.
                with log_context(job=g.qid, group=g.spec.name, namespace=ns):
                    log.info("FluxJob %s/%s not written: the namespace is being deleted", ns, name)
                return
            if exc.status in (404, 409):  # gone, or (uid precondition) another group's
                g.fj_exists, g.fj_uid = False, ""
                if g.phase.final and exc.status == 404:
                    return  # its owner is gone and took it along
            METRICS.reconcile_error("fluxjob")
            with log_context(job=g.qid, group=g.spec.name, namespace=ns):
                log.info("FluxJob %s/%s: %s", ns, name, exc)
            g.fj_dirty = True
        except Exception as exc:
            if not transient(exc):
                raise
            # the API server is away (restart, dropped connection): the status is written
            # again once it answers; until then the group stays due
            METRICS.reconcile_error("fluxjob")
            log.info("FluxJob %s/%s: not written (%s); trying again", ns, name, short(exc))
            g.fj_dirty = True

    async def delete_fluxjob(self, g: Group) -> None:
        """Delete the group's own FluxJob (uid precondition: never a newer group's of that name)."""
        try:
            await self._ctx.kube.request("DELETE", FLUXJOBS.path(g.spec.namespace, g.spec.name),
                                    {"preconditions": {"uid": g.fj_uid}}, background=True)
        except ApiError as exc:
            if exc.status not in (404, 409):  # gone already, or another group's now
                log.info("FluxJob %s/%s: not deleted (%s)", g.spec.namespace, g.spec.name, exc)
        except Exception as exc:
            if not transient(exc):
                raise
            log.info("FluxJob %s/%s: not deleted (%s); the garbage collector will", g.spec.namespace,
                     g.spec.name, short(exc))

    async def take_over_fluxjob(self, g: Group, body: Mapping[str, Any]) -> bool | None:
        """Creating the group's FluxJob found one of that name. Its own (same workload uid, or
        the same group made again after a restart): take it (False: its status is still to
        write). An earlier workload's (a Job deleted and created again under its name; the
        garbage collector has not removed its FluxJob yet): delete that one and create ours
        (True: created with its status). None: try again later."""
        ns, name = g.spec.namespace, g.spec.name
        cur = await self._ctx.kube.get_or_none(FLUXJOBS, name, ns)
        if cur is not None:
            theirs = str(((cur.get("spec") or {}).get("workload") or {}).get("uid", ""))
            ours = g.spec.owner.uid if g.spec.owner else ""
            if not theirs or not ours or theirs == ours:
                g.fj_uid = str(_meta(cur).get("uid", ""))
                return False
            with contextlib.suppress(ApiError):
                await self._ctx.kube.request("DELETE", FLUXJOBS.path(ns, name),
                                        {"preconditions": {"uid": _meta(cur).get("uid")}})
            log.info("FluxJob %s/%s belonged to an earlier %s of that name: replaced", ns, name,
                     g.spec.owner.kind if g.spec.owner else "object")
        try:
            created = await self._ctx.kube.create(FLUXJOBS, body, ns, background=True)
        except ApiError as exc:
            if exc.status != 409:
                raise
            return None
        g.fj_uid = str(_meta(created).get("uid", ""))
        return True

    async def _flush_once(self) -> None:
        try:
            await self.flush_fluxjobs()
        finally:
            self._flushing = False

    def fluxjobs_due(self, now: float) -> float | None:
        """Note when each FluxJob first needed a write; return how long until the earliest is
        due (0: now; None: nothing to write). A group's status is written once it has waited
        ``status_interval``: in a burst a group goes Pending, Running and placed within a
        second, and one status write instead of three or four halves the API server's work
        per job (each CRD status write costs it about 2 ms of CPU)."""
        dirty = self._book.groups.fj_dirty
        # in the order they came to need a write: those noted already come first, the new
        # ones at the end (the scan stops at the first one noted before)
        for g in reversed(dirty.values()):
            if g.fj_since is not None:
                break
            g.fj_since = now
        first = next(iter(dirty.values()), None)
        if first is None:
            return None
        since = now if first.fj_since is None else first.fj_since
        return max(0.0, since + self._ctx.config.status_interval - now)

    async def flush_fluxjobs(self, now: float | None = None) -> None:
        """Write the most urgent due FluxJobs, at most ``FLUSH_BATCH`` (the rest stay due: the
        loop flushes again once this one is done). The writes share a few connections: phase
        changes of live groups first, then other changes of live groups, then the ended; a
        bounded flush keeps a change made meanwhile from waiting behind thousands of writes
        (a mass delete: FluxJobs lagged minutes behind the queue after a restart)."""
        cutoff = (time.monotonic() if now is None else now) - self._ctx.config.status_interval
        due = [g for g in self._book.groups.fj_dirty.values() if (g.fj_since or 0.0) <= cutoff]
        if len(due) > FLUSH_BATCH:
            due.sort(key=lambda g: (g.phase.final, g.fj_status.get("phase") == str(g.phase)))
            due = due[:FLUSH_BATCH]
        for g in due:
            g.fj_dirty, g.fj_since = False, None
        wanted = [g for g in due if self.needs_fluxjob(g)]
        if wanted:
            await asyncio.gather(*(self.write_fluxjob(g) for g in wanted))
        for g in due:
            self._book.recheck_prune(g)  # (an ended group whose last status is written can go)

    def needs_fluxjob(self, g: Group) -> bool:
        """Does ``g`` get a FluxJob (its write is due: it changed ``status_interval`` ago)?
        With ``--fluxjobs all``, yes. With ``waiting``, only once it waited: it is still
        queued (or Provisional, Reserved, Preempted, Unsatisfiable) when its first write is due,
        or it ended otherwise than Completed (Failed, Cancelled): a group placed within
        ``status_interval`` of its arrival that runs and completes is shown by its workload and
        its pods' Events, and its recovery after a restart reads its placed pods (their
        ``fluxnetes.io/fluxjob`` and slot annotations), as for a crash before its FluxJob was
        written. Once wanted, a group keeps its FluxJob up to date (``fj_wanted``).

        Which groups may go without: those whose placed pods alone bring them back exactly
        after a restart (``recovery.group_of_placed`` / ``adopt_placed``: every slot read from
        its pod's annotation, at the size the slots say): a Job's, a ReplicaSet's or
        StatefulSet's base group, a label group and a lone pod. Every other group keeps one:
        a multi-role workload's (JobSet, LeaderWorkerSet, TrainJob, MPIJob: its pods are not
        read back into their group), an exclusive one or one with a jobspec of its user's
        (``adopt_placed`` cannot know their shares from the pods), and a replicated workload's
        scale group (rare; its recovery in this mode was not soaked). The first
        soak of this mode with every kind skipped overbooked nodes after a leader change (a
        ReplicaSet scaled up after its group was placed came back at its new replica count);
        that recovery bug, also the default mode's before a group's first FluxJob write, is
        fixed in ``recovery.group_of_placed`` (for a Job's parallelism as well); the next one
        (an accounting MISMATCH: a ReplicaSet scaled down came back from the store's allocation
        with its slots renumbered) in ``recovery.adopt_placed`` (pods before the store)."""
        if not g.fj_wanted and (self._ctx.config.fluxjobs == "all" or g.fj_exists
                                or not recovered_from_pods(g)
                                or g.phase not in (Phase.RUNNING, Phase.COMPLETED)):
            g.fj_wanted = True
        return g.fj_wanted

    def update_queue_gauge(self) -> None:
        counts: dict[str, int] = dict(self._book.pruned)  # groups over and forgotten still count
        for phase, n in self._book.groups.phase_counts().items():
            counts[phase] = counts.get(phase, 0) + n
        METRICS.set_queue_lengths(counts)
        self._counts_dirty = False


def recovered_from_pods(g: Group) -> bool:
    """Can ``g`` be taken back from its placed pods alone after a restart (see
    ``needs_fluxjob``)? Its recovery reads each pod's slot and the size the slots say."""
    if g.spec.exclusive or g.spec.jobspec or g.sets:
        return False
    if SCALE_SEP in g.spec.name:
        return False  # a scale group (told by its name: a label group so named keeps one too)
    k = g.kind
    return k is None or (not k.addon and (k.kind == "Job" or (k.owns_pods and k.resume_patch({}) is None)))

"""Preemption in the operator: the head of the queue, of higher QoS, makes room by evicting
whole lower-QoS groups (the decision: ``fluxnetes.queue.preempt.plan_preemption``; the rules
and their reasons are in its docstring and docs/preemption.md).

After each scheduling cycle (``consider_preemption``, called by ``run_cycle`` with the head
of the queue order): if preemption is on (``--preemption``), the head did not start, its
PriorityClass value is at least ``--preemption-min-priority`` and some running group of
strictly lower value may be preempted, the head's own reservation is withdrawn and the core
plans. A plan with victims is carried out at once:

* each victim gets FluxJob phase ``Preempted`` with a Warning Event naming the preemptor
  (``preempted by team-a/job-urgent (QoS high > low)``), and is evicted with
  ``Allocation.evict`` (a Job is suspended again by fluxnetes: its pods go, it is resumed when
  allocated again; pods of other groups are deleted, their controller re-creates them);
* while the victims' pods go, each gives its share back as it goes (the release paths of
  ``groupbook.member_gone``); meanwhile only the preemptor may start (``preemption_step``
  returns its id and ``run_cycle`` walks it alone), so nothing else takes the room made
  for it. It starts in the first cycle its placement fits, as in Kueue;
* a victim whose pods are all gone holds nothing any more: it is queued again (its Job still
  suspended by fluxnetes, so the next allocation resumes it; its old store row ends as
  cancelled and it continues under a new one, as a requeued Unsatisfiable group does) or,
  with ``--preemption-on-preempt fail``, fails.

If the victims are not gone after ``--preemption-grace-seconds`` the preemption in flight is
dropped (the queue walks normally again) and the head may plan again; victims still become
Pending once their pods are gone. Never preempted: groups of a protected class
(``--preemption-protected``, and every class above one billion: the system ones), groups of
equal or higher QoS, pods fluxnetes does not manage (they are not groups). A plan that finds
nothing is remembered for the same head and running set, so a blocked head does not ask the
matcher again every cycle; its reason is logged and shown by ``explain``.

Owned state (private): ``_preempting`` (the preemption in flight), ``_preempted`` (victim ->
preemptor, until requeued), ``_preempt_notes`` (head -> why it could not preempt),
``_preemptions``; what it needs of the others is ``PreemptionSide``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fluxnetes.k8s.context import Context
from fluxnetes.k8s.fairshare.accounts import SYSTEM_PRIORITY
from fluxnetes.k8s.groups.groupbook import QUEUED, Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.persistence.fluxjob import Phase

if TYPE_CHECKING:
    from fluxnetes.k8s.cluster.mirror import ClusterView
    from fluxnetes.k8s.fairshare.fairshare_book import FairShareBook
    from fluxnetes.k8s.groups import OwnerRef
    from fluxnetes.k8s.persistence.status import StatusWriter
    from fluxnetes.queue.preempt import RunningGroup

# one logger for every part of the state machine
log = logging.getLogger("fluxnetes.k8s.controller")


@dataclass
class InFlight:
    preemptor: str  # "namespace/name" of the group
    victims: tuple[str, ...]
    since: float  # monotonic


class FairShareSource(Protocol):
    """What preemption reads of the scheduling cycle: fair share's book (QoS) and a group's
    pod spec."""

    @property
    def fairshare(self) -> FairShareBook: ...
    def pod_spec_of(self, g: Group) -> Mapping[str, Any] | None: ...


class PreemptionSide(Protocol):
    """What preemption uses of the other parts: the groups, the cluster view's matcher and the
    queue's scheduler, fair share (QoS), the status writer, and eviction (allocation)."""

    @property
    def groups(self) -> GroupTable: ...
    @property
    def cluster(self) -> ClusterView: ...
    @property
    def scheduling(self) -> FairShareSource: ...
    @property
    def status(self) -> StatusWriter: ...
    async def evict(self, g: Group, pods: list[dict[str, Any]] | None = None) -> None: ...
    def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None: ...


class Preemption:
    """Plan and carry out preemptions for the head of the queue: a component of its own (its
    state is private); the scheduling cycle reaches it as ``preemption``."""

    def __init__(self, ctx: Context, side: PreemptionSide) -> None:
        self._ctx, self._side = ctx, side
        self._preempting: InFlight | None = None
        self._preempted: dict[str, str] = {}  # victim qid -> preemptor qid
        self._preempt_notes: dict[str, str] = {}  # head qid -> why it could not preempt
        self._preemptions = 0
        self._tried: tuple[str, frozenset[str]] | None = None  # (head, running groups) planned last
        self._preempt_scanned = False

    @property
    def preempt_notes(self) -> Mapping[str, str]:
        """Head of the queue -> why it could not preempt (shown by ``explain``)."""
        return self._preempt_notes

    # ---------------------------------------------------------------- each cycle
    def preemption_step(self, now: int) -> str | None:
        """Victims whose pods are gone are queued again (or failed); returns the preemptor's
        id while its victims are still going (then only it may start), else None."""
        if not self._preempt_scanned:
            # after a restart: groups shown Preempted by their FluxJob are still to requeue
            self._preempt_scanned = True
            for found in self._side.groups.values():
                if found.phase == Phase.PREEMPTED:
                    self._preempted.setdefault(found.qid, "")
        for qid, by in list(self._preempted.items()):
            g = self._side.groups.get(_key(qid))
            if g is None or g.phase != Phase.PREEMPTED:
                del self._preempted[qid]
                continue
            if g.held:
                continue  # some of its pods still run
            del self._preempted[qid]
            self.after_preemption(g, by, now)
        for qid in [q for q in self._preempt_notes if (self._side.groups.get(_key(q)) or _GONE).phase not in QUEUED]:
            del self._preempt_notes[qid]
        fl = self._preempting
        if fl is None:
            return None
        head = self._side.groups.get(_key(fl.preemptor))
        if head is None or head.phase not in QUEUED:
            self._preempting = None  # it started, or left the queue
            return None
        if not any(v in self._preempted for v in fl.victims):
            self._preempting = None  # every victim is gone: this cycle starts it
            return None
        if time.monotonic() - fl.since > self._ctx.config.preemption_grace_seconds:
            log.warning("preemption for %s: victims still running after %.0f s (%s); the queue goes on",
                        fl.preemptor, self._ctx.config.preemption_grace_seconds,
                        ", ".join(v for v in fl.victims if v in self._preempted))
            self._preempting = None
            self._tried = None
            return None
        return fl.preemptor

    def after_preemption(self, g: Group, by: str, now: int) -> None:
        """A victim's pods are all gone (it holds nothing): queue it again, or fail it."""
        by_text = f"preempted by {by}" if by else "preempted"
        requeue = self._ctx.config.preemption_on_preempt == "requeue" and self._requeueable(g)
        if not requeue:
            g.end = now
            self._side.status.set_phase(g, Phase.FAILED, by_text)
            self._side.status.group_event(g, "Warning", "Failed", g.reason, pods=False)
            return
        # the run that was preempted ends in the store; the group goes on under a new row
        self._side.status.end_run(g, f"{by_text}; queued again", now)
        g.forget_allocation()
        self._side.status.set_phase(g, Phase.PENDING, f"queued again: {by_text}")
        self._side.status.group_event(g, "Normal", "Requeued", g.reason, pods=False)
        self._ctx.dirty = True

    def _requeueable(self, g: Group) -> bool:
        """A Job (suspended again by fluxnetes: resumed when allocated) whose object is still
        there and not finished."""
        if g.kind is None or g.spec.owner is None or g.kind.resume_patch({}) is None:
            return False
        owner = self._side.owner_obj(g.spec.owner, g.spec.namespace)
        return owner is not None and not g.kind.finished(owner)

    # ---------------------------------------------------------------- deciding
    def qos_name(self, g: Group) -> str:
        spec = self._side.scheduling.pod_spec_of(g) or {}
        return str(spec.get("priorityClassName") or "")

    def running_groups(self, now: int) -> list[RunningGroup]:
        """Every running group as the planner sees it (foreign pods are no group: never here)."""
        from fluxnetes.queue.preempt import RunningGroup, over_share

        book = self._side.scheduling.fairshare
        rows = book.fs.rows(now) if book.enabled else {}
        protected = set(self._ctx.config.preemption_protected)
        out = []
        for g in self._side.groups.values():
            if g.phase != Phase.RUNNING or not isinstance(g.jobid, int) or not g.held:
                continue
            name = self.qos_name(g)
            account = book.account_of(g.qid) if book.enabled else ""
            row = rows.get(account)
            out.append(RunningGroup(
                id=g.qid, jobids=(g.jobid,), qos=g.spec.priority, start=g.start or now, qos_name=name,
                account=account, over_share=row is not None and over_share(row),
                # only Jobs can be queued again; other groups only when victims fail
                managed=self._ctx.config.preemption_on_preempt == "fail" or self._requeueable(g),
                protected=name in protected or g.spec.priority >= SYSTEM_PRIORITY,
                cores=sum(s.cores for s in g.held.values()),
            ))
        return out

    def consider_preemption(self, head: Any, started: set[str], now: int) -> None:
        """After a cycle: may the head of the queue (a QueuedJob) preempt? (module docstring)"""
        from fluxnetes.queue.preempt import Preemptor, may_preempt, plan_preemption

        if not self._ctx.config.preemption or head.id in started or self._preempting is not None:
            return
        if head.priority < self._ctx.config.preemption_min_priority:
            return
        g = self._side.groups.get(_key(head.id))
        if g is None or g.phase not in QUEUED:
            return
        running = self.running_groups(now)
        if not may_preempt(head.priority, running):
            self._preempt_notes[head.id] = (
                f"no running work of lower QoS than {self.qos_name(g) or head.priority} that may be preempted "
                "(protected and unmanaged work never is)")
            return
        tried = (head.id, frozenset(r.id for r in running))
        if self._tried == tried:
            return  # nothing changed since it was planned for
        self._tried = tried
        # the planner must not collide with the head's own reservation (queue/preempt.py)
        self._side.cluster.scheduler.withdraw(head.id)
        if g.phase == Phase.RESERVED:
            g.expected_start = None
        qos_name = self.qos_name(g)
        account = self._side.scheduling.fairshare.account_of(head.id) if self._side.scheduling.fairshare.enabled else ""
        matcher = self._side.cluster.matcher  # the plain matcher (the scheduler's is the timed one)
        plan = plan_preemption(matcher, Preemptor(head.id, head.jobspec, head.priority, qos_name, account),
                               running, now)
        if not plan.victims:
            if plan.victims is None:
                self._preempt_notes[head.id] = plan.reason
                log.info("preemption for %s: not possible: %s", head.id, plan.reason)
            self._ctx.dirty = True
            return
        self._preempt_notes.pop(head.id, None)
        self._preempting = InFlight(head.id, tuple(plan.victims), time.monotonic())
        self._preemptions += 1
        by_id = {r.id: r for r in running}
        for vid in plan.victims:
            v = self._side.groups[_key(vid)]
            self.preempt_group(v, head.id, plan.events.get(vid) or f"preempted by {head.id}")
        log.info("preemption for %s: %d group(s) evicted (%s; %d core-seconds of work lost, %d matcher questions)",
                 head.id, len(plan.victims), ", ".join(plan.victims), plan.work_lost, plan.trials)
        cores = sum(by_id[v].cores or 0 for v in plan.victims)
        self._side.status.group_event(g, "Normal", "Preempting",
                         f"evicting {len(plan.victims)} lower-QoS group(s) ({cores} cores) to start now: "
                         f"{', '.join(plan.victims)}", pods=False)
        self._ctx.dirty = True

    def preempt_group(self, g: Group, by: str, message: str) -> None:
        """Phase Preempted, a Warning Event naming the preemptor, and its pods sent away."""
        # the store row stays "running" while the pods go (journal._STATE): it holds its
        # resources until then; after_preemption ends the row
        self._side.status.set_phase(g, Phase.PREEMPTED, message)
        self._side.status.group_event(g, "Warning", "Preempted", message)
        self._preempted[g.qid] = by
        if g.kind is not None and g.spec.owner is not None:
            self._ctx.spawn(self._side.evict(g))
        else:
            self._ctx.spawn(self._delete_pods(g))

    async def _delete_pods(self, g: Group) -> None:
        from fluxnetes.k8s.kube import PODS, ApiError
        from fluxnetes.k8s.objects import _meta

        for pod in list(g.members.values()):
            try:
                await self._ctx.kube.delete(PODS, _meta(pod).get("name", ""), g.spec.namespace)
            except ApiError as exc:
                log.warning("preemption of %s: %s", g.qid, exc)


class _Gone:
    phase = Phase.CANCELLED


_GONE = _Gone()


def _key(qid: str) -> tuple[str, str]:
    ns, _, name = qid.partition("/")
    return ns, name

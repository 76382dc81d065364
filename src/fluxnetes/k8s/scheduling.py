"""One scheduling cycle over the queued groups: their jobspecs fitted to the nodes their pods
may use (``fit_groups``, k8s/nodefit.py), satisfiability judged (k8s/satisfiable.py), then the
core's pure queue cycle (fluxnetes.queue) decides; started groups go to ``start_group``,
reservations and Unsatisfiable are recorded. Unsatisfiable groups are looked at again when
nodes change (``reexamine_unsatisfiable``). Owned state: ``fitted``, ``judge``, ``cycles``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fluxnetes.k8s import fluxjob, nodefit
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.fluxjob import Phase
from fluxnetes.k8s.groupbook import QUEUED, Group
from fluxnetes.k8s.groups import OwnerRef
from fluxnetes.k8s.objects import _gated, _meta, _terminal
from fluxnetes.k8s.satisfiable import Judge
from fluxnetes.metrics import METRICS

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")


class Scheduling(Context):
    """The cycle: fit, judge, queue cycle, record its outcome."""

    if TYPE_CHECKING:  # what this part uses of the others (Controller joins them)
        groups: dict[tuple[str, str], Group]
        matcher: Any
        node_view: nodefit.NodeView
        nodes: dict[str, dict[str, Any]]
        scheduler: Any

        async def _patch_fluxjob_spec(self, g: Group, spec: dict[str, Any]) -> None: ...
        def flush_foreign(self) -> None: ...
        def group_event(self, g: Group, etype: str, reason: str, message: str, pods: bool = True) -> None: ...
        def jobspec_text(self, g: Group) -> str: ...
        def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None: ...
        def prune_finished(self) -> None: ...
        def set_phase(self, g: Group, phase: Phase, reason: str) -> None: ...
        def start_group(self, g: Group, res: Any) -> None: ...

    def init_scheduling(self) -> None:
        self.cycles = 0
        self.fitted: dict[tuple[str, str], tuple[int, Any, Any]] = {}  # key -> (version, base, fitted)
        self.judge = Judge()  # can a queued group ever run? (k8s/satisfiable.py, run_cycle)

    # ---------------------------------------------------------------- node rules
    def pod_spec_of(self, g: Group) -> Mapping[str, Any] | None:
        """The pod spec whose node rules a group follows: its workload's pod template, else
        its first pod by name (the pods of one group share one template in practice)."""
        if g.kind is not None:
            owner = self.owner_obj(g.spec.owner, g.spec.namespace)
            if owner is not None:
                return g.kind.template(owner).get("spec") or {}
        if g.members:
            first = min(g.members.values(), key=lambda p: str(_meta(p).get("name", "")))
            return first.get("spec") or {}
        return None

    def fit_groups(self) -> None:
        """Every waiting group's jobspec names the nodes its pods may run on (nodefit: their
        nodeSelector, required node affinity and taint tolerations), as a hostlist constraint,
        only when some node is excluded (otherwise the jobspec is left as it is). Done again
        when the group's jobspec was rebuilt or a node's labels or taints changed. A queued
        group that no node allows is Unsatisfiable, like any request this cluster can never
        run (the issue's rule; a user relabelling nodes recreates the workload)."""
        view = self.node_view
        if not view.synced:
            view.reset(self.nodes.values())
        changed = False
        for g in list(self.groups.values()):
            if g.jobspec is None or not (g.phase == Phase.PROVISIONAL or g.phase in QUEUED):
                continue
            done = self.fitted.get(g.key)
            current = done is not None and done[2] is g.jobspec
            if current and done is not None and done[0] == view.version:
                continue
            spec = self.pod_spec_of(g)
            if spec is None:
                continue
            base = done[1] if current and done is not None else nodefit.unconstrained(g.jobspec)
            f = view.fit(spec)
            if f.none:
                if g.phase in QUEUED:
                    self.fitted.pop(g.key, None)
                    self.scheduler.withdraw(g.qid)
                    g.end = self.now()
                    self.set_phase(g, Phase.UNSATISFIABLE, f"can never run on this cluster: {f.reason}")
                    self.group_event(g, "Warning", "Unsatisfiable", g.reason)
                continue  # provisional: judged once it is queued
            js = nodefit.constrain(base, f)
            if js.constraint == g.jobspec.constraint and js.attributes == g.jobspec.attributes:
                js = g.jobspec  # the same nodes as before
            else:
                g.jobspec, g.jobspec_yaml = js, None
                changed = True
                if g.fj_exists:  # the FluxJob's spec says what the matcher is asked
                    self.spawn(self._patch_fluxjob_spec(g, {"jobspec": self.jobspec_text(g)}))
            self.fitted[g.key] = (view.version, base, js)
        for key in [k for k in self.fitted if k not in self.groups]:
            del self.fitted[key]
        if changed:
            self.scheduler.invalidate()

    # ---------------------------------------------------------------- cycle
    def run_cycle(self) -> None:
        from fluxnetes.queue.job import QueuedJob

        self.flush_foreign()
        self.prune_finished()
        self.fit_groups()
        self.reexamine_unsatisfiable()
        now = self.now()
        pending = []
        for g in list(self.groups.values()):
            if g.phase not in QUEUED or g.jobspec is None:
                continue
            # every queued group, not only the one the matcher is asked to reserve for:
            # the count questions (queue/satisfy.py), answered once per graph version
            short = self.judge.short(g.key, g.jobspec, self.matcher)
            if short is not None:
                self.unsatisfiable(g, short)
                continue
            pending.append(QueuedJob(id=g.qid, jobspec=g.jobspec, submit_time=g.submit or now,
                                     priority=g.spec.priority))
        self.judge.keep_only(self.groups.keys())
        self.dirty = False
        if not pending:
            return
        self.cycles += 1
        with METRICS.time_cycle():
            result = self.scheduler.cycle(pending, now)
        by_id = {g.qid: g for g in self.groups.values() if g.phase in QUEUED}
        for job, res in result.started:
            self.start_group(by_id[job.id], res)
        for job, res in result.reserved:
            g = by_id[job.id]
            at = int(res.at)
            if g.expected_start != at or g.phase != Phase.RESERVED:
                g.expected_start = at
                self.set_phase(g, Phase.RESERVED, f"reserved; expected to start at {fluxjob.rfc3339(at)}")
                self.group_event(g, "Normal", "Reserved", g.reason)
        for job, reason in result.unsatisfiable:
            self.unsatisfiable(by_id[job.id], reason)
        for job in result.blocked:
            g = by_id[job.id]
            never = self.judge.never(g.key, g.jobspec, self.matcher)  # once per request shape
            if never is not None:
                self.unsatisfiable(g, never)
                continue
            if g.phase == Phase.RESERVED:
                g.expected_start = None
                self.set_phase(g, Phase.PENDING, f"waiting for resources{nodefit.note(g.jobspec)}")
            elif g.reason == "queued":
                self.set_phase(g, Phase.PENDING, f"waiting for resources{nodefit.note(g.jobspec)}")

    def unsatisfiable(self, g: Group, reason: str) -> None:
        """A queued group that can never run on this cluster as it is: out of the queue, the
        short resource named (looked at again when nodes change: reexamine_unsatisfiable)."""
        if g.phase in QUEUED:
            self.scheduler.withdraw(g.qid)
        g.end = self.now()
        g.expected_start = None
        self.set_phase(g, Phase.UNSATISFIABLE, f"can never run on this cluster: {reason}{nodefit.note(g.jobspec)}")
        self.group_event(g, "Warning", "Unsatisfiable", g.reason)

    def reexamine_unsatisfiable(self) -> None:
        """Nodes were added, removed or resized, or their labels/taints changed: an
        Unsatisfiable group whose workload still waits (a Job, gated pods) goes back to the
        queue if it could run now (its node rules, the count questions and the matcher's
        satisfiability walk all agree). Its store row stays unsatisfiable (a final state);
        the group continues under a new row."""
        if self.matcher is None or not self.judge.changed(self.matcher, self.node_view.version):
            return
        view = self.node_view
        for g in list(self.groups.values()):
            if g.phase != Phase.UNSATISFIABLE or g.jobspec is None or g.reason.startswith("invalid jobspec"):
                continue
            if not self.still_waits(g):
                continue
            spec = self.pod_spec_of(g)
            js = nodefit.unconstrained(g.jobspec)
            if spec is not None:
                f = view.fit(spec)
                if f.none:
                    continue
                js = nodefit.constrain(js, f)
            if self.judge.short(g.key, js, self.matcher) is not None or \
                    self.judge.never(g.key, js, self.matcher) is not None:
                continue
            if js is not g.jobspec:
                g.jobspec, g.jobspec_yaml = js, None
                if g.fj_exists:
                    self.spawn(self._patch_fluxjob_spec(g, {"jobspec": self.jobspec_text(g)}))
            self.fitted.pop(g.key, None)
            if self.journal is not None:
                if g.store_uid:
                    self.journal.forget((g.spec.namespace, g.spec.name, g.store_uid))
                base = g.store_uid or (g.spec.owner.uid if g.spec.owner else next(iter(g.members), ""))
                stem, _, n = base.rpartition("~requeue-")
                g.store_uid = f"{stem}~requeue-{int(n) + 1}" if stem and n.isdigit() else f"{base}~requeue-1"
                g.store_id = None
            g.end, g.expected_start = None, None
            self.set_phase(g, Phase.PENDING, "queued again: the cluster changed and the group can run on it now")
            self.group_event(g, "Normal", "Requeued", g.reason, pods=False)
            self.dirty = True

    def still_waits(self, g: Group) -> bool:
        """Is the group's work still there, held for fluxnetes (gated pods, or a workload
        that is neither finished nor gone)?"""
        if g.kind is not None and g.spec.owner is not None and g.kind.resume_patch({}) is not None:
            owner = self.owner_obj(g.spec.owner, g.spec.namespace)
            return owner is not None and not g.kind.finished(owner)
        return any(_gated(p) and not _terminal(p) for p in g.members.values())

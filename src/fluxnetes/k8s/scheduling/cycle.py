"""One scheduling cycle over the queued groups: their jobspecs fitted to the nodes their pods
may use (``fit_groups``, k8s/cluster/nodefit.py), satisfiability judged (k8s/scheduling/satisfiable.py), then the
core's pure queue cycle (fluxnetes.queue) decides; started groups go to ``start_group``,
reservations and Unsatisfiable are recorded. Unsatisfiable groups are looked at again when
nodes change (``reexamine_unsatisfiable``).

Fair share (docs/fairshare.md): the FluxAccounts and Namespaces the controller watches
configure ``fairshare`` (a ``k8s.fairshare_book.FairShareBook``) at the start of a cycle; the
book orders the queued groups (multifactor priority) and holds those over an account limit
(Pending, the limit named in the reason). What runs is charged to its account: each cycle
brings the book's running set in line with the groups (``sync_fairshare_usage``: started,
shrunk, ended), so every start, release and end path is covered without hooks in them. The
usage is read from the store on the first cycle and written back every
``--fairshare-save-seconds`` and on stop; account status and metrics every ~10 s. With no
FluxAccount the book is off and the queue keeps its plain order. Preemption runs after the
cycle (k8s/scheduling/preemption.py). Owned state: ``fitted``, ``judge``, ``cycles``, ``fairshare``,
``fluxaccounts``, ``namespaces_seen``."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from fluxnetes.k8s.cluster import nodefit
from fluxnetes.k8s.context import Context
from fluxnetes.k8s.fairshare.fairshare_book import FairShareBook
from fluxnetes.k8s.groups import OwnerRef
from fluxnetes.k8s.groups.groupbook import QUEUED, Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.objects import _gated, _meta, _terminal
from fluxnetes.k8s.persistence import fluxjob
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.scheduling.satisfiable import Judge
from fluxnetes.metrics import METRICS

if TYPE_CHECKING:
    from fluxnetes.k8s.cluster.mirror import ClusterView
    from fluxnetes.k8s.persistence.status import StatusWriter
    from fluxnetes.k8s.scheduling.preemption import Preemption

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")

HELD = "held: "  # the reason of a group an account limit holds starts with this
PUBLISH_SECONDS = 10.0  # FluxAccount status and per-account metrics


def fairshare_config(config: Any) -> Any:
    """The core's FairShareConfig from the operator's flags (PriorityError names the field)."""
    from fluxnetes.queue.priority import FairShareConfig

    values: dict[str, Any] = {"algorithm": config.fairshare_algorithm, "half_life": int(config.fairshare_half_life),
                              "running_horizon": int(config.fairshare_running_horizon)}
    if config.fairshare_weights:
        values["weights"] = dict(config.fairshare_weights)
    return FairShareConfig.from_dict(values)


class CycleSide(Protocol):
    """What the scheduling cycle uses of the other parts: the groups and their workloads, the
    PriorityClasses, pruning, the cluster view (matcher, queue scheduler, node rules),
    preemption, allocation's start and the status writer."""

    @property
    def groups(self) -> GroupTable: ...
    @property
    def priority_classes(self) -> Mapping[str, int]: ...
    @property
    def cluster(self) -> ClusterView: ...
    @property
    def preemption(self) -> Preemption: ...
    @property
    def status(self) -> StatusWriter: ...
    def owner_obj(self, ref: OwnerRef | None, namespace: str) -> dict[str, Any] | None: ...
    def prune_finished(self) -> None: ...
    def start_group(self, g: Group, res: Any) -> None: ...


class SchedulingCycle:
    """The cycle: fit, judge, queue cycle, record its outcome; fair share's book. A component
    of its own (its state is private); the other parts reach it as ``scheduling``."""

    def __init__(self, ctx: Context, side: CycleSide) -> None:
        self._ctx, self._side = ctx, side
        self._cycles = 0
        self._fitted: dict[tuple[str, str], tuple[int, Any, Any]] = {}  # key -> (version, base, fitted)
        self._judge = Judge()  # can a queued group ever run? (k8s/scheduling/satisfiable.py, run_cycle)
        from fluxnetes.k8s.fairshare.fairshare_book import default_metrics

        store = self._ctx.journal.store if self._ctx.journal is not None else None
        self._fairshare = FairShareBook(fairshare_config(self._ctx.config), store=store, metrics=default_metrics(),
                                       now=self._ctx.now())
        self._fluxaccounts: dict[str, dict[str, Any]] = {}  # name -> FluxAccount
        self._namespaces_seen: dict[str, dict[str, Any]] = {}  # name -> Namespace
        self._accounts_dirty = False
        self._fs_loaded = False
        self._fs_classes: dict[str, int] | None = None
        self._fs_cores = -1
        self._fs_cap: dict[str, int] | None = None
        self._fs_cap_sum = 0
        self._fs_published = self._fs_saved = 0.0  # monotonic times of the last publish / save
        self._fs_saving = False
        # running groups' charges as last summed (qid -> held shares' identity and counts)
        self._fs_charged: dict[str, tuple[int, int, int]] = {}
        self._fs_usage: Any = None  # the ledger they were charged to

    # ---------------------------------------------------------------- read by the other parts
    @property
    def fairshare(self) -> FairShareBook:
        return self._fairshare

    @property
    def cycles(self) -> int:
        """Cycles run so far."""
        return self._cycles

    # ---------------------------------------------------------------- fair share
    def on_account_object(self, kind: str, etype: str, obj: Mapping[str, Any]) -> None:
        """A FluxAccount or Namespace changed: the book is configured again at the next cycle."""
        name = str(_meta(obj).get("name") or "")
        table = self._fluxaccounts if kind == "FluxAccount" else self._namespaces_seen
        if kind == "Namespace" and etype != "DELETED":
            old = table.get(name)
            if old is not None and _account_choice(old) == _account_choice(obj):
                table[name] = dict(obj)
                return  # a namespace change that does not touch its account
        if etype == "DELETED":
            table.pop(name, None)
        else:
            table[name] = dict(obj)
        self._accounts_dirty = True
        self._ctx.dirty = True

    def configure_fairshare(self, now: int) -> None:
        """Bring the book up to date with the watched objects (start of each cycle)."""
        book = self._fairshare
        if self._accounts_dirty:
            self._accounts_dirty = False
            was = book.enabled
            for notice in book.configure(self._fluxaccounts.values(), self._namespaces_seen.values(), now):
                log.warning("fair share: %s", notice.message)
                self._side.status.event(notice.ref, "Warning", notice.reason, notice.message)
            if book.enabled != was:
                log.info("fair share %s (%d FluxAccounts)", "on" if book.enabled else "off", len(book.listed))
                self._side.cluster.scheduler.invalidate()
        if not self._fs_loaded:
            self._fs_loaded = True
            try:
                rows = book.load(now)
            except Exception as exc:  # the store is down: usage starts from zero, logged
                log.warning("fair share: cannot read the saved usage: %s", exc)
            else:
                if rows:
                    log.info("fair share: usage of %d account(s) read from the store", rows)
        if self._fs_classes != self._side.priority_classes:
            self._fs_classes = dict(self._side.priority_classes)
            book.set_priority_classes(self._side.priority_classes)
        cores = self._cluster_cores()
        if cores != self._fs_cores:
            self._fs_cores = cores
            book.set_total_cores(cores)

    def _cluster_cores(self) -> int:
        # the scheduler's per-node cores (a new dict whenever nodes change: mirror.sync_node_cores)
        cap = getattr(self._side.cluster.scheduler, "_node_cap", None)
        if not isinstance(cap, dict):
            return 0
        if self._fs_cap is not cap:
            self._fs_cap, self._fs_cap_sum = cap, sum(cap.values())
        return self._fs_cap_sum

    def sync_fairshare_usage(self, now: int) -> None:
        """Charge what runs: every running group (also recovered ones) is recorded as started,
        resized when part of it was given back, ended once it holds nothing. Only the groups
        whose phase or holdings changed since the last call are looked at (the table's
        ``touched``; all of them for a new ledger); an end is dated at the group's end time."""
        book = self._fairshare
        usage = book.fs.usage
        table = self._side.groups
        keys: Iterable[tuple[str, str]] = table.take_touched()
        if usage is not self._fs_usage:  # a new ledger (the account tree changed): charge anew
            self._fs_usage, self._fs_charged = usage, {}
            keys = list(table)
        charged = self._fs_charged
        for key in keys:
            g = table.get(key)
            qid = f"{key[0]}/{key[1]}"
            if g is not None and g.phase == Phase.RUNNING and g.held:
                # what it holds changes only with its held shares and released slots: a group
                # charged for the same ones is not summed again
                mark = (id(g.held), len(g.held), len(g.released))
                known = usage.resources_of(qid)
                if known is not None and charged.get(qid) == mark:
                    continue
                res = book.resources_of(g.held.values())
                if known is None:
                    book.record_start(qid, now, res)
                elif known != res:
                    book.record_resize(qid, res, now)
                if usage.resources_of(qid) is not None:
                    charged[qid] = mark
                else:
                    table.touched.add(key)  # not recorded (yet): asked again next time
            elif usage.resources_of(qid) is not None:
                self._fs_end(qid, g, now)
        if len(charged) != usage.running_count():  # the ledger and the charges disagree
            running = set(usage.running())
            for qid in [q for q in charged if q not in running]:  # ended by the ledger itself
                del charged[qid]
                table.touched.add(_key(qid))  # (still running: charged again next time)
            for qid in [q for q in running if q not in charged]:  # running for the ledger alone
                self._fs_end(qid, table.get(_key(qid)), now)

    def _fs_end(self, qid: str, g: Group | None, now: int) -> None:
        end = g.end if g is not None and g.end is not None else now
        self._fairshare.record_end(qid, min(int(end), now))
        self._fs_charged.pop(qid, None)

    def fairshare_chores(self, now: int) -> None:
        """Status, metrics, saving (background tasks; each at most one at a time)."""
        import time

        book = self._fairshare
        mono = time.monotonic()
        if mono - self._fs_published >= PUBLISH_SECONDS and (book.enabled or book.listed):
            self._fs_published = mono
            book.update_metrics(now)
            self._ctx.spawn(book.publish(self._ctx.kube, now))
        if book.store is not None and book.loaded and not self._fs_saving \
                and mono - self._fs_saved >= self._ctx.config.fairshare_save_seconds:
            self._fs_saved = mono
            self._fs_saving = True
            self._ctx.spawn(self._save_usage(now))

    async def _save_usage(self, now: int) -> None:
        try:
            await self._fairshare.save_async(now)
        except Exception as exc:
            log.warning("fair share: cannot save the usage: %s", exc)
        finally:
            self._fs_saving = False

    def save_fairshare_now(self) -> None:
        """On stop: the usage as of now into the store (so a restart loses none of it)."""
        book = self._fairshare
        if book.store is None or not book.loaded:
            return
        try:
            now = self._ctx.now()
            self.sync_fairshare_usage(now)
            book.save(now)
        except Exception as exc:
            log.warning("fair share: cannot save the usage on stop: %s", exc)

    def explain_priority(self, g: Group) -> str:
        """One line: the group's priority and its factors (and the limit holding it)."""
        from fluxnetes.queue.job import QueuedJob

        if not self._fairshare.enabled or g.jobspec is None:
            return ""
        job = QueuedJob(id=g.qid, jobspec=g.jobspec, submit_time=g.submit or self._ctx.now(), priority=g.spec.priority)
        return self._fairshare.breakdown(job, self._ctx.now()).explain()

    # ---------------------------------------------------------------- node rules
    def pod_spec_of(self, g: Group) -> Mapping[str, Any] | None:
        """The pod spec whose node rules a group follows: its workload's pod template, else
        its first pod by name (the pods of one group share one template in practice)."""
        if g.kind is not None:
            owner = self._side.owner_obj(g.spec.owner, g.spec.namespace)
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
        view = self._side.cluster.node_view
        if not view.synced:
            view.reset(self._side.cluster.nodes.values())
        changed = False
        table = self._side.groups
        waiting = (Phase.PROVISIONAL, *QUEUED)
        for g in table.in_phase(*waiting):
            if g.jobspec is None:
                continue
            done = self._fitted.get(g.key)
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
                    self._fitted.pop(g.key, None)
                    self._side.cluster.scheduler.withdraw(g.qid)
                    g.end = self._ctx.now()
                    self._side.status.set_phase(g, Phase.UNSATISFIABLE, f"can never run on this cluster: {f.reason}")
                    self._side.status.group_event(g, "Warning", "Unsatisfiable", g.reason)
                continue  # provisional: judged once it is queued
            js = nodefit.constrain(base, f)
            if js.constraint == g.jobspec.constraint and js.attributes == g.jobspec.attributes:
                js = g.jobspec  # the same nodes as before
            else:
                g.jobspec, g.jobspec_yaml = js, None
                changed = True
                if g.fj_exists:  # the FluxJob's spec says what the matcher is asked
                    self._ctx.spawn(self._side.status.patch_fluxjob_spec(g, {"jobspec": self._side.status.jobspec_text(g)}))
            self._fitted[g.key] = (view.version, base, js)
        # forget the answers of groups gone or no longer waiting, once they outnumber the rest
        # (a sweep per cycle over every group ever fitted cost as much as the fitting)
        if len(self._fitted) > 2 * sum(len(table.by_phase[p]) for p in waiting) + 1024:
            self._fitted = {k: v for k, v in self._fitted.items()
                           if (w := table.get(k)) is not None and w.phase in waiting}
        if changed:
            self._side.cluster.scheduler.invalidate()

    # ---------------------------------------------------------------- cycle
    def run_cycle(self) -> None:
        from fluxnetes.queue.job import QueuedJob, queue_order

        self._side.cluster.flush_foreign()
        self._side.prune_finished()
        self.fit_groups()
        self.reexamine_unsatisfiable()
        now = self._ctx.now()
        book = self._fairshare
        self.configure_fairshare(now)
        self.sync_fairshare_usage(now)
        only = self._side.preemption.preemption_step(now)  # a preemption in flight: only its preemptor may start
        pending = []
        by_id: dict[str, Group] = {}
        for g in self._side.groups.in_phase(*QUEUED):
            if g.jobspec is None:
                continue
            # every queued group, not only the one the matcher is asked to reserve for:
            # the count questions (queue/satisfy.py), answered once per graph version
            short = self._judge.short(g.key, g.jobspec, self._side.cluster.matcher)
            if short is not None:
                self.unsatisfiable(g, short)
                continue
            pending.append(QueuedJob(id=g.qid, jobspec=g.jobspec, submit_time=g.submit or now,
                                     priority=g.spec.priority))
            by_id[g.qid] = g
        self._judge.keep_only(self._side.groups.keys())
        self._ctx.dirty = False
        self.fairshare_chores(now)
        if not pending:
            book.arrange([], now)  # the per-account queued/held counts go back to 0
            return
        self._cycles += 1
        with METRICS.time_cycle():
            if book.enabled:
                order, held = book.arrange(pending, now)
            else:
                order, held = queue_order(pending), {}
            for job_id, why in held.items():
                self.hold(by_id[job_id], why)
            if only is not None:
                order = [j for j in order if j.id == only]
            result = self._side.cluster.scheduler.cycle(order, now, ordered=True)
        started = {job.id for job, _ in result.started}
        for job, res in result.started:
            self._side.start_group(by_id[job.id], res)
        if started:
            self.sync_fairshare_usage(now)
        for job, res in result.reserved:
            g = by_id[job.id]
            at = int(res.at)
            if g.expected_start != at or g.phase != Phase.RESERVED:
                g.expected_start = at
                self._side.status.set_phase(g, Phase.RESERVED, f"reserved; expected to start at {fluxjob.rfc3339(at)}")
                self._side.status.group_event(g, "Normal", "Reserved", g.reason)
        for job, reason in result.unsatisfiable:
            self.unsatisfiable(by_id[job.id], reason)
        for job in result.blocked:
            g = by_id[job.id]
            never = self._judge.never(g.key, g.jobspec, self._side.cluster.matcher)  # once per request shape
            if never is not None:
                self.unsatisfiable(g, never)
                continue
            if g.phase == Phase.RESERVED:
                g.expected_start = None
                self._side.status.set_phase(g, Phase.PENDING, f"waiting for resources{nodefit.note(g.jobspec)}")
            elif g.reason == "queued" or g.reason.startswith(HELD):
                self._side.status.set_phase(g, Phase.PENDING, f"waiting for resources{nodefit.note(g.jobspec)}")
        if order and only is None:
            self._side.preemption.consider_preemption(order[0], started, now)

    def hold(self, g: Group, why: str) -> None:
        """An account limit holds the group: Pending, the limit named (no reservation)."""
        reason = f"{HELD}{why}"
        if g.phase == Phase.RESERVED:
            self._side.cluster.scheduler.withdraw(g.qid)
            g.expected_start = None
        if g.phase != Phase.PENDING or g.reason != reason:
            self._side.status.set_phase(g, Phase.PENDING, reason)
            self._side.status.group_event(g, "Normal", "Held", why, pods=False)

    def unsatisfiable(self, g: Group, reason: str) -> None:
        """A queued group that can never run on this cluster as it is: out of the queue, the
        short resource named (looked at again when nodes change: reexamine_unsatisfiable)."""
        if g.phase in QUEUED:
            self._side.cluster.scheduler.withdraw(g.qid)
        g.end = self._ctx.now()
        g.expected_start = None
        self._side.status.set_phase(g, Phase.UNSATISFIABLE, f"can never run on this cluster: {reason}{nodefit.note(g.jobspec)}")
        self._side.status.group_event(g, "Warning", "Unsatisfiable", g.reason)

    def reexamine_unsatisfiable(self) -> None:
        """Nodes were added, removed or resized, or their labels/taints changed: an
        Unsatisfiable group whose workload still waits (a Job, gated pods) goes back to the
        queue if it could run now (its node rules, the count questions and the matcher's
        satisfiability walk all agree). Its store row stays unsatisfiable (a final state);
        the group continues under a new row."""
        if self._side.cluster.matcher is None or not self._judge.changed(self._side.cluster.matcher, self._side.cluster.node_view.version):
            return
        view = self._side.cluster.node_view
        for g in self._side.groups.in_phase(Phase.UNSATISFIABLE):
            if g.jobspec is None or g.reason.startswith("invalid jobspec"):
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
            if self._judge.short(g.key, js, self._side.cluster.matcher) is not None or \
                    self._judge.never(g.key, js, self._side.cluster.matcher) is not None:
                continue
            if js is not g.jobspec:
                g.jobspec, g.jobspec_yaml = js, None
                if g.fj_exists:
                    self._ctx.spawn(self._side.status.patch_fluxjob_spec(g, {"jobspec": self._side.status.jobspec_text(g)}))
            self.reopen(g)
            self._side.status.set_phase(g, Phase.PENDING, "queued again: the cluster changed and the group can run on it now")
            self._side.status.group_event(g, "Normal", "Requeued", g.reason, pods=False)
            self._ctx.dirty = True

    def reopen(self, g: Group) -> None:
        """An Unsatisfiable group is judged again (the cluster changed, or its workload was
        resized): its node fit is made afresh and, its store row being final, it continues
        under a new one (uid suffix ``~requeue-N``). The caller sets its next phase."""
        self._fitted.pop(g.key, None)
        if self._ctx.journal is not None:
            if g.store_uid:
                self._ctx.journal.forget((g.spec.namespace, g.spec.name, g.store_uid))
            g.new_store_row(g.store_uid or (g.spec.owner.uid if g.spec.owner else next(iter(g.members), "")))
        g.end, g.expected_start = None, None

    def still_waits(self, g: Group) -> bool:
        """Is the group's work still there, held for fluxnetes (gated pods, or a workload
        that is neither finished nor gone)?"""
        if g.kind is not None and g.spec.owner is not None and g.kind.resume_patch({}) is not None:
            owner = self._side.owner_obj(g.spec.owner, g.spec.namespace)
            return owner is not None and not g.kind.finished(owner)
        return any(_gated(p) and not _terminal(p) for p in g.members.values())


def _key(qid: str) -> tuple[str, str]:
    ns, _, name = qid.partition("/")
    return ns, name


def _account_choice(ns: Mapping[str, Any]) -> tuple[Any, Any]:
    from fluxnetes.k8s.fairshare.accounts import ACCOUNT_KEY

    md = _meta(ns)
    return ((md.get("labels") or {}).get(ACCOUNT_KEY), (md.get("annotations") or {}).get(ACCOUNT_KEY))

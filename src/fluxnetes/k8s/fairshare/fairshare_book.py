"""The operator's fair-share book: accounts from FluxAccounts, usage, order, limits, status.

One object (``FairShareBook``) between the controller and the pure core
(``fluxnetes.queue.priority.FairShare``): the controller tells it what the cluster holds
and what happens, and asks it the queue order and which jobs a limit holds.

How the controller drives it (times are the controller's ``now()``, int seconds; job ids
are the groups' ``namespace/name``, which is how a job finds its account)::

    book = FairShareBook(FairShareConfig(...), store=store)        # once
    book.configure(fluxaccounts, namespaces, now)                  # on start, then whenever a
                                                                   #   FluxAccount / Namespace changes
    book.load(now)                                                 # on start, before record_start
    book.set_priority_classes(self.priority_classes)               # when PriorityClasses change
    book.set_total_cores(cores)                                    # when nodes change (job-size factor)

    # each cycle, pending = the QueuedJobs of the queued groups:
    ordered, held = book.arrange(pending, now)                     # held: job id -> reason
    #   a held group: Pending with that reason (withdraw its reservation if it had one)
    result = scheduler.cycle(ordered, now, ordered=True)           # held jobs stay out

    book.record_start(g.qid, now, book.resources_of(g.alloc))      # a group started (also for
                                                                   #   groups recovered at start)
    book.record_resize(g.qid, book.resources_of(remaining), now)   # part of a group went away
    book.record_end(g.qid, now)                                    # finished / failed / cancelled
    await book.save_async(now)                                     # every minute or so (leader only)
    await book.publish(kube, now)                                  # every ~10 s: FluxAccount status
    book.update_metrics(now)                                       # with the other metrics

With no FluxAccount in the cluster fair share is off: ``arrange`` keeps the plain order
(priority, then submit time, then id) and holds nothing, so the operator behaves as before.
A FluxAccount the tree cannot be built with (a cycle, two defaults, ...) leaves the last
good configuration in force; ``configure`` returns the error as a ``Notice`` (post it as an
Event) and ``publish`` writes it into that FluxAccount's ``status.error``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from fluxnetes.k8s.fairshare import accounts as acc
from fluxnetes.k8s.kube import Resource
from fluxnetes.queue.accounts import ROOT
from fluxnetes.queue.limits import held_jobs
from fluxnetes.queue.priority import FairShare, FairShareConfig, Job, PriorityBreakdown
from fluxnetes.queue.usage import Resources, UsageError, job_resources

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from fluxnetes.k8s.kube import Kube
    from fluxnetes.store.store import Store
    from fluxnetes.store.usage import UsageRecord

log = logging.getLogger("fluxnetes.k8s.fairshare_book")  # its name from before the sub-packages

FLUXACCOUNTS = Resource("fluxnetes.io/v1alpha1", acc.PLURAL, namespaced=False)

J = TypeVar("J", bound=Job)


@dataclass(frozen=True)
class Notice:
    """Something to post as a Warning Event (``controller.event(ref, "Warning", reason,
    message)``): on ``ref``, a FluxAccount (cluster-scoped: the Event goes to "default") or
    a Namespace (the Event goes into it)."""

    ref: dict[str, str]
    reason: str
    message: str


@dataclass(frozen=True)
class AccountRow:
    """One account as ``kubectl fluxnetes accounts`` shows it (descendants included)."""

    name: str
    parent: str  # "" at the top of the tree
    depth: int  # 1 just under the top
    leaf: bool
    declared: bool  # a FluxAccount (False: the implicit default account)
    shares: int
    shares_norm: float
    usage: float  # decayed resource-seconds
    usage_norm: float
    factor: float
    running: int
    running_cores: int
    queued: int
    held: int
    namespaces: tuple[str, ...]

    def status(self) -> dict[str, Any]:
        """The FluxAccount ``status`` fields (rounded: the status is for people)."""
        return {
            "leaf": self.leaf,
            "normalizedShares": round(self.shares_norm, 6),
            "usage": round(self.usage, 1),
            "normalizedUsage": round(self.usage_norm, 6),
            "fairShare": round(self.factor, 6),
            "running": self.running,
            "runningCores": self.running_cores,
            "queued": self.queued,
            "held": self.held,
            "namespaces": list(self.namespaces),
        }


class AccountMetrics:
    """Per-account gauges (label ``account``), on prometheus_client's default registry by
    default, so the operator's /metrics serves them next to ``fluxnetes.metrics.METRICS``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import REGISTRY, Gauge

        r = registry if registry is not None else REGISTRY

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["account"], registry=r)

        self.shares = gauge("fluxnetes_account_shares_normalized",
                            "Fair share: the account's share of the whole cluster (0-1).")
        self.usage = gauge("fluxnetes_account_usage_resource_seconds",
                           "Fair share: decayed usage of the account and its sub-accounts.")
        self.factor = gauge("fluxnetes_account_fairshare_factor",
                            "Fair share: the account's fair-share factor (0-1, higher = more deserving).")
        self.running = gauge("fluxnetes_account_running_jobs", "Running jobs charged to the account.")
        self.running_cores = gauge("fluxnetes_account_running_cores", "Cores held by the account's running jobs.")
        self.queued = gauge("fluxnetes_account_queued_jobs", "Queued jobs charged to the account.")
        self.held = gauge("fluxnetes_account_held_jobs", "Queued jobs of the account held by a limit.")
        self._all = (self.shares, self.usage, self.factor, self.running, self.running_cores,
                     self.queued, self.held)
        self._accounts: set[str] = set()

    def update(self, rows: Iterable[AccountRow]) -> None:
        seen: set[str] = set()
        for row in rows:
            seen.add(row.name)
            self.shares.labels(row.name).set(row.shares_norm)
            self.usage.labels(row.name).set(row.usage)
            self.factor.labels(row.name).set(row.factor)
            self.running.labels(row.name).set(row.running)
            self.running_cores.labels(row.name).set(row.running_cores)
            self.queued.labels(row.name).set(row.queued)
            self.held.labels(row.name).set(row.held)
        for gone in self._accounts - seen:  # an account removed: its series ends
            for g in self._all:
                g.remove(gone)
        self._accounts = seen


_DEFAULT_METRICS: AccountMetrics | None = None


def default_metrics() -> AccountMetrics:
    """The process-wide per-account gauges (made once: a registry refuses a name twice)."""
    global _DEFAULT_METRICS
    if _DEFAULT_METRICS is None:
        _DEFAULT_METRICS = AccountMetrics()
    return _DEFAULT_METRICS


def _sort_key(job: Job) -> tuple[int, int, tuple[int, int, str]]:
    # the core queue's plain order (queue/job.py): priority, submit time, id
    job_id = job.id
    return (-job.priority, job.submit_time, (0, int(job_id), "") if job_id.isdigit() else (1, 0, job_id))


class FairShareBook:
    """Accounts (from FluxAccounts and Namespaces), usage, order, limits, status, metrics."""

    def __init__(self, config: FairShareConfig | None = None, *, default_account: str = acc.DEFAULT_ACCOUNT,
                 store: Store | None = None, metrics: AccountMetrics | None = None, now: int = 0) -> None:
        self.default_account = default_account
        self.store = store
        self.metrics = metrics
        self.accounts = acc.parse_accounts([], [], default_account=default_account)
        self.fs = FairShare(self.accounts.tree, config, account_of=self._account_name, start=now)
        self.error: acc.AccountConfigError | None = None  # the refused configuration, if any
        self.listed: tuple[str, ...] = ()  # every FluxAccount seen by the last configure
        self._problems: tuple[acc.Problem, ...] = ()
        self._queued: Counter[str] = Counter()  # leaf -> queued jobs (last arrange/held)
        self._held: Counter[str] = Counter()
        self._stored: dict[str, UsageRecord] = {}  # saved usage not applied yet (leaf unknown)
        self._published: dict[str, dict[str, Any]] = {}
        self.loaded = False  # load() ran: save() may write

    # --- configuration ----------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """At least one FluxAccount is in force."""
        return self.accounts.enabled

    @property
    def config(self) -> FairShareConfig:
        return self.fs.config

    def configure(self, fluxaccounts: Iterable[Mapping[str, Any]], namespaces: Iterable[Mapping[str, Any]],
                  now: int) -> list[Notice]:
        """Take the FluxAccounts and Namespaces now in the cluster. A bad FluxAccount keeps
        the last good configuration; the Notices say what to report (new problems only)."""
        objs = list(fluxaccounts)
        self.listed = tuple(str((o.get("metadata") or {}).get("name") or "") for o in objs)
        notices: list[Notice] = []
        try:
            parsed = acc.parse_accounts(objs, namespaces, default_account=self.default_account)
        except acc.AccountConfigError as exc:
            if self.error is None or str(exc) != str(self.error):
                name = exc.obj.removeprefix(f"{acc.KIND} ")
                ref = {"apiVersion": FLUXACCOUNTS.api_version, "kind": acc.KIND, "name": name} \
                    if name in self.listed else {"apiVersion": "v1", "kind": "Namespace", "name": "default"}
                notices.append(Notice(ref, "InvalidAccount",
                                      f"{exc}; keeping the last good account configuration"))
            self.error = exc
            return notices
        self.error = None
        if parsed.tree.nodes != self.accounts.tree.nodes or parsed.tree.default != self.accounts.tree.default:
            self.fs.reconfigure(parsed.tree, now)
        self.accounts = parsed
        for problem in parsed.problems:
            if problem not in self._problems:
                # the Event goes into that namespace: its users see it there
                notices.append(Notice({"apiVersion": "v1", "kind": "Namespace", "name": problem.namespace,
                                       "namespace": problem.namespace},
                                      "InvalidAccount", str(problem)))
        self._problems = parsed.problems
        self._apply_stored()
        return notices

    def set_priority_classes(self, classes: Mapping[str, int]) -> None:
        """QoS 1.0 is the highest PriorityClass below the system ones (``accounts.qos_max``)."""
        self.fs.config = replace(self.fs.config, qos_max=acc.qos_max(classes))

    def set_total_cores(self, cores: int) -> None:
        """The cluster's cores: the job-size factor's denominator."""
        self.fs.config = replace(self.fs.config, total_cores=max(int(cores), 0))

    def _account_name(self, job: Any) -> str:
        namespace = str(job.id).partition("/")[0]
        return self.accounts.namespaces.get(namespace, "")  # "": the default leaf

    def account_of(self, job_id: str) -> str:
        """The leaf account a job (``namespace/name``) charges."""
        return self.accounts.account_of_namespace(job_id.partition("/")[0])

    # --- the cycle --------------------------------------------------------------------

    def order(self, jobs: Iterable[J], now: int) -> list[J]:
        """The queue order: multifactor priority with fair share (plain order when off)."""
        if not self.enabled:
            return sorted(jobs, key=_sort_key)
        return self.fs.order(jobs, now)

    def arrange(self, pending: Iterable[J], now: int,
                running: Iterable[Job] | None = None) -> tuple[list[J], dict[str, str]]:
        """(the jobs a cycle may start, in queue order; job id -> reason for each job a limit
        holds). ``running``: the running jobs, default those recorded by ``record_start``."""
        ordered = self.order(pending, now)
        held = self._held_of(ordered, running)
        return [j for j in ordered if j.id not in held], held

    def held(self, running: Iterable[Job] | None, pending: Iterable[Job], now: int) -> dict[str, str]:
        """Job id -> reason naming the limit, for each pending job over a limit (counted in
        queue order, so ``maxQueuedJobs`` keeps the first ones)."""
        return self._held_of(self.order(pending, now), running)

    def _held_of(self, ordered: Sequence[Job], running: Iterable[Job] | None) -> dict[str, str]:
        if not ordered:
            # nothing queued (most cycles of a quiet queue: the cycle asks to zero the counts):
            # nothing is held and every count is 0, whichever branch below would run
            if self._queued:
                self._queued = Counter()
            if self._held:
                self._held = Counter()
            return {}
        tree = self.fs.tree
        leaf_of: dict[str, str] = {}

        def leaf(job: Job) -> str:
            ns = job.id.partition("/")[0]
            found = leaf_of.get(ns)
            if found is None:
                found = leaf_of[ns] = self.fs.leaf(job)
            return found

        if not any(node.limits.any() for node in tree.nodes.values()):
            # no limit anywhere: only the counts per account (this runs every cycle)
            per_ns = Counter(j.id.partition("/")[0] for j in ordered)
            first = {j.id.partition("/")[0]: j for j in reversed(ordered)}
            self._queued = Counter()
            for ns, n in per_ns.items():
                self._queued[leaf(first[ns])] += n
            self._held = Counter()
            return {}
        queue = [(j.id, leaf(j), job_resources(j)) for j in ordered]
        self._queued = Counter(q[1] for q in queue)
        if running is None:
            run = list(self.fs.usage.running_resources().values())
        else:
            run = [(leaf(j), job_resources(j)) for j in running]
        held = held_jobs(tree, run, queue)
        self._held = Counter(q[1] for q in queue if q[0] in held)
        return held

    def breakdown(self, job: Job, now: int) -> PriorityBreakdown:
        """A job's priority and its factors (``.explain()`` is one line for ``explain``)."""
        return self.fs.priority(job, now)

    # --- events -----------------------------------------------------------------------

    @staticmethod
    def resources_of(shares: Iterable[Any]) -> Resources:
        """What an allocation holds (``k8s.shares.Share`` list): cores, GPUs, nodes."""
        items = list(shares)
        return Resources(sum(int(s.cores) for s in items), sum(int(s.gpus) for s in items),
                         len({s.node for s in items}))

    def record_start(self, job: Job | str, now: int, resources: Resources | None = None) -> bool:
        """A job (or job id ``namespace/name``) started at ``now``; ``resources``: what it
        was given (default: from its jobspec; required with an id). False if it was already
        recorded (a restart recording it again)."""
        job_id = job if isinstance(job, str) else job.id
        if self.fs.usage.resources_of(job_id) is not None:  # (no copy of every running job per start)
            return False
        try:
            if resources is not None:
                self.fs.usage.start(job_id, self.account_of(job_id), resources, now)
            elif isinstance(job, str):
                raise TypeError("record_start(job id, ...) needs the resources it holds")
            else:
                self.fs.record_start(job, now)
        except (UsageError, ValueError) as exc:  # cannot happen with a valid tree; never fatal
            log.warning("fair share: job %s not charged: %s", job_id, exc)
            return False
        return True

    def record_end(self, job: Job | str, now: int) -> bool:
        return self.fs.record_end(job, now)

    def record_resize(self, job: Job | str, resources: Resources, now: int) -> bool:
        return self.fs.record_resize(job, resources, now)

    # --- what it shows ----------------------------------------------------------------

    def snapshot(self, now: int) -> list[AccountRow]:
        """Every account (and the implicit default, if it is one), in tree order."""
        tree = self.fs.tree
        rows = self.fs.rows(now)
        running: Counter[str] = Counter()
        cores: Counter[str] = Counter()
        for leaf, res in self.fs.usage.running_resources().values():
            for name in tree.path[leaf]:
                running[name] += 1
                cores[name] += res.cores
        queued: Counter[str] = Counter()
        held: Counter[str] = Counter()
        for leaf, n in self._queued.items():
            if leaf in tree.nodes:
                for name in tree.path[leaf]:
                    queued[name] += n
                    held[name] += self._held.get(leaf, 0)
        spaces = self.accounts.namespaces_of()
        declared = set(self.accounts.declared)
        out = []
        for name in tree.order:
            if name == ROOT:
                continue
            r = rows[name]
            parent = tree.nodes[name].parent
            out.append(AccountRow(
                name, "" if parent in (None, ROOT) else str(parent), len(tree.path[name]) - 1,
                tree.is_leaf(name), name in declared, r.shares_raw, r.shares_norm,
                r.usage_raw, r.usage_norm, r.factor, running[name], cores[name], queued[name], held[name],
                tuple(spaces.get(name, ())),
            ))
        return out

    def update_metrics(self, now: int) -> None:
        (self.metrics or default_metrics()).update(self.snapshot(now))

    # --- persistence ------------------------------------------------------------------

    def save(self, now: int) -> int:
        """Write every leaf's decayed usage as of ``now`` to the store. Nothing (0) without a
        store or before ``load``: a book that never read the saved usage (a replica that is
        not the leader) must not overwrite it."""
        if self.store is None or not self.loaded:
            return 0
        from fluxnetes.store.usage import save_usage

        return save_usage(self.store, self.fs.snapshot(now), now)

    async def save_async(self, now: int) -> int:
        """``save`` from the event loop: the figures are taken in the loop (no race with the
        cycle), the database write runs in a thread."""
        if self.store is None or not self.loaded:
            return 0
        import asyncio

        from fluxnetes.store.usage import save_usage

        return await asyncio.to_thread(save_usage, self.store, self.fs.snapshot(now), now)

    def load(self, now: int) -> int:
        """Read the saved usage back (on start, before the running groups are recorded with
        ``record_start(..., now)``: what they ran before the last save is in it). Usage of
        accounts not configured yet is applied when they appear. Returns rows applied."""
        if self.store is None:
            return 0
        from fluxnetes.store.usage import load_usage

        del now  # each row decays from its own save time
        self._stored = dict(load_usage(self.store))
        self.loaded = True
        return self._apply_stored()

    def _apply_stored(self) -> int:
        tree = self.fs.tree
        applied = 0
        for name, rec in list(self._stored.items()):
            if name in tree.nodes and tree.is_leaf(name):
                if rec.usage > 0:
                    self.fs.usage.charge(name, rec.usage, rec.updated_time)
                del self._stored[name]
                applied += 1
        return applied

    # --- publishing -------------------------------------------------------------------

    def statuses(self, now: int) -> dict[str, dict[str, Any]]:
        """FluxAccount name -> the status to write (``error`` set on the refused one)."""
        from fluxnetes.k8s.persistence.fluxjob import rfc3339

        rows = {r.name: r for r in self.snapshot(now)}
        out: dict[str, dict[str, Any]] = {}
        bad = self.error.obj.removeprefix(f"{acc.KIND} ") if self.error is not None else None
        for name in self.listed:
            row = rows.get(name)
            status: dict[str, Any] = row.status() if row is not None else {}
            status["error"] = (f"{self.error.field}: {self.error.rule}" if self.error.field else self.error.rule) \
                if (self.error is not None and name == bad) else ""
            status["updated"] = rfc3339(now)
            out[name] = status
        return out

    async def publish(self, kube: Kube, now: int) -> int:
        """Write each FluxAccount's status (the status subresource; only what changed besides
        the time). Returns the objects written. API errors are logged, not raised."""
        from fluxnetes.k8s.kube import ApiError

        written = 0
        for name, status in self.statuses(now).items():
            same = {k: v for k, v in status.items() if k != "updated"}
            if self._published.get(name) == same:
                continue
            try:
                await kube.patch(FLUXACCOUNTS, name, {"status": status}, sub="status")
            except ApiError as exc:
                log.warning("fair share: cannot write FluxAccount %s status: %s", name, exc)
                continue
            self._published[name] = same
            written += 1
        return written
